"""Globals a kernel or vectorized function reads: a launch after one changed
(rebound, a list or array changed in place, a closure cell, a global of an
@mg.func helper) sees the new value, or with on_global_change="error" raises
CompileError naming it; the compile cache's key comes from the same trace as
the image it names."""
import numpy as np
import pytest

import mlirgpu as mg

SCALE = 2.0
TABLE = np.array([1.0, 2.0], np.float32)
OFFSETS = [0.0]


@mg.func
def times_scale(v):
    return v * SCALE


@mg.kernel
def reads_globals(x: mg.memref[4, mg.f32]):
    i = mg.thread_idx.x
    x[i] = SCALE + TABLE[0] + OFFSETS[0]


@mg.kernel
def reads_through_helper(x: mg.memref[4, mg.f32]):
    i = mg.thread_idx.x
    x[i] = times_scale(mg.constant(1.0, mg.f32))


def launch(kernel):
    x = np.zeros(4, np.float32)
    kernel(x, grid=1, block=4)
    return x[0]


@pytest.fixture
def restore_globals():
    global SCALE
    saved = SCALE, TABLE.copy(), list(OFFSETS)
    yield
    SCALE = saved[0]
    TABLE[:] = saved[1]
    OFFSETS[:] = saved[2]


def test_a_rebound_global_recompiles(backend, restore_globals):
    global SCALE
    assert launch(reads_globals) == 3.0
    SCALE = 5.0
    assert launch(reads_globals) == 6.0


def test_arrays_and_lists_changed_in_place_recompile(backend, restore_globals):
    assert launch(reads_globals) == 3.0
    TABLE[0] = 10.0
    assert launch(reads_globals) == 12.0
    OFFSETS[0] = 100.0
    assert launch(reads_globals) == 112.0


def test_a_global_read_through_a_helper_recompiles(backend, restore_globals):
    global SCALE
    assert launch(reads_through_helper) == 2.0
    SCALE = 7.0
    assert launch(reads_through_helper) == 7.0


def test_a_closure_cell_recompiles(backend):
    factor = 2.0

    @mg.kernel
    def closes_over(x: mg.memref[4, mg.f32]):
        x[mg.thread_idx.x] = factor

    assert launch(closes_over) == 2.0
    factor = 4.0  # noqa: F841 (read by the kernel through its cell)
    assert launch(closes_over) == 4.0


def test_on_global_change_error_names_the_global_and_the_kernel(backend, restore_globals, monkeypatch):
    global SCALE

    @mg.kernel(on_global_change="error")
    def strict(x: mg.memref[4, mg.f32]):
        x[mg.thread_idx.x] = SCALE

    assert launch(strict) == 2.0
    SCALE = 3.0
    with pytest.raises(mg.CompileError, match=r"strict .*global 'SCALE'"):
        launch(strict)
    SCALE = 2.0
    assert launch(strict) == 2.0   # the value it was compiled with again


def test_mlirgpu_globals_error_sets_the_default(backend, restore_globals, monkeypatch):
    global SCALE
    monkeypatch.setenv("MLIRGPU_GLOBALS", "error")

    @mg.kernel
    def by_default(x: mg.memref[4, mg.f32]):
        x[mg.thread_idx.x] = SCALE

    assert launch(by_default) == 2.0
    SCALE = 3.0
    with pytest.raises(mg.CompileError, match="by_default .*'SCALE'"):
        launch(by_default)
    monkeypatch.setenv("MLIRGPU_GLOBALS", "sometimes")
    with pytest.raises(ValueError, match="MLIRGPU_GLOBALS"):
        launch(by_default)


def test_a_bad_on_global_change_raises_value_error():
    with pytest.raises(ValueError, match="on_global_change"):
        mg.kernel(on_global_change="never")(lambda: None)


def test_vectorize_sees_a_changed_global(backend, restore_globals):
    global SCALE

    @mg.vectorize
    def scaled(v):
        return v * SCALE

    np.testing.assert_array_equal(scaled(np.ones(3, np.float32)), 2.0)
    SCALE = 4.0
    np.testing.assert_array_equal(scaled(np.ones(3, np.float32)), 4.0)


def test_the_cache_key_and_the_image_come_from_one_trace(restore_globals):
    global SCALE
    spec = reads_globals[()]
    assert "2.0" in spec.cache_key("sm_90a").details["globals"]["SCALE"]
    assert "3.000000e+00" in spec.ir()   # SCALE + TABLE[0] + OFFSETS[0], folded
    SCALE = 5.0
    key = spec.cache_key("sm_90a")
    assert key.details["globals"]["SCALE"] == "5.0"
    assert "6.000000e+00" in spec.ir()
    assert "3.000000e+00" not in spec.ir()


class Unkeyable:
    """A value the compile cache cannot fingerprint."""


UNKEYABLE = Unkeyable()


def compile_time_size():
    """A plain helper run while tracing; it reads a value with no fingerprint."""
    return 4 if UNKEYABLE is not None else 0


@mg.kernel
def sized_by_helper(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = mg.constant(compile_time_size(), mg.f32)


def test_a_helpers_value_without_a_fingerprint_stays_out_of_the_key():
    key = sized_by_helper[()].cache_key("sm_90a")
    assert "compile_time_size" in key.details["globals"]
    assert not any("UNKEYABLE" in name for name in key.details["globals"])


@mg.kernel
def names_modules_only(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = np.float32(1.0)


def test_a_kernel_naming_only_modules_reads_no_globals():
    # Modules are not rebound between launches: such a kernel keeps the C launch path
    # (a kernel with a global to check launches through Python).
    assert launch(names_modules_only) == 1.0
    assert names_modules_only.traced_globals.values == {}
