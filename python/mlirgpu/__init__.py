"""mlirgpu: build MLIR from Python, lower it through the NVVM pipeline to PTX
and cubin, and run it on NVIDIA GPUs through the CUDA driver."""
from ._mlirgpu import (CompileError, CudaError, Error, InvalidObjectError, LaunchError,
                       MLIRError)
