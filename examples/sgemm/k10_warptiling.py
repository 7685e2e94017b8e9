"""Kernel 10 of the SGEMM worklog: warptiling. Between the block tile
(BM x BN, in shared memory) and the thread tile (in registers) sits the
warp tile: each warp of the block computes a WM x WN tile of it, which it
covers in WMITER x WNITER warp subtiles of WSUBM x WSUBN; within a
subtile the warp's 32 threads each compute TM x TN results. A thread thus
holds WMITER * TM x WNITER * TN results, and per dot_idx caches its
WMITER * TM elements of A and WNITER * TN of B in registers, read from
shared memory as float4s. The block's tiles of A and B are loaded with
float4s as in kernel 6 (A stored transposed, As[BK][BM]).

Tiles: the worklog's for its A6000 are NUM_THREADS=128, BM=BN=128, BK=16,
WM=WN=64, WNITER=4, TM=8, TN=4 (8 x 16 results a thread). Compiled here
they take 193 registers, so an H100 SM holds 2 blocks, 8 warps, and their
float4 reads of A (8 thread rows 32 bytes apart) meet 2-way bank conflicts.
For the H100 we take the shape of CUTLASS's default SIMT SGEMM instead,
with the worklog's BK=16: 256 threads over BM=BN=128, eight 32 x 64 warp
tiles, and 8 x 8 results a thread as WMITER x WNITER = 2 x 2 subtiles of
TM=TN=4. It takes 110 registers (two blocks, 16 warps an SM), and in
every float4 read of the inner loop a warp reads consecutive floats (4
thread rows, 16 floats of As; 8 thread columns, 32 floats of Bs):
conflict-free. (The transposed stores of A into As, once per BK, meet
4-way conflicts, as in the worklog.)

Two changes from the worklog's kernel 10, measured on the H100
(docs/sgemm_h100.md): the tiles in shared memory are double-buffered, the
next step's global loads issued into registers before the step's FMAs and
stored into the other buffer after them, with one barrier a step (82% to
93% of cuBLAS at 4096^3 in one run); `@mg.kernel(max_threads=256,
min_blocks=2)` keeps that at 128 registers, two blocks an SM. As's rows are
padded by one float4, which halves the bank conflicts of A's transposed
stores (90-91% to 94% of cuBLAS at 4096^3, same run). And, as BLAS does, C
is not read when beta is 0.

And one step past the worklog, for sizes whose tiles are too few to fill
the GPU: split-K. A block per tile of C leaves multiprocessors idle when
there are fewer tiles than places for blocks: at 1024^3, 64 tiles of
128 x 128 against 132 multiprocessors of an H200, which hold two blocks
each. launch() then cuts each tile's K into SPLIT slices, a block per
slice (mg.TileScheduler's "split_k" schedule): as many slices as keep
every block in that one wave of two a multiprocessor, each slice at least
MIN_SLICE_STEPS steps of BK (4 slices at 1024^3 on 132 multiprocessors).
A block runs the K loop over its slice alone; then sched.fixup
stores its partial sums in a float workspace, and the last block of the
tile to finish (an atomic counter per tile tells it) adds every slice's
sums in K order, applies alpha and beta once and writes C. The counter is
back at zero after each tile, so the workspace, kept per shape and
stream, serves the next launch. Where the tiles alone fill more than half
of the wave, SPLIT = 1: the scheduler's "data_parallel" schedule, a block
per whole tile, without fix-up or workspace traffic.

    C = alpha * A @ B + beta * C        (M, K, N multiples of BM, BK, BN: no edge guards)
"""
import sys

import mlirgpu as mg
from mlirgpu import thread_idx
from mlirgpu.ops.arrays import stream_key

import common

TITLE = "10: warptiling"
# BM, BN, BK, WM, WN, WNITER, TM, TN, NUM_THREADS
TILES = (128, 128, 16, 32, 64, 2, 4, 4, 256)
MULTIPLE = (TILES[0], TILES[2], TILES[1])
WARPSIZE = 32
BLOCKS_PER_SM = 2         # min_blocks=2 below: two blocks share a multiprocessor
MIN_SLICE_STEPS = 8       # a split-K slice keeps at least this many steps of BK
CPU_MULTIPROCESSORS = 4   # what the CPU backend plans for: few enough that small tests split K

M, K, N, BM, BN, BK, WM, WN, WNITER, TM, TN, NUM_THREADS, SPLIT = mg.generics(
    "M K N BM BN BK WM WN WNITER TM TN NUM_THREADS SPLIT")


def schedule(split):
    """The mg.TileScheduler mode and split of `split` K slices a tile (1: a block per whole tile)."""
    return ("split_k", split) if split > 1 else ("data_parallel", None)


@mg.kernel(generics=(M, K, N, BM, BN, BK, WM, WN, WNITER, TM, TN, NUM_THREADS, SPLIT), max_threads=256,
           min_blocks=2)
def kernel(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
           alpha: mg.f32, beta: mg.f32, partials: mg.memref[None, None, mg.f32], counters: mg.memref[None, mg.i32]):
    WMITER = (WM * WN) // (WARPSIZE * TM * TN * WNITER)
    # The worklog's static_asserts: the warps cover the block tile, the subtiles the warp tile, the float4
    # loads whole rows of the tiles; and float4 reads of the register caches.
    if ((BN // WN) * (BM // WM) != NUM_THREADS // WARPSIZE or BM % WM or BN % WN
            or (WM * WN) % (WARPSIZE * TM * TN * WNITER) or WMITER == 0 or WM % WMITER or WN % WNITER
            or (WM // WMITER) % TM or (WN // WNITER) % TN
            or (4 * NUM_THREADS) % BK or (4 * NUM_THREADS) % BN
            or (BM * BK) % (4 * NUM_THREADS) or (BN * BK) % (4 * NUM_THREADS) or TM % 4 or TN % 4):
        raise mg.CompileError(f"tiles BM={BM}, BN={BN}, BK={BK}, WM={WM}, WN={WN}, WNITER={WNITER}, TM={TM}, "
                              f"TN={TN} do not fit {NUM_THREADS} threads")
    WSUBM = WM // WMITER   # the warp subtile
    WSUBN = WN // WNITER
    # This block's work: its tile of C and the K steps [work.k_begin, work.k_end) of it. The grid holds a
    # block per work unit (launch()), so each block has one: work unit 0 of its own. group=1 takes the tiles
    # in rows, as a 2-D grid of blocks would.
    mode, split = schedule(SPLIT)
    sched = mg.TileScheduler(M // BM, N // BN, K // BK, mode=mode, split=split, group=1)
    work = sched.work(0)
    # Two buffers of each tile: while the block computes on one, the next tile's global loads are in flight
    # into registers, stored into the other buffer after the FMAs; one barrier a step.
    # Transposed, As[b, k, m] = A[m, k], its rows padded by one float4: a warp's transposed stores (4 rows k
    # apart by 8 columns m) then meet 2-way bank conflicts instead of 4-way; float4 reads stay aligned.
    As = mg.shared.array((2, BK, BM + 4), mg.f32)
    Bs = mg.shared.array((2, BK, BN), mg.f32)
    warp_idx = thread_idx.x // WARPSIZE   # the warp's tile in the block tile
    warp_col = warp_idx % (BN // WN)
    warp_row = warp_idx // (BN // WN)
    lane = thread_idx.x % WARPSIZE        # the thread's place in a warp subtile
    thread_col_in_warp = lane % (WSUBN // TN)
    thread_row_in_warp = lane // (WSUBN // TN)
    c_row = work.m * BM + warp_row * WM   # the warp's tile of C
    c_col = work.n * BN + warp_col * WN
    # The block's tile loads: one float4 per thread covers `stride` rows.
    inner_row_a = thread_idx.x // (BK // 4)
    inner_col_a = thread_idx.x % (BK // 4)
    stride_a = NUM_THREADS * 4 // BK
    inner_row_b = thread_idx.x // (BN // 4)
    inner_col_b = thread_idx.x % (BN // 4)
    stride_b = NUM_THREADS * 4 // BN
    a_row = work.m * BM + inner_row_a
    b_col = work.n * BN + inner_col_b * 4
    k_first = work.k_begin * BK
    # Offsets of the thread's register caches in a row of As and Bs.
    m_offset = warp_row * WM + thread_row_in_warp * TM
    n_offset = warp_col * WN + thread_col_in_warp * TN
    for offset in mg.static_range(0, BM, stride_a):
        tmp = mg.vload(A, (a_row + offset, k_first + inner_col_a * 4), 4)
        for i in mg.static_range(4):
            As[0, inner_col_a * 4 + i, inner_row_a + offset] = tmp[i]
    for offset in mg.static_range(0, BK, stride_b):
        mg.vstore(Bs, (0, inner_row_b + offset, inner_col_b * 4),
                  mg.vload(B, (k_first + inner_row_b + offset, b_col), 4))
    mg.syncthreads()
    thread_results = [0.0] * (WMITER * TM * WNITER * TN)   # registers: carried through the K loop
    for step in range(work.k_begin, work.k_end):
        current = (step - work.k_begin) % 2
        # The next step's tiles (the last step reloads its own, in bounds and unused).
        bk = mg.select(step + 1 < work.k_end, step + 1, step) * BK
        a_tile = [mg.vload(A, (a_row + offset, bk + inner_col_a * 4), 4)
                  for offset in mg.static_range(0, BM, stride_a)]
        b_tile = [mg.vload(B, (bk + inner_row_b + offset, b_col), 4) for offset in mg.static_range(0, BK, stride_b)]
        for dot_idx in mg.static_range(BK):
            reg_m = []
            for w_sub_row in mg.static_range(WMITER):
                for i in mg.static_range(0, TM, 4):
                    reg_m.extend(mg.vload(As, (current, dot_idx, m_offset + w_sub_row * WSUBM + i), 4))
            reg_n = []
            for w_sub_col in mg.static_range(WNITER):
                for i in mg.static_range(0, TN, 4):
                    reg_n.extend(mg.vload(Bs, (current, dot_idx, n_offset + w_sub_col * WSUBN + i), 4))
            for res_m in mg.static_range(WMITER * TM):
                for res_n in mg.static_range(WNITER * TN):
                    thread_results[res_m * (WNITER * TN) + res_n] += reg_m[res_m] * reg_n[res_n]
        for j, tmp in enumerate(a_tile):
            for i in mg.static_range(4):
                As[1 - current, inner_col_a * 4 + i, inner_row_a + j * stride_a] = tmp[i]
        for j, tmp in enumerate(b_tile):
            mg.vstore(Bs, (1 - current, inner_row_b + j * stride_b, inner_col_b * 4), tmp)
        mg.syncthreads()
    # A tile split along K is written by the last of its blocks to finish, with the sum of every slice's
    # products, so that alpha and beta apply once, to the whole sum. A whole tile is done as it is.
    thread_results, done = sched.fixup(work, partials, counters, thread_results)
    if done:
        for w_sub_row in mg.static_range(WMITER):
            for w_sub_col in mg.static_range(WNITER):
                for res_m in mg.static_range(TM):
                    for res_n in mg.static_range(0, TN, 4):
                        row = c_row + w_sub_row * WSUBM + thread_row_in_warp * TM + res_m
                        col = c_col + w_sub_col * WSUBN + thread_col_in_warp * TN + res_n
                        first = (w_sub_row * TM + res_m) * (WNITER * TN) + w_sub_col * TN + res_n
                        if beta == 0.0:
                            # As BLAS: C is not read when beta is 0 (a bandwidth saving, and NaNs in C do not
                            # spread).
                            mg.vstore(C, (row, col), tuple(alpha * thread_results[first + i]
                                                           for i in mg.static_range(4)))
                        else:
                            c_old = mg.vload(C, (row, col), 4)
                            mg.vstore(C, (row, col), tuple(alpha * thread_results[first + i] + beta * c_old[i]
                                                           for i in mg.static_range(4)))


def multiprocessors():
    """The current GPU's multiprocessors (on the CPU backend, CPU_MULTIPROCESSORS)."""
    if mg.backend() == "cpu":
        return CPU_MULTIPROCESSORS
    return mg.cuda.Device(mg.cuda.current_device()).multiprocessor_count


def split_for(M, K, N, split=None):
    """The K slices a tile is cut into: `split` where given, else as many as keep all the blocks in one
    wave (BLOCKS_PER_SM a multiprocessor) and each slice at least MIN_SLICE_STEPS steps of BK; 1 (no
    split) where the tiles alone fill more than half that wave. LaunchError for sizes the kernel does not
    take, or a split outside 1 .. K / BK."""
    common.check_sizes(sys.modules[__name__], M, K, N)
    bm, bn, bk = TILES[:3]
    if split is None:
        tiles = (M // bm) * (N // bn)
        split = max(1, min(BLOCKS_PER_SM * multiprocessors() // tiles, K // bk // MIN_SLICE_STEPS))
    if not 1 <= split <= K // bk:
        raise mg.LaunchError(f"{TITLE}: split={split} is not between 1 and the {K // bk} steps of K={K}")
    return split


def specialize(M, K, N, split=None):
    """The kernel for M, K, N and split_for(M, K, N, split) K slices a tile."""
    return kernel[(M, K, N, *TILES, split_for(M, K, N, split))]


# What a launch needs besides its operands, made on the first launch of each (backend, device, stream,
# M, K, N, split asked for) and kept: the kernel, its grid and the split tiles' workspace. Launches on one
# stream run one after another and can share a workspace (the counters are back at zero after each);
# launches on two streams may overlap, so each stream has its own. The LAUNCHES_KEPT most recent are kept
# (a sweep over many sizes does not keep every size's workspace).
LAUNCHES_KEPT = 8
_LAUNCHES = {}


def _prepare(M, K, N, split, stream):
    split = split_for(M, K, N, split)
    bm, bn, bk = TILES[:3]
    mode, split_k = schedule(split)
    # A block per work unit: every tile's slices at once, the hardware placing the blocks.
    plan = mg.TileScheduler.plan(M // bm, N // bn, K // bk, mode=mode, split=split_k, group=1,
                                 units=(M // bm) * (N // bn) * split, values=bm * bn)
    # A row of partial sums per slice, and a counter per tile, zero before the first launch.
    partials = mg.empty(plan.partials, mg.f32, stream=stream)
    counters = mg.zeros(plan.counters, mg.i32, stream=stream)
    return specialize(M, K, N, split), plan.grid, partials, counters


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None, split=None):
    """C = alpha * A @ B + beta * C; `split`: the K slices of a tile (by default split_for's)."""
    (m, k), n = A.shape, C.shape[1]
    device = mg.cuda.current_device() if mg.backend() == "cuda" else None
    key = (mg.backend(), device, stream_key(stream), m, k, n, split)
    kept = _LAUNCHES.pop(key, None)
    if kept is None:
        kept = _prepare(m, k, n, split, stream)
        if len(_LAUNCHES) >= LAUNCHES_KEPT:
            del _LAUNCHES[next(iter(_LAUNCHES))]    # the least recently used
    _LAUNCHES[key] = kept
    spec, grid, partials, counters = kept
    spec(A, B, C, alpha, beta, partials, counters, grid=grid, block=(TILES[-1],), stream=stream)


if __name__ == "__main__":
    common.main(sys.modules[__name__])
