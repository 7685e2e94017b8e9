"""Where kernels run: "cuda" (a CUDA driver and GPU) or "cpu" (mlirgpu.cpu,
the host through MLIR's ExecutionEngine).

    mg.backend()            # "cuda" where mg.cuda.is_available(), else "cpu"
    mg.set_backend("cpu")   # or MLIRGPU_BACKEND=cpu in the environment

The choice is made at first use (the first mg.backend(), array allocation
or launch) and holds for the process until set_backend changes it. On the
CPU backend mg.empty/zeros/to_device/asarray make DeviceArrays in host
memory, and launches run through mlirgpu.cpu.run. docs/design/cpu_backend.md has the design.

Each backend is a `Backend` object (CudaBackend in gpu.py, CpuBackend in
cpu.py), chosen here once; the rest of the runtime asks `current()` to do
what differs between them instead of asking which one it is.
"""
from __future__ import annotations

import abc
import os
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _mlirgpu
from .._mlirgpu import CudaError, DeviceArray, DType, LaunchError, Stream

if TYPE_CHECKING:
    from .kernel import Specialization
    from .vectorize import _Plan

__all__ = ["BACKENDS", "Backend", "backend", "set_backend", "current", "empty", "zeros", "to_device", "asarray"]

BACKENDS = ("cuda", "cpu")

_current = None   # the current Backend, made at first use
# Kernels whose C dispatcher may hold signatures registered for the GPU:
# forgotten when the backend changes, so no call takes the GPU's fast path.
_kernels = weakref.WeakSet()

Shape = int | tuple[int, ...]   # an array's shape, or the length of a 1-d one
Dims = int | tuple[int, ...]    # a launch's grid, block or cluster: 1 to 3 sizes


class Backend(abc.ABC):
    """What launches and allocations do on one backend. Allocation and
    copies are the C extension's, told where the memory lives (`host`);
    launching, and what a backend can or cannot do, are its own."""

    #: "cuda" or "cpu", as mg.backend() says.
    name: str
    #: Whether its arrays live in host memory.
    host: bool
    #: Whether a stream's work can be captured into a CUDA graph (mg.graph).
    captures_graphs: bool
    #: Whether a kernel's C dispatcher launches the signatures registered with
    #: it; where not, every call binds its arguments in Python.
    dispatches_in_c: bool

    def empty(self, shape: Shape, dtype: DType, stream: Stream | None) -> DeviceArray:
        return _mlirgpu.empty(shape, dtype, stream, host=self.host)

    def zeros(self, shape: Shape, dtype: DType, stream: Stream | None) -> DeviceArray:
        return _mlirgpu.zeros(shape, dtype, stream, host=self.host)

    def to_device(self, array: Any, stream: Stream | None) -> DeviceArray:
        return _mlirgpu.to_device(array, stream, host=self.host)

    def asarray(self, obj: Any) -> DeviceArray:
        return _mlirgpu.asarray(obj, host=self.host)

    def pinned_empty(self, shape: Shape, dtype: DType) -> np.ndarray:
        return _mlirgpu.pinned_empty(shape, dtype, host=self.host)

    def pinned_zeros(self, shape: Shape, dtype: DType) -> np.ndarray:
        return _mlirgpu.pinned_zeros(shape, dtype, host=self.host)

    @abc.abstractmethod
    def launch(self, spec: Specialization, args: list, grid: Dims, block: Dims, shared_mem: int,
               stream: Stream | None, cluster: Dims | None) -> None:
        """Launches `spec` with arguments already checked against it."""

    @abc.abstractmethod
    def max_cooperative_grid_blocks(self, spec: Specialization, block: Dims, shared_mem: int) -> int:
        """The most blocks of `block` threads of `spec` that can run at once."""

    @abc.abstractmethod
    def tuning_device(self) -> str | None:
        """The name of the device mg.autotune times configs on (it keys the
        recorded choices); None where nothing is timed."""

    @abc.abstractmethod
    def run_vectorized(self, plan: _Plan, stream: Stream | None) -> Any:
        """Runs an @mg.vectorize call bound to its arguments; its result."""


def read_only_error(name: str, kernel: str) -> LaunchError:
    """The error for a read-only array where `kernel` stores: a parameter, or a vectorize out=."""
    return LaunchError(f"parameter {name!r}: the array is read-only, and {kernel} stores to it")


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
    # Imported here: each backend's module imports this one for Backend.
    if name == "cpu":
        from .cpu import CpuBackend
        return CpuBackend()
    from .gpu import CudaBackend
    return CudaBackend()


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
