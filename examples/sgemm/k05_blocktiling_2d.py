"""Kernel 5 of the SGEMM worklog: 2D blocktiling. A block of
BM * BN / (TM * TN) threads computes a BM x BN tile of C, each thread a
TM x TN tile of it held in registers. Per step of K the block loads a
BM x BK tile of A and a BK x BN tile of B into shared memory, each thread
several elements at a stride (a warp on consecutive elements: coalesced);
then for each dot_idx a thread caches TM elements of A (reg_m) and TN of B
(reg_n) in registers and does their TM * TN outer product: TM * TN FMAs
per TM + TN shared memory loads.

    C = alpha * A @ B + beta * C        (M, K, N multiples of BM, BK, BN: no edge guards)
"""
import sys

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

import common

TITLE = "5: 2D blocktiling"
TILES = (128, 128, 8, 8, 8)   # BM, BN, BK, TM, TN: the worklog's (for M, N >= 128)
MULTIPLE = (TILES[0], TILES[2], TILES[1])

M, K, N, BM, BN, BK, TM, TN = mg.generics("M K N BM BN BK TM TN")


@mg.kernel(generics=(M, K, N, BM, BN, BK, TM, TN))
def kernel(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
           alpha: mg.f32, beta: mg.f32):
    threads = BM * BN // (TM * TN)
    As = mg.shared.array((BM, BK), mg.f32)
    Bs = mg.shared.array((BK, BN), mg.f32)
    c_row = block_idx.y * BM   # the block's tile of C
    c_col = block_idx.x * BN
    thread_col = thread_idx.x % (BN // TN)
    thread_row = thread_idx.x // (BN // TN)
    # The loads' positions in the tiles; the block covers a tile in rows of `threads` elements, `stride` rows apart.
    inner_row_a = thread_idx.x // BK
    inner_col_a = thread_idx.x % BK
    stride_a = threads // BK
    inner_row_b = thread_idx.x // BN
    inner_col_b = thread_idx.x % BN
    stride_b = threads // BN
    thread_results = [0.0] * (TM * TN)   # registers: carried through the K loop element by element
    for bk in range(0, K, BK):
        for load_offset in mg.static_range(0, BM, stride_a):
            As[inner_row_a + load_offset, inner_col_a] = A[c_row + inner_row_a + load_offset, bk + inner_col_a]
        for load_offset in mg.static_range(0, BK, stride_b):
            Bs[inner_row_b + load_offset, inner_col_b] = B[bk + inner_row_b + load_offset, c_col + inner_col_b]
        mg.syncthreads()
        for dot_idx in mg.static_range(BK):
            reg_m = [As[thread_row * TM + i, dot_idx] for i in mg.static_range(TM)]
            reg_n = [Bs[dot_idx, thread_col * TN + i] for i in mg.static_range(TN)]
            for res_idx_m in mg.static_range(TM):
                for res_idx_n in mg.static_range(TN):
                    thread_results[res_idx_m * TN + res_idx_n] += reg_m[res_idx_m] * reg_n[res_idx_n]
        mg.syncthreads()
    for res_idx_m in mg.static_range(TM):
        for res_idx_n in mg.static_range(TN):
            row = c_row + thread_row * TM + res_idx_m
            col = c_col + thread_col * TN + res_idx_n
            C[row, col] = alpha * thread_results[res_idx_m * TN + res_idx_n] + beta * C[row, col]


def specialize(M, K, N):
    return common.specialize_tiles(sys.modules[__name__], M, K, N)


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None):
    bm, bn, bk, tm, tn = TILES
    common.launch_tiles(sys.modules[__name__], A, B, C, alpha, beta, stream, threads=bm * bn // (tm * tn))


if __name__ == "__main__":
    common.main(sys.modules[__name__])
