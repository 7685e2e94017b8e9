"""The kernels of benchmarks/common_kernels.py (softmax, LayerNorm, the
one-launch sum, the transpose) at small sizes on both backends against
NumPy, and the PTX the benchmark relies on (read-only and streaming accesses,
the ordered ticket, redux-free float reductions)."""
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

import mlirgpu as mg

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "common_kernels.py"
spec = importlib.util.spec_from_file_location("common_kernels", PATH)
ck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ck)


@pytest.mark.parametrize("rows, columns", [(3, 256), (5, 1024)])
def test_softmax_and_layer_norm(backend, rows, columns):
    rng = np.random.default_rng(columns)
    X = rng.standard_normal((rows, columns)).astype(np.float32)
    Y = np.zeros_like(X)
    threads = ck.rows_threads(columns)
    ck.softmax[columns, threads](X, Y, grid=rows, block=threads)
    x = X.astype(np.float64)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(Y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    w, b = rng.standard_normal(columns).astype(np.float32), rng.standard_normal(columns).astype(np.float32)
    ck.layer_norm[columns, threads](X, w, b, Y, 1e-5, grid=rows, block=threads)
    expected = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(Y, expected, rtol=1e-4, atol=1e-5)


def test_one_launch_sum(backend, size):
    n, blocks, threads = size(gpu=1 << 24, cpu=1 << 16), size(gpu=264, cpu=6), size(gpu=1024, cpu=64)
    X = np.random.default_rng(2).random(n).astype(np.float32)
    partial, done, total = np.zeros(blocks, np.float32), np.zeros(1, np.uint32), np.zeros(1, np.float32)
    for _ in range(2):
        ck.total_sum[threads](X, partial, done, total, grid=blocks, block=threads)
        np.testing.assert_allclose(total[0], X.astype(np.float64).sum(), rtol=1e-5)
        assert done[0] == 0


@pytest.mark.parametrize("config", ck.transpose.configs, ids=lambda c: f"{c['TILE']}x{c['ROWS']}")
def test_transpose(backend, config):
    # Every tile the benchmark's autotuner may choose.
    A = np.random.default_rng(3).standard_normal((128, 192)).astype(np.float32)
    B = np.zeros((192, 128), np.float32)
    tile, rows = config["TILE"], config["ROWS"]
    ck.transpose.kernel[tile, rows](A, B, grid=(192 // tile, 128 // tile), block=(tile, rows))
    np.testing.assert_array_equal(B, A.T)


def test_benchmark_kernels_ptx(tmp_path):
    from support.checks import ptxas_accepts
    found = {}
    for kernel in (ck.softmax[8192, 1024], ck.layer_norm[8192, 1024], ck.total_sum[1024],
                   ck.transpose.kernel[64, 8]):
        ptx = kernel.ptx(chip="sm_90a")
        ptxas_accepts(ptx, "sm_90a", tmp_path)
        found[kernel.name] = set(re.findall(r"\b(ld\.global\.nc\S*|st\.global\.cs\S*|atom\S*|membar\.gl|"
                                            r"ld\.relaxed\S*|ex2\.approx\S*)", ptx))
    assert {"ld.global.nc.v4.b32", "st.global.cs.v4.b32", "ex2.approx.f32"} <= found["softmax"]
    assert {"ld.global.nc.v4.b32", "st.global.cs.v4.b32"} <= found["layer_norm"]
    assert {"membar.gl", "atom.acq_rel.gpu.global.add.u32", "ld.relaxed.gpu.global.b32"} <= found["total_sum"]
    assert {"ld.global.nc.b32", "st.global.cs.b32"} <= found["transpose"]
