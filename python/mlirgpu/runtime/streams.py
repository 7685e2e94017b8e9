"""The asynchronous model beyond Stream and Event: page-locked host memory,
which makes copies truly asynchronous, and CUDA graphs captured from a
stream.

    host = mg.pinned_empty(n, mg.f32)        # page-locked numpy.ndarray
    d.copy_from_host(host, stream=s)         # returns at once
    with mg.graph() as g:                    # captures the work queued on g.stream
        kernel(d, grid=..., block=..., stream=g.stream)
    g.replay()                               # runs it again, on g.stream

docs/launching.md and docs/design/cuda_runtime.md have the rules: the default stream, copies, graphs, errors.
"""
import numpy as np

from .._mlirgpu import DType, Graph, Stream, f32
from .backend import Shape, current

__all__ = ["Graph", "graph", "pinned_empty", "pinned_zeros"]


def pinned_empty(shape: Shape, dtype: DType = f32) -> np.ndarray:
    """An uninitialized numpy.ndarray in page-locked host memory
    (cuMemHostAlloc, portable to every context), freed when the last array
    viewing it dies. On the CPU backend, and for zero bytes, ordinary memory.

    For example::

        host = mg.pinned_empty((1 << 20,), mg.f32)
        host[:] = 1.0
        d = mg.to_device(host)                 # an asynchronous copy from pinned memory
    """
    return current().pinned_empty(shape, dtype)


def pinned_zeros(shape: Shape, dtype: DType = f32) -> np.ndarray:
    """pinned_empty filled with zeros.

    For example::

        host = mg.pinned_zeros((1024,), mg.f32)
        d.copy_to_host(host)
    """
    return current().pinned_zeros(shape, dtype)


class _NewStream:
    def __repr__(self):
        return "<a new stream>"


_NEW_STREAM = _NewStream()


def graph(stream: Stream | int | None = _NEW_STREAM) -> Graph:
    """A Graph whose with-block captures the work queued on its stream
    (g.stream; by default a new non-blocking mg.Stream), to run again with
    g.replay(). The legacy default stream (None, 0, mg.cuda.default_stream)
    cannot be captured: ValueError. On the CPU backend, whose launches run
    to completion, RuntimeError.

        with mg.graph() as g:
            kernel(dX, grid=4, block=256, stream=g.stream)
        g.replay()
    """
    if not current().captures_graphs:
        raise RuntimeError("mg.graph needs the CUDA backend: on the CPU backend (mg.backend() == 'cpu') "
                           "a launch runs to completion when called, so there is nothing to capture")
    return Graph() if stream is _NEW_STREAM else Graph(stream)
