"""Kernel 9 of the SGEMM worklog: autotuned. Kernel 6's code (float4 loads
of A stored transposed, float4 copies of B, float4 reads and writes of C)
with its five tile sizes chosen per problem by timing: mg.autotune over
BM, BN, BK, TM, TN. As in the worklog the block always has 256 threads,
laid out 16 x 16 over a "warptile" of WM = 16 * TM rows and WN = 16 * TN
columns; a block tile larger than one warptile is covered by WMITER x
WNITER of them, so each thread holds WMITER * TM x WNITER * TN results.
The block's float4 loads cover the tiles of A and B in whole rows,
`stride` rows a step.

The configs are the worklog's search space (BK 8-64, TM and TN 4-32, BM and
BN 64-256, its divisibility conditions) pruned to nine, among them its
choices for the A6000 (first) and the A100 (second). On the CPU backend
the first is used. The tiles have no edge guards: M, K, N must be
multiples of every config's tiles, MULTIPLE.

    C = alpha * A @ B + beta * C        (M, K, N multiples of 256, 32, 256)
"""
import sys

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

import common

TITLE = "9: autotuned"
THREADS = 256   # the worklog's K9_NUM_THREADS, for every config
CONFIGS = [
    dict(BM=128, BN=128, BK=16, TM=8, TN=8),    # the worklog's choice on an A6000
    dict(BM=64, BN=64, BK=16, TM=4, TN=4),      # ... and on an A100
    dict(BM=128, BN=128, BK=8, TM=8, TN=8),     # kernel 6's tiles
    dict(BM=128, BN=128, BK=32, TM=8, TN=8),
    dict(BM=128, BN=128, BK=16, TM=4, TN=4),    # 2 x 2 warptiles of 64 x 64
    dict(BM=128, BN=256, BK=16, TM=8, TN=8),
    dict(BM=256, BN=128, BK=16, TM=8, TN=8),
    dict(BM=64, BN=128, BK=32, TM=4, TN=8),
    dict(BM=128, BN=64, BK=32, TM=8, TN=4),
]
MULTIPLE = tuple(max(config[name] for config in CONFIGS) for name in ("BM", "BK", "BN"))

M, K, N, BM, BN, BK, TM, TN = mg.generics("M K N BM BN BK TM TN")


@mg.autotune(configs=CONFIGS, key=["M", "N", "K"])
@mg.kernel(generics=(M, K, N, BM, BN, BK, TM, TN))
def kernel(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
           alpha: mg.f32, beta: mg.f32):
    # The worklog's static_asserts: the float4 loads cover whole rows of the tiles, the warptiles the block
    # tile; and C's float4s a thread's TN columns.
    if ((4 * THREADS) % BK or (4 * THREADS) % BN or (BM * BK) % (4 * THREADS) or (BN * BK) % (4 * THREADS)
            or BM % (16 * TM) or BN % (16 * TN) or TN % 4):
        raise mg.CompileError(f"tiles BM={BM}, BN={BN}, BK={BK}, TM={TM}, TN={TN} do not fit {THREADS} threads")
    WM = TM * 16   # the 16 x 16 threads' warptile
    WN = TN * 16
    WMITER = BM // WM
    WNITER = BN // WN
    As = mg.shared.array((BK, BM), mg.f32)   # transposed: As[k, m] = A[m, k]
    Bs = mg.shared.array((BK, BN), mg.f32)
    c_row = block_idx.y * BM   # the block's tile of C
    c_col = block_idx.x * BN
    thread_col = thread_idx.x % (WN // TN)
    thread_row = thread_idx.x // (WN // TN)
    inner_row_a = thread_idx.x // (BK // 4)
    inner_col_a = thread_idx.x % (BK // 4)
    stride_a = THREADS * 4 // BK
    inner_row_b = thread_idx.x // (BN // 4)
    inner_col_b = thread_idx.x % (BN // 4)
    stride_b = THREADS * 4 // BN
    thread_results = [0.0] * (WMITER * TM * WNITER * TN)   # registers: carried through the K loop
    for bk in range(0, K, BK):
        for offset in mg.static_range(0, BM, stride_a):
            tmp = mg.vload(A, (c_row + inner_row_a + offset, bk + inner_col_a * 4), 4)
            for i in mg.static_range(4):
                As[inner_col_a * 4 + i, inner_row_a + offset] = tmp[i]
        for offset in mg.static_range(0, BK, stride_b):
            mg.vstore(Bs, (inner_row_b + offset, inner_col_b * 4),
                      mg.vload(B, (bk + inner_row_b + offset, c_col + inner_col_b * 4), 4))
        mg.syncthreads()
        for wm_idx in mg.static_range(WMITER):
            for wn_idx in mg.static_range(WNITER):
                for dot_idx in mg.static_range(BK):
                    reg_m = [As[dot_idx, wm_idx * WM + thread_row * TM + i] for i in mg.static_range(TM)]
                    reg_n = [Bs[dot_idx, wn_idx * WN + thread_col * TN + i] for i in mg.static_range(TN)]
                    for res_idx_m in mg.static_range(TM):
                        for res_idx_n in mg.static_range(TN):
                            thread_results[(wm_idx * TM + res_idx_m) * (WNITER * TN) + wn_idx * TN + res_idx_n] += \
                                reg_m[res_idx_m] * reg_n[res_idx_n]
        mg.syncthreads()
    for wm_idx in mg.static_range(WMITER):
        for wn_idx in mg.static_range(WNITER):
            for res_idx_m in mg.static_range(TM):
                for res_idx_n in mg.static_range(0, TN, 4):
                    row = c_row + wm_idx * WM + thread_row * TM + res_idx_m
                    col = c_col + wn_idx * WN + thread_col * TN + res_idx_n
                    first = (wm_idx * TM + res_idx_m) * (WNITER * TN) + wn_idx * TN + res_idx_n
                    tmp = mg.vload(C, (row, col), 4)
                    mg.vstore(C, (row, col), tuple(alpha * thread_results[first + i] + beta * tmp[i]
                                                   for i in mg.static_range(4)))


def specialize(M, K, N):
    """The first config's Specialization (the one the CPU backend runs)."""
    common.check_sizes(sys.modules[__name__], M, K, N)
    return kernel.kernel.specialize({"M": M, "K": K, "N": N, **CONFIGS[0]})


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None):
    (m, k), n = A.shape, C.shape[1]
    common.check_sizes(sys.modules[__name__], m, k, n)
    kernel(A, B, C, alpha, beta, grid=lambda g: (g["N"] // g["BN"], g["M"] // g["BM"]), block=(THREADS,),
           stream=stream)


if __name__ == "__main__":
    common.main(sys.modules[__name__])
