"""Tensor maps for Hopper's TMA copies: `mg.tensor_map(array, box, swizzle=...)`.

A tensor map (CUDA's `CUtensorMap`) describes a global array and the box
that one TMA copy moves between it and shared memory: element type, sizes,
byte strides, box sizes, the swizzle the box gets in shared memory, what is
read outside the array (zeros, or NaN for floats), and an L2 promotion hint.
The driver encodes it (`cuTensorMapEncodeTiled`) into 128 bytes that a
kernel takes by value, as an `mg.TensorMap` parameter:

    a_map = mg.tensor_map(A, box=(128, 64), swizzle="128B")   # 128 rows x 64 columns of A
    gemm(a_map, ..., grid=..., block=...)

Sizes are given in the array's own (C, row-major) order; the driver wants
them innermost first, and `encode_arguments` (pure Python, no GPU) makes
that conversion and every check the driver would otherwise answer with a
bare CUDA_ERROR_INVALID_VALUE. `map.layout` is the box as it lands in
shared memory: a row-major layout with the swizzle composed on top
(mlirgpu.layout), the layout that wgmma descriptors are computed from.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import _mlirgpu
from .._mlirgpu import DeviceArray, TensorMap, bf16, f8e4m3, f8e5m2, f16, f32, f64, i32, i64, u8, u16, u32, u64
from ..layout import ComposedLayout, Layout, Swizzle
from .backend import current

__all__ = ["TensorMap", "tensor_map", "encode_arguments", "box_layout", "SWIZZLE_BYTES", "TENSOR_MAP_CACHE_SIZE"]

# CUtensorMapDataType
# The 8-bit floats travel as bytes (CUtensorMapDataType has no 8-bit float); the
# zero fill is their +0.0.
DATA_TYPES = {u8: 0, u16: 1, u32: 2, i32: 3, u64: 4, i64: 5, f16: 6, f32: 7, f64: 8, bf16: 9, f8e4m3: 0, f8e5m2: 0}
# swizzle name -> (CUtensorMapSwizzle, the bytes of a swizzled row)
SWIZZLE_BYTES = {"none": (0, None), "32B": (1, 32), "64B": (2, 64), "128B": (3, 128)}
# CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapFloatOOBfill
INTERLEAVES = {"none": 0, "16B": 1, "32B": 2}
L2_PROMOTIONS = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
OOB_FILLS = {"zero": 0, "nan": 1}


class TensorMapInfo:
    """What a tensor map was made from, in the array's order: the kernel's
    compile-time checks and `TensorMap.info` read it."""

    __slots__ = ("shape", "dtype", "box", "swizzle", "element_strides", "oob_fill", "interleave", "l2_promotion")

    def __init__(self, **fields):
        for name in self.__slots__:
            setattr(self, name, fields[name])

    @property
    def box_bytes(self) -> int:
        """Bytes one copy of the box writes to shared memory (the mbarrier's expected transaction count)."""
        count = self.dtype.itemsize
        for b, s in zip(self.box, self.element_strides):
            count *= -(-b // s)
        return count

    @property
    def layout(self) -> Layout | ComposedLayout:
        return box_layout(self.box, self.dtype, self.swizzle)

    def __repr__(self):
        return (f"TensorMapInfo(shape={self.shape}, dtype={self.dtype.name}, box={self.box}, "
                f"swizzle={self.swizzle!r}, oob_fill={self.oob_fill!r})")


def _choice(table, value, what):
    key = "none" if value is None else value
    if key not in table:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, table))}, not {value!r}")
    return table[key]


def _ints(value, what, rank):
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    value = tuple(value)
    if len(value) != rank or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} must be {rank} ints (one per dimension of the array), got {value!r}")
    return value


def encode_arguments(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, address: int,
                     box: int | tuple[int, ...], swizzle: str | None = "128B",
                     element_strides: int | tuple[int, ...] | None = None, oob_fill: str = "zero",
                     interleave: str | None = None, l2_promotion: str | None = "128B") -> dict[str, Any]:
    """The arguments of cuTensorMapEncodeTiled for an array of `shape` and
    byte `strides` (C order) at `address`, and its TensorMapInfo: a dict
    ready for `TensorMap(owner, **arguments)`. ValueError for what the
    driver would refuse.

    >>> args = encode_arguments((1000, 304), (608, 2), bf16, 0x10000, box=(128, 64))
    >>> args["dims"], args["strides"], args["box"], args["swizzle"]
    ((304, 1000), (608,), (64, 128), 3)
    """
    dtype = _mlirgpu.dtype(dtype)
    if dtype not in DATA_TYPES:
        raise ValueError(f"a tensor map cannot hold {dtype.name} elements")
    rank = len(shape)
    if not 1 <= rank <= 5:
        raise ValueError(f"a tensor map has 1 to 5 dimensions, the array has {rank}")
    item = dtype.itemsize
    box = _ints(box, "box", rank)
    element_strides = _ints(element_strides if element_strides is not None else (1,) * rank,
                            "element_strides", rank)
    swizzle_code, swizzle_bytes = _choice(SWIZZLE_BYTES, swizzle, "swizzle")
    interleave_code = _choice(INTERLEAVES, interleave, "interleave")
    l2_code = _choice(L2_PROMOTIONS, l2_promotion, "l2_promotion")
    oob_code = _choice(OOB_FILLS, oob_fill, "oob_fill")
    if strides[-1] != item:
        raise ValueError(f"the array's last dimension must be contiguous for a tensor map (stride {item} bytes), "
                         f"got {strides[-1]}")
    if address % (32 if interleave_code == 2 else 16):
        raise ValueError(f"a tensor map's array must start at a 16-byte aligned address, got {address:#x}")
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        if not 1 <= size <= 2 ** 32:
            raise ValueError(f"dimension {axis} has {size} elements: a tensor map takes 1 to 2**32")
        if axis < rank - 1 and (stride % 16 or not 0 < stride < 2 ** 40):
            raise ValueError(f"dimension {axis}'s stride is {stride} bytes: a tensor map needs a multiple of 16 "
                             f"below 2**40 (pad the rows)")
    for axis, b in enumerate(box):
        if not 1 <= b <= 256:
            raise ValueError(f"box[{axis}] = {b}: each box size is 1 to 256 elements")
    for axis, s in enumerate(element_strides):
        if not 1 <= s <= 8:
            raise ValueError(f"element_strides[{axis}] = {s}: each is 1 to 8")
    inner = box[-1] * item
    if interleave_code == 0:
        if inner % 16:
            raise ValueError(f"the box's rows are {inner} bytes: a tensor map needs a multiple of 16")
        if swizzle_bytes is not None and inner > swizzle_bytes:
            raise ValueError(f"the box's rows are {inner} bytes, wider than the {swizzle} swizzle's "
                             f"{swizzle_bytes}: make box[-1] at most {swizzle_bytes // item}")
    if oob_code == 1 and dtype not in (f16, bf16, f32, f64):
        raise ValueError("oob_fill='nan' is for float elements")
    info = TensorMapInfo(shape=tuple(shape), dtype=dtype, box=box, swizzle=swizzle or "none",
                         element_strides=element_strides, oob_fill=oob_fill, interleave=interleave or "none",
                         l2_promotion=l2_promotion or "none")
    return {
        "info": info, "data_type": DATA_TYPES[dtype], "address": address,
        "dims": tuple(reversed(shape)), "strides": tuple(reversed(strides[:-1])),
        "box": tuple(reversed(box)), "element_strides": tuple(reversed(element_strides)),
        "interleave": interleave_code, "swizzle": swizzle_code, "l2_promotion": l2_code, "oob_fill": oob_code,
    }


def box_layout(box: tuple[int, ...], dtype: Any, swizzle: str | None) -> Layout | ComposedLayout:
    """The shared-memory layout (in elements) of a box a TMA copy writes:
    row-major, with the swizzle on top for the swizzled modes.

    >>> print(box_layout((64, 64), bf16, "128B"))
    Sw<3,3,3> o 0 o (64,64):(64,1)
    """
    dtype = _mlirgpu.dtype(dtype)
    _, swizzle_bytes = _choice(SWIZZLE_BYTES, swizzle, "swizzle")
    strides, running = [], 1
    for b in reversed(box):
        strides.append(running)
        running *= b
    plain = Layout(tuple(box), tuple(reversed(strides)))
    if swizzle_bytes is None:
        return plain
    # 16-byte units swizzled within rows of swizzle_bytes: XOR of the unit index
    # with the row index modulo the rows a swizzle pattern spans.
    bits = {32: 1, 64: 2, 128: 3}[swizzle_bytes]
    base = (16 // dtype.itemsize).bit_length() - 1
    return ComposedLayout(Swizzle(bits, base, 3), 0, plain)


def tensor_map(array: Any, box: int | tuple[int, ...], swizzle: str | None = "128B", *,
               element_strides: int | tuple[int, ...] | None = None, oob_fill: str = "zero",
               interleave: str | None = None, l2_promotion: str | None = "128B") -> TensorMap:
    """A TensorMap for TMA copies of `box`-shaped tiles of `array` (a
    DeviceArray or any CUDA array object; sizes in the array's order). The
    map keeps the array alive. See encode_arguments for the checks.

    On the CPU backend the array is a host one (a DeviceArray of host
    memory, or a NumPy array, which the map then addresses in place) and the
    map holds the same fields for the runtime's copies, without a driver.

    For example::

        A = mg.to_device(np.zeros((1000, 304), np.float16))
        a_map = mg.tensor_map(A, box=(128, 64), swizzle="128B")   # 128 x 64 tiles, 128-byte swizzle
        kernel(a_map, C, grid=..., block=..., shared_mem=...)     # a parameter annotated mg.TensorMap
    """
    host = current().host
    if host and isinstance(array, np.ndarray):
        # In place (NumPy's bfloat16 has no DLPack type to view it through).
        where = (array.shape, array.strides, _mlirgpu.dtype(array.dtype), array.ctypes.data)
        readonly = not array.flags.writeable
    else:
        device = array if isinstance(array, DeviceArray) else _mlirgpu.asarray(array, host=host)
        if device.is_host != host:
            raise ValueError("a tensor map addresses device memory: pass a device array (mg.to_device)" if not host
                             else "on the CPU backend a tensor map addresses host memory: pass a host array "
                                  "(mg.to_device while the backend is 'cpu', or a NumPy array)")
        where = (device.shape, device.strides, device.dtype, device.ptr)
        readonly = device.readonly
    if interleave not in (None, "none") and host:
        raise ValueError("the CPU backend's tensor maps take no interleave")
    key = (host, readonly and host, *where, _hashable(box), swizzle, _hashable(element_strides), oob_fill,
           interleave, l2_promotion)
    try:
        encoded = _encoded(*key)
    except TypeError:   # an unhashable argument: encoding it says what is wrong with it
        encoded = _encoded.__wrapped__(*key)
    return encoded.with_owner(array)


#: How many encoded tensor maps mg.tensor_map keeps, the least recently used going first.
TENSOR_MAP_CACHE_SIZE = 1024


def _hashable(value):
    return value if value is None or isinstance(value, int) else tuple(value)


@functools.lru_cache(maxsize=TENSOR_MAP_CACHE_SIZE)
def _encoded(host, readonly, shape, strides, dtype, address, box, swizzle, element_strides, oob_fill, interleave,
             l2_promotion):
    """The map of these encode parameters, owned by nothing. A CUtensorMap
    is a pure function of them, so an entry is never stale: an array freed
    and another made at its address with the same parameters gets the same
    128 bytes. And an entry keeps no array alive: tensor_map gives each
    caller the map with its own array as owner (TensorMap.with_owner)."""
    arguments = encode_arguments(shape, strides, dtype, address, box, swizzle, element_strides, oob_fill,
                                 interleave, l2_promotion)
    if not host:
        return TensorMap(None, **arguments)
    return TensorMap(None, host=True, readonly=readonly, **arguments)
