"""Warp and block collectives on both backends, against NumPy: shuffles with
CUDA's width, votes, warp reductions, block reductions and scans; their PTX
(shfl.sync with the width's clamp, vote.sync, redux.sync) and errors."""
import numpy as np
import pytest

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts
from mlirgpu import thread_idx

N, T = mg.generics("N T")


def segments(width):
    """Lane k's segment start and its position in it, for 32 lanes."""
    lane = np.arange(32)
    return lane - lane % width, lane % width


@mg.kernel
def shuffles_with_width(X: mg.memref[N, mg.f32], out: mg.memref[4, N, mg.f32]):
    t = thread_idx.x
    x = X[t]
    out[0, t] = mg.warp.shfl_xor(x, 5, width=8)
    out[1, t] = mg.warp.shfl_down(x, 3, width=8)
    out[2, t] = mg.warp.shfl_up(x, 3, width=8)
    out[3, t] = mg.warp.shfl_idx(x, 11, width=8)


def expected_shuffles(X, width, xor, down, up, idx):
    expected = np.empty((4, X.size), X.dtype)
    for w in range(X.size // 32):
        x = X[32 * w:32 * w + 32]
        start, position = segments(width)
        lane = np.arange(32)
        xor_lane = lane ^ xor
        expected[0, 32 * w:32 * w + 32] = np.where(xor_lane < start + width, x[xor_lane % 32], x)
        down_lane = lane + down
        expected[1, 32 * w:32 * w + 32] = np.where(down_lane < start + width, x[np.minimum(down_lane, 31)], x)
        up_lane = lane - up
        expected[2, 32 * w:32 * w + 32] = np.where(up_lane >= start, x[up_lane % 32], x)
        expected[3, 32 * w:32 * w + 32] = x[start + idx % width]
    return expected


def test_shuffles_with_width(backend):
    X = np.arange(64, dtype=np.float32) * 1.5
    out = np.zeros((4, 64), np.float32)
    shuffles_with_width(X, out, grid=1, block=64)
    np.testing.assert_array_equal(out, expected_shuffles(X, 8, 5, 3, 3, 11))


@mg.kernel
def wide_shuffle(X: mg.memref[N, mg.f64], out: mg.memref[N, mg.f64]):
    out[thread_idx.x] = mg.warp.shfl_xor(X[thread_idx.x], 1, width=2)


def test_64_bit_shuffle_with_width(backend):
    X = np.arange(32, dtype=np.float64) + 0.25
    out = np.zeros(32)
    wide_shuffle(X, out, grid=1, block=32)
    np.testing.assert_array_equal(out, X.reshape(16, 2)[:, ::-1].ravel())


def test_shuffle_clamp_in_ptx(tmp_path):
    ptx = shuffles_with_width[64].ptx(chip="sm_90a")
    # CUDA's clamp operand: ((32 - width) << 8) | 31, and | 0 for shfl_up: 6175 and 6144 for width 8.
    filecheck(ptx, r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, 5, 6175, -1;")
    filecheck(ptx, r"shfl\.sync\.down\.b32\s+%r\d+, %r\d+, 3, 6175, -1;")
    filecheck(ptx, r"shfl\.sync\.up\.b32\s+%r\d+, %r\d+, 3, 6144, -1;")
    filecheck(ptx, r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, 11, 6175, -1;")
    ptxas_accepts(ptx, "sm_90a", tmp_path)


@mg.kernel
def votes(X: mg.memref[N, mg.i32], ballots: mg.memref[N, mg.u32], any_all: mg.memref[2, N, mg.i32]):
    t = thread_idx.x
    x = X[t]
    ballots[t] = mg.warp.ballot(x > 0)
    any_all[0, t] = mg.cast(mg.warp.any(x > 5), mg.i32)
    any_all[1, t] = mg.cast(mg.warp.all(x >= 0), mg.i32)


def test_votes(backend):
    X = np.zeros(64, np.int32)
    X[[0, 3, 31]] = 1                # warp 0: bits 0, 3, 31
    X[32:] = 7                       # warp 1: every lane, and any > 5
    X[40] = -1                       # ... except lane 8: not all >= 0
    ballots, any_all = np.zeros(64, np.uint32), np.zeros((2, 64), np.int32)
    votes(X, ballots, any_all, grid=1, block=64)
    assert set(ballots[:32]) == {(1 << 0) | (1 << 3) | (1 << 31)}
    assert set(ballots[32:]) == {0xFFFFFFFF & ~(1 << 8)}
    np.testing.assert_array_equal(any_all[0], np.repeat([0, 1], 32))
    np.testing.assert_array_equal(any_all[1], np.repeat([1, 0], 32))


def test_votes_in_ptx(tmp_path):
    ptx = votes[64].ptx(chip="sm_90a")
    filecheck(ptx, r"vote\.sync\.ballot\.b32", r"vote\.sync\.any\.pred", r"vote\.sync\.all\.pred")
    ptxas_accepts(ptx, "sm_90a", tmp_path)


OPS = ("add", "max", "min", "and", "or", "xor")
NUMPY = {"add": np.add, "max": np.maximum, "min": np.minimum, "and": np.bitwise_and, "or": np.bitwise_or,
         "xor": np.bitwise_xor}


@mg.kernel
def warp_reductions(X: mg.memref[N, T], out: mg.memref[6, N, T]):
    t = thread_idx.x
    x = X[t]
    out[0, t] = mg.warp.reduce(x, "add")
    out[1, t] = mg.warp.reduce(x, "max")
    out[2, t] = mg.warp.reduce(x, "min")
    out[3, t] = mg.warp.reduce(x, "and")
    out[4, t] = mg.warp.reduce(x, "or")
    out[5, t] = mg.warp.reduce(x, "xor")


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_warp_reduce_integers(backend, dtype):
    X = np.random.default_rng(2).integers(-1000 if dtype != np.uint32 else 0, 1000, 64).astype(dtype)
    out = np.zeros((6, 64), dtype)
    warp_reductions(X, out, grid=1, block=64)
    for k, op in enumerate(OPS):
        for w in range(2):
            assert set(out[k, 32 * w:32 * w + 32]) == {NUMPY[op].reduce(X[32 * w:32 * w + 32])}, op


@mg.kernel
def warp_float_reductions(X: mg.memref[N, T], out: mg.memref[3, N, T]):
    t = thread_idx.x
    out[0, t] = mg.warp.reduce(X[t], "add")
    out[1, t] = mg.warp.reduce(X[t], "max")
    out[2, t] = mg.warp.reduce(X[t], "min")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_warp_reduce_floats(backend, dtype):
    X = np.random.default_rng(3).standard_normal(64).astype(dtype)
    out = np.zeros((3, 64), dtype)
    warp_float_reductions(X, out, grid=1, block=64)
    for w in range(2):
        x = X[32 * w:32 * w + 32]
        np.testing.assert_allclose(out[0, 32 * w:32 * w + 32], x.astype(np.float64).sum(), rtol=1e-5)
        assert set(out[1, 32 * w:32 * w + 32]) == {x.max()} and set(out[2, 32 * w:32 * w + 32]) == {x.min()}


def test_redux_sync_where_the_type_allows(tmp_path):
    ptx = warp_reductions[64, mg.i32].ptx(chip="sm_90a")
    filecheck(ptx, r"redux\.sync\.add\.s32", r"redux\.sync\.max\.s32", r"redux\.sync\.min\.s32",
              r"redux\.sync\.and\.b32", r"redux\.sync\.or\.b32", r"redux\.sync\.xor\.b32")
    ptxas_accepts(ptx, "sm_90a", tmp_path)
    unsigned = warp_reductions[64, mg.u32].ptx(chip="sm_80")
    filecheck(unsigned, r"redux\.sync\.max\.u32", r"redux\.sync\.min\.u32")
    # 64-bit and float values: the butterfly of shuffles.
    wide = warp_reductions[64, mg.i64].ptx(chip="sm_90a")
    assert "redux" not in wide and wide.count("shfl.sync.bfly.b32") >= 5
    assert "redux" not in warp_float_reductions[64, mg.f32].ptx(chip="sm_90a")
    with pytest.raises(mg.CompileError, match=r"mg\.warp\.reduce of 32-bit integers \(redux\.sync\) needs sm_80 "
                                              r"or newer, not sm_75"):
        warp_reductions[64, mg.i32].ptx(chip="sm_75")


@mg.kernel
def block_collectives(X: mg.memref[N, T], out: mg.memref[5, N, T]):
    t = thread_idx.x
    x = X[t]
    out[0, t] = mg.block.reduce(x, "add")
    out[1, t] = mg.block.reduce(x, "max")
    out[2, t] = mg.block.scan(x, "add")
    out[3, t] = mg.block.scan(x, "add", exclusive=True)
    out[4, t] = mg.block.scan(x, "max", exclusive=True)


@pytest.mark.parametrize("threads", [32, 96, 1024])
def test_block_reduce_and_scan(backend, threads):
    X = np.random.default_rng(threads).integers(-50, 50, threads).astype(np.int64)
    out = np.zeros((5, threads), np.int64)
    block_collectives(X, out, grid=1, block=threads)
    assert set(out[0]) == {X.sum()} and set(out[1]) == {X.max()}
    np.testing.assert_array_equal(out[2], np.cumsum(X))
    np.testing.assert_array_equal(out[3], np.concatenate([[0], np.cumsum(X)[:-1]]))
    lowest = np.iinfo(np.int64).min
    np.testing.assert_array_equal(out[4], np.concatenate([[lowest], np.maximum.accumulate(X)[:-1]]))


@mg.kernel
def block_sum_in_a_loop(X: mg.memref[N, mg.f32], out: mg.memref[N, mg.f32]):
    # The same call site reduces four rows one after another: no barrier of the user's between them.
    t = thread_idx.x
    for row in range(4):
        s = mg.block.reduce(X[row * 64 + t], "add")
        if t == 0:
            out[row] = s


def test_block_reduce_in_a_loop(backend):
    X = np.random.default_rng(5).standard_normal(256).astype(np.float32)
    out = np.zeros(256, np.float32)
    block_sum_in_a_loop(X, out, grid=1, block=64)
    np.testing.assert_allclose(out[:4], X.reshape(4, 64).sum(1), rtol=1e-5)


@mg.kernel
def bad_width(X: mg.memref[N, mg.f32]):
    X[0] = mg.warp.shfl_xor(X[0], 1, width=12)  # bad width


@mg.kernel
def bad_reduction(X: mg.memref[N, mg.f32]):
    X[0] = mg.warp.reduce(X[0], "xor")  # xor of floats


@mg.kernel
def bad_block_op(X: mg.memref[N, mg.f32]):
    X[0] = mg.block.scan(X[0], "mul")  # unknown op


@mg.kernel
def bad_vote(X: mg.memref[N, mg.f32]):
    X[0] = mg.cast(mg.warp.ballot(X[0]), mg.f32)  # not a predicate


@pytest.mark.parametrize("kernel, message", [
    (bad_width, "width must be a power of two from 1 to 32"),
    (bad_reduction, "'xor' needs integers, not f32"),
    (bad_block_op, "mg.block.scan: the operation must be one of 'add', 'max'"),
    (bad_vote, "mg.warp.ballot takes a traced bool"),
])
def test_collective_errors(kernel, message):
    with pytest.raises(mg.CompileError, match=message) as info:
        kernel[32].ir()
    assert info.value.lineno == kernel.function.__code__.co_firstlineno + 2
