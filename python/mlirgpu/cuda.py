"""mlirgpu.cuda: the CUDA driver as mlirgpu uses it.

The driver (libcuda.so.1) is opened on first use, never at import, so this
module imports on machines without a GPU; there every call that needs the
driver raises ``mlirgpu.CudaError`` with ``code == -1`` and
``name == "MLIRGPU_NO_DRIVER"``. ``is_available()`` never raises.

Each thread works on one device (0 unless ``set_device``,
``Device(i).make_current()`` or a ``with device(i):`` block says otherwise)
through that device's primary context, the one the CUDA runtime, PyTorch and
CuPy use too. Arrays, streams and events belong to the device that was
current when they were made; a kernel launch runs on the device of its array
arguments.
"""
import contextlib

from ._mlirgpu import CudaModule as Module
from ._mlirgpu import (CudaError, Device, Event, Function, Graph, LaunchError, Stream,
                       current_device, default_stream, device_count, driver_version,
                       is_available, load_module, set_device, synchronize)

__all__ = ["CudaError", "Device", "Event", "Function", "Graph", "LaunchError", "Module", "Stream",
           "current_device", "default_stream", "device", "device_count", "driver_version",
           "is_available", "load_module", "set_device", "synchronize"]


@contextlib.contextmanager
def device(ordinal):
    """``with mlirgpu.cuda.device(1): ...``: device 1 (an ordinal or a
    Device) is the calling thread's device inside the block, and the previous
    one again after it, however the block ends. Other threads are not
    affected. Yields the Device.

        >>> with mlirgpu.cuda.device(0) as d:        # doctest: +SKIP
        ...     x = mlirgpu.zeros(4, mlirgpu.f32)    # allocated on device 0
    """
    previous = current_device()
    set_device(ordinal)
    try:
        yield Device(current_device())
    finally:
        set_device(previous)
