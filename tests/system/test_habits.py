"""What users coming from NumPy, Numba and CuPy reach for first: one generic
from mg.generics("N"), NumPy dtypes wherever dtypes go, the early-exit guard,
help() and inspect on kernels, and errors that name the mlirgpu spelling of
what they tried (np.exp, math.sqrt, print, kernel[blocks, threads])."""
import inspect
import math
import pydoc

import numpy as np
import pytest
from support.backends import current_backend
from support.checks import run_isolated

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

N = mg.generics("N")


def test_generics_with_one_name_is_that_generic():
    assert not isinstance(N, tuple)
    assert repr(mg.memref[N, mg.f32]) == "mg.memref[N, f32]"
    M, K = mg.generics("M K")
    assert (M.name, K.name) == ("M", "K")
    with pytest.raises(ValueError):
        mg.generics("")


@mg.kernel
def scale(x: mg.memref[N, np.float32], a: np.float32):
    """x = a * x"""
    i = block_idx.x * block_dim.x + thread_idx.x
    x[i] = a * x[i]


D = mg.generics("D")


@mg.kernel
def fill(out: mg.memref[N, D], value: D):
    one = mg.constant(1, np.dtype("f4")) if D == mg.f32 else mg.constant(1, D)
    out[thread_idx.x] = mg.cast(value, np.float64) * mg.cast(one, np.float64) if D == mg.f64 else value


@pytest.mark.parametrize("dtype", [np.float32, np.dtype("f4"), "float32"])
def test_numpy_dtypes_are_dtypes(backend, dtype):
    x = mg.to_device(np.arange(8, dtype=np.float32))
    scale(x, np.float32(2), grid=1, block=8)
    np.testing.assert_array_equal(x.get(), 2 * np.arange(8, dtype=np.float32))
    assert mg.zeros(4, dtype).dtype == mg.f32
    assert mg.empty((2, 2), dtype).dtype == mg.f32
    assert "memref<8xf32>" in fill[8, dtype].ir()


def test_numpy_dtype_generic_values(backend):
    out = mg.zeros(4, np.float64)
    fill[4, np.float64](out, 2.5, grid=1, block=4)
    np.testing.assert_array_equal(out.get(), 2.5)


def test_numpy_dtype_in_annotations():
    assert scale.parameters[0].memref.dtype == mg.f32
    assert scale.parameters[1].dtype == mg.f32
    with pytest.raises(mg.CompileError, match="no mlirgpu dtype"):
        mg.memref[N, np.complex64]


def test_help_says_how_to_launch():
    text = pydoc.render_doc(scale, renderer=pydoc.plaintext)
    assert "x = a * x" in text
    assert "scale(x, a, grid=" in text and "block=" in text


def test_signature_and_module():
    assert scale.__module__ == __name__
    assert str(inspect.signature(scale)) == ("(x: mg.memref[N, f32], a: numpy.float32, *, grid, block, "
                                             "shared_mem=0, stream=None, cluster=None)")
    assert "def scale" in inspect.getsource(scale)


def test_numba_style_launch_points_to_grid_and_block():
    with pytest.raises(mg.CompileError, match=r"scale\(\.\.\., grid=blocks, block=threads\)"):
        scale[4, 64]
    with pytest.raises(mg.CompileError, match="grid=blocks, block=threads"):
        fill[(4,), (64,)]


@mg.kernel
def guarded(x: mg.memref[N, mg.f32], n: mg.index):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i >= n:
        return
    v = x[i]
    if v < 0.0:
        return
    x[i] = 2.0 * v


def test_early_return_guard(backend):
    data = np.array([1, -1, 2, 3, 4, 5, 6, 7], np.float32)
    x = mg.to_device(data)
    guarded(x, 6, grid=2, block=4)
    np.testing.assert_array_equal(x.get(), [2, -1, 4, 6, 8, 10, 6, 7])


def test_early_return_guard_is_scf_if():
    text = guarded[8].ir()
    assert text.count("scf.if") == 2


def test_return_elsewhere_says_what_works():
    @mg.kernel
    def in_loop(x: mg.memref[N, mg.f32]):
        for j in range(4):
            if j > 2:
                return
            x[j] = 1.0

    with pytest.raises(mg.CompileError, match=r"only an early-exit guard `if cond: return` at the top level"):
        in_loop[4].ir()



@mg.kernel
def uses_np_exp(x: mg.memref[N, mg.f32]):
    x[thread_idx.x] = np.exp(x[thread_idx.x])


@mg.kernel
def uses_np_maximum(x: mg.memref[N, mg.f32]):
    x[thread_idx.x] = np.maximum(x[thread_idx.x], 0.0)


@mg.kernel
def uses_math_sqrt(x: mg.memref[N, mg.f32]):
    x[thread_idx.x] = math.sqrt(x[thread_idx.x])


@mg.kernel
def uses_print(x: mg.memref[N, mg.f32]):
    print(x[thread_idx.x])


@pytest.mark.parametrize("kernel, message", [
    (uses_np_exp, r"np\.exp computes on the host .* use mg\.math\.exp"),
    (uses_np_maximum, r"np\.maximum .* use Python's max\(\) or mg\.math\.max"),
    (uses_math_sqrt, r"math\.sqrt computes on the host .* use mg\.math\.sqrt"),
    (uses_print, r"print\(\) in a kernel .* use mg\.printf"),
])
def test_host_functions_point_to_the_kernel_spelling(kernel, message):
    with pytest.raises(mg.CompileError, match=message) as info:
        kernel[4].ir()
    assert "test_habits.py:" in str(info.value)


def test_no_source_says_what_works():
    proc = run_isolated(
        "import mlirgpu as mg\n"
        "N = mg.generics('N')\n"
        "exec('@mg.kernel\\ndef k(x: mg.memref[N, mg.f32]):\\n    x[mg.thread_idx.x] = 1.0\\n')\n"
        "try:\n"
        "    k[4].ir()\n"
        "except mg.CompileError as error:\n"
        "    print(error)\n")
    assert "cannot read the source of k" in proc.stdout, proc.stderr
    for what in ("python -c", "exec()", "a .py file", "Jupyter notebook", "IPython", "3.13"):
        assert what in proc.stdout


def test_read_only_numpy_argument_is_refused(backend):
    x = np.broadcast_to(np.float32(1), (8,))
    with pytest.raises(mg.LaunchError, match="parameter 'x' is a read-only NumPy array"):
        scale(x, 2.0, grid=1, block=8)


def test_strided_numpy_argument_is_copied_in_and_back(backend):
    base = np.arange(16, dtype=np.float32)
    scale(base[::2], 10.0, grid=1, block=8)
    np.testing.assert_array_equal(base, np.where(np.arange(16) % 2 == 0, 10, 1) * np.arange(16))


def test_strided_device_array_is_refused():
    with current_backend("cpu"):
        view = mg.asarray(np.arange(16, dtype=np.float32)[::2])
        assert not view.is_c_contiguous
        with pytest.raises(mg.LaunchError, match="parameter 'x' needs a C-contiguous array"):
            scale(view, 2.0, grid=1, block=8)


def public_callables():
    return [name for name in mg.__all__ if callable(getattr(mg, name)) and not inspect.ismodule(getattr(mg, name))]


@pytest.mark.parametrize("name", public_callables())
def test_public_callable_has_a_docstring_with_an_example(name):
    """help(mg.<name>) says what it is and shows it used: an indented example line."""
    doc = inspect.getdoc(getattr(mg, name)) or ""
    assert len(doc.splitlines()[0] if doc else "") > 10, f"mg.{name} has no docstring"
    assert any((line.startswith("    ") and line.strip()) or line.startswith(">>>") for line in doc.splitlines()), \
        f"mg.{name}'s docstring has no example"


@pytest.mark.parametrize("name", ["to_device", "empty", "zeros", "asarray", "graph", "kernel", "vectorize"])
def test_public_functions_have_real_signatures(name):
    assert "*args" not in str(inspect.signature(getattr(mg, name)))
