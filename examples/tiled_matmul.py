"""The classic shared-memory tiled matmul, C = A @ B, in its two forms: a 2-D block of
TILE x TILE threads computes a TILE x TILE tile of C; per step of K it loads
a tile of A and a tile of B into shared memory (one element per thread),
waits for the block, and accumulates from shared memory.

    matmul_static    the tiles are two static shared arrays (mg.shared.array)
    matmul_dynamic   the tiles are two slices of dynamic shared memory
                     (mg.shared.dynamic), sized by the launch's shared_mem=

    python examples/tiled_matmul.py [M K N]   # default 5120 256 5120 on the GPU, 320 64 320 on the CPU

M, K and N are multiples of TILE (no edge guards). The tests
(tests/support/kernels_features.py) and benchmarks/cpu_backend.py run these kernels.
"""
import argparse
import os
import sys

import numpy as np

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "sgemm"))
import common  # noqa: E402  (the SGEMM series' operands, float64 reference and timing)

TILE = 16

M, K, N = mg.generics("M K N")


@mg.kernel(generics=(M, K, N))
def matmul_dynamic(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32]):
    smem = mg.shared.dynamic(mg.f32)  # shared_mem = 2 tiles of floats
    As = smem[0:TILE * TILE]
    Bs = smem[TILE * TILE:2 * TILE * TILE]
    tx, ty = thread_idx.x, thread_idx.y
    row = block_idx.y * TILE + ty
    col = block_idx.x * TILE + tx
    acc = mg.constant(0.0, mg.f32)
    for t in range(K // TILE):
        As[ty * TILE + tx] = A[row, t * TILE + tx]
        Bs[ty * TILE + tx] = B[t * TILE + ty, col]
        mg.syncthreads()
        for k in range(TILE):
            acc += As[ty * TILE + k] * Bs[k * TILE + tx]
        mg.syncthreads()
    C[row, col] = acc


@mg.kernel(generics=(M, K, N))
def matmul_static(A: mg.memref[M, K, mg.f32], B: mg.memref[K, N, mg.f32], C: mg.memref[M, N, mg.f32]):
    As = mg.shared.array((TILE, TILE), mg.f32)
    Bs = mg.shared.array((TILE, TILE), mg.f32)
    tx, ty = thread_idx.x, thread_idx.y
    row = block_idx.y * TILE + ty
    col = block_idx.x * TILE + tx
    acc = mg.constant(0.0, mg.f32)
    for t in range(K // TILE):
        As[ty, tx] = A[row, t * TILE + tx]
        Bs[ty, tx] = B[t * TILE + ty, col]
        mg.syncthreads()
        for k in range(TILE):
            acc += As[ty, k] * Bs[k, tx]
        mg.syncthreads()
    C[row, col] = acc


FORMS = ((matmul_static, "static shared memory", 0),
         (matmul_dynamic, "dynamic shared memory", 2 * TILE * TILE * 4))   # (kernel, name, shared_mem bytes)


def _launch(kernel, A, B, C, shared_mem):
    """C = A @ B with one of FORMS (M, K, N multiples of TILE)."""
    m, n = C.shape
    kernel(A, B, C, grid=(n // TILE, m // TILE), block=(TILE, TILE), shared_mem=shared_mem)


def launch_static(A, B, C):
    """C = A @ B, static shared memory (the benchmark and the notebook call it)."""
    _launch(matmul_static, A, B, C, 0)


def launch_dynamic(A, B, C):
    """C = A @ B, dynamic shared memory split by slices."""
    _launch(matmul_dynamic, A, B, C, 2 * TILE * TILE * 4)


def main(argv=None):
    on_gpu = mg.backend() == "cuda"
    parser = argparse.ArgumentParser(description="a tiled matmul in shared memory, static and dynamic")
    parser.add_argument("sizes", nargs="*", type=int, metavar="M K N",
                        help="multiples of 16; default 5120 256 5120 on the GPU, 320 64 320 on the CPU")
    parser.add_argument("--repeat", type=int, default=20 if on_gpu else 2)
    args = parser.parse_args(argv)
    if len(args.sizes) not in (0, 3) or any(size <= 0 or size % TILE for size in args.sizes):
        parser.error(f"give M K N, multiples of {TILE}")
    m, k, n = args.sizes or ((5120, 256, 5120) if on_gpu else (320, 64, 320))
    A, B, _ = common.operands(m, k, n)
    expected = A.astype(np.float64) @ B.astype(np.float64)
    dA, dB = mg.to_device(A), mg.to_device(B)
    worst = 0.0
    for kernel, name, shared_mem in FORMS:
        dC = mg.empty((m, n), mg.f32)
        _launch(kernel, dA, dB, dC, shared_mem)
        error = common.relative_error(dC.get(), expected)
        ms = common.time_ms(lambda: _launch(kernel, dA, dB, dC, shared_mem), repeat=args.repeat, warmup=1)
        print(f"tiled matmul, {name} ({mg.backend()}): {m}x{k} @ {k}x{n}, {ms:.3f} ms, "
              f"{2 * m * n * k / ms / 1e6:,.1f} GFLOP/s, relative error against NumPy (float64) {error:.1e}")
        worst = max(worst, error)
    if not worst < 1e-5:
        sys.exit(f"tiled matmul: wrong result (relative error {worst:.1e})")


if __name__ == "__main__":
    main()
