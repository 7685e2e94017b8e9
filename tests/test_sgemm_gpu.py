"""The first kernel end to end on the GPU: the naive SGEMM built through
mlirgpu.ir, compiled to cubin, loaded and launched through the C runtime."""
import numpy as np
import pytest
from sgemm_ir import sgemm_naive

import mlirgpu as mg

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernel():
    module = sgemm_naive.build_naive_sgemm(256, 128, 256)
    cubin = mg.compile_cubin(module, chip=mg.cuda.Device(0).chip)
    return mg.cuda.load_module(cubin).get_function("sgemm_naive")


def relative_error(got, expected):
    return np.linalg.norm(got - expected) / np.linalg.norm(expected)


@pytest.mark.parametrize("seed", [0, 1])
def test_naive_sgemm_matches_numpy(kernel, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((256, 128), dtype=np.float32)
    B = rng.standard_normal((128, 256), dtype=np.float32)
    dA, dB = mg.to_device(A), mg.to_device(B)
    dC = mg.to_device(np.full((256, 256), np.nan, dtype=np.float32))  # poisoned: every element must be written
    kernel(dA, dB, dC, grid=(16, 16), block=(16, 16))
    C = dC.get()
    expected = A.astype(np.float64) @ B.astype(np.float64) + 1.0
    assert np.isfinite(C).all()
    assert relative_error(C, expected) < 1e-5


def test_naive_sgemm_from_ptx(kernel):
    module = sgemm_naive.build_naive_sgemm(256, 128, 256)
    function = mg.cuda.load_module(mg.compile_ptx(module, chip=mg.cuda.Device(0).chip)).get_function("sgemm_naive")
    rng = np.random.default_rng(2)
    A = rng.random((256, 128), dtype=np.float32)
    B = rng.random((128, 256), dtype=np.float32)
    dC = mg.empty((256, 256), mg.f32)
    function(mg.to_device(A), mg.to_device(B), dC, grid=(16, 16), block=(16, 16))
    assert relative_error(dC.get(), A.astype(np.float64) @ B + 1.0) < 1e-5


def test_events_time_the_kernel(kernel):
    dA, dB, dC = mg.zeros((256, 128), mg.f32), mg.zeros((128, 256), mg.f32), mg.empty((256, 256), mg.f32)
    start, end = mg.cuda.Event(), mg.cuda.Event()
    start.record()
    for _ in range(10):
        kernel(dA, dB, dC, grid=(16, 16), block=(16, 16))
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert (dC.get() == 1.0).all()
