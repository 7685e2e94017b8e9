"""Kernel 4 of the SGEMM worklog: 1D blocktiling. A block of BM * BN / TM
threads computes a BM x BN tile of C, each thread a column of TM results
held in registers. Per step of K the block loads a BM x BK tile of A and a
BK x BN tile of B into shared memory (one element per thread, consecutive
threads on consecutive elements); then for each dot_idx a thread reads one
element of B into a register and reuses it for its TM results, so it does
TM FMAs per TM + 1 shared memory loads instead of one per two.

    C = alpha * A @ B + beta * C        (M, K, N multiples of BM, BK, BN: no edge guards)
"""
import sys

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

import common

TITLE = "4: 1D blocktiling"
TILES = (64, 64, 8, 8)   # BM, BN, BK, TM: the worklog's
MULTIPLE = (TILES[0], TILES[2], TILES[1])

M, K, N, BM, BN, BK, TM = mg.generics("M K N BM BN BK TM")


@mg.kernel(generics=(M, K, N, BM, BN, BK, TM))
def kernel(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
           alpha: mg.f32, beta: mg.f32):
    As = mg.shared.array((BM, BK), mg.f32)
    Bs = mg.shared.array((BK, BN), mg.f32)
    c_row = block_idx.y * BM   # the block's tile of C
    c_col = block_idx.x * BN
    thread_col = thread_idx.x % BN
    thread_row = thread_idx.x // BN
    # The loads' positions in the tiles: a warp reads consecutive elements (coalesced), BM * BK = BN * BK threads.
    inner_col_a = thread_idx.x % BK
    inner_row_a = thread_idx.x // BK
    inner_col_b = thread_idx.x % BN
    inner_row_b = thread_idx.x // BN
    thread_results = [0.0] * TM   # registers: carried through the K loop element by element
    for bk in range(0, K, BK):
        As[inner_row_a, inner_col_a] = A[c_row + inner_row_a, bk + inner_col_a]
        Bs[inner_row_b, inner_col_b] = B[bk + inner_row_b, c_col + inner_col_b]
        mg.syncthreads()
        for dot_idx in mg.static_range(BK):
            tmp_b = Bs[dot_idx, thread_col]
            for res_idx in mg.static_range(TM):
                thread_results[res_idx] += As[thread_row * TM + res_idx, dot_idx] * tmp_b
        mg.syncthreads()
    col = c_col + thread_col
    for res_idx in mg.static_range(TM):
        row = c_row + thread_row * TM + res_idx
        C[row, col] = alpha * thread_results[res_idx] + beta * C[row, col]


def specialize(M, K, N):
    return common.specialize_tiles(sys.modules[__name__], M, K, N)


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None):
    bm, bn, bk, tm = TILES
    common.launch_tiles(sys.modules[__name__], A, B, C, alpha, beta, stream, threads=bm * bn // tm)


if __name__ == "__main__":
    common.main(sys.modules[__name__])
