"""Vectors (mg.vload's results) carried through traced loops, ifs and while
loops like any other value, on both backends."""
import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import thread_idx

R, C = mg.generics("R C")


@mg.kernel
def column_sums(X: mg.memref[R, C, mg.f32], out: mg.memref[C, mg.f32]):
    # Each thread sums four columns down the rows, in one vector accumulator.
    j = thread_idx.x * 4
    acc = mg.vload(X, (0, j), 4)
    for r in range(1, R):
        acc = acc + mg.vload(X, (r, j), 4)
    mg.vstore(out, j, acc)


def test_vector_carried_through_a_loop(backend):
    X = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    out = np.zeros(64, np.float32)
    column_sums(X, out, grid=1, block=16)
    np.testing.assert_allclose(out, X.sum(0), rtol=1e-5, atol=1e-5)
    assert "scf.for" in column_sums[16, 64].ir() and "-> (vector<4xf32>)" in column_sums[16, 64].ir()


@mg.kernel
def vector_tiles(X: mg.memref[R, C, mg.f32], out: mg.memref[2, C, mg.f32]):
    # A list of two vectors (a register tile), the second half kept only where positive.
    j = thread_idx.x * 4
    tile = [mg.vload(X, (0, j), 4), mg.vload(X, (0, j), 4) * 0.0]
    for r in range(1, R):
        v = mg.vload(X, (r, j), 4)
        tile[0] += v
        if v[0] > 0.0:
            tile[1] = tile[1] + v
    k = 0
    while k < 3:
        tile[1] = tile[1] * 2.0
        k += 1
    mg.vstore(out, (0, j), tile[0])
    mg.vstore(out, (1, j), tile[1])


def test_vectors_in_lists_ifs_and_while_loops(backend):
    X = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    out = np.zeros((2, 32), np.float32)
    vector_tiles(X, out, grid=1, block=8)
    np.testing.assert_allclose(out[0], X.sum(0), rtol=1e-5, atol=1e-5)
    keep = X[1:, 0::4] > 0  # each thread's condition is its first lane's
    expected = 8 * (X[1:].reshape(7, 8, 4) * keep[:, :, None]).sum(0).ravel()
    np.testing.assert_allclose(out[1], expected, rtol=1e-5, atol=1e-5)


@mg.kernel
def vector_becomes_scalar(X: mg.memref[R, C, mg.f32]):
    acc = mg.vload(X, (0, 0), 4)
    for r in range(R):
        acc = acc[0]  # not a vector any more


def test_vector_must_stay_a_vector():
    with pytest.raises(mg.CompileError, match="vector<4xf32> before the loop and f32 at the end"):
        vector_becomes_scalar[4, 4].ir()


@mg.kernel
def reversed_bytes(X: mg.memref[C, mg.u8], out: mg.memref[C, mg.u8]):
    # 16 bytes a thread, read and written as one vector each, their lanes reversed.
    i = thread_idx.x * 16
    v = mg.vload(X, i, 16)
    mg.vstore(out, i, tuple(v[15 - k] for k in mg.static_range(16)))


def test_sixteen_bytes_in_one_vector(backend):
    X = np.arange(64, dtype=np.uint8)
    out = np.zeros(64, np.uint8)
    reversed_bytes(X, out, grid=1, block=4)
    np.testing.assert_array_equal(out, X.reshape(4, 16)[:, ::-1].ravel())
    assert "vector<16xi8>" in reversed_bytes[64].ir()
