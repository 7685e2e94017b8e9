"""Row softmax and LayerNorm over inputs whose shapes change on every call,
compiled once each: their arrays are `mg.memref[None, None, mg.f32]`, sizes
known only at launch and read in the kernel as `X.shape[...]`.

    python examples/dynamic_shapes.py

Runs on the current backend (the GPU where there is one, else the CPU),
checks every result against NumPy in float64, and prints per kernel its
specializations and, on the GPU, the builds the compile cache logged
(MLIRGPU_LOG=compile, which the script sets: a "compiling" line, or a
"loaded ... from the disk cache" one when an earlier run compiled it): one
each, for every shape.
Written with the warp and block collectives: `mg.block.reduce` gives every
thread of the block the row's maximum and sum.
"""
import logging
import os

import numpy as np

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

THREADS = 256  # a block per row


@mg.kernel
def softmax(X: mg.memref[None, None, mg.f32].readonly(), Y: mg.memref[None, None, mg.f32]):
    row, t, n = block_idx.x, thread_idx.x, X.shape[1]
    top = mg.constant(float("-inf"), mg.f32)
    for j in range(t, n, block_dim.x):
        top = mg.math.max(top, X[row, j])
    top = mg.block.reduce(top, "max")
    total = mg.constant(0.0, mg.f32)
    for j in range(t, n, block_dim.x):
        total += mg.math.exp(X[row, j] - top)
    scale = 1.0 / mg.block.reduce(total, "add")
    for j in range(t, n, block_dim.x):
        Y[row, j] = mg.math.exp(X[row, j] - top) * scale


@mg.kernel
def layer_norm(X: mg.memref[None, None, mg.f32].readonly(), weight: mg.memref[None, mg.f32].readonly(),
               bias: mg.memref[None, mg.f32].readonly(), Y: mg.memref[None, None, mg.f32], eps: mg.f32):
    row, t, n = block_idx.x, thread_idx.x, X.shape[1]
    total = mg.constant(0.0, mg.f32)
    for j in range(t, n, block_dim.x):
        total += X[row, j]
    mean = mg.block.reduce(total, "add") / mg.cast(n, mg.f32)
    spread = mg.constant(0.0, mg.f32)
    for j in range(t, n, block_dim.x):
        d = X[row, j] - mean
        spread += d * d
    rstd = mg.math.rsqrt(mg.block.reduce(spread, "add") / mg.cast(n, mg.f32) + eps)
    for j in range(t, n, block_dim.x):
        Y[row, j] = (X[row, j] - mean) * rstd * weight[j] + bias[j]


def softmax_reference(X):
    e = np.exp(X - X.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def layer_norm_reference(X, weight, bias, eps):
    mean = X.mean(1, keepdims=True)
    return (X - mean) / np.sqrt(X.var(1, keepdims=True) + eps) * weight + bias


class BuildCounter(logging.Handler):
    """Counts the compile cache's lines per kernel: each a compile, or a load of an earlier run's."""

    def __init__(self):
        super().__init__()
        self.builds = {}

    def emit(self, record):
        message = record.getMessage()
        building = message.startswith("mlirgpu: compiling") or message.endswith("from the disk cache")
        for name in ("softmax", "layer_norm"):
            if building and f".{name} [" in message:
                self.builds[name] = self.builds.get(name, 0) + 1


def main():
    os.environ["MLIRGPU_LOG"] = ",".join(filter(None, [os.environ.get("MLIRGPU_LOG"), "compile", "cache"]))
    counter = BuildCounter()
    logging.getLogger("mlirgpu").addHandler(counter)
    rng = np.random.default_rng(0)
    shapes = [(4, 1000), (64, 4096), (1, 37), (333, 768), (8, 12288)]
    for rows, columns in shapes:
        X = rng.standard_normal((rows, columns)).astype(np.float32)
        weight, bias = rng.standard_normal(columns).astype(np.float32), rng.standard_normal(columns).astype(np.float32)
        Y = np.zeros_like(X)
        softmax(X, Y, grid=rows, block=THREADS)
        np.testing.assert_allclose(Y, softmax_reference(X.astype(np.float64)), rtol=1e-4, atol=1e-7)
        layer_norm(X, weight, bias, Y, 1e-5, grid=rows, block=THREADS)
        np.testing.assert_allclose(Y, layer_norm_reference(X.astype(np.float64), weight, bias, 1e-5),
                                   rtol=1e-3, atol=1e-4)
    print(f"backend {mg.backend()}: {len(shapes)} shapes, " + ", ".join(f"{r}x{c}" for r, c in shapes))
    print("| kernel     | specializations | builds logged |")
    print("|------------|-----------------|---------------|")
    for kernel in (softmax, layer_norm):
        builds = counter.builds.get(kernel.__name__, 0) if mg.backend() == "cuda" else None
        print(f"| {kernel.__name__:<10} | {len(kernel._specializations):>15} | "
              f"{'n/a (CPU)' if builds is None else builds:>13} |")
        assert len(kernel._specializations) == 1, "a new shape made a new specialization"
        assert builds in (None, 1), f"{kernel.__name__} was built {builds} times"
    print("every result matches NumPy (float64)")


if __name__ == "__main__":
    main()
