"""An Ampere-style half-precision GEMM on the tensor cores: C = A @ B.

A (M x K) and B (K x N) are f16 or bf16, row-major; C (M x N) is f16, bf16
or f32; products are summed in f32. Any M, N, K: the tiles at the edges are
predicated (out-of-range elements of A and B read as zeros, those of C are
not written).

The kernel is the shape of CUTLASS's sm_80 GEMMs:

- A block of 128 threads (4 warps, 2 x 2) computes a 128 x 128 tile of C,
  each warp a 64 x 64 tile: 4 x 8 mma.sync m16n8k16 atoms, 32 accumulator
  fragments of 4 f32 values a lane.
- Blocks take their tiles in groups of 8 tile rows, column by column within
  a group, so that the rows of A and columns of B a group reads are reused
  from L2.
- K advances 32 at a time through a 3-stage pipeline in shared memory
  (3 x 16 KB): cp.async copies 16 bytes a thread from global memory into
  the stage two steps ahead while the warps compute on the current one;
  wait_group(1) and a barrier a step keep one group in flight.
- The warps read their fragments with ldmatrix: .x4 gives an A fragment
  (16 x 16), .x4.trans two B fragments (16 x 16 of the K x N tile).
- Shared tiles are swizzled so that neither the 16-byte cp.async stores
  nor the ldmatrix row reads meet bank conflicts: A's 128 x 32 tile
  (64-byte rows) through Swizzle(2, 3, 3), B's 32 x 128 tile (256-byte
  rows) through Swizzle(3, 3, 4), each XOR-ing the row into the 16-byte
  chunk bits of the element index.

Where K (for A) or N (for B) is not a multiple of 8, rows of the arrays are
not 16-byte aligned, which cp.async needs: the tiles are then loaded with
ordinary loads and stores (slower, still correct).

    python examples/tensorcore/ampere_gemm.py [M K N] [--dtype f16|bf16] [--out f16|bf16|f32]

checks one product against float64 NumPy on the current backend
(MLIRGPU_BACKEND=cpu runs it without a GPU).
"""
import argparse
import sys

import numpy as np

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx
from mlirgpu.layout import Swizzle, composition, row_major

BM, BN, BK = 128, 128, 32  # the block's tile of C, and its step along K
WM, WN = 64, 64            # a warp's tile of C
STAGES = 3                 # shared-memory stages of the pipeline
THREADS = 128              # (BM // WM) * (BN // WN) warps
CHUNK = 8                  # 16-bit elements in a 16-byte cp.async
GROUP_M = 8                # tile rows a group of blocks covers (for L2 reuse)

# Swizzled shared tiles: (row, col) -> element index of a stage.
A_TILE = composition(Swizzle(2, 3, 3), row_major((BM, BK)))
B_TILE = composition(Swizzle(3, 3, 4), row_major((BK, BN)))

M, K, N, T, OUT = mg.generics("M K N T OUT")


@mg.kernel(generics=(M, K, N, T, OUT), max_threads=THREADS)
def kernel(A: mg.memref[M, K, T], B: mg.memref[K, N, T], C: mg.memref[M, N, OUT]):
    atom = mg.mma.M16N8K16_F16 if T == mg.f16 else mg.mma.M16N8K16_BF16
    As = mg.shared.array((STAGES * BM * BK,), T)
    Bs = mg.shared.array((STAGES * BK * BN,), T)
    tid = thread_idx.x
    lane, warp = tid % 32, tid // 32
    wm, wn = warp % (BM // WM) * WM, warp // (BM // WM) * WN
    # Blocks go down GROUP_M tile rows before the next tile column, so that
    # the tiles of A and B a group shares are still in L2 when it reads them.
    tiles_m, tiles_n = (M + BM - 1) // BM, (N + BN - 1) // BN
    block = block_idx.y * tiles_n + block_idx.x
    first_m = block // (GROUP_M * tiles_n) * GROUP_M
    height = min(tiles_m - first_m, GROUP_M)
    bm = (first_m + block % (GROUP_M * tiles_n) % height) * BM
    bn = block % (GROUP_M * tiles_n) // height * BN
    steps = (K + BK - 1) // BK
    zero = mg.cast(0.0, T)

    # This thread's 16-byte chunks of a stage: 4 of A's 128 x 32 tile, 4 of B's 32 x 128.
    a_chunks = [((tid + i * THREADS) // (BK // CHUNK), (tid + i * THREADS) % (BK // CHUNK) * CHUNK)
                for i in mg.static_range(BM * BK // CHUNK // THREADS)]
    b_chunks = [((tid + i * THREADS) // (BN // CHUNK), (tid + i * THREADS) % (BN // CHUNK) * CHUNK)
                for i in mg.static_range(BK * BN // CHUNK // THREADS)]

    acc = [[mg.mma.zeros(atom) for _ in mg.static_range(WN // 8)] for _ in mg.static_range(WM // 16)]
    # Where this lane's ldmatrix rows start: lanes 8j..8j+7 address matrix j,
    # which sits at block (j % 2, j // 2) of the 16 x 16 tile it loads.
    a_row, a_col = lane % 8 + lane // 8 % 2 * 8, lane // 16 * 8
    b_row, b_col = lane % 8 + lane // 16 * 8, lane // 8 % 2 * 8
    # Iteration t loads step t (into stage t % STAGES) and computes step
    # t - (STAGES - 1): the first STAGES - 1 iterations only load.
    for t in range(steps + STAGES - 1):
        # Step t - (STAGES - 1)'s group has landed (this thread's copies) and,
        # after the barrier, every thread's; all are done with step t - STAGES,
        # whose stage step t takes.
        mg.mma.wait_group(STAGES - 2)
        mg.syncthreads()
        a_stage = mg.mma.tile(As, A_TILE).at(t % STAGES * (BM * BK))
        b_stage = mg.mma.tile(Bs, B_TILE).at(t % STAGES * (BK * BN))
        for row, col in a_chunks:
            r, k, ok = bm + row, t * BK + col, (t < steps) & (bm + row < M)
            if K % CHUNK == 0:  # whole chunks: in or out
                ok = ok & (k < K)
                mg.mma.cp_async(a_stage, (row, col), A, (mg.select(ok, r, 0), mg.select(ok, k, 0)), 16, ok)
            else:
                for e in mg.static_range(CHUNK):
                    e_ok = ok & (k + e < K)
                    a_stage[row, col + e] = mg.select(e_ok, A[mg.select(e_ok, r, 0), mg.select(e_ok, k + e, 0)],
                                                      zero)
        for row, col in b_chunks:
            k, c, ok = t * BK + row, bn + col, (t < steps) & (t * BK + row < K)
            if N % CHUNK == 0:
                ok = ok & (c < N)
                mg.mma.cp_async(b_stage, (row, col), B, (mg.select(ok, k, 0), mg.select(ok, c, 0)), 16, ok)
            else:
                for e in mg.static_range(CHUNK):
                    e_ok = ok & (c + e < N)
                    b_stage[row, col + e] = mg.select(e_ok, B[mg.select(e_ok, k, 0), mg.select(e_ok, c + e, 0)],
                                                      zero)
        mg.mma.commit_group()

        if t >= STAGES - 1:
            a_tile = mg.mma.tile(As, A_TILE).at((t + 1) % STAGES * (BM * BK))  # step t - (STAGES - 1)
            b_tile = mg.mma.tile(Bs, B_TILE).at((t + 1) % STAGES * (BK * BN))
            for kk in mg.static_range(0, BK, 16):
                a = [mg.mma.ldmatrix(a_tile, (wm + mi * 16 + a_row, kk + a_col), 4)
                     for mi in mg.static_range(WM // 16)]
                b = []
                for nj in mg.static_range(WN // 16):
                    pair = mg.mma.ldmatrix(b_tile, (kk + b_row, wn + nj * 16 + b_col), 4, transpose=True)
                    b += [pair.select(0, 1, 4, 5), pair.select(2, 3, 6, 7)]
                for mi in mg.static_range(WM // 16):
                    for ni in mg.static_range(WN // 8):
                        acc[mi][ni] = mg.mma.sync(atom, a[mi], b[ni], acc[mi][ni])
    mg.mma.wait_group(0)

    for v in mg.static_range(4):
        r, c = mg.mma.coordinate(atom, "c", v)
        for mi in mg.static_range(WM // 16):
            for ni in mg.static_range(WN // 8):
                row, col = bm + wm + mi * 16 + r, bn + wn + ni * 8 + c
                if (row < M) & (col < N):
                    C[row, col] = mg.cast(acc[mi][ni][v], OUT)


def grid(m, n):
    return ((n + BN - 1) // BN, (m + BM - 1) // BM)


def launch(A, B, C, stream=None):
    """C = A @ B on the current backend (A, B and C arrays of its kind)."""
    (m, k), (k2, n) = A.shape, B.shape
    if k2 != k or tuple(C.shape) != (m, n):
        raise ValueError(f"shapes do not multiply: A {A.shape} @ B {B.shape} -> C {C.shape}")
    kernel(A, B, C, grid=grid(m, n), block=THREADS, **({"stream": stream} if stream is not None else {}))


def operands(m, k, n, dtype, seed=0):
    """Random A, B as NumPy arrays of `dtype` (an mlirgpu dtype)."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (m, k)).astype(dtype.numpy), rng.uniform(-1, 1, (k, n)).astype(dtype.numpy))


def reference(A, B):
    return A.astype(np.float64) @ B.astype(np.float64)


def within_tolerance(C, expected, k, out_dtype):
    """C is the product up to f32 sums of k products of inputs in [-1, 1]
    and the rounding of the output type, element by element."""
    rounding = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}[out_dtype.name]
    return bool(np.all(np.abs(C.astype(np.float64) - expected) <= rounding * np.abs(expected) + k * 2.0 ** -22))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[300, 200, 260], help="M K N")
    parser.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    parser.add_argument("--out", default="f32", choices=["f16", "bf16", "f32"])
    args = parser.parse_args(argv)
    m, k, n = args.sizes
    dtype, out_dtype = mg.dtype(args.dtype), mg.dtype(args.out)
    A, B = operands(m, k, n, dtype)
    if mg.backend() == "cpu":  # NumPy arrays as they are (host DeviceArrays of bf16 have no NumPy view)
        C = np.zeros((m, n), out_dtype.numpy)
        launch(A, B, C)
    else:
        C = mg.zeros((m, n), out_dtype)
        launch(mg.to_device(A), mg.to_device(B), C)
        C = C.get()
    expected = reference(A, B)
    ok = within_tolerance(C, expected, k, out_dtype)
    print(f"{m}x{k}x{n} {args.dtype} -> {args.out} on {mg.backend()}: max |error| "
          f"{np.abs(C.astype(np.float64) - expected).max():.3g}, {'correct' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
