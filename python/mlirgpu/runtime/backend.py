"""Where kernels run: "cuda" (a CUDA driver and GPU) or "cpu" (mlirgpu.cpu,
the host through MLIR's ExecutionEngine).

    mg.backend()            # "cuda" where mg.cuda.is_available(), else "cpu"
    mg.set_backend("cpu")   # or MLIRGPU_BACKEND=cpu in the environment

The choice is made at first use (the first mg.backend(), array allocation
or launch) and holds for the process until set_backend changes it. On the
CPU backend mg.empty/zeros/to_device/asarray make DeviceArrays in host
memory, and launches run through mlirgpu.cpu.run. docs/design/cpu_backend.md has the design.

Each backend is a `Backend` object (backend_interface.py; CudaBackend in
gpu.py, CpuBackend in cpu.py), chosen here once; the rest of the runtime
asks `current()` to do what differs between them instead of asking which
one it is.
"""
from __future__ import annotations

import os
import weakref
from typing import Any

from .. import _mlirgpu
from .._mlirgpu import CudaError, DeviceArray, DType, Stream
from .backend_interface import Backend, Dims, Shape, read_only_error
from .cpu import CpuBackend
from .gpu import CudaBackend

__all__ = ["BACKENDS", "Backend", "Dims", "Shape", "backend", "set_backend", "current", "empty", "zeros",
           "to_device", "asarray"]

BACKENDS = ("cuda", "cpu")

_current = None   # the current Backend, made at first use
# Kernels whose C dispatcher may hold signatures registered for the GPU:
# forgotten when the backend changes, so no call takes the GPU's fast path.
_kernels = weakref.WeakSet()


def _check_name(name: str, where: str) -> None:
    if name not in BACKENDS:
        raise ValueError(f"{where}: the backend is 'cuda' or 'cpu', not {name!r}")


def _require_cuda(where: str) -> None:
    from .. import cuda
    if cuda.is_available():
        return
    cuda.device_count()   # raises the driver's CudaError (no driver, or its error) with the reason
    raise CudaError(f"{where}: the CUDA backend needs a GPU, and the driver reports none")


def _make(name: str) -> Backend:
    return CpuBackend() if name == "cpu" else CudaBackend()


def current() -> Backend:
    """The Backend launches and array allocations use, chosen at first use."""
    global _current
    if _current is None:
        name = os.environ.get("MLIRGPU_BACKEND", "").strip().lower()
        if name:
            _check_name(name, "MLIRGPU_BACKEND")
            if name == "cuda":
                _require_cuda("MLIRGPU_BACKEND=cuda")
        else:
            from .. import cuda
            name = "cuda" if cuda.is_available() else "cpu"
        _current = _make(name)
    return _current


def backend() -> str:
    """"cuda" or "cpu": the backend launches and array allocations use.

    For example::

        if mg.backend() == "cpu":
            print("no GPU: kernels run on the host")
    """
    return current().name


def set_backend(name: str) -> None:
    """Makes `name` ("cuda" or "cpu") the backend from now on. ValueError for
    another name, CudaError for "cuda" where there is no driver or GPU.
    Arrays made before keep their memory: a host DeviceArray is not a
    device pointer, and the CUDA launch path refuses it.

    For example::

        mg.set_backend("cpu")                  # or MLIRGPU_BACKEND=cpu in the environment
        x = mg.to_device(np.ones(4, np.float32))   # host memory now
    """
    global _current
    _check_name(name, "set_backend")
    if name == "cuda":
        _require_cuda("set_backend('cuda')")
    if _current is None or name != _current.name:
        for kernel in list(_kernels):
            kernel.clear()
        _current = _make(name)


def empty(shape: Shape, dtype: DType = _mlirgpu.f32, stream: Stream | None = None) -> DeviceArray:
    """An uninitialized DeviceArray of `shape` and `dtype` (host memory on
    the CPU backend), allocated in stream order on `stream`.

        >>> mg.empty((256, 256), mg.f32).shape
        (256, 256)
    """
    return current().empty(shape, dtype, stream)


def zeros(shape: Shape, dtype: DType = _mlirgpu.f32, stream: Stream | None = None) -> DeviceArray:
    """A DeviceArray of zeros (host memory on the CPU backend), set on `stream`.

        >>> mg.zeros(4, mg.i32).get()
        array([0, 0, 0, 0], dtype=int32)
    """
    return current().zeros(shape, dtype, stream)


def to_device(array: Any, stream: Stream | None = None) -> DeviceArray:
    """A DeviceArray copy of a NumPy array or array-like (a host copy on
    the CPU backend), copied on `stream`.

        >>> d = mg.to_device(np.arange(3, dtype=np.float32))
        >>> d.get()
        array([0., 1., 2.], dtype=float32)
    """
    return current().to_device(array, stream)


def asarray(obj: Any) -> DeviceArray:
    """obj itself if a DeviceArray, else a zero-copy view: of a
    __cuda_array_interface__ or CUDA __dlpack__ object on the GPU backend, of
    a host __dlpack__ object (a NumPy array, a CPU tensor) on the CPU backend.

    For example::

        t = torch.ones(8, device="cuda")
        view = mg.asarray(t)                   # shares t's memory
    """
    return current().asarray(obj)
