"""mg.wgmma: Hopper's warpgroup matrix multiply-accumulate (sm_90a).

A warpgroup (4 consecutive warps, 128 threads, starting at a warp index
divisible by 4) multiplies a 64 x K tile of A by a K x N tile of B, both in
shared memory, into an accumulator held in registers across its threads:

    A_TILE = mg.layout.wgmma.tile_layout((64, 64), 2, "128B")      # how A sits in shared memory
    acc = mg.wgmma.zeros(128)                                        # m64n128, f32: 64 values a thread
    mg.wgmma.fence()
    for k in mg.static_range(4):                                     # 4 x k16 = one 64-wide K tile
        a = mg.wgmma.descriptor(sA, A_TILE, k_block=k)
        b = mg.wgmma.descriptor(sB, B_TILE, k_block=k)
        acc = mg.wgmma.mma(acc, a, b, n=128)
    mg.wgmma.commit_group()
    acc = mg.wgmma.wait_group(0, acc)                                # the accumulator, once written

A may also come from registers: `fragments(values, dtype)` rounds an
accumulator (an m64nN product's N/2 values) to f16 or bf16 as the N/16
A operands of k16 wgmmas, each a `Fragment` of this thread's 4 registers,
so that one product feeds the next with no trip through shared memory
(FlashAttention's P in O += P V):

    p = mg.wgmma.fragments(scores, mg.bf16)                         # S's 64 x 128: 8 fragments
    for k in mg.static_range(8):
        acc = mg.wgmma.mma(acc, p[k], v_descriptor(k), n=128)

Rounded to an 8-bit float, the accumulator makes N/32 fragments of k32
wgmmas, whose K columns hold the accumulator's in another order
(`fragment_columns`): B's K rows are to be laid out in that order too.

Each wgmma reads 32 bytes of K: k16 for f16 and bf16, k32 for the 8-bit
floats (f8e4m3, f8e5m2), which wgmma reads K-major only (B given as N x K).
Descriptors are computed from layouts (mlirgpu.layout.wgmma.descriptor: the
leading and stride byte offsets and the swizzle mode); a layout wgmma cannot
read is a CompileError at the line that asks for its descriptor. The
accumulator is a list of traced f32 values (N/2 per thread) that loops
carry like any list of scalars; `accumulator_coordinates` says which (row,
column) of the 64 x N tile each one is. The CPU backend runs wgmma too:
each thread's accumulators from the operands it reads through the
descriptors, as the hardware lays them out.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import ir
from .._mlirgpu import CompileError
from ..layout import wgmma as wgmma_layout
from . import core as lang
from . import shared

if TYPE_CHECKING:
    from .._mlirgpu import DType
    from ..layout import ComposedLayout, Layout

__all__ = ["Descriptor", "descriptor", "Fragment", "fragments", "fragment_columns", "mma", "zeros", "fence", "commit_group", "wait_group",
           "accumulator_coordinates"]

_INPUTS = {lang.f16: "f16", lang.bf16: "bf16", lang.f8e4m3: "e4m3", lang.f8e5m2: "e5m2"}


class Descriptor:
    """A traced 64-bit shared-memory matrix descriptor and what it reads."""

    __slots__ = ("value", "dtype", "major", "fields")

    def __init__(self, value: lang.Scalar, dtype: DType, major: str, fields: wgmma_layout.Descriptor) -> None:
        self.value, self.dtype, self.major, self.fields = value, dtype, major, fields

    def __repr__(self):
        return f"<traced wgmma descriptor {self.fields!r}>"


@functools.lru_cache(maxsize=256)
def _fields(layout, element_bytes, major):
    """wgmma_layout.descriptor, once per tile layout: it checks where every
    element of the tile sits (a 64 x 128 tile's 8,192), and a kernel asks
    for the descriptors of the same few tiles at each of its wgmmas."""
    return wgmma_layout.descriptor(layout, element_bytes, major)


def descriptor(tile: shared.SharedMemRef, layout: Layout | ComposedLayout, *, offset: lang.Index = 0, k_block: int = 0,
               major: str = "K") -> Descriptor:
    """The descriptor of the operand tile at element `offset` of the shared
    memref `tile`, laid out as `layout` (over the tile's (MN, K)
    coordinates, a swizzle composed on top for the swizzled modes), for the
    `k_block`-th 32-byte slice of K that one mma reads (16 elements of f16
    or bf16, 32 of an 8-bit float)."""
    if not isinstance(tile, shared.SharedMemRef):
        raise CompileError(f"a wgmma operand is a shared-memory array, not {type(tile).__name__}")
    if tile.dtype not in _INPUTS:
        raise CompileError(f"wgmma here multiplies f16, bf16, f8e4m3 or f8e5m2 operands, not {tile.dtype.name}")
    if tile.dtype.itemsize == 1 and major != "K":
        raise CompileError(f"wgmma reads {tile.dtype.name} operands K-major only: give B as N x K (major='K')")
    try:
        fields = _fields(layout, tile.dtype.itemsize, major)
    except (TypeError, ValueError) as error:
        raise CompileError(f"no wgmma descriptor for this shared layout: {error}") from None
    if not isinstance(k_block, int) or isinstance(k_block, bool) or not 0 <= k_block < len(fields.k_offsets):
        raise CompileError(f"k_block must be a Python int below {len(fields.k_offsets)} "
                           f"(the tile's K / {32 // tile.dtype.itemsize}), not {k_block!r}")
    # The fixed fields, then the start address (>> 4, 14 bits) at run time.
    constant_part = fields.encode(0)
    address = shared.address(tile, offset) + fields.k_offsets[k_block]
    start = lang.cast((address >> 4) & 0x3FFF, lang.u64)
    return Descriptor(start | lang.constant(constant_part, lang.u64), tile.dtype, major, fields)


class Fragment:
    """This thread's part of a 64 x k slice of A held in registers (32
    bytes of K: k16 of f16 or bf16, k32 of an 8-bit float): 4 i32 words, in
    the order of PTX's A fragment. Lane 4r + q of a warp holds rows r
    (words 0 and 2) and r + 8 (words 1 and 3): of 16-bit elements, columns
    2q, 2q + 1 (words 0, 1) and 2q + 8, 2q + 9 (words 2, 3), which is the
    order of the accumulator values 8k .. 8k + 7 of an m64nN wgmma; of 8-bit
    ones, columns 4q .. 4q + 3 and 16 + 4q .. 16 + 4q + 3 (`fragments`)."""

    __slots__ = ("words", "dtype")

    def __init__(self, words: Sequence[lang.Scalar], dtype: DType) -> None:
        self.words, self.dtype = list(words), dtype

    def __repr__(self):
        return f"<traced wgmma A fragment of {self.dtype.name}>"


def _pair(low: lang.Scalar, high: lang.Scalar, dtype: DType) -> lang.Scalar:
    """Two values rounded to the 16-bit `dtype`, as one i32 word (low first). As a 2-vector bitcast,
    which ptxas makes one conversion of a pair (cvt.rn.bf16x2.f32), not two and a shift."""
    element = lang.ir_type(dtype)
    pair = lang.emit("vector.from_elements", [lang.cast(low, dtype).value, lang.cast(high, dtype).value],
                     [ir.Type.vector([2], element)]).result
    word = lang.emit("vector.bitcast", [pair], [ir.Type.vector([1], ir.Type.integer(32))]).result
    return lang.Scalar(lang.emit("vector.extract", [word], [ir.Type.integer(32)], {
        "static_position": ir.Attribute.dense_i64_array([0])}).result, lang.i32)


def fragment_columns(dtype: DType) -> tuple[int, ...]:
    """Which column of the accumulator each K column of a fragment that
    `fragments` makes holds, relative to the fragment's first (a Python
    tuple): for f16 and bf16 the 16 in order; for 8-bit floats a
    permutation of 32. An 8-bit fragment's lane holds 4 consecutive K
    columns where the accumulator gives it pairs of columns 8 apart, so
    `fragments` packs the values as they lie, no shuffle between lanes, and
    A's K column 16h + 4q + i is the accumulator's column
    16h + 2q + i % 2 + 8 (i // 2). A product by B then sums over the same
    columns if B's K row j holds what the accumulator's column
    fragment_columns(dtype)[j] stands for."""
    if dtype in (lang.f16, lang.bf16):
        return tuple(range(16))
    if dtype in lang.FLOATS8:
        return tuple(16 * (j // 16) + 2 * (j % 16 // 4) + j % 2 + 8 * (j % 4 // 2) for j in range(32))
    raise CompileError(f"a wgmma A fragment holds f16, bf16, f8e4m3 or f8e5m2 values, not "
                       f"{getattr(dtype, 'name', dtype)}")


def fragments(values: Sequence[lang.Number], dtype: DType) -> list[Fragment]:
    """The accumulator `values` of an m64nN wgmma (N/2 values a thread, as
    mma returns them), rounded to `dtype`, as A fragments of that 64 x N
    tile: for f16 and bf16 the N/16 fragments of its k16 slices, fragment k
    holding columns 16k .. 16k + 15, what the k-th wgmma of a product by an
    N x n B reads; for f8e4m3 and f8e5m2 (rounded to nearest, saturating at
    the largest finite value: cvt.rn.satfinite) the N/32 fragments of its
    k32 slices, fragment k holding columns 32k .. 32k + 31 in the order
    `fragment_columns` gives."""
    columns = len(fragment_columns(dtype))
    if not isinstance(values, (list, tuple)) or not values or len(values) % (columns // 2):
        raise CompileError(f"fragments of {dtype.name} take an m64nN accumulator (N/2 values, N a multiple of "
                           f"{columns}), got {len(values) if isinstance(values, (list, tuple)) else type(values).__name__}")
    values = [lang.coerce(v, lang.f32, "a wgmma accumulator value") for v in values]
    if columns == 16:
        return [Fragment([_pair(values[i], values[i + 1], dtype) for i in range(k, k + 8, 2)], dtype)
                for k in range(0, len(values), 8)]
    # Words 0 and 1: rows r and r + 8 of the slice's first 16 columns (values 0, 1, 4, 5 and 2, 3, 6, 7);
    # words 2 and 3: those of its last 16 (values 8 on).
    return [Fragment([lang.target().float8_word([values[k + i] for i in (j, j + 1, j + 4, j + 5)], _INPUTS[dtype])
                      for j in (0, 2, 8, 10)], dtype)
            for k in range(0, len(values), 16)]


def zeros(n: int) -> list[lang.Scalar]:
    """A zero accumulator of an m64nNk16 f32 wgmma: N/2 traced f32 values."""
    _check_n(n)
    zero = lang.constant(0.0, lang.f32)
    return [zero] * (n // 2)


def _check_n(n):
    if not isinstance(n, int) or isinstance(n, bool) or not (8 <= n <= 256 and n % 8 == 0):
        raise CompileError(f"a wgmma's N is a multiple of 8 from 8 to 256, not {n!r}")


def mma(acc: Sequence[lang.Number], a: Descriptor | Fragment, b: Descriptor, *, n: int) -> list[lang.Scalar]:
    """acc + A @ B for one m64nNk16 wgmma (m64nNk32 for 8-bit floats; f32
    accumulate) of `a` (64 x k, K-major: a descriptor, or a Fragment in
    registers of b's type) and the descriptor `b` (N x k, K-major, or
    MN-major for f16 and bf16); returns the new accumulator.
    Asynchronous: its result may be read only after `commit_group()` and
    `wait_group(...)`, and a Fragment's registers are read until then."""
    _check_n(n)
    if isinstance(a, Fragment) and isinstance(b, Descriptor):
        if a.dtype != b.dtype:
            raise CompileError(f"wgmma operands have one element type, got {a.dtype.name} and {b.dtype.name}")
        values = _accumulator(acc, n)
        return lang.target().wgmma_mma_registers(values, a.words, b.value, n, _INPUTS[a.dtype], b.major)
    if not isinstance(a, Descriptor) or not isinstance(b, Descriptor):
        raise CompileError("mg.wgmma.mma takes a descriptor (mg.wgmma.descriptor) or a Fragment "
                           "(mg.wgmma.fragments) for a, and a descriptor for b")
    if a.dtype != b.dtype and not (a.dtype.itemsize == b.dtype.itemsize == 1):
        # The two 8-bit floats mix (e4m3 x e5m2); the 16-bit types do not.
        raise CompileError(f"wgmma operands have one element type, got {a.dtype.name} and {b.dtype.name}")
    if a.major != "K":
        raise CompileError("A is read K-major from shared memory (its rows contiguous along K)")
    values = _accumulator(acc, n)
    return lang.target().wgmma_mma(values, a.value, b.value, n, 32 // a.dtype.itemsize, _INPUTS[a.dtype],
                                   _INPUTS[b.dtype], b.major)


def _accumulator(acc, n):
    if not isinstance(acc, (list, tuple)) or len(acc) != n // 2:
        raise CompileError(f"an m64n{n} accumulator is a list of {n // 2} f32 values, got "
                           f"{len(acc) if isinstance(acc, (list, tuple)) else type(acc).__name__}")
    return [lang.coerce(v, lang.f32, "a wgmma accumulator value") for v in acc]


def fence() -> None:
    """Orders register and shared-memory accesses before the wgmmas that follow (wgmma.fence)."""
    lang.target().wgmma_fence()


def commit_group() -> None:
    """Closes the group of wgmmas issued since the last commit."""
    lang.target().wgmma_commit()


def wait_group(pending: int = 0, accumulator: Sequence[lang.Number] | None = None) -> list[lang.Scalar] | None:
    """Until at most `pending` (a Python int) committed groups are in flight.

    Given the accumulator that those groups write, returns it as the wait's
    result: code that reads the accumulator then depends on the wait, so the
    compiler cannot move those reads (a conversion, a store, a register
    copy) above it, where they would race with the tensor cores or make
    ptxas serialize the wgmmas (its warning C7514)."""
    if not isinstance(pending, int) or isinstance(pending, bool) or not 0 <= pending <= 7:
        raise CompileError(f"mg.wgmma.wait_group takes a Python int from 0 to 7, not {pending!r}")
    values = None if accumulator is None else [lang.coerce(v, lang.f32, "a wgmma accumulator value")
                                               for v in accumulator]
    return lang.target().wgmma_wait(pending, values)


def accumulator_coordinates(register: int, lane_in_warpgroup: lang.Index) -> tuple[lang.Index, lang.Index]:
    """(row, column) in the 64 x N tile of accumulator value `register`
    (a Python int) held by thread `lane_in_warpgroup` (0-127, traced or int):
    warp w holds rows 16w..16w+15; each group of four values covers 8
    columns, rows r and r + 8, two adjacent columns each."""
    t = lane_in_warpgroup
    warp, lane = t // 32, t % 32
    row = warp * 16 + lane // 4 + 8 * ((register >> 1) & 1)
    column = (register >> 2) * 8 + (lane % 4) * 2 + (register & 1)
    return row, column
