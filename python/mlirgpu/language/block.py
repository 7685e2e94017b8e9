"""mg.block: reductions and scans over every thread of a block.

    total = mg.block.reduce(x, "add")                  # every thread gets the block's sum
    prefix = mg.block.scan(x, "add")                   # x of threads 0..t combined (inclusive)
    offset = mg.block.scan(x, "add", exclusive=True)   # threads 0..t-1 (0 for thread 0)

Every thread of the block must call them (each call is a barrier), with a
block whose size is a multiple of 32 (whole warps) of up to 1024 threads;
threads are ordered by their linear id (x fastest), as CUDA numbers them.
The operations are those of mg.warp.reduce ("add", "max", "min", "and",
"or", "xor") on 32- and 64-bit values.

They are written once here over the warp's shuffles and shared memory, as
CUB's BlockReduce and BlockScan are: each warp reduces (or scans) its own
values, writes one total per warp to shared memory, the first warp combines
the totals, and every thread reads its result back. Each call site has its
own 64 elements of shared memory; two barriers order them, so a call may
sit in a loop without another mg.syncthreads around it.
"""
from __future__ import annotations

import contextlib

from .. import ir
from . import core as lang
from . import shared, warp
from .intrinsics import syncthreads

__all__ = ["reduce", "scan"]

_MAX_WARPS = 32  # 1024 threads


@contextlib.contextmanager
def _when(condition):
    """The body runs where `condition` holds (scf.if without results)."""
    op = lang.emit("scf.if", [condition], [], regions=2)
    op.regions[1].append_block()
    with ir.InsertionPoint(op.regions[0].append_block()):
        yield
        lang.emit("scf.yield")
    with ir.InsertionPoint(op.regions[1].blocks[0]):
        lang.emit("scf.yield")


def _threads():
    """(linear thread id, lane, warp, number of warps) as index values."""
    x, y, z = (lang.thread_idx.x, lang.thread_idx.y, lang.thread_idx.z)
    bx, by, bz = (lang.block_dim.x, lang.block_dim.y, lang.block_dim.z)
    linear = (z * by + y) * bx + x
    return linear, linear % warp.WARP_SIZE, linear // warp.WARP_SIZE, (bx * by * bz + 31) // warp.WARP_SIZE


def reduce(value: lang.Number, op: str) -> lang.Scalar:
    """`value` combined over every thread of the block with `op`; every
    thread gets the result (CUB's BlockReduce, then a broadcast)."""
    value = warp.check_reduction("mg.block.reduce", value, op)
    scratch = shared.array((2 * _MAX_WARPS,), value.dtype)
    _, lane, warp_id, warps = _threads()
    total = warp.reduce(value, op)
    with _when(lane == 0):
        scratch[warp_id] = total
    syncthreads()
    with _when(warp_id == 0):
        # The first warp combines the warps' totals (lanes past the last warp add the identity,
        # reading a total that was written rather than a scratch element that was not).
        total_of_lane = scratch[lang.select(lane < warps, lane, 0)]
        partial = lang.select(lane < warps, total_of_lane, warp.identity(op, value.dtype))
        block_total = warp.reduce(partial, op)
        with _when(lane == 0):
            scratch[_MAX_WARPS] = block_total
    syncthreads()
    return scratch[_MAX_WARPS]


def scan(value: lang.Number, op: str, exclusive: bool = False) -> lang.Scalar:
    """`value` of threads 0..t combined with `op` in thread t (inclusive), or
    of threads 0..t-1 with `exclusive=True` (the identity in thread 0: 0 for
    "add", the lowest value for "max", ...) (CUB's BlockScan)."""
    value = warp.check_reduction("mg.block.scan", value, op)
    # Warp totals in the first half, their scan in the second: a thread still
    # reading the second half cannot race the next call's writes to the first.
    scratch = shared.array((2 * _MAX_WARPS,), value.dtype)
    _, lane, warp_id, warps = _threads()
    nothing = warp.identity(op, value.dtype)
    inclusive = warp.inclusive_scan(value, op, lane)
    with _when(lane == warp.WARP_SIZE - 1):
        scratch[warp_id] = inclusive
    syncthreads()
    with _when(warp_id == 0):
        totals = lang.select(lane < warps, scratch[lang.select(lane < warps, lane, 0)], nothing)
        scratch[_MAX_WARPS + lane] = warp.inclusive_scan(totals, op, lane)
    syncthreads()
    # The warps before this one, combined (the identity for the first warp).
    previous = scratch[_MAX_WARPS + lang.select(warp_id > 0, warp_id - 1, warp_id)]
    before = lang.select(warp_id > 0, previous, nothing)
    if exclusive:
        within = warp.shfl_up(inclusive, 1)
        within = lang.select(lane > 0, within, nothing)
        return warp.combine(op, before, within)
    return warp.combine(op, before, inclusive)
