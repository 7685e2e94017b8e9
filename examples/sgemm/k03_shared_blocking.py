"""Kernel 3 of the SGEMM worklog: shared memory cache blocking. A block of
BLOCKSIZE * BLOCKSIZE threads computes a BLOCKSIZE x BLOCKSIZE tile of C;
each step of K it loads a tile of A and a tile of B into shared memory (one
coalesced element per thread), waits for the block, and every thread takes
its dot product from shared memory, so each element of A and B is read from
global memory once per block instead of once per thread.

    C = alpha * A @ B + beta * C        (any M, K, N)

Unlike the worklog's kernel (multiples of 32 only), this one guards its
edges: elements of the tiles past A's or B's edge load as zero and threads
past C's edge store nothing. Every thread still reaches both barriers.
"""
import sys

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

import common

TITLE = "3: shared memory cache blocking"
MULTIPLE = (1, 1, 1)
TILE = 32   # BLOCKSIZE

M, K, N, BLOCKSIZE = mg.generics("M K N BLOCKSIZE")


@mg.kernel(generics=(M, K, N, BLOCKSIZE))
def kernel(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
           alpha: mg.f32, beta: mg.f32):
    As = mg.shared.array((BLOCKSIZE, BLOCKSIZE), mg.f32)
    Bs = mg.shared.array((BLOCKSIZE, BLOCKSIZE), mg.f32)
    thread_row = thread_idx.x // BLOCKSIZE
    thread_col = thread_idx.x % BLOCKSIZE
    row = block_idx.x * BLOCKSIZE + thread_row   # of A and C
    col = block_idx.y * BLOCKSIZE + thread_col   # of B and C
    tmp = mg.constant(0.0, mg.f32)
    for bk in range(0, K, BLOCKSIZE):
        a = mg.constant(0.0, mg.f32)
        if (row < M) & (bk + thread_col < K):
            a = A[row, bk + thread_col]
        As[thread_row, thread_col] = a
        b = mg.constant(0.0, mg.f32)
        if (bk + thread_row < K) & (col < N):
            b = B[bk + thread_row, col]
        Bs[thread_row, thread_col] = b
        mg.syncthreads()
        for dot in range(BLOCKSIZE):
            tmp += As[thread_row, dot] * Bs[dot, thread_col]
        mg.syncthreads()
    if (row < M) & (col < N):
        C[row, col] = alpha * tmp + beta * C[row, col]


def specialize(M, K, N):
    return kernel[M, K, N, TILE]


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None):
    (m, k), n = A.shape, C.shape[1]
    specialize(m, k, n)(A, B, C, alpha, beta, grid=(common.ceil_div(m, TILE), common.ceil_div(n, TILE)),
                        block=(TILE * TILE,), stream=stream)


if __name__ == "__main__":
    common.main(sys.modules[__name__])
