"""The CPU backend: kernels run on the host, JIT-compiled through MLIR's ExecutionEngine.

A Specialization is traced a second time, for the CPU target
(mlirgpu.targets.cpu.CpuLowering): a `func.func` with `llvm.emit_c_interface`
whose arguments are the kernel's followed by thread, block, block_dim and
grid_dim x/y/z as `index`, with `mg.syncthreads()` and the other device
features calls of the runtime. It is lowered to the llvm dialect in-process
and handed to `_mlirgpu.CpuEngine` (csrc/cpu/), which runs each thread of a
block as a fiber (every thread of the grid, for a kernel that calls
mg.grid.sync()); lowering and JIT-compiling run in MLIR contexts of their
own, without the GIL. docs/design/cpu_backend.md has the design. A launch
past a GPU's limits (MLIRGPU_CPU_CHIP's, or the default chip's) is refused
before it runs; MLIRGPU_CHECK chooses the checks of the kernel's accesses
(docs/cpu_backend.md).

    mlirgpu.cpu.run(spec, [A, B, C], grid=(4, 4), block=(16, 16))

CpuBackend is the backend object (runtime/backend.py) that launches so.
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import _mlirgpu, ir
from .._mlirgpu import DeviceArray, LaunchError, Stream, TensorMap, lower
from ..compiler.cpu import PIPELINE
from ..compiler.log import log
from ..targets.cpu import ACCESS_CHECKS, CpuLowering, checks_from_environment
from .backend_interface import Backend, Dims, KernelSpecialization, VectorizedCall, read_only_error
from .compiled import default_chip, stored_params as _stored_params
from .scalars import scalar_bytes
TENSOR_MAP_BYTES = 128  # a CUtensorMap's, which a host tensor map fills (csrc/cpu/cpu.h)

__all__ = ["PIPELINE", "host_module", "lowered_module", "stored_params", "engine", "run",
           "max_cooperative_grid_blocks", "CpuBackend"]


# Runtime calls that switch fibers (or, for a failed check, never return).
_FIBER_CALLS = ("mg_cpu_barrier", "mg_cpu_grid_sync", "mg_cpu_shuffle", "mg_cpu_warp_collective",
                "mg_cpu_out_of_bounds", "mg_cpu_division_fault", "mg_cpu_poll", "mg_cpu_mbarrier_init",
                "mg_cpu_mbarrier_arrive", "mg_cpu_mbarrier_wait", "mg_cpu_named_barrier", "mg_cpu_tma_load", "mg_cpu_tma_store",
                "mg_cpu_tma_reduce_add", "mg_cpu_wgmma")


# What a GPU refuses to launch, which the CPU backend refuses as well: the
# grid's and block's extents and threads (every chip since sm_75), and per
# chip the shared memory a block may have, static and dynamic, once a kernel
# opts in (mlirgpu's GPU launches opt in to all of it). MLIRGPU_CPU_CHIP
# names the chip; else the GPU present, or sm_90a.
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
SHARED_PER_BLOCK = {
    "sm_75": 64 * 1024, "sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_87": 163 * 1024, "sm_89": 99 * 1024,
    "sm_90": 227 * 1024, "sm_90a": 227 * 1024, "sm_100": 227 * 1024, "sm_100a": 227 * 1024,
    "sm_120": 99 * 1024, "sm_120a": 99 * 1024,
}
WARPGROUP = 128


def limits_chip() -> str:
    """The chip whose limits CPU launches honour: MLIRGPU_CPU_CHIP, else the GPU present, else sm_90a."""
    chip = os.environ.get("MLIRGPU_CPU_CHIP") or _present_chip()
    if chip not in SHARED_PER_BLOCK:
        raise ValueError(f"MLIRGPU_CPU_CHIP: unknown chip {chip!r} (known: {', '.join(SHARED_PER_BLOCK)})")
    return chip


@functools.cache
def _present_chip():
    # Looking for a GPU takes microseconds; one is there or not for the process's life.
    return default_chip()


def _dims(value):
    """(x, y, z) of a grid or block given as an int or 1 to 3 ints; None for
    anything else (the engine says what is wrong with it)."""
    extents = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(extents) <= 3 or not all(isinstance(e, int) and not isinstance(e, bool) for e in extents):
        return None
    return extents + (1,) * (3 - len(extents))


def _check_limits(spec, needs, grid, block, shared_mem):
    """LaunchError for a launch past the chip's limits (where cuLaunchKernel
    fails with CUDA_ERROR_INVALID_VALUE), or for a wgmma kernel's block that
    is not whole warpgroups (where a GPU would hang or compute garbage)."""
    static_shared, cooperative, wgmma = needs
    g, b = _dims(grid), _dims(block)
    if g is None or b is None or not isinstance(shared_mem, int):
        return
    chip = limits_chip()
    threads = b[0] * b[1] * b[2]
    why = None
    for axis, (extent, most) in enumerate(zip(g, MAX_GRID)):
        if extent > most:
            why = f"grid[{axis}] = {extent}: at most {most}"
    for axis, (extent, most) in enumerate(zip(b, MAX_BLOCK)):
        if extent > most:
            why = f"block[{axis}] = {extent}: at most {most}"
    if why is None and threads > MAX_THREADS:
        why = f"the block has {threads} threads: at most {MAX_THREADS}"
    if why is None and static_shared + shared_mem > SHARED_PER_BLOCK[chip]:
        why = (f"{static_shared} bytes of static and {shared_mem} of dynamic shared memory: a block has at "
               f"most {SHARED_PER_BLOCK[chip]}")
    if why is not None:
        launch = "cuLaunchKernelEx" if cooperative else "cuLaunchKernel"
        raise LaunchError(f"launch of kernel '{spec.name}' with grid=({g[0]}, {g[1]}, {g[2]}) "
                          f"block=({b[0]}, {b[1]}, {b[2]}) shared_mem={shared_mem}: {why} on {chip} (where "
                          f"{launch} fails with CUDA_ERROR_INVALID_VALUE)")
    if wgmma and threads % WARPGROUP:
        raise LaunchError(f"launch of kernel '{spec.name}': it runs wgmma, which takes whole warpgroups of "
                          f"{WARPGROUP} threads, but the block ({b[0]}, {b[1]}, {b[2]}) has {threads} threads")


def _needs(spec, checks):
    """(static shared bytes, cooperative, runs wgmma) of the spec's host trace, for _check_limits."""
    def make():
        traced = host_module(spec, checks)
        return (traced.operation.attributes["mg.cpu.static_shared"].value,
                _calls(traced, ("mg_cpu_grid_sync",)), _calls(traced, ("mg_cpu_wgmma",)))
    return _cached(spec, "_cpu_needs", checks, make)


def _cached(spec, attribute, checks, make):
    """spec.<attribute>[checks], made once: the host trace differs with MLIRGPU_CHECK."""
    spec.check_globals()
    cache = spec.__dict__.setdefault(attribute, {})
    value = cache.get(checks)
    if value is None:
        value = cache[checks] = make()
    return value


def host_module(spec: KernelSpecialization, checks: Iterable[str] | None = None) -> ir.Module:
    """The kernel traced for the host: func.func @<name> and the runtime
    functions it calls. `checks` defaults to MLIRGPU_CHECK's, read now."""
    checks = checks_from_environment() if checks is None else frozenset(checks)
    return _cached(spec, "_cpu_modules", checks, lambda: spec.trace(CpuLowering(checks)))


def _lowered(spec, checks):
    """host_module(spec, checks) lowered to the llvm dialect, as text: in an MLIR
    context of its own, without the GIL (threads compile in parallel)."""
    return lower(host_module(spec, checks), PIPELINE)


def lowered_module(spec: KernelSpecialization, checks: Iterable[str] | None = None) -> ir.Module:
    """host_module(spec, checks) lowered to the llvm dialect: a new Module in its context."""
    checks = checks_from_environment() if checks is None else frozenset(checks)
    return ir.Module.parse(_lowered(spec, checks), context=host_module(spec, checks).context)


def stored_params(module: ir.Module, name: str) -> set[int]:
    """The indices of the memref parameters the host function @`name` of the
    host trace `module` may store to (compiled.stored_params; the runtime's
    access checks read the addresses they are given, never write through them)."""
    return _stored_params(module, name, ACCESS_CHECKS)


def _calls(module, names):
    return any(op.name == "func.call" and op.get_attribute("callee").value in names for op in module.walk())


def max_cooperative_grid_blocks(block: Dims) -> int:
    """The most blocks of `block` threads (an int or a tuple) a kernel that
    calls mg.grid.sync() can launch on the CPU backend: all their threads run
    at once, as fibers, up to a fixed number."""
    threads = math.prod(block) if isinstance(block, (tuple, list)) else block
    return _mlirgpu.CPU_MAX_COOPERATIVE_THREADS // threads


def engine(spec: KernelSpecialization, checks: Iterable[str] | None = None) -> _mlirgpu.CpuEngine:
    """The spec's CpuEngine (made once per Specialization and set of checks)."""
    checks = checks_from_environment() if checks is None else frozenset(checks)
    return _cached(spec, "_cpu_engines", checks, lambda: _make_engine(spec, checks))


def _make_engine(spec, checks):
    log(("compile",), f"mlirgpu: compiling {spec!r} for the CPU because: first launch of this specialization")
    traced = host_module(spec, checks)
    stored = stored_params(traced, spec.name)
    params = []
    for index, (_, shape, dtype) in enumerate(spec._param_types()):
        if shape is not None:
            params.append(("memref", len(shape), dtype.itemsize, index in stored))
        elif dtype is TensorMap:
            params.append(("tensormap", 0, TENSOR_MAP_BYTES))
        else:
            params.append(("scalar", 0, dtype.itemsize))
    filename = spec.kernel.rewritten()[3]
    attributes = traced.operation.attributes
    strings = [a.value for a in attributes["mg.cpu.strings"].value]
    return _mlirgpu.CpuEngine(_lowered(spec, checks), spec.name, params, filename,
                              uses_fibers=_calls(traced, _FIBER_CALLS), strings=strings,
                              cooperative=_calls(traced, ("mg_cpu_grid_sync",)),
                              checks_shared=_calls(traced, ("mg_cpu_shared_access",)),
                              checks_global=_calls(traced, ("mg_cpu_global_access",)),
                              static_shared=attributes["mg.cpu.static_shared"].value)


def run(spec: KernelSpecialization, args: list, grid: Dims, block: Dims, shared_mem: int = 0) -> None:
    """Runs the Specialization `spec` on the host over NumPy arrays (written
    in place) and Python/NumPy scalars, with the GPU's grid and block."""
    params = spec._param_types()
    if len(args) != len(params):
        raise LaunchError(f"{spec.name} takes {len(params)} arguments, got {len(args)}")
    max_threads = spec.kernel.max_threads
    threads = math.prod(block) if isinstance(block, (tuple, list)) else block
    if max_threads is not None and isinstance(threads, int) and threads > max_threads:
        # As the GPU's driver refuses a block over the kernel's .maxntid.
        raise LaunchError(f"{spec.name} has max_threads={max_threads} (@mg.kernel), but the block has "
                          f"{threads} threads")
    checks = checks_from_environment()
    _check_limits(spec, _needs(spec, checks), grid, block, shared_mem)
    compiled = engine(spec, checks)
    packed, copies = [], []
    for index, ((p, shape, dtype), arg) in enumerate(zip(params, args)):
        if dtype is TensorMap:
            if not isinstance(arg, TensorMap):
                raise LaunchError(f"parameter {p.name!r} is a tensor map: pass one made by mg.tensor_map, "
                                  f"not {type(arg).__name__}")
            if not arg.host:
                raise LaunchError(f"parameter {p.name!r} is a tensor map made for the GPU: on the CPU backend, "
                                  f"make it with mg.tensor_map of a host array")
            packed.append(arg.data)
            continue
        if shape is None:
            packed.append(scalar_bytes(f"parameter {p.name!r} ({dtype.name})", dtype, arg))
            continue
        if not isinstance(arg, np.ndarray):
            raise LaunchError(f"parameter {p.name!r}: the CPU backend takes numpy.ndarray, "
                              f"not {type(arg).__name__}")
        if arg.dtype != np.dtype(dtype.numpy) or arg.ndim != len(shape) or \
                any(want is not None and want != got for want, got in zip(shape, arg.shape)):
            raise LaunchError(f"parameter {p.name!r}: expected shape {tuple(shape)} of {dtype.name} (None: any "
                              f"size), got {arg.shape} of {arg.dtype}")
        if not arg.flags.writeable and index in compiled_stores(spec):
            raise read_only_error(p.name, spec.name)
        if not (arg.flags.c_contiguous and arg.flags.aligned):
            # The kernel's memref has the identity layout: run on a contiguous copy, copy back.
            copy = np.array(arg, order="C")
            copies.append((arg, copy))
            arg = copy
        packed.append(arg)
    compiled.launch(packed, grid, block, shared_mem)
    for original, copy in copies:
        if original.flags.writeable:
            np.copyto(original, copy)


def compiled_stores(spec: KernelSpecialization, checks: Iterable[str] | None = None) -> set[int]:
    """stored_params of the spec's host trace (made once per set of checks)."""
    checks = checks_from_environment() if checks is None else frozenset(checks)
    return _cached(spec, "_cpu_stores", checks, lambda: stored_params(host_module(spec, checks), spec.name))


def _host_view(name: str, arg: Any) -> np.ndarray:
    """A NumPy view of an array argument of a CPU launch (zero copy): a NumPy
    array as is, a host DeviceArray or host DLPack object through DLPack."""
    if isinstance(arg, np.ndarray):
        return arg
    if isinstance(arg, DeviceArray) and not arg.is_host:
        raise LaunchError(f"parameter {name!r} is a DeviceArray in CUDA memory, but the backend is 'cpu': "
                          f"copy it with .get() or use mg.set_backend('cuda')")
    try:
        if not isinstance(arg, DeviceArray) and arg.__dlpack_device__()[0] not in (1, 3):  # kDLCPU, kDLCUDAHost
            raise TypeError("device memory")
        return np.from_dlpack(arg)
    except (AttributeError, TypeError, BufferError, RuntimeError) as error:
        raise LaunchError(f"parameter {name!r}: the CPU backend takes host arrays (DeviceArray, NumPy, host "
                          f"DLPack), not {type(arg).__name__} ({error})") from None


class CpuBackend(Backend):
    """Kernels run on the host through run(), each launch to completion;
    arrays live in host memory, and nothing is timed."""

    name, host, captures_graphs, dispatches_in_c = "cpu", True, False, False

    def launch(self, spec: KernelSpecialization, args: list, grid: Dims, block: Dims, shared_mem: int,
               stream: Stream | None, cluster: Dims | None) -> None:
        if cluster is not None:
            raise LaunchError(f"{spec.name} is launched in clusters of {tuple(cluster)}, which only the GPU "
                              f"has: use mg.set_backend('cuda')")
        # The launch runs to completion: `stream` has nothing to order.
        run(spec, [_host_view(p.name, a) if shape is not None else a
                   for (p, shape, _), a in zip(spec._param_types(), args)], grid, block, shared_mem)

    def max_cooperative_grid_blocks(self, spec: KernelSpecialization, block: Dims, shared_mem: int) -> int:
        return max_cooperative_grid_blocks(block)

    def tuning_device(self) -> None:
        return None

    def run_vectorized(self, plan: VectorizedCall, stream: Stream | None) -> Any:
        return plan.run_cpu()
