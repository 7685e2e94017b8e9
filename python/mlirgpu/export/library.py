"""mg.load_library: an exported library's functions, called from Python on
DeviceArrays, torch tensors and other arrays, through ctypes.

    lib = mg.load_library("out/libkernels.so")
    lib.sgemm(stream, dA, dB, dC, M, N, K)

The library describes its functions itself (the <name>_signatures string it
holds), so nothing beside the .so is needed.
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import numpy as np

from .. import _mlirgpu
from .._mlirgpu import DeviceArray, LaunchError

__all__ = ["Library", "ExportedFunction", "load_library"]

_SCALAR_TYPES = {"bool_": ctypes.c_uint8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
                 "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
                 "u64": ctypes.c_uint64, "f16": ctypes.c_uint16, "bf16": ctypes.c_uint16, "f32": ctypes.c_float,
                 "f64": ctypes.c_double, "index": ctypes.c_int64}


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint32), ("y", ctypes.c_uint32), ("z", ctypes.c_uint32)]


def _dim3(name, value):
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d > 0 for d in dims):
        raise LaunchError(f"{name} takes 1 to 3 positive ints, got {value!r}")
    return _Dim3(*(dims + (1,) * (3 - len(dims))))


def _stream_handle(stream):
    """A raw CUstream from None (the default stream), an int, an mg.Stream or
    any object with __cuda_stream__ or torch's cuda_stream."""
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return stream.__cuda_stream__()[1]
    if hasattr(stream, "cuda_stream"):
        return stream.cuda_stream
    raise LaunchError(f"stream takes None, a CUstream as an int, an mg.Stream or an object with __cuda_stream__, "
                      f"not {type(stream).__name__}")


class ExportedFunction:
    """One kernel of an exported library: call it with the stream, then the
    kernel's arguments (the array in place of a tensor map), then its sizes
    (and grid=, block=, shared_mem= for a kernel exported without a launch
    rule). A failed call raises LaunchError with the library's message."""

    def __init__(self, library: Library, description: dict) -> None:
        self.library, self.name = library, description["name"]
        self.params, self.sizes = description["params"], description["sizes"]
        self.has_launch_rule = description["launch_rule"]
        self._function = getattr(library.dll, f"{library.prefix}_{self.name}")
        self._function.restype = ctypes.c_int

    def __repr__(self):
        names = [p["name"] for p in self.params] + self.sizes
        return f"<exported kernel {self.name}(stream, {', '.join(names)})>"

    def __call__(self, stream: Any, *args: Any, grid: Any = None, block: Any = None, shared_mem: int = 0) -> None:
        want = len(self.params) + len(self.sizes)
        if len(args) != want:
            raise LaunchError(f"{self.name} takes the stream and {want} arguments "
                              f"({', '.join([p['name'] for p in self.params] + self.sizes)}), got {len(args)}")
        host = self.library.backend == "cpu"
        keep, values = [], [ctypes.c_void_p(_stream_handle(stream))]
        for p, arg in zip(self.params, args):
            if p["kind"] in ("array", "map"):
                array = _array(self.name, p, arg, host)
                keep.append(array)
                values.append(ctypes.c_void_p(array.ptr))
            else:
                values.append(_scalar(self.name, p, arg))
        for name, size in zip(self.sizes, args[len(self.params):]):
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
                raise LaunchError(f"{self.name}: size {name} is an int, not {size!r}")
            values.append(ctypes.c_int64(int(size)))
        if self.has_launch_rule:
            if grid is not None or block is not None or shared_mem:
                raise LaunchError(f"{self.name} was exported with its own launch shape: pass no grid, block or "
                                  f"shared_mem")
        else:
            if grid is None or block is None:
                raise LaunchError(f"{self.name} needs grid= and block=")
            values += [_dim3("grid", grid), _dim3("block", block), ctypes.c_uint32(shared_mem)]
        status = self._function(*values)
        if status != 0:
            raise LaunchError(f"{self.name}: {self.library.last_error()}")


def _array(kernel, p, arg, host):
    """`arg` as a DeviceArray of the library's kind of memory (host memory on the CPU)."""
    if isinstance(arg, DeviceArray):
        array = arg
    else:
        try:
            array = _mlirgpu.asarray(arg, host=host)
        except (TypeError, ValueError) as error:
            raise LaunchError(f"{kernel}: parameter {p['name']!r}: {error}") from None
    if array.dtype.name != p["dtype"] or len(array.shape) != p["rank"]:
        raise LaunchError(f"{kernel}: parameter {p['name']!r} is a {p['rank']}-d {p['dtype']} array, got a "
                          f"{len(array.shape)}-d {array.dtype.name} one")
    # A tensor map given its row strides reads any rows; other arrays are row-major.
    if not array.is_c_contiguous and not p.get("strided"):
        raise LaunchError(f"{kernel}: parameter {p['name']!r} needs a C-contiguous array, got strides "
                          f"{array.strides}")
    return array


def _scalar(kernel, p, arg):
    kind = _SCALAR_TYPES[p["dtype"]]
    if isinstance(arg, (np.ndarray, DeviceArray)) or not isinstance(arg, (int, float, bool, np.generic)):
        raise LaunchError(f"{kernel}: parameter {p['name']!r} is a scalar, got {type(arg).__name__}")
    if p["dtype"] in ("f16", "bf16"):
        bits = np.array(arg, _mlirgpu.dtype(p["dtype"]).numpy).view(np.uint16)
        return kind(int(bits))
    return kind(arg)


class Library:
    """An exported library, loaded: one ExportedFunction per kernel, as attributes."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.name.startswith("lib") or path.suffix != ".so":
            raise ValueError(f"mg.load_library takes a lib<name>.so that mg.export wrote, not {path.name!r}")
        self.path, self.prefix = path, path.name[3:-3]
        try:
            self.dll = ctypes.CDLL(str(path.resolve()))
            signatures = ctypes.c_char.in_dll(self.dll, f"{self.prefix}_signatures")
        except (OSError, ValueError) as error:
            raise ValueError(f"mg.load_library: {path} is no library mg.export wrote: {error}") from None
        description = json.loads(ctypes.string_at(ctypes.addressof(signatures)))
        self._last_error = getattr(self.dll, f"{self.prefix}_last_error")
        self._last_error.restype = ctypes.c_char_p
        backend = getattr(self.dll, f"{self.prefix}_backend")
        backend.restype = ctypes.c_char_p
        self.backend = backend().decode()
        self.functions = {k["name"]: ExportedFunction(self, k) for k in description["kernels"]}

    def __getattr__(self, name):
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"{self.path.name} exports no kernel {name!r}; it has {sorted(functions)}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.functions))

    def __repr__(self):
        return f"<mlirgpu exported library {self.path} ({self.backend}): {', '.join(self.functions)}>"

    def last_error(self) -> str:
        """The message of this thread's last failed call into the library."""
        return self._last_error().decode(errors="replace")


def load_library(path: str | Path) -> Library:
    """The exported library at `path` (lib<name>.so, as mg.export wrote it),
    its kernels callable on DeviceArrays, torch tensors, CuPy arrays (on the
    GPU) or NumPy arrays (where the library runs its CPU builds). For example::

        lib = mg.load_library("out/libkernels.so")
        lib.sgemm(None, dA, dB, dC, 256, 256, 128)      # stream, arrays, sizes
    """
    return Library(path)
