"""The CPU backend: kernels run on the host, JIT-compiled through MLIR's ExecutionEngine.

A Specialization is traced a second time for the host (kernel.py's
`_trace(host=True)`): a `func.func` with `llvm.emit_c_interface` whose
arguments are the kernel's followed by thread, block, block_dim and grid_dim
x/y/z as `index`, with `mg.syncthreads()` a call of the runtime's
`mg_cpu_barrier(line)`. It is lowered to the llvm dialect in-process and
handed to `_mlirgpu.CpuEngine` (csrc/cpu.c), which runs each thread of a
block as a fiber. docs/cpu.md has the design.

    mlirgpu.cpu.run(spec, [A, B, C], grid=(4, 4), block=(16, 16))
"""
import numpy as np

from . import _mlirgpu, ir, passes
from ._mlirgpu import LaunchError

__all__ = ["PIPELINE", "host_module", "lowered_module", "engine", "run"]

# Every dialect a traced kernel uses, down to the llvm dialect. math-to-llvm
# takes what LLVM has intrinsics for, math-to-libm the rest (tanh, atan, ...);
# convert-to-llvm lowers the rest in one conversion, so that the body of a
# memref.generic_atomic_rmw (mg.atomic.cas) is converted with the op itself.
PIPELINE = ("builtin.module(lower-affine, convert-scf-to-cf, expand-strided-metadata, convert-vector-to-llvm, "
            "convert-math-to-llvm, convert-math-to-libm, convert-to-llvm, reconcile-unrealized-casts)")


def host_module(spec):
    """The kernel traced for the host: func.func @<name> and the barrier's declaration."""
    module = getattr(spec, "_cpu_module", None)
    if module is None:
        module = spec._cpu_module = spec._trace(host=True)
    return module


def lowered_module(spec):
    """host_module(spec), cloned and lowered to the llvm dialect."""
    module = host_module(spec).clone()
    passes.run(module, PIPELINE)
    return module


def _uses_barrier(module):
    return any(op.name == "func.call" and op.get_attribute("callee").value == "mg_cpu_barrier"
               for op in module.walk())


def engine(spec):
    """The spec's CpuEngine (made once per Specialization)."""
    compiled = getattr(spec, "_cpu_engine", None)
    if compiled is None:
        traced = host_module(spec)
        params = []
        for _, shape, dtype in spec._param_types():
            if shape is not None:
                params.append(("memref", len(shape), dtype.itemsize))
            else:
                params.append(("scalar", 0, dtype.itemsize))
        filename = spec.kernel.rewritten()[3]
        compiled = spec._cpu_engine = _mlirgpu.CpuEngine(
            lowered_module(spec), spec.name, params, filename, uses_barrier=_uses_barrier(traced))
    return compiled


def _scalar_bytes(name, value, dtype):
    numpy_dtype = np.dtype(dtype.numpy)
    try:
        scalar = np.asarray(value)
        if scalar.ndim != 0:
            raise TypeError
        if numpy_dtype.kind in "iu" and scalar.dtype.kind not in "biu":
            raise TypeError
        return scalar.astype(numpy_dtype).tobytes()
    except (TypeError, ValueError):
        raise LaunchError(f"parameter {name!r}: expected a {dtype.name} scalar, got {value!r}") from None


def run(spec, args, grid, block, shared_mem=0):
    """Runs the Specialization `spec` on the host over NumPy arrays (written
    in place) and Python/NumPy scalars, with the GPU's grid and block."""
    params = spec._param_types()
    if len(args) != len(params):
        raise LaunchError(f"{spec.name} takes {len(params)} arguments, got {len(args)}")
    compiled = engine(spec)
    packed, copies = [], []
    for (p, shape, dtype), arg in zip(params, args):
        if shape is None:
            packed.append(_scalar_bytes(p.name, arg, dtype))
            continue
        if not isinstance(arg, np.ndarray):
            raise LaunchError(f"parameter {p.name!r}: the CPU backend takes numpy.ndarray, "
                              f"not {type(arg).__name__}")
        if arg.dtype != np.dtype(dtype.numpy) or list(arg.shape) != list(shape):
            raise LaunchError(f"parameter {p.name!r}: expected shape {tuple(shape)} of {dtype.name}, "
                              f"got {arg.shape} of {arg.dtype}")
        if not (arg.flags.c_contiguous and arg.flags.aligned and arg.flags.writeable):
            # The kernel's memref has the identity layout: run on a contiguous copy, copy back.
            copy = np.array(arg, order="C")
            copies.append((arg, copy))
            arg = copy
        packed.append(arg)
    compiled.launch(packed, grid, block, shared_mem)
    for original, copy in copies:
        if original.flags.writeable:
            np.copyto(original, copy)
