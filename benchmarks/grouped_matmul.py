"""mlirgpu.ops.grouped_matmul against torch._grouped_mm, called as a user
calls them, in one run: for each shape both are checked against each other
first, then timed in interleaved rounds (a round: a batch of back-to-back
calls of each, between CUDA events, host cost included); the table gives the
medians, the ratio and the kernel's throughput.

    python benchmarks/grouped_matmul.py [--dtype bf16|f16] [--rounds R]
    python benchmarks/grouped_matmul.py --fp8 [--rounds R]

Shapes, as mixture-of-experts layers have them: 8 experts x (16384 tokens,
K 4096, N 14336) and 64 experts x (32768 tokens, K 2048, N 1408), the
tokens routed unevenly (the same routing for both). Without
torch._grouped_mm (an older torch, or a GPU it does not run on) the peer is
a loop of torch.matmul over the groups.

With --fp8: mlirgpu.ops.scaled_grouped_matmul against
torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs,
out_dtype=torch.bfloat16), f8e4m3 inputs (b's matrices column-major) with a
scale per token and per expert and column, bf16 outputs, the groups' sizes
multiples of 16. The peer is called with use_fast_accum=True where torch
takes it (the accumulation wgmma's FP8 sums have in ours), and the header
says whether it was; a torch without the op, or whose signature differs,
is reported as such.
"""
import argparse
import inspect
import statistics

import torch

import mlirgpu.ops
from matmul_sweep import batch_ms   # the same timing as ops.matmul's sweep

SHAPES = [(8, 16384, 4096, 14336), (64, 32768, 2048, 1408)]


def routing(groups, tokens, seed=0, multiple=1):
    """Cumulative row ends of `groups` uneven groups of `tokens` rows (sizes
    multiples of `multiple`, where `tokens` is one), int32 on the GPU."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.rand(groups, generator=generator) + 0.5
    sizes = (weights / weights.sum() * tokens / multiple).floor().to(torch.int64) * multiple
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


def fp8_operands(groups, tokens, k, n):
    """a, b (its matrices column-major), scale_a, scale_b and offs as
    torch._scaled_grouped_mm takes them, the groups' sizes multiples of 16."""
    a = torch.randn((tokens, k), device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn((groups, n, k), device="cuda").to(torch.float8_e4m3fn).transpose(-2, -1)
    scale_a = torch.rand(tokens, device="cuda") + 0.5
    scale_b = torch.rand((groups, n), device="cuda") + 0.5
    return a, b, scale_a, scale_b, routing(groups, tokens, multiple=16)


def fp8_keywords():
    """The keywords torch._scaled_grouped_mm is called with: use_fast_accum=True
    where this torch takes it. A SystemExit saying what is wrong where torch
    has no such op or refuses both calls on a small product."""
    scaled_grouped_mm = getattr(torch, "_scaled_grouped_mm", None)
    if scaled_grouped_mm is None:
        raise SystemExit(f"--fp8: torch {torch.__version__} has no torch._scaled_grouped_mm to compare with")
    operands = fp8_operands(2, 64, 128, 128)
    errors = []
    for keywords in ({"out_dtype": torch.bfloat16, "use_fast_accum": True}, {"out_dtype": torch.bfloat16}):
        try:
            scaled_grouped_mm(*operands[:4], offs=operands[4], **keywords)
            return keywords
        except (TypeError, RuntimeError) as error:
            errors.append(f"with {', '.join(keywords)}: {type(error).__name__}: {error}")
    try:
        signature = str(inspect.signature(scaled_grouped_mm))
    except (TypeError, ValueError):
        signature = getattr(scaled_grouped_mm, "__doc__", None) or "(unknown)"
    raise SystemExit("--fp8: torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16) "
                     f"does not run as this benchmark calls it in torch {torch.__version__} (its signature: "
                     f"{signature}):\n  " + "\n  ".join(errors))


def grouped_calls(groups, tokens, k, n, kind):
    """(ours, the peer's name, theirs): the two products of one shape, as calls."""
    a = torch.randn((tokens, k), device="cuda", dtype=kind)
    b = torch.randn((groups, k, n), device="cuda", dtype=kind)
    offsets = routing(groups, tokens)
    c = torch.empty((tokens, n), device="cuda", dtype=kind)
    name, theirs = peer(a, b, offsets)
    return lambda: mlirgpu.ops.grouped_matmul(a, b, offsets, out=c), name, theirs


def fp8_calls(groups, tokens, k, n, keywords):
    """(ours, the peer's name, theirs) of the FP8 products of one shape."""
    a, b, scale_a, scale_b, offsets = fp8_operands(groups, tokens, k, n)
    c = torch.empty((tokens, n), device="cuda", dtype=torch.bfloat16)
    return (lambda: mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, out=c),
            "torch._scaled_grouped_mm",
            lambda: torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offsets, **keywords))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    parser.add_argument("--fp8", action="store_true",
                        help="scaled_grouped_matmul against torch._scaled_grouped_mm (f8e4m3 in, bf16 out)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    kind = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    if args.fp8:
        keywords = fp8_keywords()
        print(f"f8e4m3 x f8e4m3 -> bf16, row-wise scales; the peer with "
              f"use_fast_accum={keywords.get('use_fast_accum', False)}")
    print(f"{'G':>3} {'tokens':>6} {'K':>5} {'N':>6}  {'mlirgpu us':>10} {'peer us':>9} {'ratio':>6} "
          f"{'TFLOP/s':>7}  peer")
    for groups, tokens, k, n in SHAPES:
        if args.fp8:
            ours_call, name, theirs = fp8_calls(groups, tokens, k, n, keywords)
        else:
            ours_call, name, theirs = grouped_calls(groups, tokens, k, n, kind)
        ours = ours_call().float()
        try:
            expected = theirs().float()
        except RuntimeError as error:     # the peer refuses this shape
            print(f"{groups:>3} {tokens:>6} {k:>5} {n:>6}  FAILED: {name} refused it: {error}")
            continue
        error = ((ours - expected).abs().max() / expected.abs().max()).item()
        if not error < 2e-2:
            print(f"{groups:>3} {tokens:>6} {k:>5} {n:>6}  FAILED: relative difference {error:.2e} against {name}")
            continue
        flops = 2 * tokens * k * n
        # About 20 ms of work per batch.
        count = max(3, int(20e-3 / (flops / (1000e12 if args.fp8 else 500e12))))
        samples = {"ours": [], "peer": []}
        for _ in range(args.rounds):
            samples["ours"].append(batch_ms(ours_call, count))
            samples["peer"].append(batch_ms(theirs, count))
        ours_ms, peer_ms = statistics.median(samples["ours"]), statistics.median(samples["peer"])
        print(f"{groups:>3} {tokens:>6} {k:>5} {n:>6}  {ours_ms * 1e3:>10.1f} {peer_ms * 1e3:>9.1f} "
              f"{peer_ms / ours_ms:>6.2f} {flops / ours_ms / 1e9:>7.0f}  {name}")


if __name__ == "__main__":
    main()
