"""mg.TileScheduler on the CPU backend: every mode's work units cover each
(tile, K-tile) exactly once and match a pure-Python model of the schedule
(grouped order as in Triton's matmul tutorial), clusters take adjacent
tiles, the persistent GEMM of examples/tensorcore gives NumPy's product in
every mode (the fix-up of split tiles included) with fewer units than tiles
and more, and bad arguments are clear errors."""
import collections
import importlib.util
import itertools
import os

import numpy as np
import pytest

import mlirgpu as mg
from support.backends import current_backend

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                       "tensorcore", "persistent_matmul.py")
TILES_M, TILES_N, K_TILES = 5, 3, 7
FIELDS = 6  # m, n, k_begin, k_end, first, last


@pytest.fixture(autouse=True)
def cpu():
    with current_backend("cpu"):
        yield


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------

def grouped(tile, tiles_m, tiles_n, group):
    """Triton's matmul tutorial: (pid_m, pid_n) of program `tile` with GROUP_SIZE_M = group."""
    num_pid_in_group = group * tiles_n
    first_pid_m = tile // num_pid_in_group * group
    group_size_m = min(tiles_m - first_pid_m, group)
    return first_pid_m + tile % num_pid_in_group % group_size_m, tile % num_pid_in_group // group_size_m


def model(mode, tiles_m, tiles_n, k_tiles, units, group, split=None):
    """Each unit's work units, in order: (m, n, k_begin, k_end, first, last)."""
    tiles = tiles_m * tiles_n
    out = [[] for _ in range(units)]

    def add(u, tile, k_begin, k_end):
        out[u].append((*grouped(tile, tiles_m, tiles_n, group), k_begin, k_end, k_begin == 0, k_end == k_tiles))

    if mode == "split_k":
        for w in range(tiles * split):
            tile, s = divmod(w, split)
            add(w % units, tile, s * k_tiles // split, (s + 1) * k_tiles // split)
        return out
    whole = {"data_parallel": tiles, "hybrid": tiles // units * units, "stream_k": 0}[mode]
    for tile in range(whole):
        add(tile % units, tile, 0, k_tiles)
    iterations = (tiles - whole) * k_tiles
    streamers = min(units, iterations)
    for u in range(streamers):
        mine = range(u * iterations // streamers, (u + 1) * iterations // streamers)
        for tile, ks in itertools.groupby(mine, lambda it: it // k_tiles):
            ks = [k - tile * k_tiles for k in ks]
            add(u, whole + tile, ks[0], ks[-1] + 1)
    return out


def test_the_model_covers_every_k_tile_once():
    for mode, split in MODES:
        for units, group in itertools.product((1, 4, 11, 200), (1, 2, 8)):
            seen = collections.Counter((m, n, k) for unit in model(mode, TILES_M, TILES_N, K_TILES, units, group,
                                                                   split)
                                       for m, n, kb, ke, _, _ in unit for k in range(kb, ke))
            assert seen == collections.Counter(itertools.product(range(TILES_M), range(TILES_N), range(K_TILES)))


# --------------------------------------------------------------------------
# The work units a kernel gets
# --------------------------------------------------------------------------

MODES = [("data_parallel", None), ("split_k", 2), ("split_k", K_TILES), ("stream_k", None), ("hybrid", None)]


def recorder(mode, split, group, cluster=1, static=False):
    """A kernel that writes each block's work units, in the order it gets
    them, into out[block, i] (by `for work in sched`) and out2[block, i] (by
    the explicit form, sched.work(i))."""
    @mg.kernel
    def record(out: mg.memref[None, None, FIELDS, mg.i32], out2: mg.memref[None, None, FIELDS, mg.i32],
               filled: mg.memref[None, mg.i32], tiles_m: mg.i32, tiles_n: mg.i32, k_tiles: mg.i32):
        if static:
            sched = mg.TileScheduler(TILES_M, TILES_N, K_TILES, mode=mode, split=split, group=group,
                                     cluster=cluster)
        else:
            sched = mg.TileScheduler(tiles_m, tiles_n, k_tiles, mode=mode, split=split, group=group,
                                     cluster=cluster)
        b = mg.block_idx.x
        for work in sched:
            i = mg.atomic.add(filled, b, 1)
            for f, value in enumerate((work.m, work.n, work.k_begin, work.k_end, work.first, work.last)):
                out[b, i, f] = mg.cast(value, mg.i32)
        for i in range(sched.count):
            work = sched.work(i)
            for f, value in enumerate((work.m, work.n, work.k_begin, work.k_end, work.first, work.last)):
                out2[b, i, f] = mg.cast(value, mg.i32)
    return record


def test_values_updated_in_the_body_are_carried_across_work_units():
    """`for work in sched` carries what its body updates, as a range() loop does: each unit's
    running count of K-iterations and of units is the model's."""
    @mg.kernel
    def count(out: mg.memref[None, 2, mg.i32]):
        sched = mg.TileScheduler(TILES_M, TILES_N, K_TILES, mode="stream_k")
        k_iterations, units = mg.constant(0, mg.i32), mg.constant(0, mg.i32)
        for work in sched:
            k_iterations += mg.cast(work.k_end - work.k_begin, mg.i32)
            units += 1
        out[mg.block_idx.x, 0] = k_iterations
        out[mg.block_idx.x, 1] = units

    out = np.zeros((4, 2), np.int32)
    count(out, grid=4, block=1)
    units = model("stream_k", TILES_M, TILES_N, K_TILES, 4, group=1)
    assert out.tolist() == [[sum(k_end - k_begin for _, _, k_begin, k_end, _, _ in mine), len(mine)]
                            for mine in units]


def recorded(kernel, blocks, tiles=(TILES_M, TILES_N, K_TILES)):
    capacity = tiles[0] * tiles[1] * tiles[2] + 1
    out = np.full((blocks, capacity, FIELDS), -1, np.int32)
    out2 = out.copy()
    filled = np.zeros(blocks, np.int32)
    kernel(out, out2, filled, *tiles, grid=blocks, block=1)
    units = [[tuple(int(x) for x in row) for row in out[b, :filled[b]]] for b in range(blocks)]
    assert (out[:, :, 0] >= 0).sum() == filled.sum()  # nothing written past what was counted
    assert units == [[tuple(int(x) for x in row) for row in out2[b] if row[0] >= 0] for b in range(blocks)]
    return units


@pytest.mark.parametrize("mode, split", MODES)
@pytest.mark.parametrize("group", [1, 2, 8])
def test_work_units_match_the_model(mode, split, group):
    kernel = recorder(mode, split, group)
    for units in (4, 11):
        expected = [[(m, n, kb, ke, int(first), int(last)) for m, n, kb, ke, first, last in unit]
                    for unit in model(mode, TILES_M, TILES_N, K_TILES, units, group, split)]
        assert recorded(kernel, units) == expected, (mode, units)


def test_python_int_sizes_give_the_same_units():
    expected = [[(m, n, kb, ke, int(first), int(last)) for m, n, kb, ke, first, last in unit]
                for unit in model("stream_k", TILES_M, TILES_N, K_TILES, 4, 2)]
    assert recorded(recorder("stream_k", None, 2, static=True), 4) == expected


def test_grouped_order_follows_the_formula():
    # One unit walks every tile: the order itself.
    order = [(m, n) for m, n, *_ in recorded(recorder("data_parallel", None, 2), 1, (7, 4, 1))[0]]
    assert order == [grouped(t, 7, 4, 2) for t in range(28)]
    assert order[:6] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]  # column after column in a group
    assert order[-4:] == [(6, 0), (6, 1), (6, 2), (6, 3)]  # the last group has one row


@pytest.mark.parametrize("cluster", [2, (1, 2)])
@pytest.mark.parametrize("mode", ["data_parallel", "stream_k"])
def test_a_cluster_takes_adjacent_tiles(mode, cluster):
    cm, cn = (cluster, 1) if isinstance(cluster, int) else cluster
    patches_m, patches_n = -(-TILES_M // cm), -(-TILES_N // cn)
    clusters = 3
    units = recorded(recorder(mode, None, 2, cluster), clusters * 2)
    patches = model(mode, patches_m, patches_n, K_TILES, clusters, 2)
    for b, unit in enumerate(units):
        rank = b % 2
        assert unit == [(m * cm + rank % cm, n * cn + rank // cm, kb, ke, int(first), int(last))
                        for m, n, kb, ke, first, last in patches[b // 2]]


# --------------------------------------------------------------------------
# The persistent GEMM
# --------------------------------------------------------------------------

def example():
    spec = importlib.util.spec_from_file_location("persistent_matmul", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode, split", [("data_parallel", None), ("split_k", 3), ("split_k", 9),
                                         ("stream_k", None), ("hybrid", None)])
def test_persistent_matmul_matches_numpy(mode, split):
    gemm = example()
    rng = np.random.default_rng(1)
    A = rng.standard_normal((67, 129)).astype(np.float32)
    B = rng.standard_normal((129, 45)).astype(np.float32)
    expected = A.astype(np.float64) @ B.astype(np.float64)
    # 3 x 2 tiles of 9 K-tiles: fewer units than tiles, more, and a hybrid with a whole wave and a rest.
    for units in (4, 11, 5):
        C, counters = gemm.run(A, B, mode, split, units)
        np.testing.assert_allclose(C, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
        assert not counters.any()  # each tile's counter is back at zero for the next launch


@pytest.mark.parametrize("cluster", [2, (1, 2)])
def test_persistent_matmul_in_clusters(cluster):
    # Each block of a cluster completes its own tiles, those past the edge included.
    gemm = example()
    rng = np.random.default_rng(2)
    A = rng.standard_normal((67, 129)).astype(np.float32)
    B = rng.standard_normal((129, 45)).astype(np.float32)
    expected = A.astype(np.float64) @ B.astype(np.float64)
    for mode, split in (("stream_k", None), ("split_k", 2)):
        C, counters = gemm.run(A, B, mode, split, units=3, cluster=cluster)
        np.testing.assert_allclose(C, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
        assert not counters.any()


# --------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------

def traced_with(**options):
    tiles = options.pop("tiles", (TILES_M, TILES_N, K_TILES))

    @mg.kernel
    def schedule(out: mg.memref[4, mg.i32]):
        for work in mg.TileScheduler(*tiles, **options):
            out[0] = mg.cast(work.m, mg.i32)
    schedule(np.zeros(4, np.int32), grid=1, block=1)


@pytest.mark.parametrize("options, message", [
    (dict(tiles=(0, 3, 7)), "tiles_m must be positive, not 0"),
    (dict(tiles=(5, -1, 7)), "tiles_n must be positive, not -1"),
    (dict(tiles=(5, 3, 0)), "k_tiles must be positive, not 0"),
    (dict(tiles=(5, 3, 2.0)), "k_tiles must be an int or a traced integer, not float"),
    (dict(mode="split_k", split=8), "split=8 is larger than k_tiles=7"),
    (dict(mode="split_k", split=0), "split must be a positive int, not 0"),
    (dict(mode="split_k"), "split must be a positive int, not None"),
    (dict(mode="stream_k", split=2), "split= is for mode='split_k', not 'stream_k'"),
    (dict(mode="round_robin"), "mode must be one of 'data_parallel', 'split_k', 'stream_k', 'hybrid'"),
    (dict(group=0), "group must be a positive int, not 0"),
    (dict(cluster=(2, 0)), "cluster must be a positive int or a pair of them"),
    (dict(units=0), "units must be positive, not 0"),
])
def test_bad_arguments_are_compile_errors(options, message):
    with pytest.raises(mg.CompileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        traced_with(**options)


def test_fixup_checks_its_arrays():
    @mg.kernel
    def wrong(partials: mg.memref[4, 4, mg.f64], counters: mg.memref[4, mg.i32]):
        sched = mg.TileScheduler(2, 2, 4, mode="split_k", split=2)
        for work in sched:
            acc, done = sched.fixup(work, partials, counters, [mg.constant(0.0, mg.f32)])
    with pytest.raises(mg.CompileError, match="partials holds f64, the values are f32"):
        wrong(np.zeros((4, 4)), np.zeros(4, np.int32), grid=1, block=1)


def test_plan():
    plan = mg.TileScheduler.plan(5, 3, 7, mode="stream_k", units=4, values=256)
    assert plan == (4, 4, (8, 256), 15)
    assert mg.TileScheduler.plan(5, 3, 7, mode="split_k", split=2, units=6, cluster=2) == (12, 6, (36, 1), 18)
    assert mg.TileScheduler.plan(5, 3, 7, units=4).partials == (1, 1)  # data-parallel needs none
    with pytest.raises(ValueError, match="k_tiles must be a positive int, not 0"):
        mg.TileScheduler.plan(5, 3, 0, units=4)
    with pytest.raises(ValueError, match=r"TileScheduler.plan: split=9 is larger than k_tiles=7"):
        mg.TileScheduler.plan(5, 3, 7, mode="split_k", split=9, units=4)
    with pytest.raises(ValueError, match="units must be a positive int, not 0"):
        mg.TileScheduler.plan(5, 3, 7, units=0)
