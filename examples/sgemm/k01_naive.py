"""Kernel 1 of the SGEMM worklog: naive. One thread per element of C; the
threads of a warp take consecutive rows x, so their loads of A[x, i] are
32 rows apart (uncoalesced) and their B[i, y] are one broadcast.

    C = alpha * A @ B + beta * C        (any M, K, N: threads past the edge do nothing)
"""
import sys

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

import common

TITLE = "1: naive"
MULTIPLE = (1, 1, 1)
BLOCK = 32


def naive(dynamic=False):
    """The kernel over generics M, K, N; `dynamic=True` makes them sizes known
    only at launch, one compile for every size (what examples/export exports)."""
    M, K, N = mg.generics("M K N", dynamic=dynamic)

    @mg.kernel
    def sgemm(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32],
              alpha: mg.f32, beta: mg.f32):
        x = block_idx.x * block_dim.x + thread_idx.x
        y = block_idx.y * block_dim.y + thread_idx.y
        if (x < M) & (y < N):
            tmp = mg.constant(0.0, mg.f32)
            for i in range(K):
                tmp += A[x, i] * B[i, y]
            C[x, y] = alpha * tmp + beta * C[x, y]

    return sgemm


kernel = naive()


def specialize(M, K, N):
    return kernel[M, K, N]


def launch(A, B, C, alpha=1.0, beta=0.0, stream=None):
    m, n = C.shape
    kernel(A, B, C, alpha, beta, grid=(common.ceil_div(m, BLOCK), common.ceil_div(n, BLOCK)),
           block=(BLOCK, BLOCK), stream=stream)


if __name__ == "__main__":
    common.main(sys.modules[__name__])
