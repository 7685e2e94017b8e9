"""Kernel 2 of the SGEMM worklog: global memory coalescing. The same
arithmetic as kernel 1, but a 1-D block of BLOCKSIZE * BLOCKSIZE threads is
laid out so that consecutive threads take consecutive columns y of one row
x: a warp's loads of B[i, y] and its stores of C[x, y] are one contiguous
128-byte segment each, and its A[x, i] is one broadcast.

    C = alpha * A @ B + beta * C        (any M, K, N: threads past the edge do nothing)
"""
import sys

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

import common

TITLE = "2: global memory coalescing"
MULTIPLE = (1, 1, 1)
TILE = 32   # BLOCKSIZE: a block computes a TILE x TILE tile of C

M, K, N, BLOCKSIZE = mg.generics("M K N BLOCKSIZE")


@mg.kernel(generics=(M, K, N, BLOCKSIZE))
def kernel(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
           alpha: mg.f32, beta: mg.f32):
    x = block_idx.x * BLOCKSIZE + thread_idx.x // BLOCKSIZE
    y = block_idx.y * BLOCKSIZE + thread_idx.x % BLOCKSIZE
    if (x < M) & (y < N):
        tmp = mg.constant(0.0, mg.f32)
        for i in range(K):
            tmp += A[x, i] * B[i, y]
        C[x, y] = alpha * tmp + beta * C[x, y]


def specialize(M, K, N):
    return kernel[M, K, N, TILE]


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None):
    (m, k), n = A.shape, C.shape[1]
    specialize(m, k, n)(A, B, C, alpha, beta, grid=(common.ceil_div(m, TILE), common.ceil_div(n, TILE)),
                        block=(TILE * TILE,), stream=stream)


if __name__ == "__main__":
    common.main(sys.modules[__name__])
