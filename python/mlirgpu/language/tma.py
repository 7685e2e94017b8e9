"""mg.tma: Hopper's tensor memory accelerator (bulk tensor copies) in kernels.

A kernel takes a tensor map (made on the host by mg.tensor_map) as a
parameter annotated `mg.TensorMap`; it is passed by value, as CUDA's
`__grid_constant__ const CUtensorMap`. One thread starts a copy of one box:

    @mg.kernel
    def k(a_map: mg.TensorMap, ...):
        tiles = mg.shared.dynamic(mg.bf16)
        bars = mg.mbarrier.array(1)
        ...
        if mg.thread_idx.x == 0:
            bars.arrive_expect_tx(0, 128 * 64 * 2)
            mg.tma.load(a_map, tiles, (row, col), bars, 0)   # box at (row, col) -> tiles[0:]
        bars.wait(0, 0)

Coordinates are in the array's order (row, column), in elements; a box
that reaches past the array's edge reads the map's out-of-bounds fill
(zeros by default), and a store writes only the part inside the array.
Needs sm_90 or later; the destination must be aligned to 128 bytes (1024
for the 128-byte swizzle). The CPU backend runs the copies too, with a
tensor map of a host array (multicast excepted: it has no clusters).

In a cluster launch, `multicast=mask` writes the box into the shared
memory of every block of the cluster whose rank's bit is set in the mask,
at the same offset, and counts its bytes on the barrier of the same index
in each of them: blocks that need the same tile load a part of it each and
share the rest (PTX .multicast::cluster).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._mlirgpu import CompileError
from . import core as lang
from . import shared
from .mbarrier import Barriers

if TYPE_CHECKING:
    from .. import ir

# The gpu.func attribute listing its tensor-map parameters: MLIR's gpu-to-nvvm
# conversion keeps function attributes but drops `llvm.byval` on arguments, so
# the compiler makes the listed parameters byval grid constants after it.
GRID_CONSTANTS = "mlirgpu.grid_constants"
PARAMETER_TYPE = "!llvm.ptr"

__all__ = ["GRID_CONSTANTS", "TensorMapValue", "load", "store", "reduce_add", "commit_group", "wait_group",
           "fence_proxy_async"]


class TensorMapValue:
    """A traced tensor-map parameter: the address of the kernel's 128-byte
    parameter (PTX param space, read by the copy engine)."""

    __slots__ = ("value", "name")

    def __init__(self, value: ir.Value, name: str | None = None) -> None:
        self.value, self.name = value, name

    def __repr__(self):
        return f"<traced tensor map {self.name or ''}>"


def _coordinates(coords):
    coords = coords if isinstance(coords, (tuple, list)) else (coords,)
    if not 1 <= len(coords) <= 5:
        raise CompileError(f"a TMA copy takes 1 to 5 coordinates, got {len(coords)}")
    values = []
    for c in reversed(coords):  # the instruction takes the innermost dimension first
        if isinstance(c, lang.Scalar):
            if not lang.is_integer(c.dtype):
                raise CompileError(f"TMA coordinates are integers, not {c.dtype.name}")
            values.append(lang.cast(c, lang.i32))
        elif isinstance(c, int) and not isinstance(c, bool):
            values.append(lang.constant(c, lang.i32))
        else:
            raise CompileError(f"TMA coordinates are ints or traced integers, not {type(c).__name__}")
    return values


def _map(tensor_map):
    if not isinstance(tensor_map, TensorMapValue):
        raise CompileError(f"expected a tensor-map parameter (annotated mg.TensorMap), not "
                           f"{type(tensor_map).__name__}")
    return tensor_map.value


def load(tensor_map: TensorMapValue, destination: shared.SharedMemRef, coords: lang.Index | Sequence[lang.Index], barriers: Barriers,
         barrier: lang.Index = 0, offset: lang.Index = 0, multicast: lang.Index | None = None) -> None:
    """Starts copying the box at `coords` of the tensor map's array into the
    shared memref `destination` (from element `offset`); barrier `barrier`
    of `barriers` counts its bytes as they land. `multicast`: a mask of the
    cluster's block ranks (an int from 1 to 0xFFFF, or a traced integer)
    whose shared memory receives the box, instead of this block's only.
    The innermost coordinate must fall on a multiple of 16 bytes (a multiple
    of 8 for f16 elements), as for `store`; others may be anything, negative
    and past the edges included."""
    descriptor = _map(tensor_map)
    if not isinstance(barriers, Barriers):
        raise CompileError(f"mg.tma.load completes on an mg.mbarrier array, not {type(barriers).__name__}")
    values = _coordinates(coords)
    mask = []
    if multicast is not None:
        if isinstance(multicast, int) and not isinstance(multicast, bool) and 1 <= multicast <= 0xFFFF:
            mask = [lang.constant(multicast, lang.i16)]
        elif isinstance(multicast, lang.Scalar) and lang.is_integer(multicast.dtype):
            mask = [lang.cast(multicast, lang.i16)]
        else:
            raise CompileError(f"a multicast mask is an int from 1 to 0xFFFF (a bit per block of the "
                               f"cluster) or a traced integer, not {multicast!r}")
        lang.target().require_gpu("mg.tma.load with multicast")
    lang.target().tma_load(descriptor, shared.address(destination, offset), values, barriers.address(barrier), mask)


def store(tensor_map: TensorMapValue, source: shared.SharedMemRef, coords: lang.Index | Sequence[lang.Index],
          offset: lang.Index = 0) -> None:
    """Starts copying the shared memref `source` (from element `offset`) to
    the box at `coords` of the tensor map's array. Shared memory written by
    ordinary stores needs `fence_proxy_async()` and a barrier first; the
    copy is complete after `commit_group()` and `wait_group(0)`. The
    innermost coordinate must fall on a multiple of 16 bytes."""
    descriptor = _map(tensor_map)
    lang.target().tma_store(descriptor, shared.address(source, offset), _coordinates(coords))


def reduce_add(tensor_map: TensorMapValue, source: shared.SharedMemRef, coords: lang.Index | Sequence[lang.Index],
               offset: lang.Index = 0) -> None:
    """As `store`, but adds the shared memref `source` (from element `offset`)
    to what the box at `coords` of the tensor map's float32 array holds,
    element by element, each addition atomic (cp.reduce.async.bulk.tensor
    .add): blocks summing into the same array need no atomics of their own.
    The box may reach past the array's far edges (that part is skipped) but
    its coordinates start at 0 or more: a Hopper GPU stops at a negative one
    with an illegal instruction, which the CPU backend raises as a
    KernelError. The copy completes as a store's does."""
    descriptor = _map(tensor_map)
    lang.target().tma_store(descriptor, shared.address(source, offset), _coordinates(coords), add=True)


def commit_group() -> None:
    """Closes the group of TMA stores (and additions) this thread started (cp.async.bulk.commit_group)."""
    lang.target().tma_commit()


def wait_group(pending: int = 0, *, read: bool = False) -> None:
    """Until at most `pending` groups of this thread's stores are in flight;
    `read=True` waits only until their shared memory has been read (so it
    may be reused), not until the global writes are done."""
    if not isinstance(pending, int) or isinstance(pending, bool) or not 0 <= pending <= 63:
        raise CompileError(f"mg.tma.wait_group takes a Python int from 0 to 63, not {pending!r}")
    lang.target().tma_wait(pending, read)


def fence_proxy_async() -> None:
    """Orders this thread's ordinary shared-memory writes before later reads
    by the copy engine and the tensor cores (fence.proxy.async.shared::cta);
    a barrier after it extends that to the other threads' writes."""
    lang.target().fence_proxy_async()
