"""What every op does with its array arguments: takes torch tensors, CuPy or
JAX arrays, DeviceArrays (and NumPy arrays on the CPU backend) without a
copy, reads their dtype, and makes outputs in the caller's library."""
import contextlib
import functools
import numbers
import sys
import threading

from .._mlirgpu import DeviceArray, DType, LaunchError, asarray, bf16, current_device, dtype, f8e4m3, f16, f32, i32
from ..runtime import backend

__all__ = ["as_array", "capturing", "dtype_of", "geometry", "is_contiguous", "new_like", "output",
           "per_tensor_scale", "placeholder", "plan_stream", "stream_key", "torch_stream", "Workspaces", "zero"]


def as_array(x, what):
    """x as an array a kernel takes, without a copy: a NumPy array as it is
    (the CPU backend's, bf16 included), anything else as mg.asarray's view
    (a DeviceArray) of its memory; a TypeError naming `what` (say
    "attention's q") for what is no array."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return x
    try:
        if type(x).__module__.split(".")[0] == "torch" and not backend.current().host:
            # The ops launch on torch's current stream (torch_stream), the tensor's producer's:
            # it need order nothing before the view. The ordering DLPack makes (through the
            # legacy default stream) costs an event per tensor and breaks a CUDA graph capture.
            return asarray(x, synchronize=False)
        return backend.asarray(x)
    except (TypeError, BufferError) as error:
        raise TypeError(f"{what} is an array (a torch tensor, a CuPy or JAX array, a DeviceArray), "
                        f"not {type(x).__name__}: {error}") from error


def geometry(array):
    """(type, address, shape, strides, dtype[, read-only]) of an array, read the
    cheapest way its library offers (torch's data_ptr, CuPy's data.ptr),
    else through as_array: what a tensor map of it is a function of. Equal
    geometries without the address mean equal shape, strides and dtype."""
    kind = type(array)
    reader = _GEOMETRY_READERS.get(kind)
    if reader is None:
        reader = _GEOMETRY_READERS.setdefault(kind, _geometry_reader(kind))
    return reader(array)


def _geometry_reader(kind):
    """The function reading geometry() of arrays of type `kind` (chosen once
    per type: ops read it on every call)."""
    if kind is DeviceArray:
        return lambda x: (DeviceArray, x.ptr, x.shape, x.strides, x.dtype, x.readonly)
    library = kind.__module__.split(".")[0]
    if library == "torch":    # torch.Size is a tuple: equal to and hashed as one
        return lambda x: (kind, x.data_ptr(), x.shape, x.stride(), x.dtype)
    if library == "cupy":
        return lambda x: (kind, x.data.ptr, x.shape, x.strides, x.dtype)
    if library == "numpy":    # the CPU backend's
        return lambda x: (kind, x.ctypes.data, x.shape, x.strides, x.dtype, not x.flags.writeable)

    def through_view(x):
        view = as_array(x, "an array")
        return kind, view.ptr, view.shape, view.strides, view.dtype, view.readonly
    return through_view


_GEOMETRY_READERS = {}


def dtype_of(array):
    """An array's mlirgpu dtype, None where mlirgpu has none for it."""
    kind = array.dtype
    if isinstance(kind, DType):
        return kind
    # torch's dtypes print as "torch.bfloat16": NumPy's names in a namespace.
    name = str(kind).rpartition(".")[2] if type(kind).__module__.split(".")[0] == "torch" else kind
    try:
        return dtype(name)
    except (TypeError, ValueError):
        return None


def is_contiguous(array):
    """Whether an array (of any library as_array takes) is C-contiguous."""
    if hasattr(array, "flags"):                   # NumPy, CuPy
        return array.flags.c_contiguous
    if hasattr(array, "is_c_contiguous"):         # DeviceArray
        return array.is_c_contiguous
    if hasattr(array, "is_contiguous"):           # torch
        return array.is_contiguous()
    return as_array(array, "an array").is_c_contiguous


def torch_stream(x):
    """torch's current stream where x is a CUDA tensor (so that torch's
    allocations, its graph captures and an op's launches stay in one order),
    as its CUstream handle (an int: 0 for the legacy default stream), else
    None: the default stream."""
    if type(x).__module__.split(".")[0] != "torch":
        return None
    index = x.get_device()
    if index < 0:    # a CPU (or meta) tensor
        return None
    torch = sys.modules["torch"]
    # The handle alone, as torch's own extensions and Triton read it: a torch.cuda.Stream object
    # costs more to make than the whole launch.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def plan_stream(x):
    """What a LaunchPlan reads the stream torch_stream(x) names from, call
    after call: (torch's raw current-stream getter, x's device) for a CUDA
    tensor, None (the default stream) for other arrays, and False where this
    torch has no such getter."""
    if type(x).__module__.split(".")[0] != "torch" or x.get_device() < 0:
        return None
    raw = getattr(sys.modules["torch"]._C, "_cuda_getCurrentRawStream", None)
    return False if raw is None else (raw, x.get_device())


_PLACEHOLDERS = {}


def placeholder():
    """An i32 array of one element on the current backend and device, made
    once: what a kernel's array parameter is passed where the call does not
    read it (a new array on every call would cost an allocation)."""
    where = backend.backend()
    key = where, current_device() if where == "cuda" else None
    if key not in _PLACEHOLDERS:
        import numpy as np

        _PLACEHOLDERS[key] = np.zeros(1, np.int32) if where == "cpu" else backend.zeros((1,), i32)
    return _PLACEHOLDERS[key]


def stream_key(stream):
    """The CUstream a launch's `stream` stands for, as an int (None, 0 and 1:
    the legacy default stream): what keeps workspaces of launches that may
    overlap apart."""
    if stream is None or isinstance(stream, int):
        return 0 if stream in (None, 1) else stream
    if hasattr(stream, "__cuda_stream__"):
        return stream.__cuda_stream__()[1]
    return stream.cuda_stream    # torch's streams before the protocol


def new_like(x, shape, kind, zeros=False):
    """A new array (`zeros`: of zeros) of `shape` and mlirgpu dtype `kind` in
    x's library: torch for a tensor, NumPy for a NumPy array (CPU backend),
    else an mlirgpu DeviceArray."""
    import numpy as np

    if type(x).__module__.split(".")[0] == "torch":
        import torch

        kinds = {f16: torch.float16, bf16: torch.bfloat16, f32: torch.float32, i32: torch.int32,
                 f8e4m3: torch.float8_e4m3fn}
        # x's methods take its device as they stand (torch.empty's device= costs more on every call).
        return (x.new_zeros if zeros else x.new_empty)(shape, dtype=kinds[kind])
    if isinstance(x, np.ndarray):
        return (np.zeros if zeros else np.empty)(shape, kind.numpy)
    return (backend.zeros if zeros else backend.empty)(shape, kind)


def output(x, out, shape, kind, what):
    """An op's output: `out` where given (a LaunchError naming `what` unless it
    is a C-contiguous array of `shape` and mlirgpu dtype `kind`), else a new
    one in x's library (new_like)."""
    if out is None:
        return new_like(x, shape, kind)
    if tuple(out.shape) != shape or dtype_of(out) != kind or not is_contiguous(out):
        raise LaunchError(f"{what}'s out is a C-contiguous {kind.name} array of shape {shape}, "
                          f"not {out.dtype} of shape {tuple(out.shape)}")
    return out


def per_tensor_scale(value, what):
    """A per-tensor scale as a Python float: a number, or an array of one
    element (read on the host: a device array's is copied back, which waits
    for the work that writes it). `what` names it in the LaunchError of
    anything else ("scaled_matmul's scale_a")."""
    if isinstance(value, numbers.Real):
        return float(value)
    shape = tuple(getattr(value, "shape", (None,)))
    if len(shape) > 1 or shape not in ((), (1,)):
        raise LaunchError(f"{what} is a per-tensor scale: a number or an array of one element, "
                          f"not {type(value).__name__} of shape {shape}")
    if hasattr(value, "item"):     # NumPy, torch, CuPy, JAX
        return float(value.item())
    return float(value.get().reshape(()))


def zero(out, what):
    """Sets an op's output to zeros in its own library: torch's zero_ and
    CuPy's fill on their current streams, in order with their other work."""
    if type(out).__module__.split(".")[0] == "torch":
        out.zero_()
    elif hasattr(out, "fill"):   # NumPy, CuPy and DeviceArrays fill alike
        out.fill(0)
    else:
        as_array(out, f"{what}'s out").fill(0)


class Workspaces:
    """Scratch arrays that an op's launches reuse from call to call (split
    products' partial sums, tile counters), kept for the `kept` most recent
    (shapes, backend, device, stream): launches on one stream run in order
    and can share them, launches on two streams may overlap and must not.

        arrays, lock = workspaces.get(((rows, columns, f32),), stream, like)
        with lock:    # what the launches on `stream` that use the arrays hold
            ...

    Each set comes with a lock, held around the launches that write and then
    read it: two Python threads launching on one stream would otherwise put
    one's launches between the other's. While torch captures a CUDA graph on
    the current stream (`like` a CUDA tensor), `get` makes new torch arrays
    instead, from the graph's own memory: the graph keeps the addresses it
    was captured with, which a kept set could hand to another graph, or
    free once it is no longer among the most recent."""

    def __init__(self, kept):
        self._kept = functools.lru_cache(maxsize=kept)(self._make)
        # lru_cache calls _make outside any lock: two threads missing at once would each make a
        # set, and lock, of their own for the same stream.
        self._lock = threading.Lock()

    @staticmethod
    def _make(shapes, where, device, stream):
        import numpy as np

        # Allocated and zeroed on the stream that uses them: made on another (the legacy default
        # stream, say), they would not be ready in time for a non-blocking stream (torch's), which
        # does not wait for it.
        arrays = tuple((np.zeros(shape, kind.numpy) if where == "cpu" else backend.zeros(shape, kind, stream))
                       for *shape, kind in shapes)
        return arrays, threading.Lock()

    def get(self, shapes, stream, like=None):
        """The arrays of `shapes` ((*shape, mlirgpu dtype) each, zeros when
        first made: counters a launch leaves at zero can be kept as they are)
        for launches on `stream`, and their lock."""
        if like is not None and capturing(like):
            return (tuple(as_array(new_like(like, tuple(shape), kind, zeros=True), "a workspace")
                          for *shape, kind in shapes), contextlib.nullcontext())
        where = backend.backend()
        key = shapes, where, current_device() if where == "cuda" else None, stream_key(stream)
        with self._lock:
            return self._kept(*key)


def capturing(x):
    """Whether x is a CUDA tensor of torch's and torch is capturing a CUDA
    graph on its current stream."""
    if type(x).__module__.split(".")[0] != "torch" or x.get_device() < 0:
        return False
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    return raw() if raw is not None else torch.cuda.is_current_stream_capturing()
