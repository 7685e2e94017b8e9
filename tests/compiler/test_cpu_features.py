"""What the CPU backend does its own way (mlirgpu.cpu.run): shared memory per
block, warps of 32 linear thread ids, device functions in the host module,
printf through sys.stdout in the order the fibers ran, C's formatting; and
the checks only it makes: bounds (MLIRGPU_CHECK=bounds), barrier and warp
divergence. The device features themselves, on both backends, are in
test_device_features.py."""
import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

from support.kernels_features import BLOCK, dynamic_reverse, hello, use_device_functions

M, N = mg.generics("M N")


def line_of(marker):
    return next(i for i, text in enumerate(open(__file__), 1) if marker in text)


# ---------------------------------------------------------------------------
# Shared memory per block, warps

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


@mg.kernel
def lanes_2d(source: mg.memref[N, mg.i32], lane: mg.memref[N, mg.i32]):
    t = thread_idx.y * block_dim.x + thread_idx.x  # the linear thread id
    source[t] = mg.warp.shfl_idx(mg.cast(t, mg.i32), 3)
    lane[t] = mg.cast(mg.warp.lane_id(), mg.i32)


def test_warps_follow_the_linear_thread_id():
    """With 2-D blocks a warp is 32 consecutive linear ids (x fastest), as on the GPU:
    rows of 8 threads, 4 rows a warp."""
    source, lane = np.zeros(64, np.int32), np.zeros(64, np.int32)
    mg.cpu.run(lanes_2d[64], [source, lane], grid=1, block=(8, 8))
    np.testing.assert_array_equal(source, np.repeat([3, 35], 32))
    np.testing.assert_array_equal(lane, np.arange(64) % 32)


# ---------------------------------------------------------------------------
# The host module

def test_device_functions_are_func_funcs_of_the_host_module():
    text = mg.cpu.host_module(use_device_functions[64], checks=()).print()
    assert "gpu.module" not in text and "gpu." not in text
    assert "func.func private @axpy" in text


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


def test_bounds_checks_are_on_unless_mlirgpu_check_is_none(monkeypatch):
    monkeypatch.delenv("MLIRGPU_CHECK", raising=False)
    checked = mg.cpu.host_module(fill_rows[64, 48]).print()
    assert "mg_cpu_out_of_bounds" in checked and "arith.cmpi" in checked
    monkeypatch.setenv("MLIRGPU_CHECK", "none")
    plain = mg.cpu.host_module(fill_rows[64, 48]).print()
    assert "mg_cpu_out_of_bounds" not in plain and "arith.cmpi" not in plain
    monkeypatch.setenv("MLIRGPU_CHECK", "bonds")
    with pytest.raises(ValueError, match="unknown check 'bonds'"):
        mg.cpu.host_module(fill_rows[64, 48])
    # Unchecked, the same out-of-bounds kernel is not stopped (it writes past C's rows: give it room).
    monkeypatch.setenv("MLIRGPU_CHECK", "none")
    C = np.zeros((80, 48), np.float32)[:64]
    mg.cpu.run(fill_rows[64, 48], [C], grid=4, block=(16, 48))
    assert (C == 1).all()


@mg.kernel
def divergent_in_if(X: mg.memref[N, mg.f32]):
    t = thread_idx.x
    if t < 3:
        mg.syncthreads()  # reached by threads 0 to 2 only
    X[t] = 1.0


@mg.kernel
def divergent_in_loop(X: mg.memref[N, mg.f32]):
    t = thread_idx.x
    for k in range(t):
        mg.syncthreads()  # reached a different number of times by each thread
    X[t] = 1.0


@pytest.mark.parametrize("kernel, n, marker, waiting, returned", [
    (divergent_in_if, 8, "# reached by threads 0 to 2 only", 0, 3),
    (divergent_in_loop, 4, "# reached a different number", 1, 0),
], ids=["if", "loop"])
def test_barrier_divergence_names_the_line(kernel, n, marker, waiting, returned):
    line = line_of(marker)
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(kernel[n], [np.zeros(n, np.float32)], grid=1, block=n)
    assert str(info.value) == (f"barrier divergence at {__file__}:{line}: thread ({waiting}, 0, 0) of block "
                               f"(0, 0, 0) waits at mg.syncthreads() on line {line}, but thread ({returned}, 0, 0) "
                               f"returned without reaching it")
    assert isinstance(info.value, mg.Error)
    # The runtime is left usable: a launch with barriers after the error works.
    X = np.arange(96, dtype=np.float32)
    mg.cpu.run(block_local[96], [X], grid=3, block=32)
    np.testing.assert_array_equal(X, np.repeat(np.arange(96).reshape(3, 32).sum(1), 32))


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


# ---------------------------------------------------------------------------
# Narrowing to bf16 on the host (no bf16 instructions: the runtime's conversions)

@mg.kernel
def narrow_to_bf16(X: mg.memref[N, mg.f32], D: mg.memref[N, mg.f64], Y: mg.memref[N, mg.bf16],
                   Z: mg.memref[N, mg.bf16]):
    i = thread_idx.x
    if i < N:
        Y[i] = mg.cast(X[i], mg.bf16)
        Z[i] = mg.cast(D[i], mg.bf16)


def test_narrowing_to_bf16_rounds_once_to_nearest_even():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    # ties (1 + 2^-8 lies halfway between 1 and 1 + 2^-7), the smallest floats, the largest, NaN, signs
    floats = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1e-40, -1e-45, 3.4e38, np.inf, -np.inf,
                       np.nan, -0.0, 0.1, -2.5e-3] + list(np.random.default_rng(0).standard_normal(20)),
                      np.float32)
    # Through float these would round twice: 1 + 2^-8 + 2^-30 becomes the tie 1 + 2^-8, then 1.
    doubles = np.array([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 1 + 2**-8, 1 + 3 * 2**-8, 1e300, np.nan, 0.0,
                        1 + 2**-8 - 2**-40], np.float64)
    doubles = np.resize(doubles, floats.size)
    Y, Z = np.zeros(floats.size, bf16), np.zeros(floats.size, bf16)
    mg.cpu.run(narrow_to_bf16[floats.size], [floats, doubles, Y, Z], grid=1, block=32)
    np.testing.assert_array_equal(Y.view(np.uint16)[~np.isnan(floats)],
                                  floats.astype(bf16).view(np.uint16)[~np.isnan(floats)])
    assert np.isnan(Y[np.isnan(floats)].astype(np.float32)).all()
    expected = {1 + 2**-8 + 2**-30: 1 + 2**-7, -(1 + 2**-8 + 2**-30): -(1 + 2**-7), 1 + 2**-8: 1.0,
                1 + 3 * 2**-8: 1 + 2**-6, 1e300: np.inf, 0.0: 0.0, 1 + 2**-8 - 2**-40: 1.0}
    for d, z in zip(doubles, Z.astype(np.float64)):
        if np.isnan(d):
            assert np.isnan(z)
        else:
            assert z == expected[d], (d, z)
