"""mlirgpu: build MLIR from Python, lower it through the NVVM pipeline to PTX
and cubin, and run it on NVIDIA GPUs through the CUDA driver."""
from ._mlirgpu import (CompileError, CudaError, Error, InvalidObjectError, LaunchError,
                       MLIRError)
# TEMPORARY (branch cuda-arrays): the owner of this file re-exports these on merge.
from ._mlirgpu import (DeviceArray, DType, asarray, bf16, bool_, dtype, empty, f16, f32, f64, i8,
                       i16, i32, i64, index, to_device, u8, u16, u32, u64, zeros)
from ._mlirgpu import Event, Stream
from . import cuda
