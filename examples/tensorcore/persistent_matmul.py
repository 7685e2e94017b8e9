"""A persistent fp32 GEMM, C = A @ B, over mg.TileScheduler: one kernel body
for every schedule (data-parallel, split-K, stream-K and the hybrid).

    python examples/tensorcore/persistent_matmul.py [units]

A grid of `units` blocks (by default one per multiprocessor, 8 on the CPU)
loops over its work units; each is a 32 x 32 tile of C and a range of its
K-tiles. A block of 16 x 16 threads computes a tile, each thread four of its
values (rows ty + 16 * i, columns tx + 16 * j), reading A and B straight
from global memory: the point is the schedule, not the inner loop (see
ampere_gemm.py and hopper_gemm.py for that). A tile split over several
units is completed by sched.fixup, which adds the parts from the workspace.
Runs on the current backend and checks every mode against NumPy in float64.
"""
import sys

import numpy as np

import mlirgpu as mg

BM = BN = 32   # a tile of C
BK = 16        # a K-tile
THREADS = 16   # a block of THREADS x THREADS threads
PER = BM // THREADS  # values per thread along each axis


def persistent_matmul(mode, split=None, group=4, cluster=1):
    """The kernel for one schedule; it takes (A, B, C, partials, counters)."""
    @mg.kernel
    def matmul(A: mg.memref[None, None, mg.f32].readonly(), B: mg.memref[None, None, mg.f32].readonly(),
               C: mg.memref[None, None, mg.f32], partials: mg.memref[None, None, mg.f32],
               counters: mg.memref[None, mg.i32]):
        M, K, N = A.shape[0], A.shape[1], B.shape[1]
        sched = mg.TileScheduler((M + BM - 1) // BM, (N + BN - 1) // BN, (K + BK - 1) // BK,
                                 mode=mode, split=split, group=group, cluster=cluster)
        tx, ty = mg.thread_idx.x, mg.thread_idx.y
        for work in sched:
            acc = [mg.constant(0.0, mg.f32) for _ in mg.static_range(PER * PER)]
            row0, col0 = work.m * BM + ty, work.n * BN + tx
            k_end = min(work.k_end * BK, K)
            for k in range(work.k_begin * BK, k_end):
                for i in mg.static_range(PER):
                    a = mg.constant(0.0, mg.f32)
                    if row0 + THREADS * i < M:
                        a = A[row0 + THREADS * i, k]
                    for j in mg.static_range(PER):
                        if col0 + THREADS * j < N:
                            acc[i * PER + j] = acc[i * PER + j] + a * B[k, col0 + THREADS * j]
            acc, done = sched.fixup(work, partials, counters, acc)
            if done:
                for i in mg.static_range(PER):
                    for j in mg.static_range(PER):
                        if (row0 + THREADS * i < M) & (col0 + THREADS * j < N):
                            C[row0 + THREADS * i, col0 + THREADS * j] = acc[i * PER + j]
    return matmul


def run(A, B, mode, split=None, units=None, group=4, cluster=1):
    """C = A @ B with the given schedule: the plan, the workspace, the launch."""
    (M, K), N = A.shape, B.shape[1]
    plan = mg.TileScheduler.plan(-(-M // BM), -(-N // BN), -(-K // BK), mode=mode, split=split, group=group,
                                 cluster=cluster, units=units, values=THREADS * THREADS * PER * PER)
    C = np.zeros((M, N), np.float32)
    partials = np.zeros(plan.partials, np.float32)
    counters = np.zeros(plan.counters, np.int32)
    persistent_matmul(mode, split, group, cluster)(A, B, C, partials, counters, grid=plan.grid, block=(THREADS, THREADS))
    return C, counters


SCHEDULES = [("data_parallel", None), ("split_k", 3), ("stream_k", None), ("hybrid", None)]


def main():
    units = int(sys.argv[1]) if len(sys.argv) > 1 else (8 if mg.backend() == "cpu" else None)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((67, 129)).astype(np.float32)
    B = rng.standard_normal((129, 45)).astype(np.float32)
    expected = A.astype(np.float64) @ B.astype(np.float64)
    for mode, split in SCHEDULES:
        C, _ = run(A, B, mode, split, units)
        error = np.abs(C - expected).max() / np.abs(expected).max()
        print(f"{mode:14} split={split!s:5} relative error against NumPy (float64) {error:.2e}")
        assert error < 1e-5, mode


if __name__ == "__main__":
    main()
