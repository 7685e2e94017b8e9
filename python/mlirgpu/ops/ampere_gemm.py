"""An Ampere-style half-precision GEMM on the tensor cores: C = A @ B.
mlirgpu.ops.matmul runs it for small and mid-size shapes and on sm_80-89;
examples/tensorcore/ampere_gemm.py checks one product with it.

A (M x K) and B (K x N) are f16 or bf16, row-major; C (M x N) is f16, bf16
or f32; products are summed in f32. Any M, N, K: the tiles at the edges are
predicated (out-of-range elements of A and B read as zeros, those of C are
not written).

The kernel is the shape of CUTLASS's sm_80 GEMMs, made for a `Config` (the
block's tile BM x BN, its step BK along K, the warps' tiles WM x WN, and the
pipeline's depth); `CONFIGS` lists a few, the first the default:

- A block of (BM / WM) x (BN / WN) warps computes a BM x BN tile of C, each
  warp a WM x WN tile: (WM / 16) x (WN / 8) mma.sync m16n8k16 atoms, each
  a fragment of 4 f32 accumulators a lane (a 64 x 64 warp tile: 128 of them).
- The blocks take their work from an lang.TileScheduler (`build`'s mode):
  a block per tile ("data_parallel"), or persistent blocks looping over
  work units, whole tiles or ranges of a tile's K-steps ("split_k",
  "stream_k", "hybrid"), whose partial sums sched.fixup adds in a
  workspace. Tiles go in groups of 8 tile rows, column by column within a
  group, so that the rows of A and columns of B a group reads are reused
  from L2.
- K advances BK at a time through a pipeline of STAGES stages in dynamic
  shared memory (a stage: A's BM x BK tile, then B's BK x BN tile; the
  launch's shared_mem= gives the kernel STAGES x (BM + BN) x BK x 2 bytes,
  64 KB for the default, past the 48 KB static arrays may hold): cp.async
  copies 16 bytes a thread from global memory into the stage STAGES - 1
  steps ahead while the warps compute on the current one. One wait_group and
  one barrier a step, before the warps read the next stage's first
  fragments: the next stage has landed, and the one just read is free for
  the next step's copies.
- The warps read their fragments with ldmatrix: .x4 gives an A fragment
  (16 x 16), .x4.trans two B fragments (16 x 16 of the K x N tile), its
  matrices in row order so that each B fragment is two consecutive
  registers, where mma.sync reads it without moves. The
  fragments of the next 16-wide slice of K are loaded before the mmas of
  the current one (double-buffered in registers), so that shared-memory
  latency hides behind the tensor cores; the step's cp.asyncs are spread
  between those slices.
- Shared tiles are swizzled so that neither the 16-byte cp.async stores
  nor the ldmatrix row reads meet bank conflicts (`swizzle_for`).

Where K (for A) or N (for B) is not a multiple of 8, rows of the arrays are
not 16-byte aligned, which cp.async needs: the tiles are then loaded with
ordinary loads and stores (slower, still correct).

`launch` plans the schedule, allocates its workspace and launches.
"""
import numpy as np

from .. import language as lang
from .._mlirgpu import f16, f32, i32, index
from ..language import thread_idx
from ..language.schedule import GroupedTiles
from ..layout import Swizzle, composition, row_major
from ..runtime import backend
from ..runtime.kernel import kernel

CHUNK = 8      # 16-bit elements in a 16-byte cp.async (and in an ldmatrix row)
GROUP_M = 8    # tile rows a group of blocks covers (for L2 reuse)


class Config:
    """Tile shapes and pipeline depth of one GEMM kernel: the block's BM x BN
    tile of C and its step BK along K, each warp's WM x WN tile, and the
    number of shared-memory stages."""

    def __init__(self, bm=128, bn=256, bk=32, wm=64, wn=64, stages=4):
        self.bm, self.bn, self.bk, self.wm, self.wn, self.stages = bm, bn, bk, wm, wn, stages
        if bm % wm or bn % wn or wm % 16 or wn % 16:
            raise ValueError(f"{self}: warps tile the block (BM % WM == BN % WN == 0) in 16 x 16 steps")
        if bk not in (32, 64) or bn not in (64, 128, 256):
            raise ValueError(f"{self}: BK is 32 or 64 and BN 64, 128 or 256 (the swizzles' row widths)")
        if stages < 2:
            raise ValueError(f"{self}: the pipeline needs at least 2 stages")
        if (bm * bk // CHUNK) % self.threads or (bk * bn // CHUNK) % self.threads:
            raise ValueError(f"{self}: the 16-byte chunks of a stage do not divide among {self.threads} threads")

    def __repr__(self):
        return (f"Config(BM={self.bm}, BN={self.bn}, BK={self.bk}, WM={self.wm}, WN={self.wn}, "
                f"stages={self.stages})")

    @property
    def warps(self):
        return (self.bm // self.wm) * (self.bn // self.wn)

    @property
    def threads(self):
        return self.warps * 32

    @property
    def stage_elements(self):
        return (self.bm + self.bn) * self.bk

    def shared_bytes(self, itemsize=2):
        return self.stages * self.stage_elements * itemsize

    @property
    def values(self):
        """f32 accumulators a thread holds: 4 per m16n8 atom of its warp's tile."""
        return (self.wm // 16) * (self.wn // 8) * 4

    @property
    def name(self):
        return f"{self.bm}x{self.bn}x{self.bk}, {self.warps} warps of {self.wm}x{self.wn}, {self.stages} stages"


# The default first: 4 warps of 64 x 64 on a 128 x 128 tile with 4 stages of BK = 32 (64 KB, which
# every sm_80-class GPU gives a block, two blocks to an SM). Then the fastest on an H100
# (benchmarks/gemm_tensorcore.py, docs/gemm_tensorcore_h100.md: 65% of cuBLAS at 8192^3 bf16, 60-62% at
# 4096^3 and the LLM-like shapes, against 55-58% for the default): 8 warps on a 256 x 128 tile with 3
# stages of BK = 64 (144 KB: more than an L4 gives a block). Then the other 8-warp tiles (the most mma.sync
# per byte of shared memory read that the registers allow: 128 accumulators and 64 fragment registers a
# thread), BK = 64 (fewer barriers per mma; 4 stages of it, 192 KB, is more than an A100's 163 KB: H100
# only), and the deeper pipelines of BK = 32.
CONFIGS = [Config(128, 128, 32, 64, 64, 4), Config(256, 128, 64, 64, 64, 3), Config(128, 256, 64, 64, 64, 4),
           Config(128, 256, 64, 64, 64, 3), Config(128, 128, 64, 64, 64, 3), Config(128, 256, 32, 64, 64, 4),
           Config(256, 128, 32, 64, 64, 4), Config(128, 256, 32, 64, 64, 6)]


def swizzle_for(row_elements):
    """The swizzle of a row-major shared tile whose rows are `row_elements`
    16-bit elements, chosen so that the 8 rows an ldmatrix reads at one
    16-byte column, and 8 consecutive 16-byte chunks (the cp.async stores of
    8 lanes, which shared memory serves together), fall in 8 different
    groups of 4 banks. Shared memory has 32 banks of 4 bytes: a 128-byte
    line is 8 chunks. The swizzle XORs row bits into the 3 chunk bits of the
    element index (bits 3-5), leaving the 8 elements of a chunk together:
    - rows of 128 bytes or more (64, 128, 256 elements): 3 row bits
      (Swizzle(3, 3, s), s = log2(row_elements) - 3), so 8 consecutive rows
      at one column land in 8 different chunks of their lines;
    - rows of 64 bytes (32 elements, two to a line): rows 2r and 2r + 1 share
      a line, so row bits 1-2 go into chunk bits 0-1 (Swizzle(2, 3, 3)) and
      8 consecutive rows cover the line's two halves x 4 chunks."""
    if row_elements == 32:
        return Swizzle(2, 3, 3)
    shift = row_elements.bit_length() - 1 - 3
    return Swizzle(3, 3, shift)


def _copy(tile, row, col, source, r, c, rows, columns):
    """The 8 elements of `source` from (r, c) into the shared `tile` at
    (row, col); zeros from row `rows` or column `columns` on (the array's
    edge, or where a work unit's range of K ends).

    A row or column out of range is replaced by 0 in the source address,
    which must lie in the array even where nothing is read; each coordinate
    on its own, so that A's rows and B's columns, which do not change along
    K, have their selects hoisted out of the loop, and the copies of a
    thread that share a column of A share its select."""
    r_ok = r < rows
    if source.shape[1] % CHUNK == 0:  # 16-byte aligned rows: one cp.async, whole chunks in or out
        c_ok = c < columns
        lang.mma.cp_async(tile, (row, col), source, (lang.select(r_ok, r, 0), lang.select(c_ok, c, 0)), 16,
                        r_ok & c_ok)
    else:
        for e in range(CHUNK):
            c_ok = c + e < columns
            value = source[lang.select(r_ok, r, 0), lang.select(c_ok, c + e, 0)]
            tile[row, col + e] = lang.select(r_ok & c_ok, value, lang.cast(0.0, source.dtype))


def build(config, mode="data_parallel", split=None):
    """The kernel of `config` and the TileScheduler `mode` (`split` K slices
    for "split_k"), generic over M, K, N, the inputs' dtype T and C's dtype OUT.

    mode "grouped" is the grouped GEMM (lang.GroupedTiles): A holds the
    groups' rows end to end, B the groups' K x N matrices one below the
    other (G * K rows), `offsets` the groups' row ends; each persistent
    block takes whole tiles of one group in turn. The other modes are passed
    `counters` as `offsets`, which they do not read."""
    GROUPED = mode == "grouped"
    BM, BN, BK, WM, WN, STAGES = config.bm, config.bn, config.bk, config.wm, config.wn, config.stages
    THREADS, WARPS_M, STAGE = config.threads, BM // WM, config.stage_elements
    # Swizzled shared tiles: (row, col) -> element index in a stage's A or B part.
    A_TILE = composition(swizzle_for(BK), row_major((BM, BK)))
    B_TILE = composition(swizzle_for(BN), row_major((BK, BN)))
    SLICES = BK // 16  # the 16-wide slices of K a step's mmas take, one after the other
    # This thread's 16-byte chunks of a stage, as ("a" or "b", i): chunk tid + i * THREADS of that tile;
    # SHARE[kk]: those issued before the mmas of slice kk, spread evenly over the step. Tuples, not
    # lists: the kernel reads them, and a launch checks only immutable values from C (a list goes
    # through Python's check on every launch).
    COPIES = (tuple(("a", i) for i in range(BM * BK // CHUNK // THREADS)) +
              tuple(("b", i) for i in range(BK * BN // CHUNK // THREADS)))
    SHARE = tuple(COPIES[len(COPIES) * kk // SLICES:len(COPIES) * (kk + 1) // SLICES] for kk in range(SLICES))
    # A slice's mmas (mi, ni), serpentine: odd rows of atoms take the B fragments backwards, so that each
    # mma shares an operand with the one before it (A along a row, B at the turns).
    MMAS = tuple((mi, ni if mi % 2 == 0 else WN // 8 - 1 - ni) for mi in range(WM // 16) for ni in range(WN // 8))
    M, K, N, T, OUT = lang.generics("M K N T OUT")

    class Block:
        """One block's view of a work unit, for the kernel's copies and
        fragment loads: the operands and their sizes, the shared tiles (A's
        and B's of stage 0; stage s is `at` s * STAGE elements), the corner
        (bm, bn) of its tile of C, where its rows (m_stop) and its K (k_stop)
        end, the first row of B's matrix (b_row), and this thread's place in it."""

        def __init__(self, A, B, smem, bm, bn, m_stop, k_stop, b_row, tid):
            self.A, self.B, self.bm, self.bn, self.k_stop, self.tid = A, B, bm, bn, k_stop, tid
            self.m, self.b_row, self.n = m_stop, b_row, B.shape[1]
            self.tiles = (lang.mma.tile(smem, A_TILE), lang.mma.tile(smem, B_TILE).at(BM * BK))
            self.lane, warp = tid % 32, tid // 32
            self.wm, self.wn = warp % WARPS_M * WM, warp // WARPS_M * WN

        def copy(self, which, i, step, at):
            """Chunk i of this thread's share of A's (`which` "a") or B's
            tile of `step` into the stage at `at`; past the unit's K, zeros
            (all of a step past its last one: its columns of A and rows of
            B are)."""
            chunk = self.tid + i * THREADS
            if which == "a":
                row, col = chunk // (BK // CHUNK), chunk % (BK // CHUNK) * CHUNK
                r, c = self.bm + row, step * BK + col
                _copy(self.tiles[0].at(at), row, col, self.A, r, c, self.m, self.k_stop)
            else:
                row, col = chunk // (BN // CHUNK), chunk % (BN // CHUNK) * CHUNK
                r, c = self.b_row + step * BK + row, self.bn + col
                _copy(self.tiles[1].at(at), row, col, self.B, r, c, self.b_row + self.k_stop, self.n)

        def fragments(self, at, kk):
            """This warp's A fragments (WM / 16 of them) and B fragments
            (WN / 8) of slice kk of the stage at `at`. Lanes 8j .. 8j+7
            address the rows of matrix j. For A it sits at block
            (j % 2, j // 2) of the 16 x 16 tile an ldmatrix .x4 loads: the
            A fragment. For B (N x K once transposed) at block (j // 2, j % 2)
            (order="row"): matrices 0 and 1 (rows k and k + 8 of the first 8
            columns) are the first B fragment, the first two of the four
            registers, and 2, 3 the second. An mma.sync reads a B fragment
            from two consecutive registers, so these are its operands as they
            are; matrices in the other order would leave each B fragment in
            registers 0 and 2 (or 1 and 3), two register moves per mma.

            The swizzles read only bits 0-2 of a row: 16 rows further is 16
            rows of elements further, so the A tiles below one another, and
            B's slices of K, are a constant offset (an immediate of the
            ldmatrix address) from one address computed per slice (A) or per
            16 columns (B)."""
            lane = self.lane
            a_row, a_col = lane % 8 + lane // 8 % 2 * 8, lane // 16 * 8
            b_row, b_col = lane % 8 + lane // 8 % 2 * 8, lane // 16 * 8
            a = [lang.mma.ldmatrix(self.tiles[0].at(at + mi * 16 * BK), (self.wm + a_row, kk * 16 + a_col), 4)
                 for mi in range(WM // 16)]
            b = []
            for nj in range(WN // 16):
                pair = lang.mma.ldmatrix(self.tiles[1].at(at + kk * 16 * BN), (b_row, self.wn + nj * 16 + b_col), 4,
                                       transpose=True, order="row")
                b += [pair.select(0, 1, 2, 3), pair.select(4, 5, 6, 7)]
            return a, b

    @kernel(generics=(M, K, N, T, OUT), max_threads=THREADS)
    def ampere_gemm(A: lang.memref[M, K, T], B: lang.memref[None, N, T], C: lang.memref[M, N, OUT],
                    partials: lang.memref[None, None, f32], counters: lang.memref[None, i32],
                    offsets: lang.memref[None, i32]):
        (m, k), n = A.shape, B.shape[1]
        atom = lang.mma.M16N8K16_F16 if A.dtype == f16 else lang.mma.M16N8K16_BF16
        steps = (k + BK - 1) // BK
        tiles_n = (n + BN - 1) // BN
        if GROUPED:
            sched = GroupedTiles(offsets, BM, tiles_n, steps)
        else:
            sched = lang.TileScheduler((m + BM - 1) // BM, tiles_n, steps, mode=mode, split=split, group=GROUP_M)
        smem = lang.shared.dynamic(A.dtype)
        # Data-parallel: a block per tile and no loop, whose registers the 128 accumulators need.
        for work in ([sched.work(0)] if mode == "data_parallel" else sched):
            if GROUPED:
                # Rows past the group's end are the next group's: read as zeros, not written.
                bm, m_stop, b_row = work.row, work.row_end, work.group * k
            else:
                bm, m_stop, b_row = work.m * BM, m, 0
            bn = work.n * BN
            block = Block(A, B, smem, bm, bn, m_stop, min(work.k_end * BK, k), b_row, thread_idx.x)
            # Every warp is done with the previous work unit's stages before they are refilled.
            lang.syncthreads()

            # Steps k_begin .. k_begin + STAGES - 2 into stages 0 .. STAGES - 2, a group each.
            for s in lang.static_range(STAGES - 1):
                for which, i in COPIES:
                    block.copy(which, i, work.k_begin + s, s * STAGE)
                lang.mma.commit_group()
            # The first step has landed: this thread's copies, and every thread's after the barrier.
            lang.mma.wait_group(STAGES - 2)
            lang.syncthreads()
            a, b = block.fragments(0, 0)

            acc = [[lang.mma.zeros(atom) for _ in lang.static_range(WN // 8)] for _ in lang.static_range(WM // 16)]
            # Step t computes on stage (t - k_begin) % STAGES (at `here`) and
            # copies step t + STAGES - 1 into the stage before it (at `free`),
            # which every warp finished reading before the barrier of step
            # t - 1. The offsets go round the ring from one step to the next
            # (one add and one select a step, not a remainder and a product for
            # each address).
            here, free = lang.constant(0, index), lang.constant((STAGES - 1) * STAGE, index)
            for t in range(work.k_begin, work.k_end):
                after = lang.select(here == (STAGES - 1) * STAGE, 0, here + STAGE)
                for kk in lang.static_range(SLICES):
                    for which, i in SHARE[kk]:
                        block.copy(which, i, t + STAGES - 1, free)
                    if kk == SLICES - 1:
                        # Step t + 1 has landed and every warp has read all of step
                        # t's fragments: the next ones are slice 0 of step t + 1.
                        lang.mma.commit_group()
                        lang.mma.wait_group(STAGES - 2)
                        lang.syncthreads()
                        next_a, next_b = block.fragments(after, 0)
                    else:
                        next_a, next_b = block.fragments(here, kk + 1)
                    for mi, ni in MMAS:
                        acc[mi][ni] = lang.mma.sync(atom, a[mi], b[ni], acc[mi][ni])
                    a, b = next_a, next_b
                here, free = after, here
            lang.mma.wait_group(0)

            # A tile split along K is completed by the unit that brings its last part.
            values = [x for row in acc for fragment in row for x in fragment]
            values, done = sched.fixup(work, partials, counters, values)
            if done:
                for mi in lang.static_range(WM // 16):
                    for ni in lang.static_range(WN // 8):
                        for v in lang.static_range(0, 4, 2):
                            # Values v and v + 1 are columns c and c + 1 of one row.
                            x, y = values[(mi * (WN // 8) + ni) * 4 + v:(mi * (WN // 8) + ni) * 4 + v + 2]
                            r, c = lang.mma.coordinate(atom, "c", v)
                            row, col = bm + block.wm + mi * 16 + r, bn + block.wn + ni * 8 + c
                            if n % 2 == 0:  # c is even: both columns are in, or neither
                                if (row < m_stop) & (col < n):
                                    lang.vstore(C, (row, col), (lang.cast(x, C.dtype), lang.cast(y, C.dtype)))
                            else:
                                if (row < m_stop) & (col < n):
                                    C[row, col] = lang.cast(x, C.dtype)
                                if (row < m_stop) & (col + 1 < n):
                                    C[row, col + 1] = lang.cast(y, C.dtype)

    return ampere_gemm


_KERNELS = {}


def kernel_for(config, mode="data_parallel", split=None):
    """The kernel of `config` and schedule, built once."""
    key = (repr(config), mode, split)
    if key not in _KERNELS:
        _KERNELS[key] = build(config, mode, split)
    return _KERNELS[key]


def plan(m, k, n, config, mode="data_parallel", split=None, units=None):
    """The TileScheduler plan of C = A @ B (m x k times k x n) with `config`:
    a block per tile for "data_parallel", else `units` persistent blocks (by
    default one per multiprocessor)."""
    tiles_m, tiles_n, steps = -(-m // config.bm), -(-n // config.bn), -(-k // config.bk)
    if mode == "data_parallel":
        units = tiles_m * tiles_n
    return lang.TileScheduler.plan(tiles_m, tiles_n, steps, mode=mode, split=split, group=GROUP_M, units=units,
                                 values=config.threads * config.values)


def workspace(plan):
    """The partial sums and tile counters (zeros) a launch of `plan` takes,
    in the current backend's arrays (NumPy on the CPU)."""
    if backend.backend() == "cpu":
        return np.zeros(plan.partials, np.float32), np.zeros(plan.counters, np.int32)
    return backend.zeros(plan.partials, f32), backend.zeros(plan.counters, i32)


def launch(A, B, C, config=None, stream=None, mode="data_parallel", split=None, units=None, work=None):
    """C = A @ B on the current backend (A, B and C arrays of its kind) with
    `config` (CONFIGS[0] by default) and the TileScheduler `mode`; `work`:
    (plan, partials, counters) as plan() and workspace() make them, made
    here when not given (a split tile's counters are back at zero after each
    launch, so a workspace serves one launch after another on one stream)."""
    config = config or CONFIGS[0]
    (m, k), (k2, n) = A.shape, B.shape
    if k2 != k or tuple(C.shape) != (m, n):
        raise ValueError(f"shapes do not multiply: A {A.shape} @ B {B.shape} -> C {C.shape}")
    if work is None:
        schedule = plan(m, k, n, config, mode, split, units)
        work = (schedule, *workspace(schedule))
    schedule, partials, counters = work
    kernel_for(config, mode, split)(A, B, C, partials, counters, counters, grid=schedule.grid,
                                    block=config.threads, shared_mem=config.shared_bytes(A.dtype.itemsize),
                                    **({"stream": stream} if stream is not None else {}))
