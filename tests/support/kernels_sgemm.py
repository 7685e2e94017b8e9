"""The SGEMM kernels of the README and the guide, shared by the CPU and GPU tests.
sgemm_naive is the README example's own (examples/sgemm_naive.py)."""
from support.sgemm_ir import sgemm_naive as example

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

sgemm_naive = example.sgemm_naive

M, K, N, dtype = mg.generics("M K N dtype")


@mg.kernel(generics=(M, K, N, dtype))
def sgemm_loop(A: mg.memref[M, K, dtype], B: mg.memref[K, N, dtype], C: mg.memref[M, N, dtype]):
    r = block_dim.x * block_idx.x + thread_idx.x
    c = block_dim.y * block_idx.y + thread_idx.y
    acc = mg.constant(0.0, dtype)
    for k in range(K):                              # natural form: acc is found loop-carried
        acc += A[r, k] * B[k, c]
    C[r, c] = acc + 1.0


@mg.kernel
def scale_rows(X: mg.memref[M, N, dtype], alpha: dtype, rows: mg.i32):
    """Rows below `rows` scaled by alpha, the rest negated: if/else and scalars."""
    r = block_dim.x * block_idx.x + thread_idx.x
    c = thread_idx.y
    if r < M:
        if mg.cast(r, mg.i32) < rows:
            X[r, c] = X[r, c] * alpha
        else:
            X[r, c] = -X[r, c]
