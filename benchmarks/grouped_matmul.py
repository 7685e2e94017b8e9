"""mlirgpu.ops.grouped_matmul against torch._grouped_mm, called as a user
calls them, in one run: for each shape both are checked against each other
first, then timed in interleaved rounds (a round: a batch of back-to-back
calls of each, between CUDA events, host cost included); the table gives the
medians, the ratio and the kernel's throughput.

    python benchmarks/grouped_matmul.py [--dtype bf16|f16] [--rounds R]

Shapes, as mixture-of-experts layers have them: 8 experts x (16384 tokens,
K 4096, N 14336) and 64 experts x (32768 tokens, K 2048, N 1408), the
tokens routed unevenly (the same routing for both). Without
torch._grouped_mm (an older torch, or a GPU it does not run on) the peer is
a loop of torch.matmul over the groups.
"""
import argparse
import statistics

import torch

import mlirgpu.ops
from matmul_sweep import batch_ms   # the same timing as ops.matmul's sweep

SHAPES = [(8, 16384, 4096, 14336), (64, 32768, 2048, 1408)]


def routing(groups, tokens, seed=0):
    """Cumulative row ends of `groups` uneven groups of `tokens` rows, int32 on the GPU."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.rand(groups, generator=generator) + 0.5
    sizes = (weights / weights.sum() * tokens).floor().to(torch.int64)
    sizes[-1] += tokens - sizes.sum()
    return torch.cumsum(sizes, 0).to(torch.int32).cuda()


def peer(a, b, offsets):
    """torch._grouped_mm where it runs (with b as given, or its matrices
    column-major, which some versions want), else a loop of torch.matmul
    (which reads the offsets on the host)."""
    for operand, layout in ((b, ""), (b.transpose(1, 2).contiguous().transpose(1, 2), ", b column-major")):
        try:
            torch._grouped_mm(a, operand, offs=offsets)
            return f"torch._grouped_mm{layout}", lambda operand=operand: torch._grouped_mm(a, operand, offs=offsets)
        except (AttributeError, RuntimeError):
            continue
    ends = offsets.tolist()

    def loop():
        c, begin = torch.empty((a.shape[0], b.shape[2]), dtype=a.dtype, device=a.device), 0
        for g, end in enumerate(ends):
            torch.matmul(a[begin:end], b[g], out=c[begin:end])
            begin = end
        return c
    return "torch.matmul per group", loop


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    kind = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    print(f"{'G':>3} {'tokens':>6} {'K':>5} {'N':>6}  {'mlirgpu us':>10} {'peer us':>9} {'ratio':>6} "
          f"{'TFLOP/s':>7}  peer")
    for groups, tokens, k, n in SHAPES:
        a = torch.randn((tokens, k), device="cuda", dtype=kind)
        b = torch.randn((groups, k, n), device="cuda", dtype=kind)
        offsets = routing(groups, tokens)
        c = torch.empty((tokens, n), device="cuda", dtype=kind)
        name, theirs = peer(a, b, offsets)
        ours = mlirgpu.ops.grouped_matmul(a, b, offsets, out=c).float()
        expected = theirs().float()
        error = ((ours - expected).abs().max() / expected.abs().max()).item()
        if not error < 2e-2:
            print(f"{groups:>3} {tokens:>6} {k:>5} {n:>6}  FAILED: relative difference {error:.2e} against {name}")
            continue
        flops = 2 * tokens * k * n
        count = max(3, int(20e-3 / (flops / 500e12)))    # about 20 ms of work per batch
        samples = {"ours": [], "peer": []}
        for _ in range(args.rounds):
            samples["ours"].append(batch_ms(lambda: mlirgpu.ops.grouped_matmul(a, b, offsets, out=c), count))
            samples["peer"].append(batch_ms(theirs, count))
        ours_ms, peer_ms = statistics.median(samples["ours"]), statistics.median(samples["peer"])
        print(f"{groups:>3} {tokens:>6} {k:>5} {n:>6}  {ours_ms * 1e3:>10.1f} {peer_ms * 1e3:>9.1f} "
              f"{peer_ms / ours_ms:>6.2f} {flops / ours_ms / 1e9:>7.0f}  {name}")


if __name__ == "__main__":
    main()
