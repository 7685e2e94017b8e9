"""mg.warp: the 32 threads of a warp exchanging registers and voting.

    v += mg.warp.shfl_xor(v, 16)             # the butterfly of a reduction (shfl.sync.bfly)
    v += mg.warp.shfl_down(v, 1, width=8)    # within segments of 8 lanes, as CUDA's width
    b = mg.warp.shfl_idx(v, 0)               # lane 0's value to all
    bits = mg.warp.ballot(x > 0)             # u32: bit k is lane k's predicate (vote.sync.ballot)
    mg.warp.any(x > 0), mg.warp.all(x > 0)   # bool (vote.sync.any / .all)
    s = mg.warp.reduce(v, "add")             # the whole warp's sum, in every lane

Shuffles take a traced 32- or 64-bit value (f32, i32, u32, f64, i64, u64;
64-bit ones take two shuffles), an offset, lane mask or source lane (a
Python int or a traced integer), and `width`, a power of two up to 32 (a
Python int): the warp is split into segments of `width` lanes and each lane
reads within its own, as CUDA's `__shfl_*_sync(mask, v, x, width)`. Where the
source lane is outside the segment (shfl_down past its end, shfl_up before
its start, shfl_xor above it), a lane gets its own value back; shfl_idx reads
lane `lane % width` of the segment.

All 32 lanes of the warp must execute a shuffle, vote or reduction (a full
member mask, as `0xffffffff` in CUDA), so the block's size should be a
multiple of 32.

`reduce(v, op)` combines the values of the 32 lanes with op ("add", "max",
"min", "and", "or", "xor"; the last three on integers) and gives every lane
the result: PTX's redux.sync for 32-bit integers (sm_80 and newer), a
butterfly of five shuffles otherwise.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._mlirgpu import CompileError
from . import core as lang

if TYPE_CHECKING:
    from .._mlirgpu import DType

__all__ = ["WARP_SIZE", "shfl_xor", "shfl_down", "shfl_up", "shfl_idx", "lane_id", "ballot", "any", "all",
           "reduce", "REDUCTIONS", "combine", "identity"]

WARP_SIZE = 32
_TYPES = (lang.f32, lang.i32, lang.u32, lang.f64, lang.i64, lang.u64)
REDUCTIONS = ("add", "max", "min", "and", "or", "xor")


def _i32(value, what):
    if isinstance(value, lang.Scalar):
        if not lang.is_integer(value.dtype):
            raise CompileError(f"{what} must be an integer, not a {value.dtype.name} value")
        return lang.cast(value, lang.i32)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 2 ** 31:
            raise CompileError(f"{what} must be a non-negative int, got {value}")
        return lang.constant(value, lang.i32)
    raise CompileError(f"{what} must be an int or a traced integer, not {type(value).__name__}")


def _shuffle(mode, value, offset, width, what):
    name = mode_name(mode)
    if not isinstance(value, lang.Scalar):
        raise CompileError(f"mg.warp.{name} shuffles a traced value, not {type(value).__name__}: mg.constant it")
    if value.dtype not in _TYPES:
        raise CompileError(f"mg.warp.{name} shuffles 32- and 64-bit values (f32, i32, u32, f64, i64, u64), not "
                           f"{value.dtype.name}: mg.cast it")
    if not isinstance(width, int) or isinstance(width, bool) or width not in (1, 2, 4, 8, 16, 32):
        raise CompileError(f"mg.warp.{name}: width must be a power of two from 1 to 32 (a Python int), "
                           f"not {width!r}")
    return lang.target().shuffle(mode, value, _i32(offset, what), width)


def mode_name(mode):
    return {"xor": "shfl_xor", "down": "shfl_down", "up": "shfl_up", "idx": "shfl_idx"}[mode]


def shfl_xor(value: lang.Scalar, lane_mask: lang.Index, width: int = WARP_SIZE) -> lang.Scalar:
    """The value of lane (this lane ^ lane_mask) (CUDA __shfl_xor_sync)."""
    return _shuffle("xor", value, lane_mask, width, "a shuffle's lane mask")


def shfl_down(value: lang.Scalar, delta: lang.Index, width: int = WARP_SIZE) -> lang.Scalar:
    """The value of lane (this lane + delta) (CUDA __shfl_down_sync)."""
    return _shuffle("down", value, delta, width, "a shuffle's delta")


def shfl_up(value: lang.Scalar, delta: lang.Index, width: int = WARP_SIZE) -> lang.Scalar:
    """The value of lane (this lane - delta) (CUDA __shfl_up_sync)."""
    return _shuffle("up", value, delta, width, "a shuffle's delta")


def shfl_idx(value: lang.Scalar, lane: lang.Index, width: int = WARP_SIZE) -> lang.Scalar:
    """The value of lane `lane` of this lane's segment (CUDA __shfl_sync)."""
    return _shuffle("idx", value, lane, width, "a shuffle's source lane")


def lane_id() -> lang.Scalar:
    """This thread's lane in its warp, 0..31, as index (gpu.lane_id)."""
    return lang.target().lane_id()


def _predicate(pred, what):
    if isinstance(pred, bool):
        return lang.constant(pred, lang.bool_)
    if not isinstance(pred, lang.Scalar) or pred.dtype != lang.bool_:
        got = pred.dtype.name if isinstance(pred, lang.Scalar) else type(pred).__name__
        raise CompileError(f"mg.warp.{what} takes a traced bool (a comparison), not {got}")
    return pred


def ballot(pred: lang.Scalar | bool) -> lang.Scalar:
    """A u32 whose bit k is lane k's `pred` (CUDA __ballot_sync)."""
    return lang.target().vote("ballot", _predicate(pred, "ballot"))


def any(pred: lang.Scalar | bool) -> lang.Scalar:
    """Whether `pred` holds in any lane of the warp (CUDA __any_sync)."""
    return lang.target().vote("any", _predicate(pred, "any"))


def all(pred: lang.Scalar | bool) -> lang.Scalar:
    """Whether `pred` holds in every lane of the warp (CUDA __all_sync)."""
    return lang.target().vote("all", _predicate(pred, "all"))


# ---------------------------------------------------------------------------
# Reductions: written once over the shuffles (and used by mg.block)

def check_reduction(what, value, op):
    """`value` as a Scalar that `op` can combine, or CompileError."""
    if op not in REDUCTIONS:
        raise CompileError(f"{what}: the operation must be one of {', '.join(map(repr, REDUCTIONS))}, not {op!r}")
    if not isinstance(value, lang.Scalar):
        raise CompileError(f"{what} reduces a traced value, not {type(value).__name__}")
    if value.dtype not in _TYPES:
        raise CompileError(f"{what} takes 32- and 64-bit values (f32, i32, u32, f64, i64, u64), not "
                           f"{value.dtype.name}: mg.cast it")
    if op in ("and", "or", "xor") and lang.is_float(value.dtype):
        raise CompileError(f"{what}: {op!r} needs integers, not {value.dtype.name}")
    return value


def combine(op: str, a: lang.Number, b: lang.Number) -> lang.Scalar:
    """a `op` b, for op in REDUCTIONS."""
    from . import math
    if op == "add":
        return a + b
    if op == "max":
        return math.max(a, b)
    if op == "min":
        return math.min(a, b)
    return a & b if op == "and" else a | b if op == "or" else a ^ b


def identity(op: str, dtype: DType) -> lang.Scalar:
    """The value x with combine(op, x, y) == y for every y of `dtype`, as a constant."""
    if op in ("add", "or", "xor"):
        return lang.constant(0, dtype)
    if op == "and":
        return lang.constant(-1 if dtype in lang.SIGNED else lang.integer_range(dtype)[1], dtype)
    if lang.is_float(dtype):
        return lang.constant(float("-inf") if op == "max" else float("inf"), dtype)
    lowest, highest = lang.integer_range(dtype)
    return lang.constant(lowest if op == "max" else highest, dtype)


def reduce(value: lang.Number, op: str) -> lang.Scalar:
    """`value` combined over the 32 lanes of the warp with `op` ("add", "max",
    "min", "and", "or", "xor"); every lane gets the result."""
    value = check_reduction("mg.warp.reduce", value, op)
    reduced = lang.target().warp_reduce(op, value)
    if reduced is not None:
        return reduced
    for lane_mask in (16, 8, 4, 2, 1):
        value = combine(op, value, shfl_xor(value, lane_mask))
    return value


def inclusive_scan(value, op, lane):
    """This lane's `op` over lanes 0..lane of its warp (Hillis and Steele: five shuffles up)."""
    for delta in (1, 2, 4, 8, 16):
        before = shfl_up(value, delta)
        value = lang.select(lane >= delta, combine(op, value, before), value)
    return value
