"""mg.warp: exchanging registers between the 32 threads of a warp.

    v += mg.warp.shfl_xor(v, 16)     # gpu.shuffle xor: the butterfly of a reduction
    v += mg.warp.shfl_down(v, 1)     # gpu.shuffle down
    b = mg.warp.shfl_idx(v, 0)       # gpu.shuffle idx: lane 0's value to all

Each takes a traced 32- or 64-bit value (f32, i32, u32, f64, i64, u64; 64-bit
ones take two shuffles), an offset, lane mask or
source lane (a Python int or a traced integer), and returns the value read
from the other lane. All 32 lanes of the warp must execute the shuffle (PTX
shfl.sync with a full member mask). Where the source lane is out of range
(shfl_down past lane 31, shfl_up before lane 0), a thread gets its own value
back, as in CUDA.

There is no `width` argument: gpu.shuffle's width is the number of lanes
*taking part* (MLIR lowers width 16 to a member mask of lanes 0-15), not
CUDA's segment width, so only the whole warp (32) is offered.
"""
from .._mlirgpu import CompileError
from . import core as lang

__all__ = ["WARP_SIZE", "shfl_xor", "shfl_down", "shfl_up", "shfl_idx", "lane_id"]

WARP_SIZE = 32
_TYPES = (lang.f32, lang.i32, lang.u32, lang.f64, lang.i64, lang.u64)


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


def _shuffle(mode, value, offset, what):
    if not isinstance(value, lang.Scalar):
        raise CompileError(f"mg.warp.{mode_name(mode)} shuffles a traced value, not {type(value).__name__}: "
                           f"mg.constant it")
    if value.dtype not in _TYPES:
        raise CompileError(f"mg.warp.{mode_name(mode)} shuffles 32- and 64-bit values (f32, i32, u32, f64, i64, u64), not "
                           f"{value.dtype.name}: mg.cast it")
    return lang.target().shuffle(mode, value, _i32(offset, what), lang.constant(WARP_SIZE, lang.i32))


def mode_name(mode):
    return {"xor": "shfl_xor", "down": "shfl_down", "up": "shfl_up", "idx": "shfl_idx"}[mode]


def shfl_xor(value, lane_mask):
    """The value of lane (this lane ^ lane_mask) (CUDA __shfl_xor_sync)."""
    return _shuffle("xor", value, lane_mask, "a shuffle's lane mask")


def shfl_down(value, delta):
    """The value of lane (this lane + delta) (CUDA __shfl_down_sync)."""
    return _shuffle("down", value, delta, "a shuffle's delta")


def shfl_up(value, delta):
    """The value of lane (this lane - delta) (CUDA __shfl_up_sync)."""
    return _shuffle("up", value, delta, "a shuffle's delta")


def shfl_idx(value, lane):
    """The value of lane `lane` (CUDA __shfl_sync)."""
    return _shuffle("idx", value, lane, "a shuffle's source lane")


def lane_id():
    """This thread's lane in its warp, 0..31, as index (gpu.lane_id)."""
    return lang.target().lane_id()
