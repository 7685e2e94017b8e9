"""What the SGEMM series (examples/sgemm/) shares: the kernels' order,
operands, the check against NumPy in float64, timing, and the command line
of every kernel script.

Each kernel module `kNN_*.py` is the worklog's kernel NN written with
@mg.kernel, its tile sizes generics, and defines:

    TITLE     the worklog's name for it ("2D blocktiling")
    MULTIPLE  (m, k, n): the M, K, N it takes are multiples of these
              ((1, 1, 1): any size, the kernel guards its edges)
    kernel    the @mg.kernel (kernel 9: the mg.autotune over it)
    launch(A, B, C, alpha=1.0, beta=0.0, stream=None)
              C = alpha * A @ B + beta * C on the current backend, with the
              grid, block and shared memory its tiles need; mg.LaunchError
              for sizes it does not take
    specialize(M, K, N)
              the mg.Specialization that launch() launches for those sizes
              (kernel 9: its first config's), to read its IR and PTX without
              a GPU: specialize(M, K, N).ptx(chip="sm_90a"); mg.LaunchError
              for sizes it does not take

The kernels without edge guards (4-8, 10) also define TILES (BM, BN, ...,
the generics after M, K, N); kernels 4-8 take specialize() and launch()
from specialize_tiles() and launch_tiles() below, kernel 10 has its own,
which split K where the tiles are too few to fill the GPU (and take
split= to choose the split).

    python examples/sgemm/k05_blocktiling_2d.py [M K N]   # MLIRGPU_BACKEND=cpu forces the CPU
"""
import argparse
import importlib
import os
import statistics
import sys
import time

import numpy as np

import mlirgpu as mg

KERNELS = ("k01_naive", "k02_coalescing", "k03_shared_blocking", "k04_blocktiling_1d", "k05_blocktiling_2d",
           "k06_vectorized", "k07_bank_conflicts", "k08_bank_conflicts_offset", "k09_autotuned",
           "k10_warptiling")

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    """The kernel module `name` (one of KERNELS)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    return importlib.import_module(name)


def kernels():
    return [load(name) for name in KERNELS]


def check_sizes(module, M, K, N):
    """LaunchError unless M, K, N are multiples of module.MULTIPLE."""
    if any(size % multiple for size, multiple in zip((M, K, N), module.MULTIPLE)):
        raise mg.LaunchError(f"{module.TITLE} takes M, K, N multiples of {module.MULTIPLE} (its tiles have no "
                             f"edge guards); got M={M}, K={K}, N={N}")


def specialization(module, M, K, N):
    """The kernel module's specialization for M, K, N (module.specialize):
    LaunchError for sizes it does not take, TypeError if it returns
    something other than an mg.Specialization."""
    check_sizes(module, M, K, N)
    spec = module.specialize(M, K, N)
    if not isinstance(spec, mg.Specialization):
        raise TypeError(f"{module.__name__}.specialize({M}, {K}, {N}) returned {type(spec).__name__}, "
                        f"not an mg.Specialization")
    return spec


def specialize_tiles(module, M, K, N):
    """module.kernel specialized for M, K, N and its tile sizes module.TILES
    (BM, BN first), for the kernels without edge guards (check_sizes first)."""
    check_sizes(module, M, K, N)
    return module.kernel[(M, K, N, *module.TILES)]


def launch_tiles(module, A, B, C, alpha, beta, stream, threads):
    """module.specialize's kernel, one block of `threads` per BM x BN tile of C."""
    (m, k), n = A.shape, C.shape[1]
    bm, bn = module.TILES[:2]
    module.specialize(m, k, n)(A, B, C, alpha, beta, grid=(n // bn, m // bm), block=(threads,), stream=stream)


def ceil_div(a, b):
    return (a + b - 1) // b


def operands(M, K, N, seed=0):
    """Float32 A (M x K), B (K x N) and C (M x N) drawn from a normal distribution."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32),
            rng.standard_normal((M, N), dtype=np.float32))


def reference(A, B, C, alpha, beta):
    """alpha * A @ B + beta * C in float64."""
    return alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * C.astype(np.float64)


def relative_error(got, expected):
    return float(np.linalg.norm(np.asarray(got, np.float64) - expected) / np.linalg.norm(expected))


def time_ms(run, repeat=20, warmup=3, batch_ms=20.0):
    """Median milliseconds of one run().

    On the GPU: CUDA events around a batch of back-to-back runs, enough to
    fill about `batch_ms`, divided by the batch. With one run between two
    events, the host's time to reach the launch would fall between them and
    count as device time: tens of microseconds against a 0.35 ms kernel. On
    the CPU backend, where a launch runs to completion: the host clock."""
    for _ in range(warmup):
        run()
    on_gpu = mg.backend() == "cuda"
    batch = 1
    if on_gpu:
        start, end = mg.Event(), mg.Event()
        start.record()
        run()
        end.record()
        end.synchronize()
        batch = max(1, min(100, round(batch_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(repeat):
        if on_gpu:
            start, end = mg.Event(), mg.Event()
            start.record()
            for _ in range(batch):
                run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / batch)
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(module, argv=None):
    """The script of one kernel: checks it against NumPy and prints its time."""
    on_gpu = mg.backend() == "cuda"
    parser = argparse.ArgumentParser(description=f"SGEMM kernel: {module.TITLE}")
    parser.add_argument("sizes", nargs="*", type=int, metavar="M K N",
                        help="default 4096 4096 4096 on the GPU, 256 256 256 on the CPU")
    parser.add_argument("--repeat", type=int, default=20 if on_gpu else 2)
    args = parser.parse_args(argv)
    M, K, N = args.sizes or ((4096,) * 3 if on_gpu else (256,) * 3)
    alpha, beta = 1.5, -0.5
    A, B, C = operands(M, K, N)
    expected = reference(A, B, C, alpha, beta)
    dA, dB, dC = mg.to_device(A), mg.to_device(B), mg.to_device(C)
    module.launch(dA, dB, dC, alpha, beta)
    error = relative_error(dC.get(), expected)
    ms = time_ms(lambda: module.launch(dA, dB, dC, alpha, beta), repeat=args.repeat, warmup=1)
    print(f"{module.TITLE} ({mg.backend()}): {M}x{K}x{N}, {ms:.3f} ms, {2 * M * N * K / ms / 1e6:,.1f} GFLOP/s, "
          f"relative error {error:.1e}")
    if not error < 1e-5:
        sys.exit(f"{module.TITLE}: wrong result (relative error {error:.1e})")
    return error
