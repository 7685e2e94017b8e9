"""A whole-array sum in one launch with mg.grid.sync(), against the same sum in two launches.

    python benchmarks/grid_sync.py [--repeats 200] [--runs 9]

Both ways run the same device code (float32 in, float32 out): a persistent
grid of as many 256-thread blocks as the GPU holds at once
(`max_cooperative_grid_blocks`) strides over the array, each block reduces
its share (`mg.block.reduce`) to one partial per block; then one block adds
the partials. The sum in one launch has a grid barrier (`mg.grid.sync()`)
between the two steps, and is launched cooperatively; the two-launch way
launches a second kernel of one block for the last step, as one would
without a grid barrier. torch.sum is a third row where torch is importable.

Each figure is the median over the runs of (GPU time, from CUDA events on
the stream, for `repeats` sums in a row) / repeats, in microseconds; the
ratio is the two-launch time over the one-launch time (above 1: the grid
barrier is faster). Every result is checked against NumPy in float64.
"""
import argparse
import statistics

import numpy as np

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, grid_dim, thread_idx

BLOCK = 256
SIZES = [1 << 16, 1 << 20, 1 << 24, 1 << 26]

N, P = mg.generics("N P")   # elements, partials (one per block)


@mg.func
def block_partial(X, partial):
    i = block_idx.x * block_dim.x + thread_idx.x
    acc = mg.constant(0.0, mg.f32)
    while i < N:
        acc += X[i]
        i += grid_dim.x * block_dim.x
    total = mg.block.reduce(acc, "add")
    if thread_idx.x == 0:
        partial[block_idx.x] = total


@mg.func
def add_partials(partial, out):
    k = thread_idx.x
    acc = mg.constant(0.0, mg.f32)
    while k < P:
        acc += partial[k]
        k += block_dim.x
    total = mg.block.reduce(acc, "add")
    if thread_idx.x == 0:
        out[0] = total


@mg.kernel
def sum_in_one_launch(X: mg.memref[N, mg.f32], partial: mg.memref[P, mg.f32], out: mg.memref[1, mg.f32]):
    block_partial(X, partial)
    mg.grid.sync()
    if block_idx.x == 0:
        add_partials(partial, out)


@mg.kernel
def partial_sums(X: mg.memref[N, mg.f32], partial: mg.memref[P, mg.f32]):
    block_partial(X, partial)


@mg.kernel
def sum_of_partials(partial: mg.memref[P, mg.f32], out: mg.memref[1, mg.f32]):
    add_partials(partial, out)


def gpu_us(run, repeats, runs, stream):
    """Median over `runs` of the GPU time of `repeats` calls of run(), per call, in microseconds."""
    times = []
    for _ in range(runs):
        start, end = mg.Event(), mg.Event()
        start.record(stream)
        for _ in range(repeats):
            run()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / repeats)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    if mg.backend() != "cuda":
        raise SystemExit("this benchmark times GPU launches: it needs an NVIDIA GPU")
    try:
        import torch
    except ImportError:
        torch = None

    stream = mg.Stream(non_blocking=True)
    blocks = sum_in_one_launch[SIZES[0], 1].max_cooperative_grid_blocks(BLOCK)   # the same code for any N, P
    device = mg.cuda.Device(mg.cuda.current_device())
    print(f"{device.name}: {blocks} blocks of {BLOCK} threads resident at once")
    print(f"{'elements':>10} | {'one launch, grid.sync (us)':>26} | {'two launches (us)':>17} | "
          f"{'ratio':>6} | {'torch.sum (us)':>14}")
    for n in SIZES:
        host = np.random.default_rng(n).random(n, dtype=np.float32)
        expected = host.astype(np.float64).sum()
        X = mg.to_device(host)
        partial, out = mg.zeros((blocks,), mg.f32), mg.zeros((1,), mg.f32)

        def one():
            sum_in_one_launch(X, partial, out, grid=blocks, block=BLOCK, stream=stream)

        def two():
            partial_sums(X, partial, grid=blocks, block=BLOCK, stream=stream)
            sum_of_partials(partial, out, grid=1, block=1024, stream=stream)

        results = []
        for run in (one, two):
            out.fill(0)
            run()
            stream.synchronize()
            got = float(out.get()[0])
            assert abs(got - expected) <= 1e-4 * expected, (run.__name__, got, expected)
            results.append(gpu_us(run, args.repeats, args.runs, stream))
        peer = "-"
        if torch is not None:
            t = torch.from_numpy(host).cuda()
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                assert abs(float(t.sum()) - expected) <= 1e-4 * expected
                times = []
                for _ in range(args.runs):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(args.repeats):
                        t.sum()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e3 / args.repeats)
            peer = f"{statistics.median(times):.2f}"
        print(f"{n:>10} | {results[0]:>26.2f} | {results[1]:>17.2f} | {results[1] / results[0]:>6.2f} | {peer:>14}")


if __name__ == "__main__":
    main()
