"""mg.grid: synchronization of every thread of the grid (CUDA's grid.sync()).

    partial[block_idx.x] = mg.block.reduce(x, "add")
    mg.grid.sync()                      # every block's partial is written and visible
    total = partial[0] + partial[1]     # any block may read any other's

mg.grid.sync() waits until every thread of every block of the launch has
reached it, and makes every write before it (global memory, by any thread)
visible to every thread after it: CUDA's cooperative groups'
`this_grid().sync()`, Numba's `cuda.cg.this_grid().sync()`. Every thread of
the grid must reach each call, as with mg.syncthreads().

That needs every block of the grid on the GPU at once, so a kernel that
calls it is launched cooperatively (cuLaunchKernelEx with the cooperative
attribute), without being asked: a grid larger than the device holds at
once is a LaunchError before anything runs, and
`Specialization.max_cooperative_grid_blocks(block)` says how many blocks
fit.

The barrier is written here over the language's atomics and fences: a
32-bit counter in global memory, a module global of the kernel, which the
first thread of each block increments once it has the block's threads
(mg.syncthreads()). Block (0, 0, 0) adds 2**31 - (blocks - 1), every other
block 1, so the count's low 31 bits are back where they started once all
have arrived and its top bit has flipped: that flip is what the blocks
wait for, and the counter needs no reset between barriers or launches.
The increment is a release and the waiting load an acquire at device scope,
each between device-wide fences, so that every block's writes before the
barrier are seen by every block after it. Since a module's launches share
its counter, each of them waits for the one before, whatever its stream
(an event: csrc/launch/function.c); on the CPU backend every thread of the grid runs
at once, as fibers, and the runtime releases them all at the barrier.
"""
from __future__ import annotations

from .. import ir
from . import atomic
from . import core as lang
from .block import _when
from .intrinsics import syncthreads, threadfence

__all__ = ["sync", "COUNTER"]

#: The symbol of the barrier's counter (a module global); the launch finds it to
#: know the kernel must be launched cooperatively.
COUNTER = "__mg_grid_barrier"

_FLIP = 0x80000000  # the counter's top bit, which flips once per barrier


def sync() -> None:
    """Wait until every thread of the grid gets here, with every write before
    it visible to every thread after it (CUDA's grid.sync()). The kernel is
    launched cooperatively (every block resident at once).

    For example::

        partial[mg.block_idx.x] = mg.block.reduce(x, "add")
        mg.grid.sync()
        if mg.block_idx.x == 0 and mg.thread_idx.x == 0:
            out[0] = partial[0] + partial[1]
    """
    lang.target().grid_sync()


def counter_barrier(counter):
    """The grid barrier over `counter` (a u32 MemRef of one element in global
    memory, zero before the first launch): see the module's text."""
    syncthreads()
    first_thread = (lang.thread_idx.x == 0) & (lang.thread_idx.y == 0) & (lang.thread_idx.z == 0)
    with _when(first_thread):
        blocks = lang.cast(lang.grid_dim.x * lang.grid_dim.y * lang.grid_dim.z, lang.u32)
        first_block = (lang.block_idx.x == 0) & (lang.block_idx.y == 0) & (lang.block_idx.z == 0)
        flip = lang.constant(_FLIP, lang.u32)
        arrival = lang.select(first_block, flip - (blocks - 1), lang.constant(1, lang.u32))
        threadfence()
        before = atomic.add(counter, 0, arrival, order="release", scope="gpu")
        _spin_until_flipped(counter, before, flip)
        threadfence()
    syncthreads()


def _spin_until_flipped(counter, before, flip):
    """Loads `counter` (acquire) until its top bit differs from `before`'s (an scf.while)."""
    loop = lang.emit("scf.while", [], [], regions=2)
    with ir.InsertionPoint(loop.regions[0].append_block()):
        now = atomic.load(counter, 0, order="acquire", scope="gpu")
        lang.emit("scf.condition", [((now ^ before) & flip) == 0])
    with ir.InsertionPoint(loop.regions[1].append_block()):
        lang.emit("scf.yield")
