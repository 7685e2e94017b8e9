"""Device features launched as a user launches them (`kernel(..., grid=,
block=, shared_mem=)` on `mg.to_device` arrays), on each backend with the same
assertions against NumPy in float64: a block reduction (shared memory,
barriers, warp shuffles, an atomic add), the tiled matmul with dynamic shared
memory split by slices and with static shared arrays, float4 and half8
vector copies, device functions, printf, atomics and shuffles. Every test
runs on the CPU backend, and on the GPU where there is one (conftest.py's
`backend`); where the GPU's problem size would take seconds on the CPU,
`size` gives the CPU a smaller one. What only the CPU backend checks
(bounds, divergence) is in test_cpu_features.py."""
import ctypes
import functools

import numpy as np
import pytest

import mlirgpu as mg

from support.kernels_features import (BLOCK, TILE, block_sum, claim_slots, copy_float4, copy_half8, dynamic_reverse,
                              extrema, float_sum_and_exchange, hello, matmul_dynamic, matmul_static,
                              rotate_through_device_function, take_tickets, use_device_functions, warp_ops)

pytestmark = pytest.mark.usefixtures("backend")   # cpu, and cuda where there is a GPU


def relative_error(got, expected):
    return np.linalg.norm(np.asarray(got, np.float64) - expected) / np.linalg.norm(expected)


# ---------------------------------------------------------------------------
# Block reduction: shared memory tree, warp shuffles, one atomic per block

@pytest.mark.parametrize("gpu_n, cpu_n", [(1 << 20, 4 * BLOCK), (1_000_003, 3 * BLOCK + 77)],
                         ids=["whole_blocks", "last_block_partial"])
def test_block_reduction(size, gpu_n, cpu_n):
    n = size(gpu=gpu_n, cpu=cpu_n)
    A = np.random.default_rng(0).random(n, dtype=np.float32)
    out = mg.zeros((1,), mg.f32)
    block_sum(mg.to_device(A), out, grid=((n + BLOCK - 1) // BLOCK,), block=(BLOCK,))
    expected = A.astype(np.float64).sum()
    assert abs(float(out.get()[0]) - expected) <= 1e-4 * expected


# ---------------------------------------------------------------------------
# The shared-memory tiled matmul, TILE 16

@pytest.fixture(scope="module")
def matmul_operands():
    """operands(m, k, n): A, B and A @ B in float64, made once per shape for the module."""
    @functools.cache
    def operands(m, k, n):
        rng = np.random.default_rng(1)
        A = rng.standard_normal((m, k), dtype=np.float32)
        B = rng.standard_normal((k, n), dtype=np.float32)
        return A, B, A.astype(np.float64) @ B.astype(np.float64)
    return operands


@pytest.mark.parametrize("kernel, shared_mem", [(matmul_dynamic, 2 * TILE * TILE * 4), (matmul_static, 0)],
                         ids=["dynamic", "static"])
def test_tiled_matmul(size, matmul_operands, kernel, shared_mem):
    A, B, expected = matmul_operands(*size(gpu=(5120, 256, 5120), cpu=(128, 64, 96)))
    m, n = A.shape[0], B.shape[1]
    dC = mg.to_device(np.full((m, n), np.nan, dtype=np.float32))  # every element must be written
    kernel(mg.to_device(A), mg.to_device(B), dC, grid=(n // TILE, m // TILE), block=(TILE, TILE),
           shared_mem=shared_mem)
    C = dC.get()
    assert np.isfinite(C).all()
    assert relative_error(C, expected) < 1e-5


# ---------------------------------------------------------------------------
# Dynamic shared memory: its size, and slices with traced bounds

def test_dynamic_shared_memory_slices():
    A = np.arange(4 * BLOCK, dtype=np.float32)
    B, size = mg.empty((4 * BLOCK,), mg.f32), mg.zeros((1,), mg.i32)
    shared_mem = (BLOCK + 8) * 4
    dynamic_reverse(mg.to_device(A), B, size, grid=(4,), block=(BLOCK,), shared_mem=shared_mem)
    np.testing.assert_array_equal(B.get(), A.reshape(4, BLOCK)[:, ::-1].ravel())
    assert size.get()[0] == shared_mem // 4


# ---------------------------------------------------------------------------
# Vector loads and stores

def test_float4_copy():
    A = np.random.default_rng(2).standard_normal((64, 1024), dtype=np.float32)
    B, C = mg.empty(A.shape, mg.f32), mg.empty(A.shape, mg.f32)
    copy_float4(mg.to_device(A), B, C, grid=(64,), block=(256,))
    np.testing.assert_array_equal(B.get(), A)
    expected = (A.astype(np.float64) * 2.0 + 1.0).reshape(64, 256, 4)[:, :, ::-1].reshape(64, 1024)
    np.testing.assert_allclose(C.get(), expected, rtol=1e-6)


def test_half8_copy():
    A = np.random.default_rng(3).standard_normal(8 * 1024).astype(np.float16)
    B = mg.empty(A.shape, mg.f16)
    copy_half8(mg.to_device(A), B, grid=(4,), block=(256,))
    np.testing.assert_array_equal(B.get(), A)


# ---------------------------------------------------------------------------
# Device functions

def test_device_functions():
    rng = np.random.default_rng(4)
    n = 10_000
    X, Y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    out = [mg.empty((n,), mg.f32) for _ in range(4)]
    use_device_functions(mg.to_device(X), mg.to_device(Y), *out, grid=((n + 255) // 256,), block=(256,))
    x, y = X.astype(np.float64), Y.astype(np.float64)
    np.testing.assert_allclose(out[0].get(), 2.5 * x + (x * y + 1.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[1].get(), np.minimum(X, Y))
    np.testing.assert_array_equal(out[2].get(), np.maximum(X, Y))
    np.testing.assert_array_equal(out[3].get(), np.clip(X, -0.5, 0.5))


def test_device_function_sees_the_thread_and_the_barrier():
    dX = mg.to_device(np.arange(64, dtype=np.float32))
    rotate_through_device_function(dX, grid=(1,), block=(64,))
    np.testing.assert_array_equal(dX.get(), (np.arange(64) + 1) % 64)


# ---------------------------------------------------------------------------
# printf

def test_printf_reaches_stdout(backend, capfd):
    A = np.array([0.5, 1.25, 2.0, -3.75], dtype=np.float32)
    capfd.readouterr()
    hello(mg.to_device(A), grid=(1,), block=(32,))
    if backend == "cuda":
        mg.cuda.synchronize()  # the device's printf buffer is written out at a synchronization
    # The driver writes through C stdio, the CPU backend to sys.stdout: capfd reads both.
    ctypes.CDLL(None).fflush(None)
    lines = sorted(capfd.readouterr().out.splitlines())
    assert lines == ["thread 0 of block 0: 0.50", "thread 1 of block 0: 1.25", "thread 2 of block 0: 2.00",
                     "thread 3 of block 0: -3.75"]


# ---------------------------------------------------------------------------
# Atomics

def test_atomic_max_min():
    rng = np.random.default_rng(5)
    n = 100_000
    X = rng.standard_normal(n, dtype=np.float32)
    I = rng.integers(-2 ** 31, 2 ** 31, n, dtype=np.int32)
    U = rng.integers(0, 2 ** 32, n, dtype=np.uint32)  # above 2**31 too: maxu/minu, not signed
    F_out = mg.to_device(np.array([-np.inf, np.inf], dtype=np.float32))
    I_out = mg.to_device(np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max], dtype=np.int32))
    U_out = mg.to_device(np.array([0, np.iinfo(np.uint32).max], dtype=np.uint32))
    extrema(mg.to_device(X), mg.to_device(I), mg.to_device(U), F_out, I_out, U_out,
            grid=((n + 255) // 256,), block=(256,))
    assert F_out.get().tolist() == [X.max(), X.min()]
    assert I_out.get().tolist() == [I.max(), I.min()]
    assert U_out.get().tolist() == [U.max(), U.min()]


def test_atomic_add_returns_the_old_value():
    n = 50_000
    counter, tickets = mg.zeros((1,), mg.i32), mg.empty((n,), mg.i32)
    take_tickets(counter, tickets, grid=((n + 255) // 256,), block=(256,))
    assert counter.get()[0] == n
    np.testing.assert_array_equal(np.sort(tickets.get()), np.arange(n))


def test_atomic_cas_claims_each_slot_once():
    n, s = 8192, 64
    slots, old = mg.zeros((s,), mg.i32), mg.empty((n,), mg.i32)
    claim_slots(slots, old, grid=(n // 256,), block=(256,))
    owners, seen = slots.get() - 1, old.get()
    assert (owners % s == np.arange(s)).all()  # each slot won by one of its own threads
    winners = np.flatnonzero(seen == 0)
    np.testing.assert_array_equal(np.sort(winners), np.sort(owners))  # exactly the winners saw 0
    losers = seen != 0
    assert ((seen[losers] - 1) % s == np.flatnonzero(losers) % s).all()  # and the others saw the winner


def test_atomic_add_f64_and_exchange():
    X = np.random.default_rng(6).random(4096)
    total, last = mg.zeros((1,), mg.f64), mg.to_device(np.array([-1], dtype=np.int32))
    float_sum_and_exchange(mg.to_device(X), total, last, grid=(16,), block=(256,))
    assert abs(total.get()[0] - X.sum()) <= 1e-9 * X.sum()
    assert 0 <= last.get()[0] < 4096


# ---------------------------------------------------------------------------
# Warp shuffles

def test_warp_shuffles():
    n = 4096
    rng = np.random.default_rng(7)
    X = rng.standard_normal(n, dtype=np.float32)
    I = rng.integers(-1000, 1000, n, dtype=np.int32)
    total, down, up = (mg.empty((n,), mg.f32) for _ in range(3))
    lane3, lane = mg.empty((n,), mg.i32), mg.empty((n,), mg.i32)
    warp_ops(mg.to_device(X), mg.to_device(I), total, lane3, down, up, lane, grid=(n // 128,), block=(128,))
    warps = X.astype(np.float64).reshape(-1, 32)
    np.testing.assert_allclose(total.get().reshape(-1, 32), np.repeat(warps.sum(1, keepdims=True), 32, 1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(lane3.get().reshape(-1, 32), np.repeat(I.reshape(-1, 32)[:, 3:4], 32, 1))
    expected_down = X.reshape(-1, 32).copy()
    expected_down[:, :31] = X.reshape(-1, 32)[:, 1:]  # lane 31 keeps its own value
    np.testing.assert_array_equal(down.get().reshape(-1, 32), expected_down)
    expected_up = X.reshape(-1, 32).copy()
    expected_up[:, 2:] = X.reshape(-1, 32)[:, :30]  # lanes 0 and 1 keep theirs
    np.testing.assert_array_equal(up.get().reshape(-1, 32), expected_up)
    np.testing.assert_array_equal(lane.get(), np.arange(n) % 32)
