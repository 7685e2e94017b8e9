"""The CPU backend against the GPU: the same kernels on the same inputs, run on
each backend in turn in one process, give results that agree within float32
rounding. Needs a GPU (the `gpu` marker)."""
import numpy as np
import pytest
from support.backends import current_backend

import mlirgpu as mg

from support.kernels_features import BLOCK, TILE, block_sum, matmul_dynamic

pytestmark = pytest.mark.gpu


def launch_on(backend, kernel, *arrays, **config):
    """kernel(*arrays) on `backend`, the NumPy arrays copied there and back: the results."""
    with current_backend(backend):
        on_backend = [mg.to_device(array) for array in arrays]
        kernel(*on_backend, **config)
        return [array.get() for array in on_backend]


def relative_error(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    return np.linalg.norm(got - expected) / np.linalg.norm(expected)


def test_cpu_backend_matches_the_gpu():
    rng = np.random.default_rng(9)

    # The tiled matmul, its two tiles in dynamic shared memory.
    m, k, n = 256, 128, 192
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    C = np.full((m, n), np.nan, dtype=np.float32)  # an element left unwritten fails the comparison
    config = dict(grid=(n // TILE, m // TILE), block=(TILE, TILE), shared_mem=2 * TILE * TILE * 4)
    _, _, on_cpu = launch_on("cpu", matmul_dynamic, A, B, C, **config)
    _, _, on_gpu = launch_on("cuda", matmul_dynamic, A, B, C, **config)
    assert relative_error(on_cpu, on_gpu) < 1e-5

    # The block reduction: shared memory, barriers, warp shuffles, one atomic add per block.
    X = rng.random(64 * BLOCK + 77, dtype=np.float32)   # the last block partial
    config = dict(grid=((X.size + BLOCK - 1) // BLOCK,), block=(BLOCK,))
    _, on_cpu = launch_on("cpu", block_sum, X, np.zeros(1, np.float32), **config)
    _, on_gpu = launch_on("cuda", block_sum, X, np.zeros(1, np.float32), **config)
    # Each block's sum is computed in the same order on both; only the order of the 65 atomic adds
    # differs, which moves the total by at most 2 * 65 float32 roundings (7.7e-6 relative).
    assert relative_error(on_cpu, on_gpu) < 1e-5
