"""mlirgpu: build MLIR from Python, lower it through the NVVM pipeline to PTX
and cubin, and run it on NVIDIA GPUs through the CUDA driver, or on the host
through MLIR's ExecutionEngine (the CPU backend: mg.backend()).

The package is layered; each layer imports only the ones above it here:

    ir         MLIR objects and pass pipelines, over MLIR's C API
    layout     the layout algebra (pure integer functions, used by the language)
    language   what kernels are written with (knows no backend)
    frontend   Python source to MLIR: the rewrite, the trace, device functions
    compiler   MLIR to PTX and cubin, the CPU target's lowering, the compile cache
    runtime    backends, arrays, launches, vectorize, autotune, host programs

Everything a user needs is exported here (see __all__).
"""
from ._version import __version__
from ._mlirgpu import (CompileError, CudaError, DeviceArray, DType, Error, Event, InvalidObjectError,
                       KernelError, LaunchError, MLIRError, Stream, TensorMap, bf16, bool_, dtype, f8e4m3, f8e5m2,
                       f16, f32, f64, i8, i16, i32, i64, index, u8, u16, u32, u64)
from . import cuda, ir, layout
from .ir import passes
from .language import (atomic, block, block_dim, block_idx, cast, constant, generics, grid_dim, load, math,
                       mbarrier, memref, mma, printf, range_, select, shared, static_range, store, syncthreads,
                       thread_idx, threadfence, threadfence_block, threadfence_system, tma, vload, vstore, warp,
                       warpgroup, wgmma)
from .frontend import func
from .compiler import Compilation, Target, compile_cubin, compile_ptx
from .compiler.cache import cache_clear, cache_info
from .runtime import cpu
from .runtime.backend import asarray, backend, empty, set_backend, to_device, zeros
from .runtime.streams import Graph, graph, pinned_empty, pinned_zeros
from .runtime.kernel import Kernel, Specialization, kernel
from .runtime.vectorize import vectorize
from .runtime.autotune import Autotuner, autotune
from .runtime.host_program import HostProgram
from .runtime.tensormap import tensor_map

__all__ = [
    # errors
    "Error", "MLIRError", "CompileError", "CudaError", "LaunchError", "KernelError", "InvalidObjectError",
    # dtypes
    "DType", "dtype", "bool_", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32",
    "f64", "f8e4m3", "f8e5m2", "index",
    # kernels
    "kernel", "Kernel", "Specialization", "generics", "memref", "func", "vectorize", "autotune", "Autotuner",
    # inside kernels
    "thread_idx", "block_idx", "block_dim", "grid_dim", "constant", "cast", "select", "range_",
    "static_range", "syncthreads", "threadfence", "threadfence_block", "threadfence_system", "printf", "vload",
    "vstore", "load", "store", "math", "atomic", "warp", "block", "shared", "mma",
    # Hopper: tensor maps, TMA, mbarriers, warpgroup MMA, warpgroups and clusters
    "TensorMap", "tensor_map", "tma", "mbarrier", "wgmma", "warpgroup",
    # arrays, streams, graphs
    "DeviceArray", "to_device", "empty", "zeros", "asarray", "pinned_empty", "pinned_zeros", "Stream",
    "Event", "Graph", "graph",
    # backends, compiling, host programs
    "backend", "set_backend", "cpu", "cuda", "Compilation", "Target", "compile_ptx", "compile_cubin",
    "cache_info", "cache_clear", "HostProgram",
    # the IR layer, layouts
    "ir", "passes", "layout",
    "__version__",
]


def __dir__():
    return sorted(__all__)
