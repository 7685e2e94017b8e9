"""Attention on the tensor cores: mlirgpu.ops.attention (forward, decoding)
and mlirgpu.ops.attention_backward against torch's
scaled_dot_product_attention with its FlashAttention and cuDNN backends,
measured in the same run.

    python benchmarks/attention.py [--quick] [--rounds R] [--dtype bf16|f16] [--head-dims D ...]
                                   [--forward | --decode | --fp8 | --train]

- Problems: bf16 (--dtype f16: fp16), head dims 64 and 128 (--head-dims: any
  of 64, 128 and 256), without and with the causal mask,
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

- Backward: the same problems (L = 4096 only with --quick, causal and not),
  mlirgpu.ops.attention_backward(dout, q, k, v, out, lse) against SDPA's
  backward (torch.autograd.grad of the backend's output, its forward done
  once and kept); TFLOP/s count 2.5 times the forward's products; dq, dk, dv
  checked against the flash backend's (cuDNN's where that one fails).
- Forward plus backward (`--train`, this table only): the step of a
  training loop, as users write it: the output of mlirgpu.ops.attention on
  q, k and v that require grad (the torch custom op) and then
  torch.autograd.grad(out, (q, k, v), dout), against the same two calls on
  each SDPA backend's output; TFLOP/s count 3.5 forwards (the forward's and
  the backward's 2.5); the gradients checked as the backward's are.
- Decoding: one query a sequence against a K/V cache, bf16, d = 128, 32 query
  heads on 4 key/value heads (8:1), batches of 1 to 64 sequences with caches
  of 8k to 128k keys: mlirgpu (the group's query heads in one block, keys
  split among blocks, merged by a second kernel) and SDPA's backends with
  enable_gqa, in GB/s of K and V read; beside them a device-to-device copy
  of the cache (torch's copy_), whose GB/s count the bytes it reads and
  writes: the memory's bandwidth on this GPU. `--decode`: these rows only;
  `--forward`: the forward's rows only.
- FP8 (`--fp8`, this table only): the forward's problems with q, k and v
  quantized to e4m3 with per-tensor descales (powers of two: the largest
  |x| / 448 rounded up), mlirgpu.ops.attention(q8, k8, v8, descale_q=...,
  ...) (the descales as floats; bf16 output, V^T written in each call) beside the bf16 forward
  (mlirgpu) and SDPA cuDNN on the dequantized values in bf16 (exact: e4m3
  values times powers of two); checked before timing, the FP8 output within
  TOLERANCE of mlirgpu's bf16 output, whose max |difference| the table
  prints ("err vs bf16").

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
# The FP8 forward rounds P to e4m3 (3 bits of mantissa), each value by up to 2^-4 of itself: a row
# that sees few keys (causal) passes that to its output as up to 2^-4 of |v|'s largest, 1 here.
FP8_TOLERANCE = 2 ** -4 + TOLERANCE
MLIRGPU, FA2, FLASH, CUDNN = "mlirgpu", "mlirgpu FA2", "SDPA flash", "SDPA cuDNN"
FP8 = "mlirgpu FP8"


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


def checked(torch, named, tolerances=None):
    """({name: (run, outputs)}, {name: 'FAILED: why'}) of `named` (name, run): each
    run once, its outputs (a tensor or a tuple) compared with the flash
    backend's (cuDNN's where that one failed), within TOLERANCE or the name's
    entry of `tolerances`."""
    results, runs = {}, {}
    for name, run in named:
        try:
            out = run()
            runs[name] = run, [x.float() for x in (out if isinstance(out, tuple) else (out,))]
        except Exception as error:  # a backend this GPU or torch does not have: report it, time the others
            results[name] = f"FAILED: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:80]}"
    reference = FLASH if FLASH in runs else CUDNN
    for name, (run, outs) in list(runs.items()):
        if name != reference and reference in runs:
            error = max((a - b).abs().max().item() for a, b in zip(outs, runs[reference][1]))
            if not error <= (tolerances or {}).get(name, TOLERANCE):
                results[name] = f"FAILED: max |difference| from {reference} {error:.3g}"
                del runs[name]
    return runs, results


def measure(torch, length, d, causal, rounds, dtype):
    """{name: median ms or 'FAILED: why'} of one forward problem."""
    batch, heads = TOKENS // length, WIDTH // d
    q, k, v = (torch.rand(batch, length, heads, d, device="cuda", dtype=dtype) * 2 - 1 for _ in range(3))
    runs, results = checked(torch, [(name, lambda run=run: run(q, k, v)) for name, run in rows(torch, causal)])
    return timed(torch, runs, results, rounds)


def measure_backward(torch, length, d, causal, rounds, dtype):
    """{name: median ms or 'FAILED: why'} of one backward problem."""
    batch, heads = TOKENS // length, WIDTH // d
    q, k, v = (torch.rand(batch, length, heads, d, device="cuda", dtype=dtype) * 2 - 1 for _ in range(3))
    dout = torch.rand_like(q) * 2 - 1
    named = []
    for name, run in rows(torch, causal):
        if name == MLIRGPU:
            out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, return_lse=True)
            named.append((name, lambda out=out, lse=lse: mlirgpu.ops.attention_backward(dout, q, k, v, out, lse,
                                                                                     causal=causal)))
            continue
        try:
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            out = run(*leaves)
        except Exception:  # reported by checked() when it runs again
            named.append((name, lambda run=run: run(q, k, v)))
            continue
        named.append((name, lambda out=out, leaves=leaves: torch.autograd.grad(out, leaves, dout, retain_graph=True)))
    runs, results = checked(torch, named)
    return timed(torch, runs, results, rounds)


def measure_train(torch, length, d, causal, rounds, dtype):
    """{name: median ms or 'FAILED: why'} of one forward-plus-backward problem."""
    batch, heads = TOKENS // length, WIDTH // d
    leaves = [(torch.rand(batch, length, heads, d, device="cuda", dtype=dtype) * 2 - 1).requires_grad_()
              for _ in range(3)]
    dout = torch.rand_like(leaves[0]) * 2 - 1

    def step(run):
        return lambda: torch.autograd.grad(run(*leaves), leaves, dout)

    named = [(name, step(run)) for name, run in rows(torch, causal) if name != FA2]
    runs, results = checked(torch, named)
    return timed(torch, runs, results, rounds)


def quantized(torch, x):
    """x as e4m3 and its descale: a power of two, so that the dequantized values are exact in bf16."""
    descale = 2.0 ** torch.ceil(torch.log2(x.abs().max().float() / 448.0))
    return (x.float() / descale).to(torch.float8_e4m3fn), descale.reshape(1)


def measure_fp8(torch, length, d, causal, rounds):
    """({name: median ms or 'FAILED: why'}, max |FP8 - bf16|) of one FP8 forward problem."""
    batch, heads = TOKENS // length, WIDTH // d
    stored = [quantized(torch, torch.rand(batch, length, heads, d, device="cuda") * 2 - 1) for _ in range(3)]
    (q8, dq), (k8, dk), (v8, dv) = stored
    q, k, v = ((x.float() * s).to(torch.bfloat16) for x, s in stored)
    dq, dk, dv = dq.item(), dk.item(), dv.item()     # floats: a tensor's would be read back in each call
    named = dict(rows(torch, causal))
    runs, results = checked(torch, [
        (MLIRGPU, lambda: named[MLIRGPU](q, k, v)), (CUDNN, lambda: named[CUDNN](q, k, v)),
        (FP8, lambda: mlirgpu.ops.attention(q8, k8, v8, causal=causal, descale_q=dq, descale_k=dk, descale_v=dv))],
        {FP8: FP8_TOLERANCE})
    error = None
    if FP8 in runs and MLIRGPU in runs:
        error = (runs[FP8][1][0] - runs[MLIRGPU][1][0]).abs().max().item()
        if not error <= FP8_TOLERANCE:
            results[FP8] = f"FAILED: max |difference| from {MLIRGPU} {error:.3g}"
            del runs[FP8]
    return timed(torch, runs, results, rounds), error


def fp8_ratio(results, peer):
    mine, theirs = results.get(FP8), results.get(peer)
    return f"{theirs / mine:.2f}" if isinstance(mine, float) and isinstance(theirs, float) else "-"


DECODE = dict(hq=32, hk=4, d=128)
DECODE_SHAPES = ((1, 131072), (8, 8192), (8, 32768), (8, 131072), (64, 8192), (64, 32768))   # (batch, cache)
QUICK_DECODE_SHAPES = ((8, 32768),)
COPY = "d2d copy"


def measure_decode(torch, batch, length, rounds):
    """{name: median ms or 'FAILED: why'} of one decode step of `batch` sequences against caches of `length` keys."""
    hq, hk, d = DECODE["hq"], DECODE["hk"], DECODE["d"]
    q = torch.rand(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    k, v = (torch.rand(batch, length, hk, d, device="cuda", dtype=torch.bfloat16) * 2 - 1 for _ in range(2))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                    enable_gqa=True).transpose(1, 2)
        return run

    runs, results = checked(torch, [(MLIRGPU, lambda: mlirgpu.ops.attention(q, k, v)),
                                    (FLASH, sdpa(SDPBackend.FLASH_ATTENTION)), (CUDNN, sdpa(SDPBackend.CUDNN_ATTENTION))])
    cache = torch.cat([k, v])
    target = torch.empty_like(cache)
    runs[COPY] = (lambda: target.copy_(cache)), None
    return timed(torch, runs, results, rounds)


def timed(torch, runs, results, rounds):
    """results with the median ms of each of `runs`, measured in interleaved rounds."""
    batches = {}
    for name, (run, _) in runs.items():
        batches[name] = max(1, min(200, round(20.0 / max(sample_ms(torch, run, 1), 1e-3))))
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (run, _) in runs.items():
            samples[name].append(sample_ms(torch, run, batches[name]))
    results.update({name: statistics.median(times) for name, times in samples.items()})
    return results


def tflops(length, d, causal, ms, work=1.0):
    batch, heads = TOKENS // length, WIDTH // d
    return work * 4 * batch * heads * length * length * d / (2 if causal else 1) / (ms * 1e-3) / 1e12


def cell(result, length, d, causal, work=1.0):
    return result if isinstance(result, str) else f"{tflops(length, d, causal, result, work):.1f}"


def decode_rate(result, name, batch, length):
    """GB/s of the K/V cache read (read and written by the copy), or the failure."""
    if isinstance(result, str):
        return result
    nbytes = 2 * batch * length * DECODE["hk"] * DECODE["d"] * 2 * (2 if name == COPY else 1)
    return nbytes / (result * 1e-3) / 1e9


def ratio(results, peer):
    mine, theirs = results.get(MLIRGPU), results.get(peer)
    if isinstance(mine, float) and isinstance(theirs, float):
        return f"{theirs / mine:.2f}"    # time ratio = throughput ratio mlirgpu / peer
    return "-"


def rate_ratio(rates, peer):
    mine, theirs = rates[MLIRGPU], rates[peer]
    return f"{mine / theirs:.2f}" if isinstance(mine, float) and isinstance(theirs, float) else "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"L = {QUICK_LENGTHS[0]} only")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timed rounds (default 15)")
    parser.add_argument("--decode", action="store_true", help="the decoding rows only")
    parser.add_argument("--forward", action="store_true", help="the forward rows only")
    parser.add_argument("--fp8", action="store_true", help="the FP8 forward beside the bf16 one only")
    parser.add_argument("--train", action="store_true", help="the forward-plus-backward rows only")
    parser.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS), choices=[64, 128, 256],
                        help="head dims of the forward and backward rows (default 64 128)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"],
                        help="q, k and v of the forward and backward rows (default bf16; decoding is bf16)")
    args = parser.parse_args(argv)
    if args.decode + args.forward + args.fp8 + args.train > 1:
        parser.error("--decode, --forward, --fp8 and --train each keep one table only: give one of them")
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks/attention.py needs torch (its SDPA is the peer)")
    if not torch.cuda.is_available():
        sys.exit("benchmarks/attention.py needs a CUDA GPU")
    if args.fp8:
        return main_fp8(torch, args)
    if args.train:
        return main_train(torch, args)
    if not args.decode:
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
        print(f"attention forward, {args.dtype}, {TOKENS} tokens a batch, heads x head_dim = {WIDTH}, "
              f"on {torch.cuda.get_device_name()} (TFLOP/s, median of {args.rounds} interleaved rounds)")
        header = (f"{'L':>6} {'B':>3} {'H':>3} {'d':>4} {'causal':>6} | {MLIRGPU:>8} {FA2:>11} {FLASH:>10} {CUDNN:>10} | "
                  f"{'mlirgpu/cuDNN':>13} {'mlirgpu/flash':>13}")
        print(header)
        print("-" * len(header))
        for length in QUICK_LENGTHS if args.quick else LENGTHS:
            for d in args.head_dims:
                for causal in (False, True):
                    results = measure(torch, length, d, causal, args.rounds, dtype)
                    cells = [cell(results[name], length, d, causal) for name in (MLIRGPU, FA2, FLASH, CUDNN)]
                    print(f"{length:>6} {TOKENS // length:>3} {WIDTH // d:>3} {d:>4} {str(causal):>6} | "
                          f"{cells[0]:>8} {cells[1]:>11} {cells[2]:>10} {cells[3]:>10} | "
                          f"{ratio(results, CUDNN):>13} {ratio(results, FLASH):>13}", flush=True)
                    report(results)
    if not (args.decode or args.forward):
        print()
        gradient_table(torch, args, f"attention backward, {args.dtype} (dq, dk, dv; TFLOP/s count 2.5 forwards)",
                       measure_backward, 2.5)
    if args.forward:
        return 0
    print(f"\ndecoding: 1 query, {DECODE['hq']} query heads on {DECODE['hk']} key/value heads, d = {DECODE['d']}, "
          f"bf16, on {torch.cuda.get_device_name()} (GB/s of the K/V cache read, the copy's read and written; "
          f"median of {args.rounds} interleaved rounds)")
    header = (f"{'B':>3} {'cache':>6} | {MLIRGPU:>8} {FLASH:>10} {CUDNN:>10} {COPY:>9} | {'mlirgpu/copy':>12} "
              f"{'mlirgpu/flash':>13}")
    print(header)
    print("-" * len(header))
    for batch, length in QUICK_DECODE_SHAPES if args.quick else DECODE_SHAPES:
        results = measure_decode(torch, batch, length, args.rounds)
        rates = {name: decode_rate(results[name], name, batch, length) for name in (MLIRGPU, FLASH, CUDNN, COPY)}
        cells = [rate if isinstance(rate, str) else f"{rate:.0f}" for rate in rates.values()]
        print(f"{batch:>3} {length:>6} | {cells[0]:>8} {cells[1]:>10} {cells[2]:>10} {cells[3]:>9} | "
              f"{rate_ratio(rates, COPY):>12} {rate_ratio(rates, FLASH):>13}", flush=True)
        report(results)
    return 0


def gradient_table(torch, args, title, measure_one, work):
    """The table of `measure_one` (measure_backward or measure_train) over the problems
    (the first two lengths, or with --quick L = 4096), its TFLOP/s counting `work` forwards."""
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    print(title)
    header = (f"{'L':>6} {'B':>3} {'H':>3} {'d':>4} {'causal':>6} | {MLIRGPU:>8} {FLASH:>10} {CUDNN:>10} | "
              f"{'mlirgpu/cuDNN':>13} {'mlirgpu/flash':>13}")
    print(header)
    print("-" * len(header))
    for length in QUICK_LENGTHS if args.quick else LENGTHS[:2]:
        for d in args.head_dims:
            for causal in (False, True):
                results = measure_one(torch, length, d, causal, args.rounds, dtype)
                cells = [cell(results[name], length, d, causal, work) for name in (MLIRGPU, FLASH, CUDNN)]
                print(f"{length:>6} {TOKENS // length:>3} {WIDTH // d:>3} {d:>4} {str(causal):>6} | "
                      f"{cells[0]:>8} {cells[1]:>10} {cells[2]:>10} | "
                      f"{ratio(results, CUDNN):>13} {ratio(results, FLASH):>13}", flush=True)
                report(results)


def main_train(torch, args):
    gradient_table(torch, args, f"attention forward plus backward, {args.dtype} (output, then dq, dk, dv through "
                   f"autograd; TFLOP/s count 3.5 forwards), on {torch.cuda.get_device_name()} (median of "
                   f"{args.rounds} interleaved rounds)", measure_train, 3.5)
    return 0


def main_fp8(torch, args):
    print(f"attention forward, FP8 (e4m3 q, k, v, per-tensor descales, bf16 output) beside bf16 on the "
          f"dequantized values, {TOKENS} tokens a batch, heads x head_dim = {WIDTH}, on "
          f"{torch.cuda.get_device_name()} (TFLOP/s, median of {args.rounds} interleaved rounds)")
    header = (f"{'L':>6} {'B':>3} {'H':>3} {'d':>4} {'causal':>6} | {FP8:>11} {MLIRGPU + ' bf16':>12} {CUDNN:>10} | "
              f"{'FP8/bf16':>8} {'FP8/cuDNN':>9} | {'err vs bf16':>11}")
    print(header)
    print("-" * len(header))
    for length in QUICK_LENGTHS if args.quick else LENGTHS:
        for d in args.head_dims:
            for causal in (False, True):
                results, error = measure_fp8(torch, length, d, causal, args.rounds)
                cells = [cell(results[name], length, d, causal) for name in (FP8, MLIRGPU, CUDNN)]
                print(f"{length:>6} {TOKENS // length:>3} {WIDTH // d:>3} {d:>4} {str(causal):>6} | "
                      f"{cells[0]:>11} {cells[1]:>12} {cells[2]:>10} | {fp8_ratio(results, MLIRGPU):>8} "
                      f"{fp8_ratio(results, CUDNN):>9} | {'-' if error is None else f'{error:.2e}':>11}", flush=True)
                report(results)
    return 0


def report(results):
    for name, result in results.items():
        if isinstance(result, str):
            print(f"    {name}: {result}")


if __name__ == "__main__":
    sys.exit(main())
