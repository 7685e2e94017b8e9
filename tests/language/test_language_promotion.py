"""Mixed operand types: integers widen without loss (an i32 parameter meets
mg.thread_idx.x, an index, as in CUDA C, NumPy and Triton), floats widen to
the wider float; an integer with a float, and pairs no type holds both of,
stay CompileErrors, as does storing a wider value (narrowing)."""
import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu.language.core import widened


@pytest.mark.parametrize("a, b, common", [
    (mg.i32, mg.index, mg.index), (mg.i64, mg.index, mg.index), (mg.i8, mg.i64, mg.i64),
    (mg.u8, mg.u32, mg.u32), (mg.u32, mg.i64, mg.i64), (mg.u32, mg.index, mg.index), (mg.u8, mg.i8, mg.i16),
    (mg.u16, mg.i16, mg.i32), (mg.u32, mg.i32, mg.i64), (mg.f16, mg.f32, mg.f32), (mg.f32, mg.f64, mg.f64),
    (mg.f16, mg.bf16, mg.f32), (mg.bf16, mg.f64, mg.f64),
    (mg.u64, mg.i64, None), (mg.u64, mg.index, None), (mg.i32, mg.f32, None), (mg.index, mg.f64, None),
    (mg.bool_, mg.i32, None),
])
def test_widening_loses_no_value(a, b, common):
    assert widened(a, b) == common and widened(b, a) == common
    if common is not None and mg.index not in (a, b, common) and mg.bf16 not in (a, b, common):
        assert np.result_type(a.numpy, b.numpy) == common.numpy   # NumPy's promotion, where it has the types


@mg.kernel
def first_n(n: mg.i32, x: mg.memref[8, mg.f32]):
    i = mg.thread_idx.x
    if i < n:                       # i32 with index: index
        x[i] = 1.0


@mg.kernel
def mixed_floats(x: mg.memref[4, mg.f64], y: mg.memref[4, mg.f32], a: mg.f16):
    i = mg.thread_idx.x
    x[i] = x[i] + y[i] * a          # f32 * f16 is f32, then f64 + f32 is f64


@mg.kernel
def unsigned_offset(x: mg.memref[4, mg.i64], k: mg.u32):
    i = mg.thread_idx.x
    x[i] = x[i] - k                 # u32 with i64: i64 (zero-extended)


def test_an_i32_parameter_meets_thread_idx(backend):
    x = np.zeros(8, np.float32)
    first_n(5, x, grid=1, block=8)
    np.testing.assert_array_equal(x, [1] * 5 + [0] * 3)
    assert "arith.index_cast %arg0 : i32 to index" in first_n[()].ir()


def test_floats_and_unsigned_integers_widen(backend):
    x, y = np.ones(4), np.full(4, 0.1, np.float32)
    mixed_floats(x, y, np.float16(2), grid=1, block=4)
    np.testing.assert_array_equal(x, 1.0 + np.float64(np.float32(0.1) * np.float32(2)))
    z = np.zeros(4, np.int64)
    unsigned_offset(z, 2**32 - 1, grid=1, block=4)
    np.testing.assert_array_equal(z, -(2**32 - 1))
    assert "arith.extui" in unsigned_offset[()].ir()


@mg.kernel
def int_times_float(x: mg.memref[4, mg.f32], n: mg.i32):
    x[mg.thread_idx.x] = x[mg.thread_idx.x] * n


@mg.kernel
def index_with_u64(x: mg.memref[4, mg.f32], u: mg.u64):
    x[0] = mg.cast(mg.thread_idx.x < u, mg.f32)


@mg.kernel
def narrowing_store(x: mg.memref[4, mg.f32], w: mg.f64):
    x[mg.thread_idx.x] = w


@pytest.mark.parametrize("kernel, message", [
    (int_times_float, "operands of \\* have types f32 and i32"),
    (index_with_u64, "operands of < have types index and u64"),
    (narrowing_store, "the memref's element type is f32 but the value is f64"),
])
def test_int_float_mixes_and_narrowing_stay_errors(kernel, message):
    with pytest.raises(mg.CompileError, match=message):
        kernel[()].ir()


def test_vectorize_mixes_float32_and_float64_as_numpy(backend):
    @mg.vectorize
    def scaled(x):
        return x * mg.constant(0.1, mg.f64)

    @mg.vectorize(["f64(f32, f64)"])
    def product(a, b):
        return a * b

    x = np.arange(4, dtype=np.float32)
    got = scaled(x)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x * np.float64(0.1))
    np.testing.assert_array_equal(product(x, np.full(4, 0.1)), x * np.full(4, 0.1))
