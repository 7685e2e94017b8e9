"""mlirgpu: build MLIR from Python, lower it through the NVVM pipeline to PTX
and cubin, and run it on NVIDIA GPUs through the CUDA driver, or on the host
through MLIR's ExecutionEngine (the CPU backend: mg.backend()).

The package is layered; each layer imports only the ones above it here:

    ir         MLIR objects and pass pipelines, over MLIR's C API
    layout     the layout algebra (pure integer functions, used by the language)
    language   what kernels are written with (knows no backend)
    targets    what the language becomes on the GPU and on the host (the lowerings)
    frontend   Python source to MLIR: the rewrite, the trace, device functions
    compiler   MLIR to PTX and cubin, the CPU target's pipeline, the compile cache
    runtime    backends, arrays, launches, vectorize, autotune, host programs

Everything a user needs is exported here (see __all__). `import mlirgpu`
loads none of it: each name imports its layer (and the C extension) when it
is first used, so a process that only imports mlirgpu, or a command-line
tool that imports it for one function, does not pay for the rest.
"""
from ._version import __version__

# Type checkers and editors read the names from these imports (they take any
# TYPE_CHECKING as true); at run time __getattr__ below makes each of them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import cuda, ir, layout, ops
    from ._mlirgpu import (CompileError, CudaError, DeviceArray, DType, Error, Event, InvalidObjectError,
                           KernelError, LaunchError, MLIRError, Stream, TensorMap, bf16, bool_, dtype, f8e4m3,
                           f8e5m2, f16, f32, f64, i8, i16, i32, i64, index, u8, u16, u32, u64)
    from .compiler import Compilation, Target, compile_cubin, compile_ptx
    from .compiler.cache import cache_clear, cache_info
    from . import export   # a module that mg.export(...) calls
    from .export import load_library
    from .frontend import func
    from .ir import passes
    from .language import (TileScheduler, assume, atomic, block, block_dim, block_idx, cast, constant, generics, grid,
                           grid_dim, load, math, mbarrier, memref, mma, printf, range_, select, shared,
                           static_range, store, syncthreads, thread_idx, threadfence, threadfence_block,
                           threadfence_system, tma, vload, vstore, warp, warpgroup, wgmma)
    from .runtime import cpu
    from .runtime.autotune import Autotuner, autotune
    from .runtime.backend import asarray, backend, empty, set_backend, to_device, zeros
    from .runtime.host_program import HostProgram
    from .runtime.kernel import Kernel, Specialization, kernel
    from .runtime.streams import Graph, graph, pinned_empty, pinned_zeros
    from .runtime.tensormap import tensor_map
    from .runtime.vectorize import vectorize

_EXTENSION = ("CompileError", "CudaError", "DeviceArray", "DType", "Error", "Event", "InvalidObjectError",
              "KernelError", "LaunchError", "MLIRError", "Stream", "TensorMap", "bf16", "bool_", "dtype", "f8e4m3",
              "f8e5m2", "f16",
              "f32", "f64", "i8", "i16", "i32", "i64", "index", "u8", "u16", "u32", "u64")
_LANGUAGE = ("assume", "atomic", "block", "block_dim", "block_idx", "cast", "constant", "generics", "grid", "grid_dim",
             "load", "math", "mbarrier", "memref", "mma", "printf", "range_", "select", "shared", "static_range",
             "store", "syncthreads", "thread_idx", "threadfence", "threadfence_block", "threadfence_system", "tma",
             "TileScheduler", "vload", "vstore", "warp", "warpgroup", "wgmma")

# Where each public name lives: (module, attribute), attribute None for the module itself.
_WHERE = {
    **{name: ("._mlirgpu", name) for name in _EXTENSION},
    **{name: (".language", name) for name in _LANGUAGE},
    "cuda": (".cuda", None), "ir": (".ir", None), "layout": (".layout", None), "passes": (".ir.passes", None),
    "ops": (".ops", None),
    "func": (".frontend", "func"),
    **{name: (".compiler", name) for name in ("Compilation", "Target", "compile_cubin", "compile_ptx")},
    "cache_clear": (".compiler.cache", "cache_clear"), "cache_info": (".compiler.cache", "cache_info"),
    "cpu": (".runtime.cpu", None),
    **{name: (".runtime.backend", name) for name in ("asarray", "backend", "empty", "set_backend", "to_device",
                                                       "zeros")},
    **{name: (".runtime.streams", name) for name in ("Graph", "graph", "pinned_empty", "pinned_zeros")},
    **{name: (".runtime.kernel", name) for name in ("Kernel", "Specialization", "kernel")},
    "vectorize": (".runtime.vectorize", "vectorize"),
    "Autotuner": (".runtime.autotune", "Autotuner"), "autotune": (".runtime.autotune", "autotune"),
    "HostProgram": (".runtime.host_program", "HostProgram"),
    "tensor_map": (".runtime.tensormap", "tensor_map"),
    "export": (".export", None), "load_library": (".export", "load_library"),
}


def __getattr__(name):
    """A public name's first use (PEP 562): import its module, keep the value
    here so that later uses are plain lookups. The import system's module
    locks make concurrent first uses from several threads safe; a failure (an
    extension that cannot load) is the ImportError of that import."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'mlirgpu' has no attribute {name!r}")
    from importlib import import_module

    module, attribute = where
    value = import_module(module, __name__)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


__all__ = [
    # errors
    "Error", "MLIRError", "CompileError", "CudaError", "LaunchError", "KernelError", "InvalidObjectError",
    # dtypes
    "DType", "dtype", "bool_", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32",
    "f64", "f8e4m3", "f8e5m2", "index",
    # kernels
    "kernel", "Kernel", "Specialization", "generics", "memref", "func", "vectorize", "autotune", "Autotuner",
    # inside kernels
    "thread_idx", "block_idx", "block_dim", "grid_dim", "constant", "cast", "select", "assume", "range_",
    "static_range", "syncthreads", "threadfence", "threadfence_block", "threadfence_system", "printf", "vload",
    "vstore", "load", "store", "math", "atomic", "warp", "block", "grid", "shared", "mma", "TileScheduler",
    # Hopper: tensor maps, TMA, mbarriers, warpgroup MMA, warpgroups and clusters
    "TensorMap", "tensor_map", "tma", "mbarrier", "wgmma", "warpgroup",
    # arrays, streams, graphs
    "DeviceArray", "to_device", "empty", "zeros", "asarray", "pinned_empty", "pinned_zeros", "Stream",
    "Event", "Graph", "graph",
    # backends, compiling, host programs
    "backend", "set_backend", "cpu", "cuda", "Compilation", "Target", "compile_ptx", "compile_cubin",
    "cache_info", "cache_clear", "HostProgram",
    # kernels out of Python: a C library, and calling one
    "export", "load_library",
    # the IR layer, layouts, the kernels shipped ready to call
    "ir", "passes", "layout", "ops",
    "__version__",
]


def __dir__():
    return sorted(__all__)
