"""Kernels out of Python: a self-contained C library, and calling one back.

    mg.export([sgemm], "out/", chips=["sm_80", "sm_90a"])   # out/libkernels.so, kernels.h, README.md
    python -m mlirgpu.export examples.sgemm:sgemm -o out/   # the same from a shell
    lib = mg.load_library("out/libkernels.so")
    lib.sgemm(None, dA, dB, dC, M, N, K, grid=(16, 16), block=(16, 16))

The library has one C function per kernel (kernels.h declares them): it takes
a CUDA stream, device pointers, sizes and scalars, picks the specialization
that serves the sizes (a dynamic generic's variants included), loads its
image on the calling device the first time (a cubin for the device's chip,
else PTX the driver compiles) and launches through the CUDA driver, which it
opens with dlopen: it needs only libc, and the driver to run on a GPU. Where
LLVM's llc is found at export time, the same kernels built for the CPU go in
too, and the functions run on host pointers where there is no GPU. Exporting
needs a C compiler (CC, else cc); running the library does not.
"""
import inspect
import sys
import types

from .build import build
from .library import Library, load_library

__all__ = ["export", "load_library", "Library"]


def export(kernels, out_dir, *, chips=("sm_80", "sm_90a"), name="kernels", launch=None, tuned=None,
           tensor_maps=None, cpu=None, cc=None):
    """Write `out_dir`/lib<name>.so, <name>.h and README.md: a C library of
    `kernels` (kernels whose generics are all dynamic, or specializations,
    several of one kernel dispatched by their sizes, or autotuned kernels)
    with cubins for `chips` and PTX for newer GPUs; returns the library's path.

    `launch` gives kernels their own launch shape, {kernel name: {"grid": C
    expressions of its sizes, "block": the same or ints, "shared_mem": the
    same or bytes}}; the functions of the others take grid, block and
    shared_mem. An @mg.autotune kernel is exported with its table, {key
    values: config} (`tuned`, {kernel name: table}; else the choices
    recorded for the current GPU, autotuned.table()): each config as the
    specialization of its key's values, the function choosing it by size,
    and its launch rule may name the tuned generics.

    A kernel's tensor-map parameters (mg.TensorMap) are described in
    `tensor_maps`, {kernel name: {parameter: {"dtype", "shape", "box" and
    optionally "swizzle", "strides", "element_strides", "oob_fill",
    "l2_promotion", as mg.tensor_map takes them}}}: the function takes the
    array's pointer in the map's place, and the map's extents (and row
    strides, in elements) that are None as sizes <parameter>_extent<d>
    (<parameter>_stride<d>); an entry may also be an int, or a name: one
    of the kernel's sizes, or a size parameter of its own that every map
    naming it shares. The function encodes each map (cuTensorMapEncodeTiled,
    or the CPU builds' form) and keeps it for later calls on the same array.

    `cpu`: put in the CPU builds (True: required, None: where LLVM's llc is
    found). `cc`: the C compiler (default: CC, else cc). For example::

        M, N, K = mg.generics("M N K", dynamic=True)

        @mg.kernel
        def sgemm(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32]):
            ...

        mg.export([sgemm], "out", chips=["sm_90a"],
                  launch={"sgemm": {"grid": ("(M + 15) / 16", "(N + 15) / 16"), "block": (16, 16)}})
    """
    return build(kernels, out_dir, chips=chips, name=name, launch=launch, tuned=tuned, tensor_maps=tensor_maps, cpu=cpu,
                 cc=cc)


class _CallableModule(types.ModuleType):
    """`mg.export(...)` is this module called: the package attribute that
    `python -m mlirgpu.export` needs is the function users call."""

    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
__signature__ = inspect.signature(export)
