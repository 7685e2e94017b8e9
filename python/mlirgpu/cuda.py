"""mlirgpu.cuda: the CUDA driver as mlirgpu uses it.

The driver (libcuda.so.1) is opened on first use, never at import, so this
module imports on machines without a GPU; there every call that needs the
driver raises ``mlirgpu.CudaError`` with ``code == -1`` and
``name == "MLIRGPU_NO_DRIVER"``. ``is_available()`` never raises.

Each thread works on one device (0 unless ``set_device`` or
``Device(i).make_current()`` says otherwise) through that device's primary
context, the one the CUDA runtime, PyTorch and CuPy use too.
"""
from ._mlirgpu import CudaModule as Module
from ._mlirgpu import (CudaError, Device, Event, Function, Graph, LaunchError, Stream,
                       current_device, default_stream, device_count, driver_version,
                       is_available, load_module, set_device, synchronize)

__all__ = ["CudaError", "Device", "Event", "Function", "Graph", "LaunchError", "Module", "Stream",
           "current_device", "default_stream", "device_count", "driver_version",
           "is_available", "load_module", "set_device", "synchronize"]
