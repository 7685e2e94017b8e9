"""Kernel 7 of the SGEMM worklog: avoid bank conflicts (linearize).
Kernel 6, with B's tile stored into shared memory in another order. In
kernel 6 the 16 thread columns of a warp read B at addresses TN = 8
floats apart: as 32-bit accesses, thread columns 4 apart hit the same bank
(a 4-way conflict). Here element (k, thread_col * TN + i) of the tile is
stored at Bs[k * TN + i, thread_col], so a warp's load of the i-th of its
TN elements reads 16 consecutive floats, 16 banks: no conflict. The
float4 from B is stored as four scalars, and the TN elements, BN / TN
floats apart, are read by TN scalar loads.

    C = alpha * A @ B + beta * C        (M, K, N multiples of BM, BK, BN: no edge guards)
"""
import sys

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

import common

TITLE = "7: avoid bank conflicts (linearize)"
TILES = (128, 128, 8, 8, 8)   # BM, BN, BK, TM, TN: the worklog's, 256 threads
MULTIPLE = (TILES[0], TILES[2], TILES[1])

M, K, N, BM, BN, BK, TM, TN = mg.generics("M K N BM BN BK TM TN")


@mg.kernel(generics=(M, K, N, BM, BN, BK, TM, TN))
def kernel(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
           alpha: mg.f32, beta: mg.f32):
    threads = BM * BN // (TM * TN)
    # The float4 loads cover whole rows of the tiles, and C's float4s a thread's TN columns.
    if (BM * BK) % (4 * threads) or (BN * BK) % (4 * threads) or (4 * threads) % BK or (4 * threads) % BN or TN % 4:
        raise mg.CompileError(f"tiles BM={BM}, BN={BN}, BK={BK}, TM={TM}, TN={TN} do not fit {threads} threads")
    As = mg.shared.array((BK, BM), mg.f32)   # transposed: As[k, m] = A[m, k]
    Bs = mg.shared.array((BK * TN, BN // TN), mg.f32)   # "linearized": Bs[k * TN + i, c] = B[k, c * TN + i]
    c_row = block_idx.y * BM   # the block's tile of C
    c_col = block_idx.x * BN
    thread_col = thread_idx.x % (BN // TN)
    thread_row = thread_idx.x // (BN // TN)
    # Each load moves 4 elements: a thread's float4 in the tiles, the block covering `stride` rows per step
    # (one step for the worklog's tiles).
    inner_row_a = thread_idx.x // (BK // 4)
    inner_col_a = thread_idx.x % (BK // 4)
    stride_a = threads * 4 // BK
    inner_row_b = thread_idx.x // (BN // 4)
    inner_col_b = thread_idx.x % (BN // 4)
    stride_b = threads * 4 // BN
    thread_results = [0.0] * (TM * TN)   # registers: carried through the K loop element by element
    for bk in range(0, K, BK):
        for offset in mg.static_range(0, BM, stride_a):
            tmp = mg.vload(A, (c_row + inner_row_a + offset, bk + inner_col_a * 4), 4)
            for i in mg.static_range(4):
                As[inner_col_a * 4 + i, inner_row_a + offset] = tmp[i]
        for offset in mg.static_range(0, BK, stride_b):
            tmp = mg.vload(B, (bk + inner_row_b + offset, c_col + inner_col_b * 4), 4)
            # Column inner_col_b * 4 + i of the tile is column i' = (inner_col_b % (TN // 4)) * 4 + i of
            # thread column inner_col_b // (TN // 4)'s TN.
            for i in mg.static_range(4):
                Bs[(inner_row_b + offset) * TN + (inner_col_b % (TN // 4)) * 4 + i, inner_col_b // (TN // 4)] = tmp[i]
        mg.syncthreads()
        for dot_idx in mg.static_range(BK):
            reg_m = [As[dot_idx, thread_row * TM + i] for i in mg.static_range(TM)]
            reg_n = [Bs[dot_idx * TN + i, thread_col] for i in mg.static_range(TN)]
            for res_idx_m in mg.static_range(TM):
                for res_idx_n in mg.static_range(TN):
                    thread_results[res_idx_m * TN + res_idx_n] += reg_m[res_idx_m] * reg_n[res_idx_n]
        mg.syncthreads()
    for res_idx_m in mg.static_range(TM):
        for res_idx_n in mg.static_range(0, TN, 4):
            row = c_row + thread_row * TM + res_idx_m
            col = c_col + thread_col * TN + res_idx_n
            tmp = mg.vload(C, (row, col), 4)
            mg.vstore(C, (row, col), tuple(alpha * thread_results[res_idx_m * TN + res_idx_n + i] + beta * tmp[i]
                                           for i in mg.static_range(4)))


def specialize(M, K, N):
    return common.specialize_tiles(sys.modules[__name__], M, K, N)


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None):
    bm, bn, bk, tm, tn = TILES
    common.launch_tiles(sys.modules[__name__], A, B, C, alpha, beta, stream, threads=bm * bn // (tm * tn))


if __name__ == "__main__":
    common.main(sys.modules[__name__])
