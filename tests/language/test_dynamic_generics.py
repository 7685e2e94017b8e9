"""Dynamic generics: sizes known only at launch, one compile per variant.

A dynamic generic's value is the extent of the array it sizes, passed at
launch; a size that is a multiple of 16 selects a variant of its own, and
MLIRGPU_LOG=compile says why each variant was compiled.
"""
import logging
import re

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu.language.generics import Dynamic

M = mg.generics("M", dynamic=True)
R, C = mg.generics("R C", dynamic=True)
N = mg.generics("N")


@mg.kernel
def scale_rows(x: mg.memref[M, N, mg.f32], y: mg.memref[M, N, mg.f32], a: mg.f32):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < M:
        for j in range(N):
            y[i, j] = a * x[i, j]


@mg.kernel
def add_one(x: mg.memref[R, C, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < R * C:
        x[i // C, i % C] = x[i // C, i % C] + 1.0


@pytest.fixture
def compiles(monkeypatch, caplog):
    """The compile lines MLIRGPU_LOG=compile writes from now on."""
    monkeypatch.setenv("MLIRGPU_LOG", "compile")
    caplog.set_level(logging.INFO, logger="mlirgpu")
    return lambda: [r.getMessage() for r in caplog.records
                    if r.name == "mlirgpu" and r.getMessage().startswith("mlirgpu: compiling")]


def test_one_compile_per_variant_for_a_hundred_sizes(backend, compiles):
    @mg.kernel
    def axpy(x: mg.memref[M, mg.f32], y: mg.memref[M, mg.f32], a: mg.f32):
        i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
        if i < M:
            y[i] = a * x[i] + y[i]

    sizes = range(1, 101)
    for size in sizes:
        x = np.arange(size, dtype=np.float32)
        dx, dy = mg.to_device(x), mg.to_device(np.ones(size, np.float32))
        axpy(dx, dy, 2.0, grid=(size + 31) // 32, block=32)
        np.testing.assert_array_equal(dy.get(), 2.0 * x + 1.0)
    lines = compiles()
    variants = {size % 16 == 0 for size in sizes}
    assert len(lines) == len(variants) == 2, lines
    assert any("M=dynamic(multiple of 16)" in line for line in lines)
    assert any(re.search(r"M=dynamic\b(?!\()", line) for line in lines)


def test_a_size_selects_its_variant():
    assert scale_rows[16, 4] is scale_rows[64, 4]
    assert scale_rows[17, 4] is scale_rows[3, 4]
    assert scale_rows[16, 4] is not scale_rows[17, 4]
    assert scale_rows[16, 4].values["M"] == Dynamic(16)


def test_the_cache_key_records_the_variant():
    assert "M=dynamic(multiple of 16)" in scale_rows[32, 4].cache_fields()[0]
    assert "M=dynamic," in scale_rows[33, 4].cache_fields()[0] + ","


def test_the_multiple_variant_assumes_divisibility():
    assert "llvm.intr.assume" in scale_rows[32, 4].ir()
    assert "llvm.intr.assume" not in scale_rows[31, 4].ir()


def test_results_for_sizes_of_both_variants(backend):
    for rows in (5, 16, 48, 50):
        x = np.random.rand(rows, 3).astype(np.float32)
        y = np.zeros_like(x)
        scale_rows(x, y, 3.0, grid=(rows + 31) // 32, block=32)
        np.testing.assert_allclose(y, 3.0 * x, rtol=1e-6)


def test_dynamic_sizes_after_the_first_dimension(backend):
    for shape in ((3, 5), (4, 16), (16, 16), (7, 33)):
        x = np.random.rand(*shape).astype(np.float32)
        got = x.copy()
        add_one(got, grid=(x.size + 63) // 64, block=64)
        np.testing.assert_allclose(got, x + 1.0, rtol=1e-6)


@pytest.mark.parametrize("sizes", [(8, 16), (5, 7), (16, 32)])
def test_dynamic_sizes_at_every_position_compile_to_ptx(sizes):
    ptx = add_one[sizes].ptx(chip="sm_90a")
    assert ".entry add_one" in ptx


def test_sizes_the_arguments_disagree_on_raise():
    x = np.zeros((4, 2), np.float32)
    y = np.zeros((5, 2), np.float32)
    with pytest.raises(mg.LaunchError, match="generic M is 4 from x.shape\\[0\\] but 5 from y.shape\\[0\\]"):
        scale_rows(x, y, 1.0, grid=1, block=32)


def test_a_dynamic_generic_must_size_an_array():
    K = mg.generics("K", dynamic=True)

    def f(x: mg.memref[4, mg.f32]):
        pass
    with pytest.raises(mg.CompileError, match="dynamic generic K sizes no array parameter"):
        mg.kernel(f, generics=(K,))


def test_a_dynamic_generic_is_no_element_type():
    T = mg.generics("T", dynamic=True)

    def f(x: mg.memref[4, T]):
        pass
    with pytest.raises(mg.CompileError, match="dynamic generic T is a size, not an element type"):
        mg.kernel(f)


def test_generics_dynamic_takes_a_bool():
    with pytest.raises(ValueError, match="takes True or False"):
        mg.generics("M", dynamic=1)


def test_assume_emits_an_llvm_assume():
    @mg.kernel
    def first(x: mg.memref[M, mg.f32]):
        mg.assume(M % 64 == 0)
        x[0] = 1.0
    text = first[3].ir()
    assert text.count("llvm.intr.assume") == 1
    assert re.search(r"arith.remsi %\w+, %c64", text)


def test_assume_of_a_false_static_fact_raises():
    @mg.kernel
    def first(x: mg.memref[N, mg.f32]):
        mg.assume(N % 64 == 0)
        x[0] = 1.0
    assert "llvm.intr.assume" not in first[128].ir()
    with pytest.raises(mg.CompileError, match="mg.assume\\(...\\) is false for this specialization"):
        first[100].ir()


def test_assume_takes_a_condition():
    @mg.kernel
    def first(x: mg.memref[M, mg.f32]):
        mg.assume(x[0])
    with pytest.raises(mg.CompileError, match="mg.assume takes a traced bool"):
        first[4].ir()


def test_misaligned_arrays_select_a_variant_of_their_own(backend, compiles):
    @mg.kernel
    def copy(x: mg.memref[M, mg.f32], y: mg.memref[M, mg.f32]):
        i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
        if i < M:
            y[i] = x[i]

    base = mg.to_device(np.arange(33, dtype=np.float32))
    for start in (0, 1, 0, 1):
        y = mg.to_device(np.zeros(32, np.float32))
        copy(base[start:start + 32], y, grid=1, block=32)
        np.testing.assert_array_equal(y.get(), np.arange(start, start + 32, dtype=np.float32))
    lines = compiles()
    assert len(lines) == 2, lines
    # The CPU backend's log names the specialization, the GPU's the cache key's fields.
    aligned = [", arrays 16-byte aligned" in line or ",aligned=16, chip" in line for line in lines]
    assert aligned == [True, False], lines


def test_the_aligned_variant_assumes_alignment():
    aligned = scale_rows.specialize({"M": 32, "N": 4}, aligned=True)
    assert aligned is not scale_rows[32, 4] and not scale_rows[32, 4].aligned
    assert re.search(r"memref.assume_alignment %\w+, 16", aligned.ir())
    assert "assume_alignment" not in scale_rows[32, 4].ir()
    assert aligned.cache_fields()[0].endswith(",aligned=16")


def test_an_aligned_specialization_refuses_misaligned_arrays():
    aligned = scale_rows.specialize({"M": 16, "N": 2}, aligned=True)
    x = np.zeros(33 * 2 + 1, np.float32)[1:].reshape(33, 2)[:16]
    with pytest.raises(mg.LaunchError, match="an array that does not start at a multiple of 16 bytes"):
        aligned(x, np.zeros((16, 2), np.float32), 1.0, grid=1, block=32)
