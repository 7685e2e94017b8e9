"""mlirgpu: build MLIR from Python, lower it through the NVVM pipeline to PTX
and cubin, and run it on NVIDIA GPUs through the CUDA driver, or on the host
through MLIR's ExecutionEngine (the CPU backend: mg.backend())."""
from . import atomic, cpu, cuda, ir, math, passes, shared, warp
from ._mlirgpu import (CompileError, CudaError, DeviceArray, DType, Error, Event,
                       InvalidObjectError, KernelError, LaunchError, MLIRError, Stream, bf16, bool_,
                       dtype, f16, f32, f64, i8, i16, i32, i64, index, u8, u16, u32, u64)
from .backend import asarray, backend, empty, set_backend, to_device, zeros
from .streams import Graph, graph, pinned_empty, pinned_zeros
from .device import func, printf, syncthreads, vload, vstore
from .compiler import Compilation, Target, compile_cubin, compile_ptx
from .kernel import Kernel, Specialization, generics, kernel, memref
from .program import HostProgram
from .autotune import Autotuner, autotune
from .vectorize import vectorize
from .language import (block_dim, block_idx, cast, constant, grid_dim, range_, select, static_range,
                       thread_idx)

__version__ = "0.1.0"

from .cache import cache_clear, cache_info  # noqa: E402 (reads __version__)
