"""Device features on the CPU backend (mlirgpu.cpu.run), with the kernels and
assertions of the GPU's tests (kernels_features.py): shared memory static and
dynamic, warp shuffles, atomics, vector loads and stores, device functions,
printf; and the checks only the CPU backend makes (bounds, divergence)."""
import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

from kernels_features import (BLOCK, TILE, block_sum, claim_slots, copy_float4, copy_half8, dynamic_reverse,
                              extrema, float_sum_and_exchange, hello, matmul_dynamic, matmul_static,
                              take_tickets, use_device_functions, warp_ops)

M, N = mg.generics("M N")


def relative_error(got, expected):
    return np.linalg.norm(np.asarray(got, np.float64) - expected) / np.linalg.norm(expected)


def line_of(marker):
    return next(i for i, text in enumerate(open(__file__), 1) if marker in text)


# ---------------------------------------------------------------------------
# Shared memory, barriers, shuffles, atomics

@pytest.mark.parametrize("n", [4 * BLOCK, 3 * BLOCK + 77])
def test_block_reduction(n):
    A = np.random.default_rng(0).random(n, dtype=np.float32)
    out = np.zeros(1, np.float32)
    mg.cpu.run(block_sum[n], [A, out], grid=((n + BLOCK - 1) // BLOCK,), block=(BLOCK,))
    expected = A.astype(np.float64).sum()
    assert abs(float(out[0]) - expected) <= 1e-4 * expected


@pytest.fixture(scope="module")
def matmul_operands():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((128, 64), dtype=np.float32)
    B = rng.standard_normal((64, 96), dtype=np.float32)
    return A, B, A.astype(np.float64) @ B.astype(np.float64)


@pytest.mark.parametrize("kernel, shared_mem", [(matmul_dynamic, 2 * TILE * TILE * 4), (matmul_static, 0)],
                         ids=["dynamic", "static"])
def test_tiled_matmul(matmul_operands, kernel, shared_mem):
    A, B, expected = matmul_operands
    m, k = A.shape
    n = B.shape[1]
    C = np.full((m, n), np.nan, dtype=np.float32)  # every element must be written
    mg.cpu.run(kernel[m, k, n], [A, B, C], grid=(n // TILE, m // TILE), block=(TILE, TILE), shared_mem=shared_mem)
    assert np.isfinite(C).all()
    assert relative_error(C, expected) < 1e-5


def test_dynamic_shared_memory_slices():
    A = np.arange(4 * BLOCK, dtype=np.float32)
    B, size = np.zeros(4 * BLOCK, np.float32), np.zeros(1, np.int32)
    shared_mem = (BLOCK + 8) * 4
    mg.cpu.run(dynamic_reverse[4 * BLOCK], [A, B, size], grid=(4,), block=(BLOCK,), shared_mem=shared_mem)
    np.testing.assert_array_equal(B, A.reshape(4, BLOCK)[:, ::-1].ravel())
    assert size[0] == shared_mem // 4


@mg.kernel
def block_local(X: mg.memref[N, mg.f32]):
    """Each block sums its own slice in shared memory: wrong if blocks shared it."""
    partial = mg.shared.array(1, mg.f32)
    t = thread_idx.x
    if t == 0:
        partial[0] = 0.0
    mg.syncthreads()
    mg.atomic.add(partial, 0, X[block_idx.x * block_dim.x + t])
    mg.syncthreads()
    X[block_idx.x * block_dim.x + t] = partial[0]


def test_shared_memory_is_per_block():
    X = np.arange(3 * 8, dtype=np.float32)
    mg.cpu.run(block_local[24], [X], grid=3, block=8)
    np.testing.assert_array_equal(X, np.repeat(np.arange(24).reshape(3, 8).sum(1), 8))


def test_warp_shuffles():
    n = 512
    rng = np.random.default_rng(7)
    X = rng.standard_normal(n, dtype=np.float32)
    I = rng.integers(-1000, 1000, n, dtype=np.int32)
    total, down, up = (np.zeros(n, np.float32) for _ in range(3))
    lane3, lane = np.zeros(n, np.int32), np.zeros(n, np.int32)
    mg.cpu.run(warp_ops[n], [X, I, total, lane3, down, up, lane], grid=(n // 128,), block=(128,))
    warps = X.astype(np.float64).reshape(-1, 32)
    np.testing.assert_allclose(total.reshape(-1, 32), np.repeat(warps.sum(1, keepdims=True), 32, 1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(lane3.reshape(-1, 32), np.repeat(I.reshape(-1, 32)[:, 3:4], 32, 1))
    expected_down = X.reshape(-1, 32).copy()
    expected_down[:, :31] = X.reshape(-1, 32)[:, 1:]  # lane 31 keeps its own value
    np.testing.assert_array_equal(down.reshape(-1, 32), expected_down)
    expected_up = X.reshape(-1, 32).copy()
    expected_up[:, 2:] = X.reshape(-1, 32)[:, :30]  # lanes 0 and 1 keep theirs
    np.testing.assert_array_equal(up.reshape(-1, 32), expected_up)
    np.testing.assert_array_equal(lane, np.arange(n) % 32)


def test_warps_follow_the_linear_thread_id():
    """With 2-D blocks a warp is 32 consecutive linear ids (x fastest), as on the GPU."""
    n = 128
    X = np.arange(n, dtype=np.float32)
    I = np.arange(n, dtype=np.int32)
    total, down, up = (np.zeros(n, np.float32) for _ in range(3))
    lane3, lane = np.zeros(n, np.int32), np.zeros(n, np.int32)
    mg.cpu.run(warp_ops[n], [X, I, total, lane3, down, up, lane], grid=(2,), block=(64,))
    np.testing.assert_array_equal(lane3, np.repeat(np.arange(n).reshape(-1, 32)[:, 3], 32))


def test_atomic_max_min():
    rng = np.random.default_rng(5)
    n = 4096
    X = rng.standard_normal(n, dtype=np.float32)
    I = rng.integers(-2 ** 31, 2 ** 31, n, dtype=np.int32)
    U = rng.integers(0, 2 ** 32, n, dtype=np.uint32)
    F_out = np.array([-np.inf, np.inf], dtype=np.float32)
    I_out = np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max], dtype=np.int32)
    U_out = np.array([0, np.iinfo(np.uint32).max], dtype=np.uint32)
    mg.cpu.run(extrema[n], [X, I, U, F_out, I_out, U_out], grid=((n + 255) // 256,), block=(256,))
    assert F_out.tolist() == [X.max(), X.min()]
    assert I_out.tolist() == [I.max(), I.min()]
    assert U_out.tolist() == [U.max(), U.min()]


def test_atomic_add_returns_the_old_value():
    n = 5000
    counter, tickets = np.zeros(1, np.int32), np.zeros(n, np.int32)
    mg.cpu.run(take_tickets[n], [counter, tickets], grid=((n + 255) // 256,), block=(256,))
    assert counter[0] == n
    np.testing.assert_array_equal(np.sort(tickets), np.arange(n))


def test_atomic_cas_claims_each_slot_once():
    n, s = 2048, 64
    slots, old = np.zeros(s, np.int32), np.zeros(n, np.int32)
    mg.cpu.run(claim_slots[n, s], [slots, old], grid=(n // 256,), block=(256,))
    owners, seen = slots - 1, old
    assert (owners % s == np.arange(s)).all()
    winners = np.flatnonzero(seen == 0)
    np.testing.assert_array_equal(np.sort(winners), np.sort(owners))
    losers = seen != 0
    assert ((seen[losers] - 1) % s == np.flatnonzero(losers) % s).all()


def test_atomic_add_f64_and_exchange():
    X = np.random.default_rng(6).random(4096)
    total, last = np.zeros(1, np.float64), np.array([-1], dtype=np.int32)
    mg.cpu.run(float_sum_and_exchange[4096], [X, total, last], grid=(16,), block=(256,))
    assert abs(total[0] - X.sum()) <= 1e-9 * X.sum()
    assert 0 <= last[0] < 4096


# ---------------------------------------------------------------------------
# Vector loads and stores, device functions

def test_float4_copy():
    A = np.random.default_rng(2).standard_normal((16, 1024), dtype=np.float32)
    B, C = np.zeros_like(A), np.zeros_like(A)
    mg.cpu.run(copy_float4[16, 1024], [A, B, C], grid=(16,), block=(256,))
    np.testing.assert_array_equal(B, A)
    expected = (A.astype(np.float64) * 2.0 + 1.0).reshape(16, 256, 4)[:, :, ::-1].reshape(16, 1024)
    np.testing.assert_allclose(C, expected, rtol=1e-6)


def test_half8_copy():
    A = np.random.default_rng(3).standard_normal(8 * 1024).astype(np.float16)
    B = np.zeros_like(A)
    mg.cpu.run(copy_half8[A.size], [A, B], grid=(4,), block=(256,))
    np.testing.assert_array_equal(B, A)


def test_device_functions():
    rng = np.random.default_rng(4)
    n = 1000
    X, Y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    out = [np.zeros(n, np.float32) for _ in range(4)]
    mg.cpu.run(use_device_functions[n], [X, Y, *out], grid=((n + 255) // 256,), block=(256,))
    x, y = X.astype(np.float64), Y.astype(np.float64)
    np.testing.assert_allclose(out[0], 2.5 * x + (x * y + 1.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[1], np.minimum(X, Y))
    np.testing.assert_array_equal(out[2], np.maximum(X, Y))
    np.testing.assert_array_equal(out[3], np.clip(X, -0.5, 0.5))


def test_device_functions_are_func_funcs_of_the_host_module():
    text = mg.cpu.host_module(use_device_functions[64], checks=()).print()
    assert "gpu.module" not in text and "gpu." not in text
    assert "func.func private @axpy" in text


@mg.func
def own_index(X):
    """A device function that reads the thread's index and waits at a barrier."""
    i = block_idx.x * block_dim.x + thread_idx.x
    v = X[(i + 1) % N]
    mg.syncthreads()
    X[i] = v


@mg.kernel
def rotate_through_device_function(X: mg.memref[N, mg.f32]):
    own_index(X)


def test_device_function_sees_the_thread_and_the_barrier():
    X = np.arange(64, dtype=np.float32)
    mg.cpu.run(rotate_through_device_function[64], [X], grid=1, block=64)
    np.testing.assert_array_equal(X, (np.arange(64) + 1) % 64)


# ---------------------------------------------------------------------------
# printf

def test_printf_reaches_stdout_in_order(capsys):
    A = np.array([0.5, 1.25, 2.0, -3.75], dtype=np.float32)
    capsys.readouterr()
    mg.cpu.run(hello[4], [A], grid=(2,), block=(32,))
    assert capsys.readouterr().out.splitlines() == [
        "thread 0 of block 0: 0.50", "thread 1 of block 0: 1.25", "thread 2 of block 0: 2.00",
        "thread 3 of block 0: -3.75",
        "thread 0 of block 1: 0.50", "thread 1 of block 1: 1.25", "thread 2 of block 1: 2.00",
        "thread 3 of block 1: -3.75"]


@mg.kernel
def formats(X: mg.memref[N, mg.i32]):
    t = thread_idx.x
    mg.printf("%d %u %x %5.1f|%-4d|%e %ld %c%%\n", X[t], X[t], X[t], mg.cast(X[t], mg.f32), X[t],
              mg.cast(X[t], mg.f64), thread_idx.x, 65)


def test_printf_formats_like_c(capsys):
    X = np.array([-1, 255], dtype=np.int32)
    capsys.readouterr()
    mg.cpu.run(formats[2], [X], grid=1, block=2)
    assert capsys.readouterr().out == ("-1 4294967295 ffffffff  -1.0|-1  |-1.000000e+00 0 A%\n"
                                       "255 255 ff 255.0|255 |2.550000e+02 1 A%\n")


# ---------------------------------------------------------------------------
# Bounds checks (MLIRGPU_CHECK=bounds) and divergence

@mg.kernel
def shift_left(X: mg.memref[N, mg.f32], Y: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    Y[i] = X[i + 1]  # the load past N


@mg.kernel
def fill_rows(C: mg.memref[M, N, mg.f32]):
    C[block_idx.x * block_dim.x + thread_idx.x, thread_idx.y] = 1.0  # the store past M


@mg.kernel
def shared_overrun(X: mg.memref[N, mg.f32]):
    tile = mg.shared.array(32, mg.f32)
    t = thread_idx.x
    tile[t] = X[t]  # the store past the shared array
    mg.syncthreads()
    X[t] = tile[0]


@mg.kernel
def vector_overrun(X: mg.memref[N, mg.f32], Y: mg.memref[N, mg.f32]):
    j = thread_idx.x * 4
    mg.vstore(Y, j + 4, mg.vload(X, j, 4))  # the vector store past N


@pytest.fixture
def bounds_checks(monkeypatch):
    monkeypatch.setenv("MLIRGPU_CHECK", "bounds")


def test_out_of_bounds_load(bounds_checks):
    X, Y = np.zeros(64, np.float32), np.zeros(64, np.float32)
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(shift_left[64], [X, Y], grid=2, block=32)
    assert str(info.value) == (f"out-of-bounds load from 'X' at index (64,) [shape (64,)] by thread (31, 0, 0) "
                               f"of block (1, 0, 0) at {__file__}:{line_of('# the load past N')}")


def test_out_of_bounds_store(bounds_checks):
    C = np.zeros((64, 48), np.float32)
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(fill_rows[64, 48], [C], grid=5, block=(16, 48))
    assert str(info.value) == (f"out-of-bounds store to 'C' at index (64, 0) [shape (64, 48)] by thread "
                               f"(0, 0, 0) of block (4, 0, 0) at {__file__}:{line_of('# the store past M')}")
    assert (C == 1).all()  # the blocks before ran


def test_out_of_bounds_shared_memory(bounds_checks):
    X = np.zeros(40, np.float32)
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(shared_overrun[40], [X], grid=1, block=40)
    assert str(info.value) == (f"out-of-bounds store to 'shared' at index (32,) [shape (32,)] by thread "
                               f"(32, 0, 0) of block (0, 0, 0) at {__file__}:"
                               f"{line_of('# the store past the shared array')}")


def test_out_of_bounds_vector_store(bounds_checks):
    X, Y = np.zeros(64, np.float32), np.zeros(64, np.float32)
    with pytest.raises(mg.KernelError, match=r"out-of-bounds vector store to 'Y' at index \(64,\) "
                                             r"\[shape \(64,\)\] by thread \(15, 0, 0\)"):
        mg.cpu.run(vector_overrun[64], [X, Y], grid=1, block=16)


def test_in_bounds_kernels_pass_the_checks(bounds_checks):
    A = np.arange(4 * BLOCK, dtype=np.float32)
    B, size = np.zeros(4 * BLOCK, np.float32), np.zeros(1, np.int32)
    mg.cpu.run(dynamic_reverse[4 * BLOCK], [A, B, size], grid=(4,), block=(BLOCK,), shared_mem=(BLOCK + 8) * 4)
    np.testing.assert_array_equal(B, A.reshape(4, BLOCK)[:, ::-1].ravel())


def test_without_mlirgpu_check_no_checks_are_emitted(monkeypatch):
    monkeypatch.delenv("MLIRGPU_CHECK", raising=False)
    plain = mg.cpu.host_module(fill_rows[64, 48]).print()
    assert "mg_cpu_out_of_bounds" not in plain and "arith.cmpi" not in plain
    monkeypatch.setenv("MLIRGPU_CHECK", "bounds")
    checked = mg.cpu.host_module(fill_rows[64, 48]).print()
    assert "mg_cpu_out_of_bounds" in checked and "arith.cmpi" in checked
    # Unchecked, the same out-of-bounds kernel is not stopped (it writes past C's rows: give it room).
    monkeypatch.delenv("MLIRGPU_CHECK")
    C = np.zeros((80, 48), np.float32)[:64]
    mg.cpu.run(fill_rows[64, 48], [C], grid=4, block=(16, 48))
    assert (C == 1).all()


@mg.kernel
def divergent_in_loop(X: mg.memref[N, mg.f32]):
    t = thread_idx.x
    for k in range(t):
        mg.syncthreads()  # reached a different number of times by each thread
    X[t] = 1.0


def test_barrier_divergence_names_the_line():
    X = np.zeros(4, np.float32)
    with pytest.raises(mg.KernelError, match=rf"barrier divergence at .*test_cpu_features.py:"
                                             rf"{line_of('# reached a different number')}\b"):
        mg.cpu.run(divergent_in_loop[4], [X], grid=1, block=4)


@mg.kernel
def shuffle_against_barrier(X: mg.memref[N, mg.f32]):
    t = thread_idx.x
    v = X[t]
    if t < 16:
        v = mg.warp.shfl_xor(v, 1)  # half the warp shuffles
    else:
        mg.syncthreads()
    X[t] = v


def test_warp_divergence_raises_kernel_error():
    X = np.zeros(32, np.float32)
    with pytest.raises(mg.KernelError, match=rf"warp divergence at .*:{line_of('# half the warp shuffles')}: "
                                             r"thread \(0, 0, 0\) .* thread \(16, 0, 0\) of its warp"):
        mg.cpu.run(shuffle_against_barrier[32], [X], grid=1, block=32)
