"""mlirgpu.ops.matmul against torch.matmul (cuBLAS), called as a user calls
them, in one run: for each shape both are checked against each other first,
then timed in interleaved rounds (a round: a batch of back-to-back calls of
each, between CUDA events); the table gives the medians, the ratio and the
kernel ops.matmul chose, and the geometric mean of the ratios.

    python benchmarks/matmul_sweep.py [--quick] [--dtype bf16|f16] [--rounds R]

Shapes: M in {1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192} x (N, K) in
{(4096, 4096), (8192, 8192), (4096, 14336)}, the squares 512^3 .. 8192^3
and an odd size; --quick a subset of them.
"""
import argparse
import math
import statistics
import sys

import torch

import mlirgpu.ops

gemm = sys.modules["mlirgpu.ops.gemm"]

ROWS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
WIDTHS = ((4096, 4096), (8192, 8192), (4096, 14336))
SQUARES = (512, 1024, 2048, 4096, 8192)
QUICK = [(1, 4096, 4096), (16, 8192, 8192), (128, 8192, 8192), (1024, 1024, 1024), (2048, 2048, 2048),
         (4096, 4096, 4096), (777, 1000, 520)]


def shapes(quick):
    """(M, N, K) triples."""
    if quick:
        return QUICK
    return ([(m, n, k) for m in ROWS for n, k in WIDTHS] + [(s, s, s) for s in SQUARES] + [(777, 1000, 520)])


def batch_ms(call, count):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / count


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    kind = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    print(f"{'M':>5} {'N':>6} {'K':>6}  {'mlirgpu us':>10} {'torch us':>9} {'ratio':>6}  kernel")
    ratios = []
    for m, n, k in shapes(args.quick):
        a = torch.randn((m, k), device="cuda", dtype=kind)
        b = torch.randn((k, n), device="cuda", dtype=kind)
        c = torch.empty((m, n), device="cuda", dtype=kind)
        ours = mlirgpu.ops.matmul(a, b, out=c).float()
        theirs = torch.matmul(a, b).float()
        error = ((ours - theirs).abs().max() / theirs.abs().max()).item()
        choice = gemm.choose(m, k, n, *gemm._device())
        label = f"{choice.kernel} {choice.mode or ''}".strip()
        if not error < 2e-2:
            print(f"{m:>5} {n:>6} {k:>6}  FAILED: relative difference {error:.2e} ({label})")
            continue
        # About 20 ms of work per batch.
        count = max(3, min(1000, int(20e-3 / max(2 * m * n * k / 500e12, 5e-6))))
        samples = {"ours": [], "torch": []}
        for _ in range(args.rounds):
            samples["ours"].append(batch_ms(lambda: mlirgpu.ops.matmul(a, b, out=c), count))
            samples["torch"].append(batch_ms(lambda: torch.matmul(a, b, out=c), count))
        ours_ms, torch_ms = statistics.median(samples["ours"]), statistics.median(samples["torch"])
        ratios.append(torch_ms / ours_ms)
        print(f"{m:>5} {n:>6} {k:>6}  {ours_ms * 1e3:>10.1f} {torch_ms * 1e3:>9.1f} {torch_ms / ours_ms:>6.2f}  {label}")
    if ratios:
        print(f"geometric mean of torch / mlirgpu time: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
