"""The memory model: fences and atomics with orderings and scopes, on both
backends (a one-launch sum whose last block adds the partial sums), their
PTX, and the errors of a bad order or scope."""
import numpy as np
import pytest

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts
from mlirgpu import block_dim, block_idx, grid_dim, thread_idx

N, B = mg.generics("N B")


@mg.kernel
def one_launch_sum(X: mg.memref[N, mg.f32], partial: mg.memref[B, mg.f32], done: mg.memref[1, mg.u32],
                   total: mg.memref[1, mg.f32]):
    # Each block sums its slice; the block that finishes last sums the partial sums.
    i = block_idx.x * block_dim.x + thread_idx.x
    s = mg.block.reduce(X[i], "add")
    is_last = mg.shared.array((1,), mg.u32)
    if thread_idx.x == 0:
        partial[block_idx.x] = s
        mg.threadfence()  # the partial sum is visible before the ticket is taken
        is_last[0] = mg.atomic.add(done, 0, 1, order="acq_rel")
    mg.syncthreads()
    if mg.cast(is_last[0], mg.index) == grid_dim.x - 1:
        if thread_idx.x == 0:
            acc = mg.constant(0.0, mg.f32)
            for b in range(grid_dim.x):
                acc += partial[b]
            mg.atomic.store(total, 0, acc, order="release")
            done[0] = 0  # ready for the next launch


def test_last_block_sum(backend, size):
    blocks = size(gpu=1024, cpu=16)
    X = np.random.default_rng(1).random(blocks * 64).astype(np.float32)
    partial = np.zeros(blocks, np.float32)
    done, total = np.zeros(1, np.uint32), np.zeros(1, np.float32)
    for _ in range(2):  # the kernel resets its counter: a second launch sums again
        total[0] = 0
        one_launch_sum(X, partial, done, total, grid=blocks, block=64)
        np.testing.assert_allclose(total[0], X.astype(np.float64).sum(), rtol=1e-5)
        assert done[0] == 0


@mg.kernel
def orderings(count: mg.memref[8, mg.u32], F: mg.memref[4, mg.f32], L: mg.memref[2, mg.i64]):
    t = thread_idx.x
    flags = mg.shared.array((32,), mg.i32)
    flags[t] = 0
    mg.syncthreads()
    added = mg.atomic.add(count, 0, 1, order="acquire")
    mg.atomic.or_(count, 2, mg.cast(t, mg.u32) % 4, order="release", scope="sys")
    mg.atomic.cas(count, 3, 0, mg.cast(t, mg.u32) + 1, order="acq_rel", scope="cta")
    loaded = mg.atomic.load(count, 6, order="acquire")
    mg.atomic.store(count, 5, 1, order="release", scope="cta")
    largest = mg.atomic.max(F, 0, 1.5, order="acquire")
    least = mg.atomic.min(L, 0, mg.cast(t, mg.i64), order="acq_rel")
    if t == 0:  # one thread keeps what its atomics returned: plain stores of all threads to one element race
        count[1] = added
        count[4] = loaded
        F[1] = largest
        L[1] = least
    mg.atomic.exchange(flags, t, 1, order="relaxed", scope="cta")
    mg.threadfence_block()
    mg.threadfence()
    mg.threadfence_system()


def test_orderings_in_ptx(tmp_path):
    ptx = orderings.specialize({}).ptx(chip="sm_90a")
    filecheck(ptx, r"atom\.acquire\.gpu(\.global)?\.add\.u32", r"atom\.release\.sys(\.global)?\.or\.b32",
              r"atom\.acq_rel\.cta(\.global)?\.cas\.b32", r"ld\.acquire\.gpu(\.global)?\.b32",
              r"st\.release\.cta(\.global)?\.b32")
    # Float max is a compare-and-swap loop that keeps the ordering.
    filecheck(ptx, r"atom\.acquire\.gpu(\.global)?\.cas\.b32")
    filecheck(ptx, r"atom\.acq_rel\.gpu(\.global)?\.min\.s64")
    filecheck(ptx, r"atom\.relaxed\.cta\.shared\.exch\.b32")
    filecheck(ptx, r"membar\.cta", r"membar\.gl", r"membar\.sys")
    for chip in ("sm_90a", "sm_80", "sm_75"):
        ptxas_accepts(orderings.specialize({}).ptx(chip=chip), chip, tmp_path)


def test_last_block_sum_in_ptx():
    ptx = one_launch_sum[64, 1].ptx(chip="sm_90a")
    filecheck(ptx, r"membar\.gl", r"atom\.acq_rel\.gpu\.global\.add\.u32", r"st\.release\.gpu\.global\.b32")


def test_orderings_run_on_both(backend):
    count, F, L = np.zeros(8, np.uint32), np.zeros(4, np.float32), np.full(2, 99, np.int64)
    count[6] = 7
    orderings.specialize({})(count, F, L, grid=1, block=32)
    assert count[0] == 32 and count[2] == 3 and count[4] == 7 and count[5] == 1
    assert 1 <= count[3] <= 32  # the one thread whose swap found 0
    assert F[0] == 1.5 and L[0] == 0


@mg.kernel
def bad_order(C: mg.memref[1, mg.u32]):
    mg.atomic.add(C, 0, 1, order="seq")  # bad order


@mg.kernel
def bad_scope(C: mg.memref[1, mg.u32]):
    mg.atomic.add(C, 0, 1, scope="grid")  # bad scope


@mg.kernel
def release_load(C: mg.memref[1, mg.u32]):
    C[0] = mg.atomic.load(C, 0, order="release")  # a load cannot release


@pytest.mark.parametrize("kernel, message", [
    (bad_order, "order must be one of 'relaxed', 'acquire', 'release', 'acq_rel', not 'seq'"),
    (bad_scope, "scope must be one of 'cta', 'gpu', 'sys', not 'grid'"),
    (release_load, "mg.atomic.load: order must be one of 'relaxed', 'acquire', not 'release'"),
])
def test_bad_order_or_scope(kernel, message):
    with pytest.raises(mg.CompileError, match=message) as info:
        kernel.specialize({}).ir()
    assert info.value.lineno == kernel.function.__code__.co_firstlineno + 2
