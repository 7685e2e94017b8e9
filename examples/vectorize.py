"""An element-wise kernel with @mg.vectorize: y = a * x + b over a vector,
checked against NumPy in float64.

    python examples/vectorize.py [N]   # default 1 << 20

On the GPU when there is one, else on the CPU backend.
"""
import sys

import numpy as np

import mlirgpu as mg


@mg.vectorize
def axpb(a, x, b):
    return a * x + b


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    dx = mg.to_device(x)
    dy = axpb(np.float32(2.0), dx, np.float32(0.5))
    expected = 2.0 * x.astype(np.float64) + 0.5
    error = float(np.max(np.abs(dy.get() - expected)))
    print(f"axpb over {n} float32 on {mg.backend()}: max abs error {error:.1e}")
    return 0 if error < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
