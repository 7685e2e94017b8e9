"""The CPU backend's runtime (mlirgpu.cpu.run): kernels JIT-compiled for the
host through MLIR's ExecutionEngine, each thread of a block a fiber; its
barriers, argument checks and memory. Runs without a GPU. The SGEMM kernels
launched on both backends are in test_kernel_launch.py."""
import gc
import os

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

from support.backends import current_backend
from support.kernels_sgemm import scale_rows

N = mg.generics("N")


def test_non_contiguous_argument_is_written_back():
    X = np.zeros((4, 128), np.float32)[:, ::2]
    X[:] = 1
    mg.cpu.run(scale_rows[4, 64, mg.f32], [X, 3.0, 4], grid=(1, 1), block=(4, 64))
    np.testing.assert_array_equal(X, 3.0)


@mg.kernel
def rotate(X: mg.memref[N, mg.f32]):
    """X[t] = 2 * ((t + 1) % N): right only if each barrier waits for every thread."""
    t = thread_idx.x
    X[t] = mg.cast(t, mg.f32) * 2.0
    mg.syncthreads()
    v = X[(t + 1) % N]
    mg.syncthreads()
    X[t] = v


def test_barrier_waits_for_every_thread():
    X = np.zeros(96, np.float32)
    mg.cpu.run(rotate[96], [X], grid=1, block=96)
    np.testing.assert_array_equal(X, 2.0 * ((np.arange(96) + 1) % 96))


@mg.kernel
def rotate_2d(X: mg.memref[N, mg.f32]):
    """Each block rotates its own slice of X; threads are 2-D."""
    t = thread_idx.y * block_dim.x + thread_idx.x
    n = block_dim.x * block_dim.y
    base = block_idx.x * n
    X[base + t] = mg.cast(base + t, mg.f32)
    mg.syncthreads()
    v = X[base + (t + 1) % n]
    mg.syncthreads()
    X[base + t] = v


def test_barrier_per_block_with_2d_threads():
    X = np.zeros(3 * 32, np.float32)
    mg.cpu.run(rotate_2d[96], [X], grid=3, block=(8, 4))
    t = np.arange(96)
    np.testing.assert_array_equal(X, (t // 32) * 32 + (t % 32 + 1) % 32)


@pytest.mark.parametrize("args, message", [
    ([np.zeros(8, np.float64)], "parameter 'X'"),
    ([np.zeros(9, np.float32)], "parameter 'X'"),
    ([[0.0] * 8], "numpy.ndarray"),
    ([], "takes 1 arguments"),
])
def test_bad_arguments_raise_launch_error(args, message):
    with pytest.raises(mg.LaunchError, match=message):
        mg.cpu.run(rotate[8], args, grid=1, block=8)


@pytest.mark.parametrize("grid, block, message", [
    (1, 2048, "at most 1024"),
    (0, 8, r"grid\[0\]"),
    ((1, 2, 3, 4), 8, "tuple of 1 to 3"),
])
def test_bad_configuration_raises_launch_error(grid, block, message):
    with pytest.raises(mg.LaunchError, match=message):
        mg.cpu.run(rotate[8], [np.zeros(8, np.float32)], grid=grid, block=block)


def test_bad_scalar_raises_launch_error():
    with pytest.raises(mg.LaunchError, match="'rows'"):
        mg.cpu.run(scale_rows[4, 4, mg.f32], [np.zeros((4, 4), np.float32), 1.0, 2.5], grid=1, block=(4, 4))


def _rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    pytest.skip("no /proc/self/status")


def test_repeated_launches_do_not_grow_rss():
    spec = rotate[96]
    X = np.zeros(96, np.float32)
    for _ in range(50):  # warm up: engine, fiber stacks
        mg.cpu.run(spec, [X], grid=2, block=96)
    gc.collect()
    before = _rss_kb()
    for _ in range(1000):
        mg.cpu.run(spec, [X], grid=2, block=96)
    gc.collect()
    assert _rss_kb() - before < 4096


@mg.kernel
def math_and_atomics(X: mg.memref[N, mg.f32], S: mg.memref[1, mg.f32]):
    t = block_idx.x * block_dim.x + thread_idx.x
    X[t] = mg.math.tanh(X[t]) + mg.math.exp(X[t]) + mg.math.rsqrt(X[t] + 1.0)
    mg.atomic.add(S, (0,), 1.0)


def test_math_and_atomic_add():
    X = np.linspace(0, 1, 64).astype(np.float32)
    x = X.astype(np.float64)
    S = np.zeros(1, np.float32)
    mg.cpu.run(math_and_atomics[64], [X, S], grid=2, block=32)
    np.testing.assert_allclose(X, np.tanh(x) + np.exp(x) + 1 / np.sqrt(x + 1), rtol=1e-6)
    assert S[0] == 64


@mg.kernel
def double_all(X: mg.memref[N, mg.f32]):
    i = thread_idx.x
    if i < N:
        X[i] = X[i] * 2.0


class Delegating:
    """An array wrapper whose protocols come from __getattr__, on demand."""
    def __init__(self, array):
        self._array = array

    def __getattr__(self, name):
        return getattr(self._array, name)


def test_an_array_whose_protocol_comes_from_getattr_is_an_argument():
    x = np.arange(8, dtype=np.float32)
    with current_backend("cpu"):
        double_all(Delegating(x), grid=1, block=8)
    np.testing.assert_array_equal(x, 2 * np.arange(8, dtype=np.float32))


@mg.kernel
def fill_size(x: mg.memref[N, mg.i32]):
    x[thread_idx.x] = N


def test_specializations_beyond_the_budget_are_dropped_and_made_again(monkeypatch):
    import weakref

    from mlirgpu.runtime import kernel
    monkeypatch.setattr(kernel, "SPECIALIZATION_CACHE_SIZE", 3)
    with current_backend("cpu"):
        first = weakref.ref(fill_size[1])
        for n in range(1, 9):
            x = np.zeros(n, np.int32)
            fill_size(x, grid=1, block=n)
            np.testing.assert_array_equal(x, n)
        assert len(fill_size._specializations) <= 3
        gc.collect()
        assert first() is None                 # dropped with what it compiled
        x = np.zeros(1, np.int32)
        fill_size(x, grid=1, block=1)          # made again on demand
        np.testing.assert_array_equal(x, 1)
        assert len(fill_size._specializations) <= 3


@pytest.mark.parametrize("through", ["kernel", "specialization"])
def test_a_specialization_launched_from_c_is_not_the_least_recently_used(monkeypatch, through):
    """A hit of a C dispatcher ticks the specialization it launches: eviction
    passes over one launched from C since, however long ago it was specialized.
    (The CPU backend launches from Python and host arrays never hit, so the
    entry here is for a token argument and stores a callable where a GPU
    launch stores its Function.)"""
    from mlirgpu.runtime import kernel
    monkeypatch.setattr(kernel, "SPECIALIZATION_CACHE_SIZE", 3)
    with current_backend("cpu"):
        for n in (1, 2, 3):
            fill_size(np.zeros(n, np.int32), grid=1, block=n)
        first = fill_size._specializations[1,]
        x = np.zeros(1, np.int32)
        hits = []

        def launch(token, **kwargs):
            hits.append(token)
            first.launch([x], **kwargs)
        if through == "kernel":
            fill_size.register((0,), launch, None, first)
            dispatcher = fill_size
        else:
            first.register((0,), launch)
            dispatcher = first
        before = first.last_used
        dispatcher(0, grid=1, block=1)
        assert hits == [0] and first.last_used > before > 0
        assert first.last_used > fill_size._specializations[2,].last_used
        np.testing.assert_array_equal(x, 1)
        fill_size(np.zeros(4, np.int32), grid=1, block=4)      # a fourth: one must go
        assert set(fill_size._specializations) == {(1,), (3,), (4,)}
