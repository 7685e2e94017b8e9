"""mlirgpu: build MLIR from Python, lower it through the NVVM pipeline to PTX
and cubin, and run it on NVIDIA GPUs through the CUDA driver."""
from . import ir, passes
from ._mlirgpu import (CompileError, CudaError, Error, InvalidObjectError, LaunchError,
                       MLIRError)
from .compiler import Compilation, Target, compile_cubin, compile_ptx

__version__ = "0.1.0"
