"""mg.mbarrier: Hopper's shared-memory barriers that count arrivals and bytes.

    bars = mg.mbarrier.array(4)            # 4 barriers in static shared memory
    if mg.thread_idx.x == 0:
        bars.init(0, 1)                    # expects 1 arrival per phase
        mg.mbarrier.fence_init()           # make the initialisation visible to the copy engine
    mg.syncthreads()
    bars.arrive_expect_tx(0, 8192)         # one arrival, and 8192 bytes of TMA copies to come
    bars.wait(0, phase)                    # until phase `phase` (0 or 1) of barrier 0 completes

An mbarrier completes a phase when its expected arrivals have arrived and
the transaction bytes it was told to expect (by `arrive_expect_tx`) have
been written by the copies that name it (mg.tma.load); `wait` spins on
`mbarrier.try_wait.parity` with the phase's parity. Needs sm_90 or later
on the GPU; the CPU backend runs them too (a waiting thread lets the
others run until its phase completes).

In a cluster launch, `arrive_cluster(index, rank)` arrives on barrier
`index` of the block of rank `rank` in the cluster (its own rank too):
that is how the blocks that share a multicast tile tell each other's
producer that they are done with it.
"""
from __future__ import annotations

from .. import ir
from .._mlirgpu import CompileError
from . import core as lang
from . import shared

__all__ = ["Barriers", "array", "fence_init"]


def _i32(value, what):
    if isinstance(value, lang.Scalar):
        if not lang.is_integer(value.dtype) and value.dtype != lang.bool_:
            raise CompileError(f"{what} must be an integer, not a {value.dtype.name} value")
        return lang.cast(value, lang.i32)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31:
        return lang.constant(value, lang.i32)
    raise CompileError(f"{what} must be a non-negative int or a traced integer, not {value!r}")


class Barriers:
    """`count` mbarriers (8 bytes each) in shared memory; every method takes
    the barrier's index (an int or a traced integer)."""

    def __init__(self, memref: shared.SharedMemRef, count: int) -> None:
        self.memref, self.count = memref, count

    def __repr__(self):
        return f"<{self.count} traced mbarriers>"

    def __len__(self):
        return self.count

    def _check(self, index):
        if isinstance(index, int) and not isinstance(index, bool) and not 0 <= index < self.count:
            raise CompileError(f"mbarrier index {index} is out of range: there are {self.count}")

    def address(self, index: lang.Index) -> lang.Scalar:
        """The u32 shared-memory address of barrier `index`."""
        self._check(index)
        return shared.address(self.memref, index)

    def init(self, index: lang.Index, arrivals: lang.Index) -> None:
        """Barrier `index` expects `arrivals` arrivals per phase (one thread initialises it)."""
        lang.target().mbarrier_init(self.address(index), _i32(arrivals, "the arrival count"))

    def arrive(self, index: lang.Index) -> None:
        """One arrival of the calling thread."""
        lang.target().mbarrier_arrive(self.address(index))

    def arrive_cluster(self, index: lang.Index, rank: lang.Index) -> None:
        """One arrival of the calling thread on barrier `index` of the block
        of rank `rank` (an int or traced integer) in the cluster: PTX mapa to
        that block's address of the barrier, then mbarrier.arrive on it with
        release semantics at cluster scope (inline PTX: MLIR 22's
        nvvm.mbarrier.arrive names only this block's barriers)."""
        lang.target().require_gpu("mg.mbarrier.arrive_cluster")
        asm = ("{\n\t.reg .b32 remote;\n\tmapa.shared::cluster.u32 remote, $0, $1;\n\t"
               "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n\t}")
        lang.emit("llvm.inline_asm", [lang.cast(self.address(index), lang.i32), _i32(rank, "the block rank")], [],
                  attributes={"asm_string": ir.Attribute.string(asm),
                              "constraints": ir.Attribute.string("r,r,~{memory}"),
                              "has_side_effects": ir.Attribute.unit()})

    def arrive_expect_tx(self, index: lang.Index, nbytes: lang.Index) -> None:
        """One arrival, and `nbytes` more transaction bytes the phase waits for."""
        lang.target().mbarrier_arrive(self.address(index), _i32(nbytes, "the byte count"))

    def wait(self, index: lang.Index, phase: lang.Index) -> None:
        """Until the phase of parity `phase` (0 or 1, an int or traced integer) completes."""
        lang.target().mbarrier_wait(self.address(index), _i32(phase, "the phase parity"))


def array(count: int) -> Barriers:
    """`count` mbarriers in static shared memory, one set per call site."""
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1024:
        raise CompileError(f"mg.mbarrier.array takes a count from 1 to 1024, not {count!r}")
    return Barriers(shared.array((count,), lang.u64), count)


def fence_init() -> None:
    """Makes the barriers this thread initialised visible to the other
    threads of the cluster and to the copy engine (fence.mbarrier_init)."""
    lang.target().mbarrier_fence_init()
