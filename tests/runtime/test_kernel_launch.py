"""@mg.kernel launched: the naive SGEMM in both loop forms, launched with
generics inferred from DeviceArrays, NumPy arrays, torch and cupy tensors,
and scale_rows (if/else, scalars). Every test runs on the CPU backend and,
where there is a GPU, on the CUDA one (conftest.py's `backend`); torch and
cupy tensors are GPU-only."""
import numpy as np
import pytest
from support.backends import cuda_only, current_backend
from support.kernels_sgemm import scale_rows, sgemm_loop, sgemm_naive

import mlirgpu as mg

pytestmark = pytest.mark.usefixtures("backend")


def relative_error(got, expected):
    return np.linalg.norm(got - expected) / np.linalg.norm(expected)


@pytest.fixture
def operands():
    rng = np.random.default_rng()
    A = rng.standard_normal((256, 128), dtype=np.float32)
    B = rng.standard_normal((128, 192), dtype=np.float32)   # M, K, N all different
    return A, B, A.astype(np.float64) @ B.astype(np.float64) + 1.0


@pytest.mark.parametrize("kernel", [sgemm_naive, sgemm_loop], ids=["range_", "range"])
def test_sgemm_device_arrays(kernel, operands):
    A, B, expected = operands
    dA, dB = mg.to_device(A), mg.to_device(B)
    dC = mg.to_device(np.full((256, 192), np.nan, np.float32))  # poisoned
    kernel(dA, dB, dC, grid=(16, 12), block=(16, 16))
    assert relative_error(dC.get(), expected) < 1e-5


def test_sgemm_specialization_launch(operands):
    A, B, expected = operands
    spec = sgemm_naive[256, 128, 192, mg.f32]
    dC = mg.empty((256, 192), mg.f32)
    spec(mg.to_device(A), mg.to_device(B), dC, grid=(16, 12), block=(16, 16))
    assert relative_error(dC.get(), expected) < 1e-5
    with pytest.raises(mg.LaunchError, match="K=64"):
        spec(mg.empty((256, 64), mg.f32), mg.empty((64, 192), mg.f32), dC, grid=(16, 12), block=(16, 16))


N, TILE = mg.generics("N TILE")


@mg.kernel(generics=(N, TILE))
def fill_with_tile(X: mg.memref[N, mg.f32]):
    X[mg.block_idx.x * TILE + mg.thread_idx.x] = TILE


def test_specialization_gives_generics_the_arguments_do_not():
    X = mg.to_device(np.zeros(64, np.float32))
    with pytest.raises(mg.LaunchError, match=r"do not determine the generics \['TILE'\]"):
        fill_with_tile(X, grid=(4,), block=(16,))
    spec = fill_with_tile[64, 16]
    spec(X, grid=(4,), block=(16,))
    np.testing.assert_array_equal(X.get(), np.full(64, 16, np.float32))
    with pytest.raises(mg.LaunchError, match=r"N=32 \(specialized for 64\)"):
        spec(mg.empty((32,), mg.f32), grid=(2,), block=(16,))


def test_sgemm_numpy_arrays_copied_back(operands):
    A, B, expected = operands
    C = np.full((256, 192), np.nan, np.float32)
    sgemm_loop(A, B, C, grid=(16, 12), block=(16, 16))
    assert relative_error(C, expected) < 1e-5


def test_sgemm_float64(operands):
    A, B, _ = operands
    A, B = A.astype(np.float64), B.astype(np.float64)
    C = np.empty((256, 192))
    sgemm_naive(A, B, C, grid=(16, 12), block=(16, 16))
    assert relative_error(C, A @ B + 1.0) < 1e-12


@cuda_only   # tensors in CUDA memory
def test_sgemm_torch_and_cupy(operands):
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    A, B, expected = operands
    tC = torch.empty((256, 192), dtype=torch.float32, device="cuda")
    sgemm_loop(torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda(), tC, grid=(16, 12), block=(16, 16))
    torch.cuda.synchronize()
    assert relative_error(tC.cpu().numpy(), expected) < 1e-5
    cC = cupy.empty((256, 192), dtype=cupy.float32)
    sgemm_loop(cupy.asarray(A), cupy.asarray(B), cC, grid=(16, 12), block=(16, 16))
    assert relative_error(cupy.asnumpy(cC), expected) < 1e-5


def test_if_else_and_scalars():
    X = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    dX = mg.to_device(X)
    # 80 threads along x: the last 16 are past M and must do nothing.
    scale_rows(dX, np.float32(3.0), 40, grid=(5,), block=(16, 8))
    expected = X.copy()
    expected[:40] *= 3.0
    expected[40:] *= -1.0
    np.testing.assert_allclose(dX.get(), expected, rtol=1e-6)


@mg.kernel(max_threads=64, min_blocks=4)
def bounded_fill(X: mg.memref[N, mg.f32]):
    X[mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x] = 2.0


def test_launch_bounds_reach_ptx_and_the_cpu_backend_refuses_bigger_blocks():
    spec = bounded_fill[256]
    assert "nvvm.maxntid = array<i32: 64, 1, 1>, nvvm.minctasm = 4 : i32" in spec.ir()
    ptx = spec.ptx(chip="sm_90a")
    assert ".maxntid 64, 1, 1" in ptx and ".minnctapersm 4" in ptx
    X = np.zeros(256, np.float32)
    with current_backend("cpu"):
        bounded_fill(X, grid=(4,), block=(64,))
        np.testing.assert_array_equal(X, 2.0)
        with pytest.raises(mg.LaunchError, match="max_threads=64 .* 128 threads"):
            bounded_fill(X, grid=(2,), block=(128,))


@pytest.mark.parametrize("options, message", [(dict(max_threads=0), "positive int"),
                                              (dict(max_threads=2048), "at most 1024"),
                                              (dict(min_blocks=2), "needs max_threads")])
def test_bad_launch_bounds(options, message):
    with pytest.raises(ValueError, match=message):
        mg.kernel(**options)(bounded_fill.function)
