"""A Hopper (sm_90a) GEMM: TMA copies into a ring of shared-memory stages
guarded by mbarriers, and warp-specialized wgmma. mlirgpu.ops.matmul runs it
for large shapes; examples/tensorcore/hopper_gemm.py measures every `Config`.

C = A @ B with A (M x K) and B (K x N) in bf16 or fp16, accumulated in f32,
written as f32, bf16 or fp16. Or in 8 bits (f8e4m3 or f8e5m2, B given as
N x K) with a scale per tensor: C = (scale_a * scale_b) * (A @ B), see
below. One block computes a BM x BN tile of C with three warpgroups (384
threads):

- warpgroup 0, the producer, gives most of its registers away (setmaxnreg)
  and has one thread issue the TMA copies: for each BK-wide slice of K, the
  A tile (BM x BK) and the B tile (BK x BN) into the next free stage, whose
  "full" mbarrier counts the bytes as they land;
- warpgroups 1 and 2, the consumers, claim the registers, wait on a stage's
  "full" barrier, run 4 wgmma m64nBNk16 each (one 64-row half of the tile)
  reading A and B straight from shared memory through descriptors computed
  from the stage's layouts, and free the stage on its "empty" barrier once
  those wgmmas are done, while the next stage's are already running;
- the consumers then store their accumulators to C, predicated at the
  edges of C.

BN is 32, 64, 128, 192 or 256. B's tile lands as BN / 64 boxes of BK rows
of 64 columns, rows of 128 bytes in the 128-byte swizzle as A's are; a
32-column tile is one box whose rows of 64 bytes take the 64-byte swizzle.
32 columns double the tiles of a product of few rows (an N of 4096 makes
128, where 64 columns make 64), but each block still reads a slice of A
for half as much of B at every step: on an H200 (1 to 128 rows, N and K of
4096 and 8192) they ran slower than 64 columns on every product but one
(64 x 4096^2 with A's 64 rows a step), and ops.matmul does not choose
them.

Two options of `Config` change how tiles get in and out (CONFIGS lists the
combinations; the first is the default):

- epilogue="tma": the consumers convert their accumulators to C's type and
  write them into shared memory, box after box of 64 rows x 128 bytes laid
  out as the 128-byte swizzle (which also spreads the rows a warp writes at
  once over all the banks), then one thread of the warpgroup has a TMA store
  copy each box to C, through a tensor map of C that clips the boxes at C's
  edges. Each consumer warpgroup alternates between two 8 KB buffers: the
  32 KB fit beside the 4 stages of a 128 x 256 tile (192 KB) in the 227 KB
  of shared memory a block may have, and the next box is written while the
  previous one is copied. A C whose rows are not multiples of 16 bytes
  cannot have a tensor map: its threads then store it from the registers.
- multicast="B" ("A"): the grid runs in clusters of 2 blocks on vertically
  (horizontally) adjacent tiles, which read the same tile of B (A) at every
  step of K: each block loads half of it by a TMA multicast into both, so
  L2 serves it once. Both blocks' producers then write every stage, so its
  "empty" barrier collects the consumer warps of both blocks (arrivals on
  the other block's barrier go through mapa), and the blocks meet at a
  cluster barrier before they exit.
- schedule="pingpong" (BN = 128): each consumer warpgroup takes whole
  128 x 128 tiles (two 64-row accumulators), every other tile of the block,
  instead of 64 rows of every tile; the two pass the tensor cores to each
  other through named barriers once they have issued a tile's wgmmas, so
  that one's epilogue runs under the other's wgmmas. A stage is then read by
  one warpgroup, whose 4 warps free it.
- split=S (register epilogue, no multicast): each tile's K is cut into S
  slices of equal steps, and each (slice, tile) is a work unit of the
  persistent loop, so that a product of few tiles and a long K keeps every
  SM busy. The kernel's C is then a float32 workspace of S times C's rows,
  a slice's partial products below the previous one's; a second kernel
  (split_k_sum) adds them up into C. SplitK runs the two as one launch,
  with a workspace per stream (launches on one stream run in order), and
  a lock that keeps another thread's pair of launches on that stream from
  coming between them.

Any M, N, K: the tensor maps' out-of-bounds fill reads zeros past the edges
of A and B. TMA needs each row's byte stride to be a multiple of 16, so K
(and N, for B) are padded to multiples of 8 when they are not.

B may also be given transposed (N x K, `b_major="K"`), the layout
cuBLAS and CUTLASS favour: both operands are then K-major.

8-bit floats (FP8): the same kernel with A and B of f8e4m3 (or f8e5m2),
which wgmma reads K-major only, so B is given as N x K (`b_major="K"`).
A stage's slice of K is still one 128-byte swizzled row, now of 128
elements (BK = 128), and each wgmma is m64nBNk32. The scales of A and B
(per tensor, as FP8 checkpoints carry them) are two f32 kernel scalars
whose product multiplies the f32 accumulators in the epilogue, before
they are converted to C's type.

Grouped (`build(..., grouped=True)`, mlirgpu.ops.grouped_matmul on sm_90a):
A holds groups of rows end to end, B (G x K x N) one matrix per group, and
`offsets` the groups' row ends, which the kernel reads (lang.GroupedTiles:
a tile's linear index is mapped to its group, rows and columns by walking
the groups' tile counts). A is read through one 2-d tensor map: a tile
that runs past its group's last row loads rows of the next group (or TMA's
zeros past A), which only feed accumulator rows that are never stored. B
is read through one 3-d tensor map with the group as its outer coordinate,
so no map is made per group. The epilogue stores from the registers, the
rows of the tile's group only. In 8 bits (mlirgpu.ops.scaled_grouped_matmul)
B is G x N x K, each group's matrix K-major as wgmma reads 8-bit floats, its
3-d map's boxes BN rows of BK; the scales are then rows of them, not two
numbers: one per row of A and one per column of each group's B (a G x N
array), which the epilogue loads for the rows and columns of each thread's
accumulators and multiplies them by (the rows past the group's end, and the
columns past C's, read the last row's or column's scale: their sums are
never stored).
"""
import functools

import numpy as np

from .. import cuda, layout
from .. import language as lang
from .._mlirgpu import TensorMap, f8e4m3, f8e5m2, f32, i32, index
from ..language.schedule import GroupedTiles
from ..layout import wgmma as wgmma_layout
from ..runtime import backend
from ..runtime.kernel import kernel
from ..runtime.tensormap import tensor_map
from .arrays import Workspaces, as_array, dtype_of, geometry, placeholder

CONSUMERS = 2                       # consumer warpgroups: 64 rows of each tile each, or whole tiles in turn
THREADS = 128 * (1 + CONSUMERS)
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232
GROUP_M = 8                         # row tiles per group of the block order
SHARED_LIMIT = 227 * 1024           # shared memory one block may have on the H100
ROW_BYTES = 128                     # a stage's slice of K: one row of the 128-byte swizzle
FLOATS8 = (f8e4m3, f8e5m2)
# The TMA-store epilogue writes C in boxes of 64 rows of 128 bytes (the 128-byte
# swizzle's row), two boxes per consumer warpgroup in turn.
STORE_BOX_BYTES = 64 * 128
STORE_BUFFERS = 2


class Config:
    """Tile shape, pipeline depth, epilogue and cluster of one GEMM kernel.

    epilogue: "registers" (each thread stores its accumulators to C) or
    "tma" (through shared memory and TMA stores); multicast: None, "B" (a
    cluster of 2 blocks on vertically adjacent tiles shares B's tile) or "A"
    (2 blocks on horizontally adjacent tiles share A's); schedule:
    "cooperative" (both consumer warpgroups on every tile, 64 rows each) or
    "pingpong" (each consumer warpgroup on every other tile, all its rows);
    split: K cut into that many slices, each a work unit of its own, whose
    float32 partial products a second kernel adds up (split-K: for products
    with fewer tiles than multiprocessors and a long K); a_rows: the rows of
    A's tile each step loads, BM or a multiple of 8 up to 64, for products
    of at most that many rows (the other rows of the stage keep what they
    held, and their accumulators are never stored: on an H200 a product of
    64 rows, its 128-row boxes reading zeros past A's rows, ran slower than
    one of 128 rows).
    BK is 64 for 2-byte inputs and 128 for 8-bit ones (`for_dtype`)."""

    def __init__(self, bn=256, bk=64, stages=4, b_major="MN", epilogue="registers", multicast=None,
                 schedule="cooperative", split=1, a_rows=64 * CONSUMERS):
        if b_major not in ("MN", "K"):
            raise ValueError("b_major is 'MN' (B is K x N) or 'K' (B is given as N x K)")
        if bk not in (64, 128):
            raise ValueError("BK is one 128-byte swizzled row: 64 for 2-byte inputs, 128 for 8-bit ones")
        if bn not in (32, 64, 128, 192, 256):
            raise ValueError(f"BN is 32, 64, 128, 192 or 256 (B's tile is boxes of 64 columns, or one of 32), not {bn}")
        if epilogue not in ("registers", "tma"):
            raise ValueError("epilogue is 'registers' or 'tma'")
        if epilogue == "tma" and bn % 128:
            # An even number of store boxes per tile, whichever C's type: the two
            # buffers then alternate in the same order on every tile.
            raise ValueError("the TMA epilogue needs BN = 128 or 256")
        if multicast not in (None, "A", "B"):
            raise ValueError("multicast is None, 'A' or 'B'")
        if multicast == "B" and bn % 128:
            raise ValueError("multicast='B' splits B's tile into halves of whole 64-column boxes: BN = 128 or 256")
        if schedule not in ("cooperative", "pingpong"):
            raise ValueError("schedule is 'cooperative' or 'pingpong'")
        if schedule == "pingpong" and bn != 128:
            # A warpgroup holds the whole 128 x BN tile's accumulators: BN f32 registers a thread.
            raise ValueError("the ping-pong schedule needs BN = 128 (the 128 x BN accumulators of a warpgroup)")
        if not isinstance(split, int) or isinstance(split, bool) or split < 1:
            raise ValueError(f"split is an int >= 1 (slices of K), not {split!r}")
        if split > 1 and (epilogue != "registers" or multicast):
            # A slice's rows of the partial products end where the next slice's begin: TMA's
            # stores would clip at the partials' end only; and a cluster's blocks share K.
            raise ValueError("split-K takes the register epilogue and no multicast")
        few = isinstance(a_rows, int) and not isinstance(a_rows, bool) and 8 <= a_rows <= 64 and a_rows % 8 == 0
        if not (few or a_rows == 64 * CONSUMERS) or (a_rows != 64 * CONSUMERS and multicast == "A"):
            raise ValueError(f"a_rows is {64 * CONSUMERS} (BM) or a multiple of 8 up to 64 (rows of the first "
                             f"consumer warpgroup's only, without multicast='A'), not {a_rows!r}")
        self.bm, self.bn, self.bk, self.stages, self.b_major = 64 * CONSUMERS, bn, bk, stages, b_major
        self.epilogue, self.multicast, self.schedule, self.split = epilogue, multicast, schedule, split
        self.a_rows = a_rows
        if self.shared_bytes() > SHARED_LIMIT:
            raise ValueError(f"{self} needs {self.shared_bytes()} bytes of shared memory, over {SHARED_LIMIT}")

    def __repr__(self):
        return (f"Config(BM={self.bm}, BN={self.bn}, BK={self.bk}, stages={self.stages}, b_major={self.b_major!r}, "
                f"epilogue={self.epilogue!r}, multicast={self.multicast!r}, schedule={self.schedule!r}"
                + (f", split={self.split}" if self.split > 1 else "")
                + (f", a_rows={self.a_rows})" if self.a_rows != self.bm else ")"))

    def replace(self, **changes):
        """This configuration with some of its options changed."""
        options = dict(bn=self.bn, bk=self.bk, stages=self.stages, b_major=self.b_major,
                       epilogue=self.epilogue, multicast=self.multicast, schedule=self.schedule, split=self.split,
                       a_rows=self.a_rows)
        options.update(changes)
        return Config(**options)

    def for_dtype(self, dtype):
        """This configuration for inputs of `dtype`: BK is one 128-byte row of them."""
        return self if self.bk * dtype.itemsize == ROW_BYTES else self.replace(bk=ROW_BYTES // dtype.itemsize)

    @property
    def name(self):
        parts = [f"wgmma {self.bm}x{self.bn}x{self.bk}", f"{self.stages} stages"]
        if self.schedule == "pingpong":
            parts.append("ping-pong")
        if self.epilogue == "tma":
            parts.append("TMA-store epilogue")
        if self.multicast:
            parts.append(f"{self.multicast} multicast in clusters of 2")
        if self.split > 1:
            parts.append(f"split-K {self.split}")
        if self.a_rows != self.bm:
            parts.append(f"{self.a_rows} rows of A")
        return ", ".join(parts)

    @property
    def cluster(self):
        """The blocks of a cluster along M and along N."""
        return {None: (1, 1), "B": (2, 1), "A": (1, 2)}[self.multicast]

    @property
    def b_columns(self):
        """The columns of one TMA box of B given as K x N: 64, a 128-byte row of
        2-byte inputs, or the 32 of a BN = 32 tile (a 64-byte row)."""
        return min(self.bn, 64)

    @property
    def b_swizzle(self):
        """The swizzle B's tiles land with: that of their rows, 128 bytes of K (B
        given as N x K) or b_columns of N (K x N)."""
        return "128B" if self.b_major == "K" or self.b_columns == 64 else "64B"

    @property
    def stage_elements(self):
        return (self.bm + self.bn) * self.bk

    def shared_bytes(self):
        # A stage is BM + BN rows of 128 bytes, whatever the input type.
        # + 1 KB: the stages start at the first 1024-byte boundary (the 128-byte swizzle's period).
        staging = CONSUMERS * STORE_BUFFERS * STORE_BOX_BYTES if self.epilogue == "tma" else 0
        return self.stages * (self.bm + self.bn) * ROW_BYTES + staging + 1024


# The first is the default (and the benchmark's first row); the order is what the H100
# measured (benchmarks/gemm_tensorcore.py; docs/gemm_tensorcore_h100.md): the TMA-store
# epilogue first, then the ping-pong schedule and the register epilogue. With multicast
# the same tile ran at about two thirds of its speed there (a stage is refilled only
# when the consumers of both blocks have freed it, which ties the blocks together);
# it stays an option, measured in the last row.
CONFIGS = [Config(256, 64, 4, epilogue="tma"), Config(128, 64, 6, epilogue="tma", schedule="pingpong"),
           Config(256, 64, 4), Config(256, 64, 3), Config(128, 64, 6),
           Config(256, 64, 4, epilogue="tma", multicast="B")]


def build(config, dtype, grouped=False):
    """The kernel of `config` for inputs of `dtype` (bf16, f16, or
    f8e4m3 or f8e5m2 with config.b_major == "K"), with BK = one
    128-byte row of them (`config.for_dtype(dtype)`); `grouped`: the
    grouped GEMM (B given as G x K x N, or as G x N x K for 8-bit inputs,
    whose scales are then arrays: one per row of A, one per group and
    column of C; no multicast, the register epilogue)."""
    config = config.for_dtype(dtype)
    if grouped and ((config.b_major == "K") != (dtype in FLOATS8) or config.multicast
                    or config.epilogue != "registers" or config.split > 1 or config.a_rows != config.bm):
        raise ValueError(f"the grouped GEMM takes B as G x K x N (2-byte inputs) or G x N x K (8-bit ones), no "
                         f"multicast, the register epilogue and tiles of BM rows of A, not {config} for {dtype.name}")
    BM, BN, BK, STAGES = config.bm, config.bn, config.bk, config.stages
    K_STEP = 32 // dtype.itemsize  # the K of one wgmma: 32 bytes
    SCALED = dtype in FLOATS8
    # The grouped 8-bit kernel's scales: a row's and a column's (arrays); the others', a tensor's (numbers).
    ROWWISE = grouped and SCALED
    SCALE_A = lang.memref[None, f32].readonly() if ROWWISE else f32
    SCALE_B = lang.memref[None, None, f32].readonly() if ROWWISE else f32
    STAGE = config.stage_elements
    # What TMA writes into a stage: A's a_rows rows (the rest of A's part stays as it was) and B's tile.
    STAGE_BYTES = (config.a_rows + BN) * BK * dtype.itemsize
    B_MAJOR, TMA_EPILOGUE, MULTICAST = config.b_major, config.epilogue == "tma", config.multicast
    PINGPONG = config.schedule == "pingpong"
    SPLIT = config.split
    HALVES = 2 if PINGPONG else 1  # 64-row halves of the tile a consumer warpgroup multiplies
    # With at most 64 rows of A a step, the cooperative tile's second 64 rows lie past A's: their
    # warpgroup would only multiply what is never stored, on the tensor cores the first one needs.
    # It sits the tiles out, and each stage is read by the first warpgroup alone.
    ALONE = not PINGPONG and config.a_rows <= 64
    CM, CN = config.cluster
    CLUSTER = CM * CN
    B_COLUMNS = config.b_columns
    # How each stage's tiles sit in shared memory, as TMA writes them: A is
    # BM rows of BK (K-major, 128-byte swizzle); B is BN rows of BK when given
    # as N x K, else BN / B_COLUMNS boxes of BK rows of B_COLUMNS (MN-major,
    # the swizzle of rows of B_COLUMNS * 2 bytes).
    A_TILE = wgmma_layout.tile_layout((64, BK), dtype.itemsize, "128B")
    if B_MAJOR == "K":
        B_TILE = wgmma_layout.tile_layout((BN, BK), dtype.itemsize, "128B")
    else:
        B_TILE = layout.ComposedLayout(
            wgmma_layout.swizzle_for(config.b_swizzle, dtype.itemsize), 0,
            layout.Layout(((B_COLUMNS, BN // B_COLUMNS), (8, BK // 8)),
                          ((1, B_COLUMNS * BK), (B_COLUMNS, 8 * B_COLUMNS))))
    M, N, out_dtype = lang.generics("M N out_dtype")

    def place(tile, tiles, rows, tiles_m, tiles_n, rank):
        """(first row, first column, B's group, the row where the tile's rows
        end) of linear tile `tile`, as i32."""
        if grouped:
            at = tiles.locate(tile)
            return tuple(lang.cast(x, i32) for x in (at.row, at.n * BN, at.group, at.row_end))
        # Tiles in groups of GROUP_M rows, column after column inside a
        # group: blocks running together share A's and B's panels in L2.
        pid = lang.cast(tile, i32)
        group_first = pid // (GROUP_M * tiles_n) * GROUP_M
        group_rows = lang.select(tiles_m - group_first < GROUP_M, tiles_m - group_first, GROUP_M)
        m0 = (group_first + pid % group_rows) * (BM * CM) + (rank * BM if CM > 1 else 0)
        n0 = pid % (GROUP_M * tiles_n) // group_rows * (BN * CN) + (rank * BN if CN > 1 else 0)
        return m0, n0, 0, rows

    # c_map is read by the TMA epilogue only (the register epilogue is passed A's map in its place);
    # scale_a and scale_b by the 8-bit kernels only (numbers, or the grouped kernel's arrays);
    # offsets by the grouped kernel only (the others are passed placeholder()).
    @kernel(generics=(M, N, out_dtype), max_threads=THREADS, min_blocks=1)
    def hopper_gemm(a_map: TensorMap, b_map: TensorMap, c_map: TensorMap,
                    C: lang.memref[M, N, out_dtype], K: i32, scale_a: SCALE_A, scale_b: SCALE_B,
                    offsets: lang.memref[None, i32]):
        smem = lang.shared.dynamic(dtype)
        base = lang.shared.address(smem)
        first = lang.cast(((base + 1023) & 0xFFFFFC00) - base, index) // dtype.itemsize
        full = lang.mbarrier.array(STAGES)
        empty = lang.mbarrier.array(STAGES)
        wg = lang.warpgroup.index()
        t = lang.warpgroup.thread_index()
        rows, columns = C.shape
        if SPLIT > 1:
            rows = rows // SPLIT    # C holds the partial products of the slices one below the other
        # A cluster's blocks take the CM x CN tiles of one "cluster tile", block `rank` the rank-th.
        rank = lang.warpgroup.cluster_rank() if CLUSTER > 1 else 0
        tiles_m, tiles_n = -(-rows // (BM * CM)), -(-columns // (BN * CN))
        k_tiles = (K + (BK - 1)) // BK
        tiles = GroupedTiles(offsets, BM, tiles_n, k_tiles) if grouped else None
        total = tiles.total if grouped else tiles_m * tiles_n
        # Split-K: work unit u is slice u // total of tile u % total, `steps` slices of BK each
        # (the last slice's steps past K read TMA's zeros).
        steps = (k_tiles + (SPLIT - 1)) // SPLIT if SPLIT > 1 else k_tiles
        units = total * SPLIT if SPLIT > 1 else total
        if lang.thread_idx.x == 0:
            for s in lang.static_range(STAGES):
                full.init(s, 1)
                # One arrival per consumer warp that reads the stage (one warpgroup's
                # in ping-pong and ALONE), in every block whose consumers read it.
                empty.init(s, 4 * (1 if PINGPONG or ALONE else CONSUMERS) * CLUSTER)
            lang.mbarrier.fence_init()
        if CLUSTER > 1:
            lang.warpgroup.cluster_sync()  # the other block's barriers are ready before anything reaches them
        else:
            lang.syncthreads()
        # Persistent: each block (cluster) takes tiles block_idx.x, + grid_dim.x, ...; the
        # stages and their phases run on across tiles (`it` counts K slices).
        if wg == 0:
            lang.warpgroup.set_max_registers(PRODUCER_REGISTERS, increase=False)
            if t == 0:
                it = lang.constant(0, i32)
                for unit in range(lang.block_idx.x // CLUSTER, units, lang.grid_dim.x // CLUSTER):
                    m0, n0, group, _ = place(unit % total if SPLIT > 1 else unit, tiles, rows, tiles_m, tiles_n, rank)
                    k_first = unit // total * steps if SPLIT > 1 else 0
                    for kt in range(k_first, k_first + steps):
                        s = it % STAGES
                        if it >= STAGES:
                            empty.wait(s, (it // STAGES + 1) % 2)  # the consumers freed its last use
                        # Every block's stage receives all of A's and B's tiles, part of
                        # them from the other block of the cluster when they are shared.
                        full.arrive_expect_tx(s, STAGE_BYTES)
                        a_at = first + lang.cast(s, index) * STAGE
                        b_at = a_at + BM * BK
                        if MULTICAST == "A":
                            # Each block loads 64 rows of the shared A tile into both.
                            lang.tma.load(a_map, smem, (m0 + 64 * rank, kt * BK), full, s,
                                        offset=a_at + lang.cast(rank, index) * (64 * BK), multicast=0b11)
                        else:
                            lang.tma.load(a_map, smem, (m0, kt * BK), full, s, offset=a_at)
                        if MULTICAST == "B":
                            # Each block loads half of the shared B tile into both.
                            half_at = b_at + lang.cast(rank, index) * (BN // 2 * BK)
                            if B_MAJOR == "K":
                                lang.tma.load(b_map, smem, (n0 + BN // 2 * rank, kt * BK), full, s,
                                            offset=half_at, multicast=0b11)
                            else:
                                for j in lang.static_range(BN // 128):
                                    lang.tma.load(b_map, smem, (kt * BK, n0 + BN // 2 * rank + 64 * j), full, s,
                                                offset=half_at + j * 64 * BK, multicast=0b11)
                        elif B_MAJOR == "K":
                            at = (group, n0, kt * BK) if grouped else (n0, kt * BK)
                            lang.tma.load(b_map, smem, at, full, s, offset=b_at)
                        else:
                            for j in lang.static_range(BN // B_COLUMNS):
                                n = n0 + B_COLUMNS * j
                                at = (group, kt * BK, n) if grouped else (kt * BK, n)
                                lang.tma.load(b_map, smem, at, full, s, offset=b_at + j * B_COLUMNS * BK)
                        it = it + 1
        else:
            lang.warpgroup.set_max_registers(CONSUMER_REGISTERS, increase=True)
            w = wg - 1
            clusters = lang.grid_dim.x // CLUSTER
            if PINGPONG:
                # The tile loop depends on the warpgroup here: read from lane 0, its
                # index is visibly the same in the whole warp, and ptxas keeps the
                # wgmmas inside the loop asynchronous (else its warning C7520).
                w = lang.warp.shfl_idx(w, 0)
                # Whole tiles in turn: this warpgroup's are every other one of the block's,
                # and its stages every other run of `steps` in the ring.
                first_unit = lang.block_idx.x // CLUSTER + lang.cast(w, index) * clusters
                step, half = 2 * clusters, 0
                it = w * steps
            else:
                # Each warpgroup its 64 rows of every tile (ALONE: the first warpgroup only; its
                # index read from lane 0, as above, for the tile loop that depends on it).
                first_unit, step, half = lang.block_idx.x // CLUSTER, clusters, w * 64
                if ALONE:
                    w = lang.warp.shfl_idx(w, 0)
                    first_unit = lang.select(w == 0, first_unit, units)
                it = lang.constant(0, i32)
            half_at = lang.cast(half, index) * BK
            if TMA_EPILOGUE:
                # This warpgroup's two store buffers, after the stages (1024-byte aligned:
                # the 128-byte swizzle's period), viewed as C's type.
                out = lang.shared.dynamic(C.dtype)
                out_first = ((first + STAGES * STAGE) * dtype.itemsize + lang.cast(w, index)
                             * (STORE_BUFFERS * STORE_BOX_BYTES)) // C.dtype.itemsize
                BOX_COLUMNS = 128 // C.dtype.itemsize
                CHUNK = 16 // C.dtype.itemsize  # elements per 16 bytes, what the swizzle permutes
            for unit in range(first_unit, units, step):
                m0, n0, group, row_end = place(unit % total if SPLIT > 1 else unit, tiles, rows, tiles_m, tiles_n,
                                               rank)
                c_row = unit // total * rows if SPLIT > 1 else 0    # the slice's partial products
                if PINGPONG:
                    # Zeros the compiler cannot see (returned by a wait on nothing): it would
                    # otherwise rebuild the second accumulator's zeros between the two
                    # wgmmas of the first slice, which ptxas fences (warnings C7519, C7517).
                    acc = lang.wgmma.wait_group(0, lang.wgmma.zeros(BN) * HALVES)
                else:
                    acc = lang.wgmma.zeros(BN)
                if PINGPONG:
                    # The tensor cores are the other warpgroup's until it has issued its
                    # tile's wgmmas (the first warpgroup's first tile waits for nothing).
                    if (w == 1) | (unit != first_unit):
                        lang.warpgroup.barrier(4 - w, 256)
                for kt in range(steps):
                    s = it % STAGES
                    full.wait(s, it // STAGES % 2)
                    a_at = first + lang.cast(s, index) * STAGE + half_at
                    b_at = first + lang.cast(s, index) * STAGE + BM * BK
                    lang.wgmma.fence()
                    for kk in lang.static_range(BK // K_STEP):
                        a = lang.wgmma.descriptor(smem, A_TILE, offset=a_at, k_block=kk)
                        b = lang.wgmma.descriptor(smem, B_TILE, offset=b_at, k_block=kk, major=B_MAJOR)
                        if PINGPONG:
                            # The tile's two 64-row halves, two accumulators, one B.
                            a_low = lang.wgmma.descriptor(smem, A_TILE, offset=a_at + 64 * BK, k_block=kk)
                            acc = (lang.wgmma.mma(acc[:BN // 2], a, b, n=BN)
                                   + lang.wgmma.mma(acc[BN // 2:], a_low, b, n=BN))
                        else:
                            acc = lang.wgmma.mma(acc, a, b, n=BN)
                    lang.wgmma.commit_group()
                    # The previous slice's wgmmas are done: free its stage (in both
                    # blocks of a cluster, whose producers both write into it).
                    acc = lang.wgmma.wait_group(1, acc)
                    if CLUSTER > 1:
                        if (kt > 0) & (t % 32 < CLUSTER):
                            empty.arrive_cluster((it + (STAGES - 1)) % STAGES, t % 32)
                    elif (kt > 0) & (t % 32 == 0):
                        empty.arrive((it + (STAGES - 1)) % STAGES)
                    it = it + 1
                if PINGPONG:
                    # The other warpgroup's turn, if it has a tile after this one: its
                    # wgmmas run while this one's finish and its epilogue stores them.
                    if unit + clusters < units:
                        lang.warpgroup.arrive(3 + w, 256)
                acc = lang.wgmma.wait_group(0, acc)
                # The tile's last slice.
                if CLUSTER > 1:
                    if t % 32 < CLUSTER:
                        empty.arrive_cluster((it + (STAGES - 1)) % STAGES, t % 32)
                elif t % 32 == 0:
                    empty.arrive((it + (STAGES - 1)) % STAGES)
                if PINGPONG:
                    it = it + steps  # past the other warpgroup's tile
                if SCALED and not ROWWISE:
                    scale = scale_a * scale_b
                    acc = [v * scale for v in acc]
                for h in lang.static_range(HALVES):
                    values = acc[h * (BN // 2):(h + 1) * (BN // 2)]
                    row0 = m0 + half + 64 * h
                    if ROWWISE:
                        values = scaled_by_rows(values, scale_a, scale_b, group, row0, row_end, n0, columns, t)
                    if TMA_EPILOGUE:
                        # Box after box of 64 rows x 128 bytes: written in C's type into a buffer
                        # laid out as the 128-byte swizzle (16-byte chunk c of row r at chunk
                        # c ^ (r % 8): the 8 rows a warp writes at once fall in different banks),
                        # then one thread has TMA copy it to C, which clips it at C's edges.
                        for box in lang.static_range(BN // BOX_COLUMNS):
                            at = out_first + (box % STORE_BUFFERS) * (STORE_BOX_BYTES // C.dtype.itemsize)
                            for r in lang.static_range(box * BOX_COLUMNS // 2, (box + 1) * BOX_COLUMNS // 2, 2):
                                row, col = lang.wgmma.accumulator_coordinates(r, t)
                                element = row * BOX_COLUMNS + (col - box * BOX_COLUMNS)
                                swizzled = lang.cast(element ^ ((row % 8) * CHUNK), index)
                                lang.vstore(out, at + swizzled,
                                          (lang.cast(values[r], C.dtype), lang.cast(values[r + 1], C.dtype)))
                            lang.tma.fence_proxy_async()  # the writes above, before the copy engine reads them
                            if t == 0:
                                # The previous box's copy has read the other buffer: the next box may overwrite it.
                                lang.tma.wait_group(0, read=True)
                            lang.warpgroup.barrier(wg)  # the warpgroup's writes are all in (ids 1 and 2)
                            if t == 0:
                                lang.tma.store(c_map, out, (row0, n0 + box * BOX_COLUMNS), offset=at)
                                lang.tma.commit_group()
                    else:
                        inside = (m0 + BM <= row_end) & (n0 + BN <= columns)
                        if inside:
                            for r in lang.static_range(0, BN // 2, 2):
                                row, col = lang.wgmma.accumulator_coordinates(r, t)
                                if columns % 2 == 0:
                                    # Values r and r + 1 are adjacent columns of one row: one paired store.
                                    lang.vstore(C, (c_row + row0 + row, n0 + col),
                                              (lang.cast(values[r], C.dtype), lang.cast(values[r + 1], C.dtype)))
                                else:
                                    C[c_row + row0 + row, n0 + col] = lang.cast(values[r], C.dtype)
                                    C[c_row + row0 + row, n0 + col + 1] = lang.cast(values[r + 1], C.dtype)
                        else:
                            for r in lang.static_range(BN // 2):
                                row, col = lang.wgmma.accumulator_coordinates(r, t)
                                if (row0 + row < row_end) & (n0 + col < columns):
                                    C[c_row + row0 + row, n0 + col] = lang.cast(values[r], C.dtype)
            if TMA_EPILOGUE:
                if t == 0:
                    lang.tma.wait_group(0)  # the last stores are done before the block's shared memory goes
        if CLUSTER > 1:
            # Neither block leaves while the other may still arrive on its barriers.
            lang.warpgroup.cluster_sync()

    return hopper_gemm


def scaled_by_rows(values, scale_a, scale_b, group, row0, row_end, n0, columns, t):
    """`values`, the accumulators thread `t` of a consumer warpgroup holds of
    the 64 rows from row0 and the columns from n0, each times its row's
    scale (scale_a[row]) and its column's (scale_b[group, column]). Rows at
    or past row_end (the group's end, where scale_a may end too) read the
    group's last row's scale, columns past C's the last column's: their
    values are never stored."""
    last_row, last_column = row_end - 1, lang.cast(columns, i32) - 1
    # The thread's two rows (r and r + 8 of its warp's 16), the same in every 8 columns.
    rows = []
    for r in (0, 2):
        row = row0 + lang.wgmma.accumulator_coordinates(r, t)[0]
        rows.append(scale_a[lang.select(row <= last_row, row, last_row)])
    scaled = list(values)
    # Each 8 columns: values r, r + 1 in the first row, r + 2, r + 3 in the second, two adjacent columns.
    for r in range(0, len(values), 4):
        for pair in (0, 1):
            column = n0 + lang.wgmma.accumulator_coordinates(r + pair, t)[1]
            scale = scale_b[group, lang.select(column <= last_column, column, last_column)]
            scaled[r + pair] = values[r + pair] * rows[0] * scale
            scaled[r + 2 + pair] = values[r + 2 + pair] * rows[1] * scale
    return scaled


def config_for(config, dtype):
    """`config` (CONFIGS[0] if None, with B given as N x K for 8-bit inputs) for inputs of `dtype`."""
    if config is None:
        config = CONFIGS[0].replace(b_major="K") if dtype in FLOATS8 else CONFIGS[0]
    return config.for_dtype(dtype)


_KERNELS = {}


def kernel_for(config, dtype, grouped=False):
    key = (repr(config.for_dtype(dtype)), dtype, grouped)
    if key not in _KERNELS:
        _KERNELS[key] = build(config, dtype, grouped)
    return _KERNELS[key]


def _padded(array, axis, multiple):
    """`array` (a DeviceArray) with `axis` zero-padded to a multiple of `multiple`."""
    size = array.shape[axis]
    if size % multiple == 0:
        return array
    host = array.get()
    shape = list(host.shape)
    shape[axis] = -(-size // multiple) * multiple
    padded = np.zeros(shape, host.dtype)
    padded[tuple(slice(0, n) for n in host.shape)] = host
    return backend.to_device(padded)


def prepare(A, B, config):
    """The tensor maps of A (M x K) and B (K x N, or N x K for b_major="K")."""
    # Rows of K (A, and B given as N x K) or of N (B given as K x N) become multiples of 16 bytes.
    A, B = _padded(A, 1, 16 // A.dtype.itemsize), _padded(B, 1, 16 // B.dtype.itemsize)
    # A block that shares a tile with the other block of its cluster loads half of it.
    a_rows = config.bm // 2 if config.multicast == "A" else config.a_rows
    b_part = config.bn // 2 if config.multicast == "B" else config.bn
    a_map = tensor_map(A, box=(a_rows, config.bk), swizzle="128B")
    if config.b_major == "K":
        b_map = tensor_map(B, box=(b_part, config.bk), swizzle="128B")
    else:
        b_map = tensor_map(B, box=(config.bk, config.b_columns), swizzle=config.b_swizzle)
    return a_map, b_map


def store_map(C):
    """The tensor map the TMA epilogue stores C through (boxes of 64 rows x
    128 bytes, 128-byte swizzle), or None where TMA cannot address C: its
    rows must be multiples of 16 bytes, its start 16-byte aligned."""
    address = C.ctypes.data if isinstance(C, np.ndarray) else C.ptr   # NumPy: the CPU backend's arrays
    if C.strides[-1] != C.dtype.itemsize or C.strides[0] % 16 or address % 16:
        return None
    return tensor_map(C, box=(64, 128 // C.dtype.itemsize), swizzle="128B")


def matmul(A, B, out_dtype=f32, config=None, C=None, maps=None, stream=None, scale_a=1.0, scale_b=1.0):
    """C = A @ B on the GPU (A: M x K, B: K x N, or N x K with config.b_major == "K"); the
    arrays are DeviceArrays or any CUDA array object (torch tensors too). `maps`: the
    tensor maps of A, B and C as prepare() and store_map() make them. With 8-bit A and B
    (B given as N x K), C = (scale_a * scale_b) * (A @ B)."""
    A, B = backend.asarray(A), backend.asarray(B)
    check_scales(A.dtype, scale_a, scale_b)
    C = None if C is None else backend.asarray(C)
    if C is None:
        N = B.shape[0] if config_for(config, A.dtype).b_major == "K" else B.shape[1]
        C = backend.empty((A.shape[0], N), out_dtype)
    gemm, arguments, keywords = plan(A, B, C, config, maps)
    gemm(*arguments, scale_a, scale_b, placeholder(), stream=stream, **keywords)
    return C


def check_scales(dtype, scale_a, scale_b):
    if (scale_a, scale_b) != (1.0, 1.0) and dtype not in FLOATS8:
        raise ValueError(f"scale_a and scale_b scale 8-bit inputs, not {dtype.name}")


def plan(A, B, C, config=None, maps=None):
    """What a launch of C = A @ B needs but the scales and the stream: the
    specialization, its arguments up to the scales (after them it takes
    placeholder()), and its launch keywords."""
    dtype = dtype_of(A)
    config = config_for(config, dtype)
    M, K = A.shape
    N = B.shape[0] if config.b_major == "K" else B.shape[1]
    a_map, b_map, c_map = maps or (prepare(A, B, config) + (store_map(C) if config.epilogue == "tma" else None,))
    if config.epilogue == "tma" and c_map is None:
        # C's rows are not 16-byte multiples (an odd N of a 2-byte type, say): its
        # threads store it instead.
        config = config.replace(epilogue="registers")
    gemm = kernel_for(config, dtype)
    cm, cn = config.cluster
    clusters = -(-N // (config.bn * cn)) * -(-M // (config.bm * cm)) * config.split
    # (The CPU backend runs one block at a time: one persistent block takes every tile.)
    sms = cuda.Device(cuda.current_device()).multiprocessor_count if backend.backend() == "cuda" else 1
    # Persistent: at most one block per SM, whole clusters (a cluster of 2 fits a pair of SMs).
    grid = min(clusters, sms // (cm * cn)) * cm * cn
    keywords = {"grid": grid, "block": THREADS, "shared_mem": config.shared_bytes(),
                "cluster": (cm * cn, 1, 1) if cm * cn > 1 else None}
    if config.split > 1:
        return SplitK(gemm[config.split * M, N, f32], config.split, M, N), (a_map, b_map, a_map, C, K), keywords
    return gemm[M, N, dtype_of(C)], (a_map, b_map, c_map or a_map, C, K), keywords


SUM_THREADS = 256


@functools.cache
def _split_sum():
    T = lang.generics("T")

    @kernel(generics=(T,), max_threads=SUM_THREADS)
    def split_k_sum(parts: lang.memref[None, None, f32].readonly(), C: lang.memref[None, None, T].noalias()):
        """C = the sum of the partial products in parts: slices of C's rows one below the other."""
        rows, columns = C.shape
        i = lang.block_idx.x * SUM_THREADS + lang.thread_idx.x
        if i < rows * columns:
            r, c = i // columns, i % columns
            total = parts[r, c]
            for part in range(1, parts.shape[0] // rows):
                total += parts[part * rows + r, c]
            C[r, c] = lang.cast(total, C.dtype)

    return split_k_sum


class SplitK:
    """A split-K launch, called as the kernel specialization it wraps (C
    where the kernel takes it): the slices' float32 partial products into a
    workspace of the stream's, then a second kernel's sum of them into C."""

    def __init__(self, gemm, split, rows, columns):
        self.gemm, self.shape = gemm, (split * rows, columns)

    def __call__(self, a_map, b_map, c_map, C, K, scale_a, scale_b, offsets, stream=None, **keywords):
        (parts,), lock = _WORKSPACES.get(((*self.shape, f32),), stream, C)
        size = C.shape[0] * C.shape[1]
        # Another thread's split-K on this stream and workspace must not launch between these two:
        # its partial products would overwrite these before the sum reads them.
        with lock:
            self.gemm(a_map, b_map, c_map, parts, K, scale_a, scale_b, offsets, stream=stream, **keywords)
            _split_sum()(parts, C, grid=-(-size // SUM_THREADS), block=SUM_THREADS, stream=stream)


# Split-K's partial products, a float32 array per shape and stream (arrays.Workspaces).
_WORKSPACES = Workspaces(kept=8)


#: The grouped kernel's configuration: 128 x 256 tiles, 4 stages, the register epilogue.
GROUPED = Config(256, 64, 4)


def grouped_plan(A, B, offsets, C, config=GROUPED, scales=None):
    """What a launch of the grouped GEMM needs but the stream (A: total_M x K,
    B: G x K x N, offsets: the groups' row ends, an i32 array the kernel
    reads, C: total_M x N): the specialization, its arguments and its launch
    keywords. K and N are multiples of 8 (TMA reads rows of 16-byte
    multiples: tensor_map refuses others). In 8 bits, B is G x N x K (each
    group's matrix K-major, config's B given as N x K) and `scales` are
    (scale_a, scale_b): f32 arrays of a scale per row of A and per group and
    column of C (G x N)."""
    dtype = dtype_of(A)
    (total_m, k), groups, n = A.shape, B.shape[0], C.shape[1]
    config = config.replace(b_major="K") if dtype in FLOATS8 else config
    config = config.for_dtype(dtype)
    a_map = tensor_map(A, box=(config.bm, config.bk), swizzle="128B")
    b_box = (1, config.bn, config.bk) if config.b_major == "K" else (1, config.bk, config.b_columns)
    b_map = tensor_map(B, box=b_box, swizzle=config.b_swizzle)
    # Each group's tiles: at most one more row of tiles than its rows fill.
    tiles = (-(-total_m // config.bm) + groups) * -(-n // config.bn)
    sms = cuda.Device(cuda.current_device()).multiprocessor_count if backend.backend() == "cuda" else 1
    keywords = {"grid": min(tiles, sms), "block": THREADS, "shared_mem": config.shared_bytes()}
    gemm = kernel_for(config, dtype, grouped=True)
    scale_a, scale_b = scales or (1.0, 1.0)
    return gemm[total_m, n, C.dtype], (a_map, b_map, a_map, C, k, scale_a, scale_b, offsets), keywords


def available():
    """Whether the GPU backend's current device runs these kernels (sm_90a)."""
    return backend.backend() == "cuda" and cuda.Device(cuda.current_device()).chip == "sm_90a"


# The plans of the most recent launches, the least recently used first, by
# `config` and the arrays' geometry (arrays.geometry: address, shape, strides,
# dtype). A tensor map is a pure function of its array's geometry, so a plan
# made for arrays serves any arrays of that geometry since; its maps keep no
# array alive.
_PLANS = {}
PLANS_KEPT = 64


def launch(A, B, C, config=None, stream=None, scale_a=1.0, scale_b=1.0, geometries=None):
    """C = A @ B (A: M x K, B: K x N, C: M x N, DeviceArrays or CUDA arrays of
    C's type) with `config`; what the launch needs (the specialization, the
    tensor maps of A, B and C, the grid) is planned on the first launch with
    arrays of this geometry and kept, as a library caches it, so that later
    launches read the arrays' addresses and go straight to the kernel's C
    fast path. With 8-bit A and B (B given as N x K), C = (scale_a *
    scale_b) * (A @ B). `geometries`: (arrays.geometry(x) for A, B and C),
    where the caller has read them already."""
    # `config` by identity: the plan keeps it, so no other object can take its id.
    key = (config, *(geometries or (geometry(A), geometry(B), geometry(C))))
    planned = _PLANS.pop(key, None)
    kept = True
    if planned is None:
        arrays = [x if isinstance(x, np.ndarray) else as_array(x, "the GEMM's array") for x in (A, B, C)]
        gemm, arguments, keywords = plan(*arrays, config)
        maps = arguments[:3]
        # The placeholder of the device the arrays are on (their addresses, in the key, are that device's).
        planned = (gemm, tuple(m.with_owner(None) for m in maps), arguments[4], keywords, dtype_of(arrays[0]),
                   placeholder(), (0, 1, 0 if maps[2] is maps[0] else 2))
        # Where A or B was padded into a copy, the next launch pads their contents anew.
        kept = maps[0].owner is arrays[0] and maps[1].owner is arrays[1]
    gemm, maps, k, keywords, dtype, offsets, _ = planned
    check_scales(dtype, scale_a, scale_b)
    if kept:
        if len(_PLANS) >= PLANS_KEPT:
            _PLANS.pop(next(iter(_PLANS)), None)
        _PLANS[key] = planned   # the most recent last
    gemm(*maps, C, k, scale_a, scale_b, offsets, stream=stream, **keywords)
    return C


def launch_plan(A, B, C, config, geometries, stream, args=(0, 1, 2), scales=None):
    """The launch that launch() keeps for arrays of these `geometries`
    (arrays.geometry of A, B and C), which it has just made, as a
    Specialization.launch_plan for calls on LaunchPlan's stream `stream`
    whose arguments `args` (their indices) are A, B and C, returning C: its
    maps re-encoded at each call's addresses. `scales`: the indices of the
    call's scale_a and scale_b (Python numbers, passed as the kernel's f32
    scales), else None: 1.0 and 1.0. None where no single launch is kept:
    split-K, A or B padded into a copy, a backend that launches from
    Python."""
    planned = _PLANS.get((config, *geometries))
    if planned is None or isinstance(planned[0], SplitK):
        return None
    gemm, maps, k, keywords, _, offsets, sources = planned
    params = [("map", args[source], m) for source, m in zip(sources[:2], maps)]
    # The register epilogue reads no map of C: A's goes in its place as it was made, never encoded anew.
    params.append(("map", args[2], maps[2]) if sources[2] == 2 else ("value", maps[2]))
    return gemm.launch_plan([*maps, C, k, 1.0, 1.0, offsets], params + _tail(args[2], k, scales, ("value", offsets)),
                            stream=stream, result=args[2], **keywords)


def grouped_launch_plan(planned, stream, args=(0, 1, 2, 3), scales=None):
    """The grouped launch grouped_plan `planned` (its specialization,
    arguments and keywords), just made, as a Specialization.launch_plan for
    calls on LaunchPlan's stream `stream` whose arguments `args` (their
    indices) are A, B, the offsets and C, returning C: the maps of A and B
    re-encoded at each call's addresses. `scales`: the indices of the
    call's scale_a and scale_b arrays (8 bits), else None: 1.0 and 1.0."""
    gemm, arguments, keywords = planned
    a_map, b_map, _, C, k = arguments[:5]
    # Maps that keep no array alive; the register epilogue reads no map of C: A's goes in its place as made.
    a_map, b_map = a_map.with_owner(None), b_map.with_owner(None)
    params = [("map", args[0], a_map), ("map", args[1], b_map), ("value", a_map)]
    return gemm.launch_plan(list(arguments), params + _tail(args[3], k, scales, ("arg", args[2])),
                            stream=stream, result=args[3], **keywords)


def _tail(c, k, scales, offsets):
    """A launch plan's entries after the maps: C (the call's argument `c`),
    K, the scales (the call's arguments `scales`, else 1.0 and 1.0) and
    the `offsets` entry."""
    scale_entries = [("arg", i) for i in scales] if scales else [("value", 1.0)] * 2
    return [("arg", c), ("value", k), *scale_entries, offsets]
