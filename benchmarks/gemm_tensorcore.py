"""Half-precision GEMM on the tensor cores: mlirgpu's kernels against cuBLAS
and Triton, measured in the same run.

    python benchmarks/gemm_tensorcore.py [--sizes MxNxK ...] [--dtypes bf16,f16] [--repeat R] [--out DIR] [--no-write]

- Problems: C = A @ B with A (M x K) and B (K x N) row-major, C in the
  inputs' type (bf16 or fp16), accumulated in f32; default sizes 4096^3,
  8192^3 and the LLM-like 4096x4096x14336, 8192x8192x1024, 16384x4096x4096.
- Rows: cuBLAS (torch.matmul), Triton (the autotuned matmul of
  benchmarks/sgemm.py, run on these dtypes), and the Hopper GEMM of
  examples/tensorcore/hopper_gemm.py (sm_90a only): each of its CONFIGS is
  timed and the fastest reported, with its name. Tensor maps are made once
  per problem, outside the timing, as a library would cache them.
- Checks, before any timing: every result against cuBLAS's, max |error| /
  max |C| below 2e-2 (the rounding of bf16 outputs); a result over it, or an
  exception, is reported as FAILED and not timed.
- Time: the median of --repeat samples (examples/sgemm/common.time_ms:
  batches of back-to-back launches between CUDA events on the default
  stream); TFLOP/s = 2 M N K / time; % of cuBLAS and % of Triton are ratios
  of times measured in this run.

It prints the table and, unless --no-write, writes it with the GPU, driver
and command line to OUT/gemm_tensorcore_h100.md and a bar chart to
OUT/gemm_tensorcore_h100.png (matplotlib; OUT is --out, default docs/).
"""
import argparse
import datetime
import os
import shlex
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(1, os.path.join(ROOT, "examples", "sgemm"))
sys.path.insert(2, os.path.join(ROOT, "examples", "tensorcore"))
sys.path.insert(3, os.path.join(ROOT, "benchmarks"))

import mlirgpu as mg  # noqa: E402
import common  # noqa: E402
import hopper_gemm  # noqa: E402
from sgemm import TRITON_MISSING, triton_matmul  # noqa: E402

DEFAULT_SIZES = ("4096x4096x4096", "8192x8192x8192", "4096x4096x14336", "8192x8192x1024", "16384x4096x4096")
TOLERANCE = 2e-2
FILE_NAME = "gemm_tensorcore_h100"
CUBLAS, TRITON = "cuBLAS", "Triton"


def parse_size(text):
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is MxNxK, e.g. 8192x8192x8192, not {text!r}") from None
    return m, n, k


class Row:
    def __init__(self, name, ms=None, error=None, detail=""):
        self.name, self.ms, self.error, self.detail = name, ms, error, detail


def measure(name, run, out, expected, repeat, torch):
    """Row of `run` (which writes `out`), checked against `expected`, then timed."""
    try:
        run()
        torch.cuda.synchronize()
        got = out.float()
        error = ((got - expected).abs().max() / expected.abs().max()).item()
        if not error < TOLERANCE:
            return Row(name, error=f"FAILED: error {error:.2e}")
        return Row(name, common.time_ms(run, repeat=repeat))
    except Exception as exc:  # reported in the table: one failing row must not hide the others
        return Row(name, error=f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")


def problem(torch, size, dtype, repeat):
    M, N, K = size
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    generator = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=torch_dtype, generator=generator)
    B = torch.randn(K, N, device="cuda", dtype=torch_dtype, generator=generator)
    C = torch.empty(M, N, device="cuda", dtype=torch_dtype)
    reference = (A @ B).float()
    rows = [measure(CUBLAS, lambda: torch.matmul(A, B, out=C), C, reference, repeat, torch)]
    if TRITON_MISSING is None:
        rows.append(measure(TRITON, lambda: triton_matmul(A, B, C), C, reference, repeat, torch))
    if mg.cuda.Device(mg.cuda.current_device()).chip == "sm_90a":
        best = None
        for config in hopper_gemm.CONFIGS:
            maps = hopper_gemm.prepare(mg.asarray(A), mg.asarray(B), config)
            row = measure("mlirgpu Hopper", lambda: hopper_gemm.matmul(A, B, C=C, config=config, maps=maps),
                          C, reference, repeat, torch)
            row.detail = repr(config)
            if best is None or (row.ms is not None and (best.ms is None or row.ms < best.ms)):
                best = row
        rows.append(best)
    return rows


def percent(ms, peer):
    return f"{100 * peer.ms / ms:.1f}%" if ms is not None and peer is not None and peer.ms else "-"


def table(results):
    lines = ["| dtype | M x N x K | kernel | ms | TFLOP/s | % of cuBLAS | % of Triton | config |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for (dtype, size), rows in results:
        peers = {r.name: r for r in rows if r.name in (CUBLAS, TRITON)}
        flops = 2 * size[0] * size[1] * size[2]
        for r in rows:
            label = "x".join(map(str, size))
            if r.ms is None:
                lines.append(f"| {dtype} | {label} | {r.name} | {r.error} | | | | {r.detail} |")
                continue
            lines.append(f"| {dtype} | {label} | {r.name} | {r.ms:.3f} | {flops / r.ms / 1e9:.1f} | "
                         f"{percent(r.ms, peers.get(CUBLAS))} | {percent(r.ms, peers.get(TRITON))} | {r.detail} |")
    return "\n".join(lines)


def chart(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{dtype}\n{'x'.join(map(str, size))}" for (dtype, size), _ in results]
    names = [CUBLAS, TRITON, "mlirgpu Hopper"]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(labels)), 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = []
        for (dtype, size), rows in results:
            row = next((r for r in rows if r.name == name and r.ms), None)
            values.append(2 * size[0] * size[1] * size[2] / row.ms / 1e9 if row else 0)
        ax.bar(np.arange(len(labels)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(labels)) + width, labels, fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("Half-precision GEMM, f32 accumulate")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(s) for s in DEFAULT_SIZES])
    parser.add_argument("--dtypes", default="bf16,f16")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("this benchmark compares with cuBLAS through torch, which is not installed")
        return 1
    if not mg.cuda.is_available() or not torch.cuda.is_available():
        print("no GPU: nothing to measure")
        return 1
    results = []
    for dtype in args.dtypes.split(","):
        for size in args.sizes:
            results.append(((dtype, size), problem(torch, size, dtype, args.repeat)))
            print("\n".join(table(results[-1:]).splitlines()[2:]), flush=True)
    text = table(results)
    print()
    print(text)
    if TRITON_MISSING is not None:
        print(f"\nTriton: not measured ({TRITON_MISSING})")
    if not args.no_write:
        os.makedirs(args.out, exist_ok=True)
        device = mg.cuda.Device(mg.cuda.current_device())
        image = f"{FILE_NAME}.png"
        has_chart = chart(results, os.path.join(args.out, image))
        with open(os.path.join(args.out, f"{FILE_NAME}.md"), "w") as f:
            f.write(f"# Half-precision GEMM on {device.name}\n\n")
            f.write(f"Measured {datetime.date.today()} with CUDA driver {mg.cuda.driver_version()}, "
                    f"torch {torch.__version__}: `{shlex.join(['python'] + sys.argv)}`\n\n")
            f.write(text + "\n")
            if has_chart:
                f.write(f"\n![TFLOP/s]({image})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
