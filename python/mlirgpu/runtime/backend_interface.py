"""What a backend is: the `Backend` interface that "cuda" (gpu.py) and "cpu"
(cpu.py) implement, and what a backend needs of the kernels and
@mg.vectorize calls it runs, as protocols: kernel.py and vectorize.py sit
above the backends (they ask backend.py for the current one), so a backend
names what it uses of them here instead of importing them.
"""
from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from .. import _mlirgpu, ir
from .._mlirgpu import DeviceArray, DType, Function, LaunchError, Stream

__all__ = ["Backend", "KernelSpecialization", "VectorizedCall", "Shape", "Dims", "read_only_error"]

Shape = int | tuple[int, ...]   # an array's shape, or the length of a 1-d one
Dims = int | tuple[int, ...]    # a launch's grid, block or cluster: 1 to 3 sizes


class KernelSpecialization(Protocol):
    """What a backend launches: a kernel.Specialization, as far as backends use it."""

    name: str
    kernel: Any   # the kernel.Kernel: its max_threads and rewritten() source

    def _param_types(self) -> list[tuple[Any, list[int | None] | None, Any]]:
        """Per parameter: (its Parameter, its shape (None for a scalar or tensor map), its dtype)."""

    def trace(self, target: Any = None) -> ir.Module:
        """The kernel traced for `target` (default: the GPU's gpu.module)."""

    def loaded(self, args: list) -> AbstractContextManager[Function]:
        """The kernel loaded on the device of its array arguments, current meanwhile."""

    def function(self, exact_stores: bool = False) -> Function:
        """The kernel loaded on the current device."""


class VectorizedCall(Protocol):
    """An @mg.vectorize call bound to its arguments (vectorize._Plan)."""

    def run_gpu(self, stream: Stream | None) -> Any:
        """Runs it on the GPU; its result."""

    def run_cpu(self) -> Any:
        """Runs it on the host; its result."""


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
    def launch(self, spec: KernelSpecialization, args: list, grid: Dims, block: Dims, shared_mem: int,
               stream: Stream | None, cluster: Dims | None) -> None:
        """Launches `spec` with arguments already checked against it."""

    @abc.abstractmethod
    def max_cooperative_grid_blocks(self, spec: KernelSpecialization, block: Dims, shared_mem: int) -> int:
        """The most blocks of `block` threads of `spec` that can run at once."""

    @abc.abstractmethod
    def tuning_device(self) -> str | None:
        """The name of the device mg.autotune times configs on (it keys the
        recorded choices); None where nothing is timed."""

    @abc.abstractmethod
    def run_vectorized(self, plan: VectorizedCall, stream: Stream | None) -> Any:
        """Runs an @mg.vectorize call bound to its arguments; its result."""


def read_only_error(name: str, kernel: str) -> LaunchError:
    """The error for a read-only array where `kernel` stores: a parameter, or a vectorize out=."""
    return LaunchError(f"parameter {name!r}: the array is read-only, and {kernel} stores to it")
