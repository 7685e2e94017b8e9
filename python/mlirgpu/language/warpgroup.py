"""mg.warpgroup: warpgroups, their registers, and thread-block clusters (sm_90).

A warpgroup is 4 consecutive warps (128 threads); Hopper's wgmma runs on
one. Warp-specialized kernels give warpgroups different roles, one branch
of an `if` each, and move registers from the producer to the consumers:

    @mg.kernel(max_threads=384, min_blocks=1)     # setmaxnreg needs the register cap
    def k(...):
        if mg.warpgroup.index() == 0:
            mg.warpgroup.set_max_registers(40, increase=False)    # producer: TMA copies
            ...
        else:
            mg.warpgroup.set_max_registers(232, increase=True)    # consumers: wgmma
            ...

`barrier(id)` synchronizes the threads of one warpgroup only (a named
barrier, as `syncthreads` is barrier 0 of the whole block), so that one
warpgroup's steps do not wait for the others:

    mg.warpgroup.barrier(1 + mg.warpgroup.index())   # the calling warpgroup's 128 threads

Clusters (a launch's `cluster=(x, y, z)`): `cluster_rank()` is the block's
rank in its cluster, `cluster_sync()` a barrier over the cluster's blocks.
"""
from __future__ import annotations

from .. import ir
from .._mlirgpu import CompileError
from . import core as lang

__all__ = ["SIZE", "index", "thread_index", "set_max_registers", "barrier", "arrive", "cluster_rank", "cluster_sync"]

SIZE = 128


def index() -> lang.Scalar:
    """The calling thread's warpgroup in its block (thread_idx.x // 128, as i32)."""
    return lang.cast(lang.thread_idx.x, lang.i32) // SIZE


def thread_index() -> lang.Scalar:
    """The calling thread's index in its warpgroup (0-127, as i32)."""
    return lang.cast(lang.thread_idx.x, lang.i32) % SIZE


def set_max_registers(count: int, *, increase: bool) -> None:
    """setmaxnreg (sm_90a): this warpgroup's threads release registers down
    to `count` (increase=False) or claim them up to `count` (increase=True),
    a multiple of 8 from 24 to 256. All warps of the warpgroup must run it;
    it takes effect only in a kernel with a register cap (@mg.kernel's
    max_threads with min_blocks=1)."""
    if not isinstance(count, int) or isinstance(count, bool) or not (24 <= count <= 256 and count % 8 == 0):
        raise CompileError(f"setmaxnreg takes a multiple of 8 from 24 to 256, not {count!r}")
    lang.target().set_max_registers(count, increase)


def _barrier_operands(barrier_id, threads):
    if not isinstance(threads, int) or isinstance(threads, bool) or not (32 <= threads <= 1024 and threads % 32 == 0):
        raise CompileError(f"a named barrier counts a multiple of 32 threads up to 1024, not {threads!r}")
    if isinstance(barrier_id, int) and not isinstance(barrier_id, bool):
        if not 1 <= barrier_id <= 15:
            raise CompileError(f"a named barrier's id is 1 to 15 (0 is syncthreads), not {barrier_id}")
        barrier_id = lang.constant(barrier_id, lang.i32)
    elif not (isinstance(barrier_id, lang.Scalar) and lang.is_integer(barrier_id.dtype)):
        raise CompileError(f"a named barrier's id is an int or a traced integer, not {barrier_id!r}")
    return [lang.cast(barrier_id, lang.i32), lang.constant(threads, lang.i32)]


def barrier(barrier_id: lang.Index, threads: int = SIZE) -> None:
    """Named barrier `barrier_id` (1 to 15, an int or traced integer; 0 is
    the block's `syncthreads`): waits until `threads` threads (a multiple of
    32, by default one warpgroup) have reached it, and orders their shared
    memory accesses as syncthreads does (PTX bar.sync id, threads). Every
    warp of those threads must call it (or `arrive`) with the same id."""
    lang.target().named_barrier(*_barrier_operands(barrier_id, threads), wait=True)


def arrive(barrier_id: lang.Index, threads: int = SIZE) -> None:
    """Arrives at named barrier `barrier_id` without waiting (PTX bar.arrive
    id, threads): one warpgroup signals another that waits on it with
    `barrier(barrier_id, threads)`, counting both sides' threads."""
    lang.target().named_barrier(*_barrier_operands(barrier_id, threads), wait=False)


def cluster_rank() -> lang.Scalar:
    """The block's rank in its thread-block cluster (%cluster_ctarank, as i32)."""
    lang.target().require_gpu("mg.warpgroup.cluster_rank")
    return lang.Scalar(lang.emit("nvvm.read.ptx.sreg.cluster.ctarank", results=[ir.Type.integer(32)]).result,
                       lang.i32)


def cluster_sync() -> None:
    """A barrier over every thread of every block of the cluster (barrier.cluster.arrive + wait)."""
    lang.target().require_gpu("mg.warpgroup.cluster_sync")
    lang.emit("nvvm.cluster.arrive", attributes={"aligned": ir.Attribute.unit()})
    lang.emit("nvvm.cluster.wait", attributes={"aligned": ir.Attribute.unit()})
