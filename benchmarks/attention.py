"""Attention forward on the tensor cores: mlirgpu.ops.attention against torch's
scaled_dot_product_attention with its FlashAttention and cuDNN backends,
measured in the same run.

    python benchmarks/attention.py [--quick] [--rounds R]

- Problems: bf16, head dims 64 and 128, without and with the causal mask,
  16k tokens a batch: B = 16384 / L sequences of L = 1024, 4096, 16384,
  H = 2048 / head_dim heads (as many query as key/value heads); q, k and v
  (B, L, H, d), uniform in [-1, 1). `--quick`: L = 4096 only.
- Rows: mlirgpu.ops.attention(q, k, v, causal=...) on the torch tensors, as
  a user calls it (its host work included): on an sm_90a GPU its Hopper
  kernel (ops/attention_sm90.py), and in the row "mlirgpu FA2" the same call
  with that kernel turned off (the mma.sync kernel every other GPU runs);
  and torch's SDPA on the same
  memory seen as (B, H, L, d) (`q.transpose(1, 2)`), under
  sdpa_kernel(SDPBackend.FLASH_ATTENTION) and (CUDNN_ATTENTION).
- Checks, before any timing: each row's output against the FlashAttention
  backend's (cuDNN's where that one fails), max |difference| below 2e-2; a row over it, or one that
  raises, is reported as FAILED with the reason and not timed.
- Time: --rounds rounds (default 15) after a warm-up; in each round every row
  runs one sample in turn (interleaved, so that clocks and temperature
  drifts fall on all rows alike): a batch of back-to-back calls (about
  20 ms) between two torch.cuda.synchronize(), on the host clock, divided by
  the batch. The table has each row's median; TFLOP/s = 4 B H L^2 d, halved
  when causal, over that time; the ratios are mlirgpu's TFLOP/s over cuDNN's
  and over FlashAttention's.

Needs a CUDA GPU and torch.
"""
import argparse
import statistics
import sys
import time
from unittest import mock

import checkout  # noqa: E402,F401 (mlirgpu: the installed package, else this checkout's)

import mlirgpu.ops  # noqa: E402
from mlirgpu.ops import attention_sm90  # noqa: E402

TOKENS, WIDTH = 16384, 2048      # tokens a batch, heads x head_dim
LENGTHS, QUICK_LENGTHS = (1024, 4096, 16384), (4096,)
HEAD_DIMS = (64, 128)
TOLERANCE = 2e-2
MLIRGPU, FA2, FLASH, CUDNN = "mlirgpu", "mlirgpu FA2", "SDPA flash", "SDPA cuDNN"


def rows(torch, causal):
    """(name, run(q, k, v) -> output (B, L, H, d)) of each implementation."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                    is_causal=causal).transpose(1, 2)
        return run

    def fa2(q, k, v):
        with mock.patch.object(attention_sm90, "supported", lambda *args: False):
            return mlirgpu.ops.attention(q, k, v, causal=causal)

    return [(MLIRGPU, lambda q, k, v: mlirgpu.ops.attention(q, k, v, causal=causal)), (FA2, fa2),
            (FLASH, sdpa(SDPBackend.FLASH_ATTENTION)), (CUDNN, sdpa(SDPBackend.CUDNN_ATTENTION))]


def sample_ms(torch, run, batch):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(batch):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / batch


def measure(torch, length, d, causal, rounds):
    """{name: median ms or 'FAILED: why'} of one problem."""
    batch, heads = TOKENS // length, WIDTH // d
    q, k, v = (torch.rand(batch, length, heads, d, device="cuda", dtype=torch.bfloat16) * 2 - 1 for _ in range(3))
    results, runs = {}, {}
    for name, run in rows(torch, causal):
        try:
            runs[name] = (lambda run=run: run(q, k, v)), run(q, k, v).float()
        except Exception as error:  # a backend this GPU or torch does not have: report it, time the others
            results[name] = f"FAILED: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:80]}"
    reference = FLASH if FLASH in runs else CUDNN
    for name, (run, out) in list(runs.items()):
        if name != reference and reference in runs:
            error = (out - runs[reference][1]).abs().max().item()
            if not error <= TOLERANCE:
                results[name] = f"FAILED: max |difference| from {reference} {error:.3g}"
                del runs[name]
    batches = {}
    for name, (run, _) in runs.items():
        batches[name] = max(1, min(200, round(20.0 / max(sample_ms(torch, run, 1), 1e-3))))
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (run, _) in runs.items():
            samples[name].append(sample_ms(torch, run, batches[name]))
    results.update({name: statistics.median(times) for name, times in samples.items()})
    return results


def tflops(length, d, causal, ms):
    batch, heads = TOKENS // length, WIDTH // d
    return 4 * batch * heads * length * length * d / (2 if causal else 1) / (ms * 1e-3) / 1e12


def cell(result, length, d, causal):
    return result if isinstance(result, str) else f"{tflops(length, d, causal, result):.1f}"


def ratio(results, peer):
    mine, theirs = results.get(MLIRGPU), results.get(peer)
    if isinstance(mine, float) and isinstance(theirs, float):
        return f"{theirs / mine:.2f}"    # time ratio = throughput ratio mlirgpu / peer
    return "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"L = {QUICK_LENGTHS[0]} only")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timed rounds (default 15)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks/attention.py needs torch (its SDPA is the peer)")
    if not torch.cuda.is_available():
        sys.exit("benchmarks/attention.py needs a CUDA GPU")
    print(f"attention forward, bf16, {TOKENS} tokens a batch, heads x head_dim = {WIDTH}, "
          f"on {torch.cuda.get_device_name()} (TFLOP/s, median of {args.rounds} interleaved rounds)")
    header = (f"{'L':>6} {'B':>3} {'H':>3} {'d':>4} {'causal':>6} | {MLIRGPU:>8} {FA2:>11} {FLASH:>10} {CUDNN:>10} | "
              f"{'mlirgpu/cuDNN':>13} {'mlirgpu/flash':>13}")
    print(header)
    print("-" * len(header))
    for length in QUICK_LENGTHS if args.quick else LENGTHS:
        for d in HEAD_DIMS:
            for causal in (False, True):
                results = measure(torch, length, d, causal, args.rounds)
                cells = [cell(results[name], length, d, causal) for name in (MLIRGPU, FA2, FLASH, CUDNN)]
                print(f"{length:>6} {TOKENS // length:>3} {WIDTH // d:>3} {d:>4} {str(causal):>6} | "
                      f"{cells[0]:>8} {cells[1]:>11} {cells[2]:>10} {cells[3]:>10} | "
                      f"{ratio(results, CUDNN):>13} {ratio(results, FLASH):>13}", flush=True)
                for name, result in results.items():
                    if isinstance(result, str):
                        print(f"    {name}: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
