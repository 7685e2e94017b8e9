"""Scalar arguments: one conversion, the same on every path that passes a
Python or NumPy scalar to compiled code (the CPU backend's launches,
element-wise kernels, host programs)."""
import numpy as np

from .._mlirgpu import DeviceArray, LaunchError
from ..language.core import integer_range

__all__ = ["scalar_bytes"]


def scalar_bytes(where, dtype, value):
    """`value` (a Python or NumPy scalar) as the bytes of a `dtype` scalar;
    LaunchError, naming `where`, when it is not a scalar, is a float for an
    integer, or does not fit the dtype's range."""
    numpy_dtype = np.dtype(dtype.numpy)
    kind = numpy_dtype.kind
    if isinstance(value, (np.ndarray, DeviceArray)) or not isinstance(value, (int, float, bool, np.generic)):
        raise LaunchError(f"{where}: expected a scalar, got {type(value).__name__}")
    if kind in "biu":
        if not isinstance(value, (int, np.integer, np.bool_)):
            raise LaunchError(f"{where}: expected an integer, got {value!r}")
        low, high = integer_range(dtype)
        if not low <= int(value) <= high:
            raise LaunchError(f"{where}: {int(value)} is out of range [{low}, {high}]")
        return np.array(int(value), numpy_dtype).tobytes()
    if not isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
        raise LaunchError(f"{where}: expected a real number, got {value!r}")
    try:
        wide = float(value)
    except OverflowError:
        raise LaunchError(f"{where}: {value!r} is out of range") from None
    with np.errstate(over="ignore"):
        converted = np.array(wide, numpy_dtype)
    if np.isfinite(wide) and not np.isfinite(converted.astype(np.float64)):
        raise LaunchError(f"{where}: {value!r} is out of range")
    return converted.tobytes()
