"""@mg.kernel(fastmath=True), the approximate functions by name, and mg.math
on vectors: results on both backends against NumPy, and the PTX (the
approximate instructions only where asked for)."""
import re

import numpy as np
import pytest

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts
from mlirgpu import thread_idx

N, M = mg.generics("N M")


@mg.func
def functions(X, Y):
    t = thread_idx.x
    x = X[t]
    Y[0, t] = mg.math.exp(x)
    Y[1, t] = mg.math.log(x) + mg.math.sin(x) * mg.math.cos(x)
    Y[2, t] = x / (x + 1.0)
    Y[3, t] = mg.math.pow(x, 1.5)


@mg.kernel(fastmath=True)
def fast(X: mg.memref[N, mg.f32], Y: mg.memref[4, N, mg.f32]):
    functions(X, Y)  # a device function called from a fastmath kernel is fast too


@mg.kernel
def accurate(X: mg.memref[N, mg.f32], Y: mg.memref[4, N, mg.f32]):
    functions(X, Y)


def expected(X):
    x = X.astype(np.float64)
    return np.stack([np.exp(x), np.log(x) + np.sin(x) * np.cos(x), x / (x + 1), x ** 1.5])


@pytest.mark.parametrize("kernel", [fast, accurate])
def test_fast_and_accurate_results(backend, kernel):
    X = np.linspace(0.5, 3.0, 64, dtype=np.float32)
    Y = np.zeros((4, 64), np.float32)
    kernel(X, Y, grid=1, block=64)
    # The approximate instructions are within a few ulp over this range.
    np.testing.assert_allclose(Y, expected(X), rtol=2e-6 if kernel is accurate else 2e-5, atol=1e-6)


APPROXIMATE = r"\b(ex2\.approx\.f32|lg2\.approx\.f32|sin\.approx\.f32|cos\.approx\.f32|div\.approx\.f32)"


def test_fastmath_ptx(tmp_path):
    ptx = fast[64].ptx(chip="sm_90a")
    assert set(re.findall(APPROXIMATE, ptx)) == {"ex2.approx.f32", "lg2.approx.f32", "sin.approx.f32",
                                                 "cos.approx.f32", "div.approx.f32"}
    ptxas_accepts(ptx, "sm_90a", tmp_path)
    precise = accurate[64].ptx(chip="sm_90a")
    assert not {"lg2.approx.f32", "sin.approx.f32", "div.approx.f32"} & set(re.findall(APPROXIMATE, precise))
    filecheck(precise, r"div\.rn\.f32")
    assert "fastmath<fast>" in fast[64].ir() and "fastmath<fast>" not in accurate[64].ir()


@mg.kernel
def by_name(X: mg.memref[N, mg.f32], Y: mg.memref[5, N, mg.f32]):
    t = thread_idx.x
    x = X[t]
    Y[0, t] = mg.math.fast_exp(x)
    Y[1, t] = mg.math.rcp_approx(x)
    Y[2, t] = mg.math.fast_log(x) + mg.math.fast_sin(x)
    Y[3, t] = mg.math.fast_div(x, x + 2.0)
    Y[4, t] = mg.math.exp2_approx(x * -40.0)


def test_approximate_functions_by_name(backend, tmp_path):
    X = np.linspace(0.5, 3.0, 64, dtype=np.float32)
    Y = np.zeros((5, 64), np.float32)
    by_name(X, Y, grid=1, block=64)
    x = X.astype(np.float64)
    np.testing.assert_allclose(Y[:4], np.stack([np.exp(x), 1 / x, np.log(x) + np.sin(x), x / (x + 2)]),
                               rtol=2e-5, atol=1e-6)
    # 2^-20 .. 2^-120, normal floats (what ex2.approx.ftz.f32 keeps): within its 2 ulp, scaled.
    np.testing.assert_allclose(Y[4], np.exp2(-40.0 * X.astype(np.float64)), rtol=2e-5, atol=0)
    if backend == "cpu":
        ptx = by_name[64].ptx(chip="sm_90a")
        filecheck(ptx, r"ex2\.approx\.(ftz\.)?f32", r"rcp\.approx\.ftz\.f32", r"lg2\.approx\.(ftz\.)?f32",
                  r"ex2\.approx\.ftz\.f32")
        ptxas_accepts(ptx, "sm_90a", tmp_path)


@mg.kernel
def vector_math(X: mg.memref[N, mg.f32], Y: mg.memref[N, mg.f32]):
    i = thread_idx.x * 4
    v = mg.vload(X, i, 4)
    w = mg.math.exp(v) + mg.math.max(v, 1.0) * mg.math.sqrt(v)
    mg.vstore(Y, i, mg.math.fma(w, v, 0.5) + mg.math.trunc(-v))


def test_math_on_vectors(backend):
    X = np.linspace(0.25, 4.0, 64, dtype=np.float32)
    Y = np.zeros(64, np.float32)
    vector_math(X, Y, grid=1, block=16)
    x = X.astype(np.float64)
    np.testing.assert_allclose(Y, (np.exp(x) + np.maximum(x, 1) * np.sqrt(x)) * x + 0.5 + np.trunc(-x), rtol=1e-5)
    assert "math.exp %" in vector_math[64].ir() and "vector<4xf32>" in vector_math[64].ir()


@mg.kernel
def rcp_of_double(X: mg.memref[N, mg.f64]):
    X[0] = mg.math.rcp_approx(X[0])  # f64


@mg.kernel
def exp2_of_half(X: mg.memref[N, mg.f16]):
    X[0] = mg.math.exp2_approx(X[0])  # f16


@mg.kernel
def exp_of_int(X: mg.memref[N, mg.i32]):
    X[0] = mg.math.exp(X[0])  # an integer


@pytest.mark.parametrize("kernel, message", [
    (rcp_of_double, "mg.math.rcp_approx takes f32 values"),
    (exp2_of_half, "mg.math.exp2_approx takes f32 values"),
    (exp_of_int, "mg.math.exp takes a traced float value or vector"),
])
def test_math_errors(kernel, message):
    with pytest.raises(mg.CompileError, match=message):
        kernel[4].ir()


def test_fastmath_option_is_checked():
    with pytest.raises(ValueError, match="fastmath"):
        mg.kernel(fastmath="yes")(lambda X: None)
