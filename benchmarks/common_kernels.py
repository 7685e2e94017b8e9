"""Four memory-bound kernels as a CUDA programmer writes them, in mlirgpu,
beside torch and Triton tutorial-style kernels in the same run.

    python benchmarks/common_kernels.py [--repeats R]

- row softmax of a 4096 x 8192 float32 matrix (one block a row, the row in
  registers, mg.block.reduce for its maximum and sum);
- LayerNorm forward of the same matrix, with weight and bias;
- the sum of 2**28 float32 in one launch: each block reduces its share, and
  the block that takes the last ticket of a release/acquire counter adds the
  partial sums (mg.threadfence, mg.atomic.add(order="acq_rel"));
- the transpose of an 8192 x 8192 float32 matrix through a padded shared
  tile, with streaming stores; the tile (32 x 32 or 64 x 64) and the threads
  that copy it are chosen by mg.autotune on the GPU it runs on.

The rows are dynamic extents (`mg.memref[None, N, mg.f32]`): a new batch size
runs the same compiled kernel. Loads take the read-only cache
(`.readonly()` parameters, `cache="readonly"`) and stores the streaming hint.
Every result is checked against torch first. Each figure is the median of R
runs of 20 launches timed with CUDA events (ms per launch); GB/s counts the
bytes the kernel must move (read once, write once).
"""
import argparse
import statistics

import numpy as np

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, grid_dim, thread_idx

N, THREADS, TILE, ROWS = mg.generics("N THREADS TILE ROWS")
VEC = 4       # float4 accesses


@mg.kernel(generics=(N, THREADS), max_threads=1024)
def softmax(X: mg.memref[None, N, mg.f32].readonly(), Y: mg.memref[None, N, mg.f32]):
    # Each thread holds N / (THREADS * 4) float4 of the row in registers.
    row, t = block_idx.x, thread_idx.x
    chunks = []
    for k in mg.static_range(N // (THREADS * VEC)):
        chunks.append(mg.vload(X, (row, (k * THREADS + t) * VEC), VEC))
    top = chunks[0]
    for v in chunks[1:]:
        top = mg.math.max(top, v)
    m = mg.block.reduce(mg.math.max(mg.math.max(top[0], top[1]), mg.math.max(top[2], top[3])), "max")
    total = mg.constant(0.0, mg.f32)
    for k in mg.static_range(len(chunks)):
        chunks[k] = mg.math.fast_exp(chunks[k] - m)
        total += chunks[k][0] + chunks[k][1] + chunks[k][2] + chunks[k][3]
    scale = mg.math.rcp_approx(mg.block.reduce(total, "add"))
    for k in mg.static_range(len(chunks)):
        mg.vstore(Y, (row, (k * THREADS + t) * VEC), chunks[k] * scale, cache="streaming")


@mg.kernel(generics=(N, THREADS), max_threads=1024)
def layer_norm(X: mg.memref[None, N, mg.f32].readonly(), weight: mg.memref[N, mg.f32].readonly(),
               bias: mg.memref[N, mg.f32].readonly(), Y: mg.memref[None, N, mg.f32], eps: mg.f32):
    row, t = block_idx.x, thread_idx.x
    chunks = []
    total = mg.constant(0.0, mg.f32)
    for k in mg.static_range(N // (THREADS * VEC)):
        v = mg.vload(X, (row, (k * THREADS + t) * VEC), VEC)
        chunks.append(v)
        total += v[0] + v[1] + v[2] + v[3]
    mean = mg.block.reduce(total, "add") * (1.0 / N)
    spread = mg.constant(0.0, mg.f32)
    for k in mg.static_range(len(chunks)):
        chunks[k] = chunks[k] - mean
        d = chunks[k] * chunks[k]
        spread += d[0] + d[1] + d[2] + d[3]
    rstd = mg.math.rsqrt(mg.block.reduce(spread, "add") * (1.0 / N) + eps)
    for k in mg.static_range(len(chunks)):
        j = (k * THREADS + t) * VEC
        w, b = mg.vload(weight, j, VEC), mg.vload(bias, j, VEC)
        mg.vstore(Y, (row, j), mg.math.fma(chunks[k] * rstd, w, b), cache="streaming")


@mg.kernel(generics=(THREADS,), max_threads=1024)
def total_sum(X: mg.memref[None, mg.f32].readonly(), partial: mg.memref[None, mg.f32],
              done: mg.memref[1, mg.u32], total: mg.memref[1, mg.f32]):
    t = thread_idx.x
    zero = mg.constant(0.0, mg.f32)
    acc = [zero, zero, zero, zero]
    for i in range((block_idx.x * THREADS + t) * VEC, X.shape[0], grid_dim.x * THREADS * VEC):
        v = mg.vload(X, i, VEC)
        for lane in mg.static_range(VEC):
            acc[lane] += v[lane]
    s = mg.block.reduce((acc[0] + acc[1]) + (acc[2] + acc[3]), "add")
    ticket = mg.shared.array((1,), mg.u32)
    if t == 0:
        partial[block_idx.x] = s
        mg.threadfence()  # the partial sum is visible device-wide before the ticket is taken
        ticket[0] = mg.atomic.add(done, 0, 1, order="acq_rel")
    mg.syncthreads()
    if mg.cast(ticket[0], mg.index) == grid_dim.x - 1:
        # The last block: every other block's partial sum is visible (their release, our acquire).
        mine = mg.constant(0.0, mg.f32)
        for b in range(t, grid_dim.x, THREADS):
            mine += mg.atomic.load(partial, b, order="relaxed")
        grand = mg.block.reduce(mine, "add")
        if t == 0:
            total[0] = grand
            done[0] = 0  # ready for the next launch


@mg.autotune(configs=[dict(TILE=32, ROWS=8), dict(TILE=64, ROWS=4), dict(TILE=64, ROWS=8), dict(TILE=64, ROWS=16)],
             key=[], progress=False)
@mg.kernel(generics=(TILE, ROWS), max_threads=1024)
def transpose(X: mg.memref[None, None, mg.f32].readonly(), Y: mg.memref[None, None, mg.f32]):
    # Sizes are multiples of TILE: a TILE x (TILE + 1) shared tile (the padding keeps the column reads
    # conflict-free), copied in and out by TILE x ROWS threads, TILE / ROWS elements each.
    tile = mg.shared.array((TILE, TILE + 1), mg.f32)
    x, y = block_idx.x * TILE + thread_idx.x, block_idx.y * TILE + thread_idx.y
    for k in mg.static_range(0, TILE, ROWS):
        tile[thread_idx.y + k, thread_idx.x] = X[y + k, x]
    mg.syncthreads()
    x, y = block_idx.y * TILE + thread_idx.x, block_idx.x * TILE + thread_idx.y
    for k in mg.static_range(0, TILE, ROWS):
        mg.store(Y, (y + k, x), tile[thread_idx.x, thread_idx.y + k], cache="streaming")


def rows_threads(columns):
    """Threads a block for rows of `columns`: each thread at least two float4,
    whole warps (mg.block.reduce's rule), at most 1024 threads."""
    threads = min(1024, columns // (2 * VEC))
    if threads % 32 or columns % (threads * VEC):
        raise ValueError(f"rows of {columns} do not split into whole warps of threads holding float4")
    return threads


# ---------------------------------------------------------------------------
# Peers: Triton kernels written as its tutorials write them

def triton_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * stride + cols, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=mask)

    @triton.jit
    def layer_norm_kernel(X, Y, W, B, stride, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = 1 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        tl.store(Y + row * stride + cols, xc * rstd * w + b, mask=mask)

    @triton.jit
    def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
        tl.atomic_add(out_ptr, tl.sum(x, axis=0))

    @triton.jit
    def transpose_kernel(x_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        tile = tl.load(x_ptr + rm[:, None] * N + rn[None, :])
        tl.store(y_ptr + rn[:, None] * M + rm[None, :], tl.trans(tile))

    return triton, softmax_kernel, layer_norm_kernel, sum_kernel, transpose_kernel


# ---------------------------------------------------------------------------
# The run

def time_ms(launch, torch, repeats):
    """Median over `repeats` of the mean time of 20 launches (CUDA events)."""
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            launch()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / 20)
    return statistics.median(runs)


def cases(torch, triton_peers):
    """(name, bytes moved, {peer: launch}) per kernel, each result checked first."""
    device = "cuda"
    generator = torch.Generator(device=device).manual_seed(0)
    out = []

    # Row softmax
    M, C = 4096, 8192
    X = torch.randn(M, C, device=device, generator=generator)
    Y = torch.empty_like(X)
    threads = rows_threads(C)
    spec = softmax[C, threads]
    launches = {"mlirgpu": lambda: spec(X, Y, grid=M, block=threads), "torch": lambda: torch.softmax(X, 1)}
    launches["mlirgpu"]()
    torch.testing.assert_close(Y, torch.softmax(X, 1), rtol=1e-4, atol=1e-7)
    if triton_peers:
        triton, softmax_kernel, *_ = triton_peers
        block = triton.next_power_of_2(C)
        launches["Triton"] = lambda: softmax_kernel[(M,)](Y, X, X.stride(0), C, BLOCK=block, num_warps=16)
    out.append((f"softmax {M}x{C}", 2 * X.numel() * 4, launches))

    # LayerNorm forward
    weight = torch.randn(C, device=device, generator=generator)
    bias = torch.randn(C, device=device, generator=generator)
    spec_ln = layer_norm[C, threads]
    expected = torch.nn.functional.layer_norm(X, (C,), weight, bias, 1e-5)
    launches = {"mlirgpu": lambda: spec_ln(X, weight, bias, Y, 1e-5, grid=M, block=threads),
                "torch": lambda: torch.nn.functional.layer_norm(X, (C,), weight, bias, 1e-5)}
    launches["mlirgpu"]()
    torch.testing.assert_close(Y, expected, rtol=1e-4, atol=1e-4)
    if triton_peers:
        triton, _, layer_norm_kernel, *_ = triton_peers
        block = triton.next_power_of_2(C)
        launches["Triton"] = lambda: layer_norm_kernel[(M,)](X, Y, weight, bias, X.stride(0), C, 1e-5,
                                                             BLOCK=block, num_warps=16)
    out.append((f"LayerNorm {M}x{C}", 2 * X.numel() * 4, launches))

    # The sum of 2**28 float32, one launch
    n = 2 ** 28
    big = torch.rand(n, device=device, generator=generator)
    blocks = mg.cuda.Device(torch.cuda.current_device()).multiprocessor_count * 2
    partial = torch.zeros(blocks, device=device)
    done = mg.zeros(1, mg.u32)  # the ticket counter: an mlirgpu array beside torch's
    total = torch.zeros(1, device=device)
    spec_sum = total_sum[1024]
    launches = {"mlirgpu": lambda: spec_sum(big, partial, done, total, grid=blocks, block=1024),
                "torch": lambda: torch.sum(big)}
    launches["mlirgpu"]()
    torch.testing.assert_close(total[0], big.double().sum().float(), rtol=1e-4, atol=0)
    if triton_peers:
        _, _, _, sum_kernel, _ = triton_peers
        triton_total = torch.zeros(1, device=device)

        def triton_sum():
            triton_total.zero_()
            sum_kernel[(n // 8192,)](big, triton_total, n, BLOCK=8192, num_warps=8)

        launches["Triton"] = triton_sum
    out.append(("sum 2^28 (one launch)", n * 4, launches))

    # Transpose
    S = 8192
    A = torch.randn(S, S, device=device, generator=generator)
    B = torch.empty_like(A)
    # The first call times each config and launches the fastest; then its specialization runs alone.
    transpose(A, B, grid=lambda g: (S // g["TILE"], S // g["TILE"]), block=lambda g: (g["TILE"], g["ROWS"]))
    tile, rows = transpose.best_config["TILE"], transpose.best_config["ROWS"]
    spec_t = transpose.kernel[tile, rows]
    launches = {"mlirgpu": lambda: spec_t(A, B, grid=(S // tile, S // tile), block=(tile, rows)),
                "torch": lambda: B.copy_(A.t())}
    launches["mlirgpu"]()
    print(f"transpose: mg.autotune chose a {tile} x {tile} tile copied by {tile} x {rows} threads")
    torch.testing.assert_close(B, A.t())
    if triton_peers:
        *_, transpose_kernel = triton_peers
        launches["Triton"] = lambda: transpose_kernel[(S // 64, S // 64)](A, B, S, S, BM=64, BN=64, num_warps=4)
    out.append((f"transpose {S}x{S}", 2 * A.numel() * 4, launches))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if not mg.cuda.is_available():
        raise SystemExit("common_kernels.py needs a CUDA GPU")
    import torch
    try:
        triton_peers = triton_kernels()
    except ImportError as missing:
        print(f"Triton: not importable ({missing})")
        triton_peers = None
    rows = []
    for name, nbytes, launches in cases(torch, triton_peers):
        ms = {peer: time_ms(launch, torch, args.repeats) for peer, launch in launches.items()}
        rows.append((name, nbytes, ms))
    print(f"\n{mg.cuda.Device(torch.cuda.current_device()).name}: ms per launch and GB/s (bytes moved once), "
          f"medians of {args.repeats} runs of 20; ratio = the peer's time / mlirgpu's (above 1: mlirgpu is faster)")
    print(f"| {'kernel':<24} | {'mlirgpu':>16} | {'torch':>16} | {'Triton':>16} | {'vs torch':>8} | {'vs Triton':>9} |")
    print(f"|{'-' * 26}|{'-' * 18}|{'-' * 18}|{'-' * 18}|{'-' * 10}|{'-' * 11}|")
    for name, nbytes, ms in rows:
        def cell(peer):
            return f"{ms[peer]:.4f} {nbytes / ms[peer] / 1e6:6.0f}" if peer in ms else "n/a"
        ratio = {peer: f"{ms[peer] / ms['mlirgpu']:.2f}x" if peer in ms else "n/a" for peer in ("torch", "Triton")}
        print(f"| {name:<24} | {cell('mlirgpu'):>16} | {cell('torch'):>16} | {cell('Triton'):>16} | "
              f"{ratio['torch']:>8} | {ratio['Triton']:>9} |")


if __name__ == "__main__":
    main()
