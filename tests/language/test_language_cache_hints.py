"""Cache hints on loads and stores, and read-only / no-alias parameters: the
same results on both backends (a hint is a plain access on the CPU), the PTX
each asks for, and the errors."""
import numpy as np
import pytest

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts
from mlirgpu import block_dim, block_idx, thread_idx

N, T = mg.generics("N T")


@mg.kernel
def hinted_copy(X: mg.memref[N, T], Y: mg.memref[N, T]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        mg.store(Y, i, mg.load(X, i, cache="readonly") * 2, cache="streaming")


@mg.kernel
def hinted_vectors(X: mg.memref[N, T], Y: mg.memref[N, T]):
    i = (block_idx.x * block_dim.x + thread_idx.x) * 4
    v = mg.vload(X, i, 4, cache="evict_first")
    mg.vstore(Y, i, v + v, cache="evict_last")


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float16])
def test_hinted_accesses_compute_plain_results(backend, dtype):
    X = np.arange(256).astype(dtype)
    # 4 x i64 is 32 bytes: more than one vector access moves.
    for kernel in (hinted_copy, hinted_vectors) if dtype != np.int64 else (hinted_copy,):
        Y = np.zeros_like(X)
        kernel(X, Y, grid=4, block=64 if kernel is hinted_copy else 16)
        np.testing.assert_array_equal(Y, X * 2)


def test_hints_in_ptx(tmp_path):
    ptx = hinted_copy[256, mg.f32].ptx(chip="sm_90a")
    filecheck(ptx, r"ld\.global\.nc\.b32", r"st\.global\.cs\.b32")
    ptxas_accepts(ptx, "sm_90a", tmp_path)
    vectors = hinted_vectors[256, mg.f32].ptx(chip="sm_90a")
    filecheck(vectors, r"ld\.global\.L1::evict_first\.v4\.b32 \{%r\d+, %r\d+, %r\d+, %r\d+\}",
              r"st\.global\.L1::evict_last\.v4\.b32 \[%rd\d+\], \{")
    ptxas_accepts(vectors, "sm_90a", tmp_path)
    # 4 x f16: two 32-bit words; the L1 eviction hints raise sm_80's PTX ISA from 7.0 to 7.4.
    halves = hinted_vectors[256, mg.f16].ptx(chip="sm_80")
    filecheck(halves, r"^\.version 7\.4", r"ld\.global\.L1::evict_first\.v2\.b32")
    ptxas_accepts(halves, "sm_80", tmp_path)
    with pytest.raises(mg.CompileError, match=r"needs PTX ISA 7\.4, but features='\+ptx70'"):
        mg.Compilation(hinted_vectors[256, mg.f16].module(), "sm_80", features="+ptx70")
    wide = hinted_copy[256, mg.f64].ptx(chip="sm_75")
    filecheck(wide, r"ld\.global\.nc\.b64", r"st\.global\.cs\.b64")
    ptxas_accepts(wide, "sm_75", tmp_path)


@mg.kernel
def restricted(X: mg.memref[None, mg.f32].readonly(), Y: mg.memref[None, mg.f32].noalias(),
               Z: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < X.shape[0]:
        Y[i] = X[i] + 1.0
        mg.atomic.add(Z, i % N, X[i])  # atomic: threads i and i + N share an element


def test_readonly_and_noalias_parameters(backend):
    X = np.arange(100, dtype=np.float32)
    Y, Z = np.zeros(100, np.float32), np.zeros(4, np.float32)
    restricted(X, Y, Z, grid=2, block=64)
    np.testing.assert_array_equal(Y, X + 1)


def test_readonly_parameter_loads_through_the_readonly_cache(tmp_path):
    spec = restricted[4]
    filecheck(spec.ir(), r"%arg0: memref<f32> \{llvm\.noalias, llvm\.readonly\}", r"%arg2: memref<f32> \{llvm\.noalias\}")
    ptx = spec.ptx(chip="sm_90a")
    filecheck(ptx, r"ld\.global\.nc\.b32")
    assert ptx.count("ld.global.nc") == 1  # X only: Y and Z are written
    ptxas_accepts(ptx, "sm_90a", tmp_path)
    assert repr(mg.memref[None, mg.f32].readonly()) == "mg.memref[None, f32].readonly()"


@mg.kernel
def store_to_readonly(X: mg.memref[N, mg.f32].readonly()):
    X[0] = 1.0  # a store to a read-only array


@mg.func
def bump(A):
    mg.atomic.add(A, 0, 1.0)  # an atomic on a read-only array


@mg.kernel
def atomic_through_function(X: mg.memref[N, mg.f32].readonly()):
    bump(X)


@mg.kernel
def bad_hint(X: mg.memref[N, mg.f32]):
    X[1] = mg.load(X, 0, cache="sticky")  # unknown hint


@mg.kernel
def hint_on_shared(X: mg.memref[N, mg.f32]):
    s = mg.shared.array((4,), mg.f32)
    X[0] = mg.load(s, 0, cache="readonly")  # shared memory


@pytest.mark.parametrize("kernel, message", [
    (store_to_readonly, "a store to 'X', which is declared .readonly()"),
    (atomic_through_function, "mg.atomic.add to 'X', which is declared .readonly()"),
    (bad_hint, "cache must be one of 'readonly', 'streaming'"),
    (hint_on_shared, "cache hints are for arrays in global memory"),
])
def test_hint_and_qualifier_errors(kernel, message):
    with pytest.raises(mg.CompileError, match=message):
        kernel[4].ir()
