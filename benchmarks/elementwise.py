"""Bandwidth of an element-wise kernel: out = a * x + y on float32.

    python benchmarks/elementwise.py [--log2n 28] [--repeats 15] [--batch 10]

Every row computes the same thing over the same x, y (2**log2n float32 each,
random) into one output, on the legacy default stream, and counts its bytes
as two reads and one write (12 bytes an element); the device-to-device copy
counts one read and one write. Each time is the median of `repeats` CUDA-event
measurements of `batch` back-to-back calls, after a warm-up, so the host's
call path overlaps the GPU's work as it does in a loop. Every row's output is
checked against torch's (or NumPy's) before it is timed; a row that fails
prints FAILED and is not timed.

Rows: @mg.vectorize with the direct mapping (the default, then other
threads/unroll shapes), with MLIR's parallel-loops mapping, and as peers in
the same run a device-to-device copy, torch.add(y, x, alpha=a, out=out) (one
fused kernel) and a CuPy ElementwiseKernel, each where importable.
"""
import argparse
import statistics
import sys

import numpy as np

import mlirgpu as mg

A = 1.5


def axpy(a, x, y):
    return a * x + y


def time_ms(call, repeats, batch):
    """Median over `repeats` of the event time of `batch` calls, per call."""
    call()
    mg.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = mg.Event(), mg.Event()
        start.record()
        for _ in range(batch):
            call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / batch)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    if not mg.cuda.is_available():
        sys.exit("benchmarks/elementwise.py needs an NVIDIA GPU (mlirgpu.cuda.is_available() is False)")
    n = 2 ** args.log2n
    device = mg.cuda.Device(mg.cuda.current_device())
    rng = np.random.default_rng(0)
    x = mg.to_device(rng.standard_normal(n, dtype=np.float32))
    y = mg.to_device(rng.standard_normal(n, dtype=np.float32))
    out = mg.empty((n,), mg.f32)

    try:
        import torch
    except ImportError:
        torch = None
    reference = None
    if torch is not None:
        tx, ty, tout = (torch.from_dlpack(a) for a in (x, y, out))
        reference = torch.add(ty, tx, alpha=A)

    def check():
        """The output against the reference: max |diff| (fused or not, float32 rounding)."""
        if reference is not None:
            return float((tout - reference).abs().max())
        got, xs, ys = out.get()[::4099], x.get()[::4099], y.get()[::4099]
        return float(np.abs(got - (np.float64(A) * xs + ys)).max())

    rows = []  # (name, call, bytes)

    def vectorized(**options):
        function = mg.vectorize(**options)(axpy)
        return lambda: function(A, x, y, out=out)

    rows.append(("mlirgpu vectorize, direct (default: 1024 threads, unroll 1)", vectorized(), 12 * n))
    for threads, unroll in ((256, 1), (512, 1), (256, 4), (128, 4), (256, 2), (512, 2), (128, 2)):
        rows.append((f"mlirgpu vectorize, direct ({threads} threads, unroll {unroll})",
                     vectorized(threads=threads, unroll=unroll), 12 * n))
    rows.append(("mlirgpu vectorize, parallel-loops (MLIR's mapping)", vectorized(mapping="parallel-loops"), 12 * n))
    rows.append(("device-to-device copy (cuMemcpyDtoD)", lambda: out.copy_from(x), 8 * n))
    if torch is not None:
        rows.append(("torch.add(y, x, alpha=a, out=out)", lambda: torch.add(ty, tx, alpha=A, out=tout), 12 * n))
    try:
        import cupy
        kernel = cupy.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 z", "z = a * x + y", "axpy")
        cx, cy, cout = (cupy.from_dlpack(a) for a in (x, y, out))
        rows.append(("CuPy ElementwiseKernel", lambda: kernel(np.float32(A), cx, cy, cout), 12 * n))
    except ImportError:
        pass

    results = []
    for name, call, nbytes in rows:
        try:
            call()
            mg.cuda.synchronize()
            error = check() if "copy" not in name else 0.0
        except Exception as failure:  # a row that cannot run is reported, not fatal
            results.append((name, None, f"FAILED: {type(failure).__name__}: {str(failure).splitlines()[0]}"))
            continue
        if error > 1e-5:
            results.append((name, None, f"FAILED: max |diff| {error:.3g}"))
            continue
        ms = time_ms(call, args.repeats, args.batch)
        results.append((name, ms, nbytes / (ms * 1e-3) / 1e12))

    torch_tbs = next((r[2] for r in results if r[0].startswith("torch") and r[1] is not None), None)
    print(f"\n### a * x + y, 2^{args.log2n} float32 ({12 * n / 2**30:.1f} GiB moved), {device.name}\n")
    print("| kernel | ms | TB/s | vs torch |")
    print("| --- | ---: | ---: | ---: |")
    for name, ms, value in results:
        if ms is None:
            print(f"| {name} | | {value} | |")
            continue
        ratio = f"{value / torch_tbs:.3f}" if torch_tbs else ""
        print(f"| {name} | {ms:.4f} | {value:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
