"""The host's time per call of mlirgpu.ops.matmul, against a launch of the
kernel it runs and against torch.matmul, on torch tensors; and the same for
mlirgpu.ops.grouped_matmul (against torch._grouped_mm) and
mlirgpu.ops.scaled_matmul (against torch._scaled_mm, on sm_90a GPUs).

    python benchmarks/matmul_host.py [--calls N] [--repeats R] [--batch B]

For each shape, five paths, each called B times in a row between untimed
synchronizations (so that the driver's queue never fills and the GPU never
sets the pace), N calls in all; the figure is the host's time per call, the
median of R runs, the paths taking turns run after run:

- ops.matmul: `mlirgpu.ops.matmul(a, b, out=c)`, as a user calls it;
- its kernel: the kernel ops.matmul chose for the shape (see
  mlirgpu.ops.gemm.choose), launched directly with what ops.matmul keeps
  for it (the Hopper GEMM's tensor maps and grid, the mma.sync GEMM's
  workspace and grid) on the same tensors and stream;
- torch.matmul: `torch.matmul(a, b, out=c)` (cuBLAS);
- the same two with a new output each call: `mlirgpu.ops.matmul(a, b)` and
  `torch.matmul(a, b)`.

"over its kernel" is what ops.matmul adds to its kernel's launch (the
median of the two paths' differences within each run). After a first call
with arrays of a signature (types, dtypes, shapes, devices), ops.matmul
launches from C: the arrays read once, the kept launch found by their
signature, torch's current stream read, the Hopper GEMM's tensor maps
encoded only where an array moved; the direct launch of its kernel goes
through the kernel's own Python-level call, so the difference can be
below zero.
Each path's result is checked against torch.matmul's before any timing.

The second table times grouped_matmul(a, b, offs, out=c) (offsets on the
device) and scaled_matmul(a, b, scale_a, scale_b, out=c) (scales that are
Python numbers) the same way: each against a direct launch of the Hopper
kernel it runs (its tensor maps made once), against torch's op where this
torch has it ("-" where not), and with a new output each call; results are
checked against a float32 product first.
"""
import argparse
import statistics
import sys
import time

import torch

import mlirgpu.ops
from mlirgpu.ops.arrays import placeholder

gemm = sys.modules["mlirgpu.ops.gemm"]
ampere_gemm = sys.modules["mlirgpu.ops.ampere_gemm"]
hopper_gemm = sys.modules["mlirgpu.ops.hopper_gemm"]

# (M, N, K): host-bound products on the mma.sync GEMM, and GPU-bound ones on the Hopper GEMM (on sm_90a).
SHAPES = [(64, 64, 64), (1, 4096, 4096), (64, 4096, 4096), (4096, 4096, 4096)]
# grouped_matmul's (groups, rows, N, K), as mixture-of-experts layers run it; scaled_matmul's (M, N, K).
GROUPED_SHAPES = [(8, 512, 1408, 2048), (64, 8192, 1408, 2048)]
SCALED_SHAPES = [(16, 4096, 4096), (4096, 4096, 4096)]


def direct_launch(a, b, c, stream):
    """A launch of the kernel ops.matmul chose for a @ b, made from what ops.matmul keeps, and its name."""
    (m, k), n = a.shape, b.shape[1]
    choice = gemm.choose(m, k, n, *gemm._device())
    if choice.kernel == "wgmma":
        spec, arguments, keywords = hopper_gemm.plan(*(mlirgpu.asarray(x) for x in (a, b, c)), choice.config)
        maps, k_arg, offsets = arguments[:3], arguments[4], placeholder()

        def launch():
            spec(*maps, c, k_arg, 1.0, 1.0, offsets, stream=stream, **keywords)
        return launch, f"wgmma {choice.config.name}"
    config = choice.config
    plan = ampere_gemm.plan(m, k, n, config, choice.mode, choice.split, choice.units)
    kernel = ampere_gemm.kernel_for(config, choice.mode, choice.split)
    partials, counters = ampere_gemm.workspace(plan)
    grid, block, shared = plan.grid, config.threads, config.shared_bytes()

    def launch():
        kernel(a, b, c, partials, counters, counters, grid=grid, block=block, shared_mem=shared, stream=stream)
    return launch, f"mma.sync {choice.mode}"


def host_us(call, calls, batch):
    """The host's time per call, in microseconds, over `calls` calls."""
    spent, done = 0.0, 0
    while done < calls:
        start = time.perf_counter()
        for _ in range(batch):
            call()
        spent += time.perf_counter() - start
        torch.cuda.synchronize()
        done += batch
    return spent / done * 1e6


def measure(paths, expected, what, args, out=None, tolerance=3e-2):
    """{path: its runs' host times per call} for `paths` (name: call), each
    result first checked against `expected` (float32): what the call
    returns, or `out` (zeroed before) for a launch that returns nothing."""
    for name, call in paths.items():
        if out is not None:
            out.zero_()
        result = call()
        result = out if result is None else result
        error = ((result.float() - expected).abs().max() / expected.abs().max()).item()
        if not error < tolerance:
            raise SystemExit(f"{name} at {what}: relative difference {error:.1e} from the expected product")
    runs = {name: [] for name in paths}
    for _ in range(args.repeats):
        for name, call in paths.items():
            runs[name].append(host_us(call, args.calls, args.batch))
    return runs


def grouped_paths(groups, tokens, n, k, stream):
    """grouped_matmul's paths at one shape (groups of about tokens / groups rows), and their float32 product."""
    a = torch.randn((tokens, k), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((groups, k, n), device="cuda", dtype=torch.bfloat16)
    c = torch.empty((tokens, n), device="cuda", dtype=torch.bfloat16)
    ends = torch.linspace(0, tokens, groups + 1)[1:].round().to(torch.int32)
    offs = ends.cuda()
    expected, begin = torch.zeros((tokens, n), device="cuda"), 0
    for g, end in enumerate(ends.tolist()):
        expected[begin:end] = a[begin:end].float() @ b[g].float()
        begin = end
    spec, arguments, keywords = hopper_gemm.grouped_plan(*(mlirgpu.asarray(x) for x in (a, b, offs, c)))

    def kernel():
        spec(*arguments[:3], c, *arguments[4:7], offs, stream=stream, **keywords)
        return c
    return {"ops": lambda: mlirgpu.ops.grouped_matmul(a, b, offs, out=c), "kernel": kernel,
            "torch": lambda: torch._grouped_mm(a, b, offs=offs),
            "ops new": lambda: mlirgpu.ops.grouped_matmul(a, b, offs)}, expected


def scaled_paths(m, n, k, stream):
    """scaled_matmul's paths at one shape (scales 0.5 and 0.25), and their float32 product."""
    a = torch.randn((m, k), device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn((n, k), device="cuda").to(torch.float8_e4m3fn).t()
    c = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    expected = (a.float() @ b.float()) * 0.125
    spec, arguments, keywords = hopper_gemm.plan(*(mlirgpu.asarray(x) for x in (a, b.t(), c)))
    maps, k_arg, offsets = arguments[:3], arguments[4], placeholder()
    one, eighth = torch.ones((), device="cuda"), torch.full((), 0.125, device="cuda")

    def kernel():
        spec(*maps, c, k_arg, 0.5, 0.25, offsets, stream=stream, **keywords)
        return c
    return {"ops": lambda: mlirgpu.ops.scaled_matmul(a, b, 0.5, 0.25, out=c), "kernel": kernel,
            "torch": lambda: torch._scaled_mm(a, b, scale_a=eighth, scale_b=one, out_dtype=torch.bfloat16,
                                              use_fast_accum=True),
            "ops new": lambda: mlirgpu.ops.scaled_matmul(a, b, 0.5, 0.25)}, expected


def grouped_and_scaled(args):
    """The second table: grouped_matmul and scaled_matmul."""
    print(f"\n{'op':<14} {'shape':>22}  {'ops':>7} {'its kernel':>10} {'torch':>7} {'over its kernel':>15}  "
          f"{'ops, new C':>10}")
    stream = torch.cuda.current_stream().cuda_stream
    rows = [("grouped_matmul", " x ".join(map(str, shape)), grouped_paths, shape) for shape in GROUPED_SHAPES]
    rows += [("scaled_matmul", " x ".join(map(str, shape)), scaled_paths, shape) for shape in SCALED_SHAPES]
    for op, shape, make, sizes in rows:
        paths, expected = make(*sizes, stream)
        try:
            paths["torch"]()
        except (AttributeError, RuntimeError, TypeError):    # this torch has no such op, or not for these
            del paths["torch"]
        runs = measure(paths, expected, f"{op} {shape}", args)
        median = {name: statistics.median(r) for name, r in runs.items()}
        over = statistics.median(x - y for x, y in zip(runs["ops"], runs["kernel"]))
        theirs = f"{median['torch']:>7.2f}" if "torch" in median else f"{'-':>7}"
        print(f"{op:<14} {shape:>22}  {median['ops']:>7.2f} {median['kernel']:>10.2f} {theirs} {over:>15.2f}  "
              f"{median['ops new']:>10.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    print(f"host time per call, us, bf16, torch tensors, on {torch.cuda.get_device_name()} "
          f"(median of {args.repeats} runs)")
    print(f"{'M':>5} {'N':>5} {'K':>5}  {'ops.matmul':>10} {'its kernel':>10} {'torch':>7} {'over its kernel':>15}  "
          f"{'ops, new C':>10} {'torch, new C':>12}  kernel")
    for m, n, k in SHAPES:
        a = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((k, n), device="cuda", dtype=torch.bfloat16)
        c = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        expected = torch.matmul(a, b).float()
        stream = torch.cuda.current_stream().cuda_stream
        launch, name = direct_launch(a, b, c, stream)
        paths = {"ops": lambda: mlirgpu.ops.matmul(a, b, out=c), "kernel": launch,
                 "torch": lambda: torch.matmul(a, b, out=c), "ops new": lambda: mlirgpu.ops.matmul(a, b),
                 "torch new": lambda: torch.matmul(a, b)}
        runs = measure(paths, expected, f"{m} x {n} x {k}", args, out=c, tolerance=2e-2)
        median = {what: statistics.median(r) for what, r in runs.items()}
        over = statistics.median(x - y for x, y in zip(runs["ops"], runs["kernel"]))
        print(f"{m:>5} {n:>5} {k:>5}  {median['ops']:>10.2f} {median['kernel']:>10.2f} {median['torch']:>7.2f} "
              f"{over:>15.2f}  {median['ops new']:>10.2f} {median['torch new']:>12.2f}  {name}", flush=True)
    if hopper_gemm.available():
        grouped_and_scaled(args)


if __name__ == "__main__":
    main()
