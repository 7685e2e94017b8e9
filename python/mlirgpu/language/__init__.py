"""The kernel language: what a kernel's body is written with.

Traced scalars and memrefs with their operators, constants and casts, thread
and block indices, loops, barriers, vector accesses and printf, and the
namespaces `math`, `atomic`, `warp`, `block`, `grid`, `shared` and `mma`, and Hopper's
`tma`, `mbarrier`, `wgmma` and `warpgroup`, and the persistent kernels'
`TileScheduler`. It builds IR for whichever lowering (mlirgpu.targets) the
trace is for, and knows nothing of how or where kernels run.
"""
from . import atomic, block, grid, math, mbarrier, mma, shared, tma, warp, warpgroup, wgmma
from .core import (block_dim, block_idx, cast, constant, grid_dim, range_, select, static_range,
                   thread_idx)
from .generics import generics, memref
from .intrinsics import (assume, load, printf, store, syncthreads, threadfence, threadfence_block, threadfence_system, vload,
                         vstore)
from .schedule import TileScheduler

__all__ = ["atomic", "block", "grid", "math", "mma", "shared", "warp", "tma", "mbarrier", "wgmma", "warpgroup",
           "block_dim", "block_idx", "cast", "constant", "grid_dim",
           "range_", "select", "static_range", "thread_idx", "generics", "memref", "printf", "syncthreads",
           "threadfence", "threadfence_block", "threadfence_system", "vload", "vstore", "load", "store",
           "TileScheduler", "assume"]
