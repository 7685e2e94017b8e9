"""The naive SGEMM of the worklog (examples/sgemm/k01_naive.py) with dynamic
sizes: one compile per variant serves every M, K, N, which is what a C
library exported from it needs.

    C = alpha * A @ B + beta * C        (any M, K, N: threads past the edge do nothing)
"""
import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

BLOCK = 16
M, K, N = mg.generics("M K N", dynamic=True)


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


# The kernel's own launch shape, in C on its sizes: the library's function then takes no grid.
LAUNCH = {"sgemm": {"grid": (f"(M + {BLOCK - 1}) / {BLOCK}", f"(N + {BLOCK - 1}) / {BLOCK}"),
                    "block": (BLOCK, BLOCK)}}
