"""mlirgpu.ops.matmul: the kernel choice (`choose`) at the shapes it is made
for, every kernel and TileScheduler mode it runs on the CPU backend at odd
sizes against float64 NumPy (the CPU backend standing in for a GPU of a
given chip and number of multiprocessors), the per-shape cache, empty
products, each bad input's exception, and on a GPU against torch.matmul at
full sizes.

Each (kernel, mode, shape) is a compilation of its own, which takes tens of
seconds for the CPU: the cases are few and small."""
import gc
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops

from support.backends import current_backend
from support.checks import assert_each_close, on_two_streams

ml_dtypes = pytest.importorskip("ml_dtypes")
gemm = sys.modules["mlirgpu.ops.gemm"]

DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
# f32 sums of products of rounded inputs, the result rounded to the output type: relative to max |C|.
TOLERANCE = {"f16": 2e-3, "bf16": 1e-2}


def operands(m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(DTYPES[dtype]), rng.standard_normal((k, n)).astype(DTYPES[dtype]))


def relative_error(c, a, b):
    exact = a.astype(np.float64) @ b.astype(np.float64)
    return np.abs(np.asarray(c, np.float64) - exact).max() / np.abs(exact).max()


# ==========================================================================
# The choice

H200 = ("sm_90a", 132)


@pytest.mark.parametrize("m, k, n, kernel, mode", [
    (8192, 8192, 8192, "wgmma", None),
    (4096, 4096, 4096, "wgmma", None),
    (1024, 8192, 8192, "wgmma", None),        # 256 tiles of 128 x 256: past one wave of 132
    (2048, 2048, 2048, "wgmma", None),        # 128 tiles of 128 x 256: 256 of 128 x 128, ping-pong
    (512, 4096, 4096, "wgmma", None),
    (512, 4096, 14336, "wgmma", None),        # 224 tiles
    (1024, 1024, 1024, "wgmma", None),
    (512, 512, 512, "mma.sync", "data_parallel"),   # bound by the host's time, which mma.sync's launch cuts
    (777, 520, 1000, "mma.sync", "data_parallel"),
    (128, 8192, 8192, "wgmma", None),         # 64 tiles of 128 x 128, K too short to split
    (17, 8192, 8192, "wgmma", None),
    (64, 14336, 4096, "wgmma", "split_k"),    # 64 tiles of 128 x 64: 2 slices of K
    (256, 14336, 4096, "wgmma", "split_k"),   # 64 tiles: 2 slices
    (16, 8192, 8192, "wgmma", None),          # up to 16 rows, a B of 8192 x 4096 elements or more
    (1, 14336, 4096, "wgmma", "split_k"),
    (16, 4096, 4096, "mma.sync", "split_k"),   # a smaller B
    (32, 4096, 4096, "wgmma", None),          # under 1024^3, but it reads B as 64 rows would
    (32, 2048, 2048, "mma.sync", "data_parallel"),
    (128, 8192, 8196, "mma.sync", "data_parallel"),   # no TMA: 64 x 128 tiles, a block each
    (1, 4096, 4096, "mma.sync", "split_k"),
    (4096, 4100, 4096, "mma.sync", "hybrid"),  # rows of 4100 halves are not 16-byte multiples: no TMA
    (4096, 4096, 4096 - 4, "mma.sync", "hybrid"),
])
def test_the_choice_on_an_h200(m, k, n, kernel, mode):
    choice = gemm.choose(m, k, n, *H200)
    assert (choice.kernel, choice.mode) == (kernel, mode)


def test_skinny_products_split_k_so_that_every_multiprocessor_reads_b():
    choice = gemm.choose(16, 6144, 4096, *H200)      # a B under 8192 x 4096 elements
    assert choice.config is gemm.SKINNY
    tiles = 4096 // choice.config.bn
    # A slice of B per multiprocessor: 32 tiles x 4.
    assert (choice.split, choice.units) == (4, tiles * 4)
    assert gemm.choose(16, 8192, 4096, "sm_80", 108).split == 108 // 32
    assert gemm.choose(64, 8192, 8192, "sm_80", 108).config is gemm.SHORT
    assert gemm.choose(200, 8192, 8192, "sm_80", 108).config is gemm.SQUARE
    # On sm_90a, past 16 rows, where TMA cannot address the rows: 64 x 128 tiles, a block each.
    assert gemm.choose(64, 8192, 8196, *H200) == ("mma.sync", gemm.SHORT, "data_parallel", None, 65)


def test_on_sm_90a_fewer_tiles_than_multiprocessors_take_the_ping_pong_kernel():
    assert gemm.choose(4096, 4096, 4096, *H200).config is gemm.WGMMA       # 512 tiles of 128 x 256
    assert gemm.choose(1024, 4096, 4096, *H200).config is gemm.PINGPONG    # 128 tiles of 128 x 256
    assert gemm.PINGPONG.bn == 128 and gemm.PINGPONG.schedule == "pingpong"


def test_on_sm_90a_17_to_256_rows_take_128_by_64_tiles_where_they_make_one_wave():
    for m, k, n in [(128, 4096, 4096), (65, 8192, 8192), (256, 4096, 4096)]:
        choice = gemm.choose(m, k, n, *H200)
        assert (choice.config, choice.split) == (gemm.NARROW, None), (m, k, n)
    for m, k, n in [(64, 4096, 4096), (17, 8192, 8192), (1, 8192, 8192)]:
        choice = gemm.choose(m, k, n, *H200)
        assert (choice.config.bn, choice.config.stages, choice.split) == (64, 8, None), (m, k, n)
    assert (gemm.NARROW.bm, gemm.NARROW.bn, gemm.NARROW.epilogue) == (128, 64, "registers")
    # 128 tiles of 128 x 64 and a long K: 2 slices.
    choice = gemm.choose(128, 14336, 4096, *H200)
    assert (choice.config.bn, choice.config.split, choice.mode) == (64, 2, "split_k")
    assert gemm.choose(256, 8192, 8192, *H200).config is gemm.PINGPONG     # 256 tiles of 128 x 64
    assert gemm.choose(256, 14336, 4096, *H200).config.bn == 128           # 129 rows on, K long: ping-pong


def test_on_sm_90a_products_of_at_most_64_rows_load_their_rows_of_a_only():
    for m, k, n, rows in [(64, 4096, 4096, 64), (17, 8192, 8192, 24), (64, 14336, 4096, 64), (1, 8192, 8192, 8),
                          (16, 14336, 4096, 16), (40, 4096, 4096, 40)]:
        config = gemm.choose(m, k, n, *H200).config
        assert config.a_rows == rows and config.bm == 128, (m, k, n)
    assert gemm.choose(65, 8192, 8192, *H200).config.a_rows == 128


def test_on_sm_90a_half_idle_multiprocessors_and_a_long_k_take_split_k():
    choice = gemm.choose(64, 14336, 4096, *H200)
    config = choice.config
    assert (config.bn, config.split, choice.split) == (64, 2, 2)     # 64 tiles of 128 x 64
    assert config.epilogue == "registers"    # a slice's rows of partial sums end where the next one's begin
    choice = gemm.choose(256, 14336, 4096, *H200)
    assert (choice.config.schedule, choice.split) == ("pingpong", 2)  # 64 tiles of 128 x 128
    assert gemm.choose(512, 14336, 4096, *H200).config is gemm.PINGPONG   # 128 tiles


def test_a_short_k_is_not_split_below_a_full_pipeline():
    choice = gemm.choose(16, 256, 8192, *H200)
    assert choice.mode == "data_parallel"   # 4 steps of 64: one slice


def test_without_sm_90a_every_shape_runs_mma_sync():
    for m, k, n in [(8192, 8192, 8192), (16, 8192, 8192), (2048, 2048, 2048)]:
        assert gemm.choose(m, k, n, "sm_80", 108).kernel == "mma.sync"
        assert gemm.choose(m, k, n, "sm_89", 128).kernel == "mma.sync"
    assert gemm.choose(8192, 8192, 8192, "sm_80", 108).config is gemm.SQUARE


@pytest.mark.parametrize("mode", ["data_parallel", "split_k", "stream_k", "hybrid", "grouped"])
def test_every_gemm_kernel_launches_from_c(mode):
    """Each kernel's closure holds only values the C dispatcher can compare, so
    that its launches after the first skip Python (a list there cost a Python
    check of every global on each launch: hundreds of microseconds on a GPU)."""
    ampere_gemm, gemm = sys.modules["mlirgpu.ops.ampere_gemm"], sys.modules["mlirgpu.ops.gemm"]
    for config in (gemm.SKINNY, gemm.SHORT, gemm.SQUARE):
        kernel = ampere_gemm.kernel_for(config, mode, 2 if mode == "split_k" else None)
        assert kernel.traced_globals.guards() is not None, (config, mode)
    hopper_gemm = sys.modules["mlirgpu.ops.hopper_gemm"]
    # The 32-column tiles too, B given as K x N and as N x K.
    columns_32 = [hopper_gemm.Config(32, 64, 8), hopper_gemm.Config(32, 64, 8, "K", split=2)]
    chosen = [gemm.choose(m, k, 4096, *H200).config for m, k in ((64, 14336), (64, 4096))]    # A's 64 rows a step
    for config in hopper_gemm.CONFIGS + chosen + [gemm.NARROW] + columns_32:
        assert hopper_gemm.kernel_for(config, mg.bf16).traced_globals.guards() is not None, config
    # The grouped kernel, in 2 bytes and in 8 (scaled_grouped_matmul's).
    for config, dtype in ((hopper_gemm.GROUPED, mg.bf16), (hopper_gemm.GROUPED.replace(b_major="K"), mg.f8e4m3)):
        assert hopper_gemm.kernel_for(config, dtype, grouped=True).traced_globals.guards() is not None, dtype
    assert hopper_gemm._split_sum().traced_globals.guards() is not None


# ==========================================================================
# Every kernel and mode on the CPU backend, against NumPy

CPU_CASES = [
    # (chip, multiprocessors, m, k, n, dtype, kernel, mode)
    ("sm_80", 4, 5, 600, 130, "bf16", "mma.sync", "split_k"),        # 16-row tiles, 2 slices of 5 steps
    ("sm_80", 4, 40, 520, 70, "f16", "mma.sync", "split_k"),         # 64-row tiles, a slice's last step partial
    ("sm_86", 3, 300, 150, 100, "bf16", "mma.sync", "data_parallel"),  # 3 tiles, 3 units
    ("sm_86", 2, 300, 150, 100, "bf16", "mma.sync", "hybrid"),       # 2 whole tiles, 1 streamed over 2 units
    ("sm_86", 4, 300, 150, 100, "f16", "mma.sync", "stream_k"),      # 3 tiles streamed over 4 units
    ("sm_90a", 1, 300, 200, 264, "bf16", "wgmma", None),
    ("sm_90a", 132, 300, 200, 264, "f16", "wgmma", None),            # 128 x 128 tiles, ping-pong
    ("sm_90a", 8, 100, 200, 136, "bf16", "wgmma", None),             # 128 x 64 tiles, the last N one partial
]


@pytest.mark.parametrize("chip, multiprocessors, m, k, n, dtype, kernel, mode", CPU_CASES,
                         ids=[f"{c[6]}-{c[7]}-{c[2]}x{c[3]}x{c[4]}-{c[5]}" for c in CPU_CASES])
def test_matmul_on_the_cpu(device, chip, multiprocessors, m, k, n, dtype, kernel, mode):
    device(chip, multiprocessors)
    a, b = operands(m, k, n, dtype)
    c = mlirgpu.ops.matmul(a, b)
    (call,) = gemm._CALLS.values()
    assert (call.choice.kernel, call.choice.mode) == (kernel, mode)
    assert c.shape == (m, n) and c.dtype == a.dtype
    assert relative_error(c, a, b) < TOLERANCE[dtype]
    # Again, into `out`, through the kept choice: split tiles' counters were left at zero.
    out = np.full((m, n), np.nan, DTYPES[dtype])
    assert mlirgpu.ops.matmul(a, b, out=out) is out
    assert len(gemm._CALLS) == 1
    np.testing.assert_array_equal(out, c)


@pytest.mark.parametrize("m, schedule", [
    (20, "cooperative"),    # 3 tiles of 128 x 64, A's 24 rows a step: 2 slices
    (200, "pingpong"),      # 4 tiles of 128 x 128: 2 slices
])
def test_the_hopper_split_k_on_the_cpu(device, monkeypatch, m, schedule):
    device("sm_90a", 8)
    monkeypatch.setattr(gemm, "WGMMA_SPLIT_MIN_K", 4096)    # a K the CPU multiplies in seconds
    a, b = operands(m, 4104, 136, "bf16")     # K's last step part-filled
    c = mlirgpu.ops.matmul(a, b)
    (call,) = gemm._CALLS.values()
    assert (call.choice.kernel, call.choice.mode, call.choice.split) == ("wgmma", "split_k", 2)
    assert call.choice.config.schedule == schedule
    assert relative_error(c, a, b) < TOLERANCE["bf16"]


def test_two_threads_split_k_launch_pairs_do_not_interleave(monkeypatch):
    """Two threads' split-K products of one shape on one stream share a workspace: each one's
    product and the sum of its partial products launch one after the other, with no product of
    the other thread between them (it would overwrite the partial products before the sum)."""
    hopper_gemm = sys.modules["mlirgpu.ops.hopper_gemm"]
    launches = []

    def product(*args, **keywords):
        launches.append("product")
        time.sleep(0.05)    # the other thread runs meanwhile

    monkeypatch.setattr(hopper_gemm, "_split_sum", lambda: lambda *args, **keywords: launches.append("sum"))
    split = hopper_gemm.SplitK(product, 2, 16, 8)
    C = np.zeros((16, 8), np.float32)
    with current_backend("cpu"):
        threads = [threading.Thread(target=split, args=(None, None, None, C, 64, 1.0, 1.0, None)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert launches == ["product", "sum", "product", "sum"]


def test_hopper_launches_keep_tensor_maps_by_address_and_no_array_alive(device):
    device("sm_90a", 1)
    a, b = operands(300, 200, 264, "f16")
    A, B, C = mg.to_device(a), mg.to_device(b), mg.empty((300, 264), mg.f16)
    assert mlirgpu.ops.matmul(A, B, out=C) is C
    (call,) = gemm._CALLS.values()
    assert call.choice.kernel == "wgmma"
    assert relative_error(C.get(), a, b) < TOLERANCE["f16"]
    # New values at the same addresses: the kept maps address them.
    a2, b2 = operands(300, 200, 264, "f16", seed=1)
    A.copy_from_host(a2)
    B.copy_from_host(b2)
    mlirgpu.ops.matmul(A, B, out=C)
    assert relative_error(C.get(), a2, b2) < TOLERANCE["f16"]
    # Other arrays: maps of their own.
    other = mg.to_device(a)
    assert relative_error(mlirgpu.ops.matmul(other, B).get(), a, b2) < TOLERANCE["f16"]
    kept = weakref.ref(other)
    del other
    gc.collect()
    assert kept() is None


def test_an_empty_k_gives_zeros_and_an_empty_output_nothing(device):
    device("sm_80", 4)
    a, b = operands(3, 0, 5, "bf16")
    np.testing.assert_array_equal(mlirgpu.ops.matmul(a, b, out=np.ones((3, 5), DTYPES["bf16"])), 0)
    a, b = operands(0, 7, 5, "bf16")
    assert mlirgpu.ops.matmul(a, b).shape == (0, 5)


# ==========================================================================
# Bad input

def test_shapes_that_do_not_multiply_are_a_launch_error(device):
    device("sm_80", 4)
    a, b = operands(3, 4, 5, "bf16")
    with pytest.raises(mg.LaunchError, match=r"do not multiply: a has 4 columns, b 5 rows"):
        mlirgpu.ops.matmul(a, b.T.copy())
    with pytest.raises(mg.LaunchError, match="2-d arrays"):
        mlirgpu.ops.matmul(a.reshape(3, 2, 2), b)
    assert issubclass(mg.LaunchError, ValueError)


def test_dtypes_other_than_one_half_precision_are_a_launch_error(device):
    device("sm_80", 4)
    a, b = operands(3, 4, 5, "bf16")
    with pytest.raises(mg.LaunchError, match="one dtype, f16 or bf16"):
        mlirgpu.ops.matmul(a.astype(np.float32), b.astype(np.float32))
    with pytest.raises(mg.LaunchError, match="one dtype, f16 or bf16"):
        mlirgpu.ops.matmul(a, b.astype(np.float16))


def test_non_contiguous_operands_are_a_launch_error(device):
    device("sm_80", 4)
    a, b = operands(3, 8, 5, "bf16")
    with pytest.raises(mg.LaunchError, match="C-contiguous"):
        mlirgpu.ops.matmul(np.zeros((3, 16), a.dtype)[:, ::2], b)


def test_a_bad_out_is_a_launch_error(device):
    device("sm_80", 4)
    a, b = operands(3, 8, 5, "bf16")
    for out in (np.zeros((3, 4), a.dtype), np.zeros((3, 5), np.float32), np.zeros((5, 3), a.dtype).T):
        with pytest.raises(mg.LaunchError, match=r"out is a C-contiguous bf16 array of shape \(3, 5\)"):
            mlirgpu.ops.matmul(a, b, out=out)


def test_what_is_no_array_is_a_type_error(device):
    device("sm_80", 4)
    with pytest.raises(TypeError, match="matmul's a is an array"):
        mlirgpu.ops.matmul([[1.0]], [[2.0]])


# ==========================================================================
# On a GPU, at full sizes, against torch.matmul (NumPy in float64 without torch)

GPU_SHAPES = [(1, 4096, 4096), (16, 8192, 8192), (17, 4096, 4104), (128, 8192, 8192), (256, 4096, 14336),
              (64, 14336, 4096),
              (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (1000, 1000, 1000), (8192, 8192, 8192),
              (777, 520, 1000)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("m, k, n", GPU_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in GPU_SHAPES])
def test_matmul_on_the_gpu(m, k, n, dtype):
    torch = pytest.importorskip("torch")
    kind = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with current_backend("cuda"):
        generator = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn((m, k), device="cuda", dtype=kind, generator=generator)
        b = torch.randn((k, n), device="cuda", dtype=kind, generator=generator)
        c = mlirgpu.ops.matmul(a, b)
        given = torch.empty_like(c)
        again = mlirgpu.ops.matmul(a, b, out=given)
        torch.cuda.synchronize()
        exact = a.double() @ b.double()
        expected = torch.matmul(a, b).double()
        scale = exact.abs().max().item()
    assert c.dtype == kind and tuple(c.shape) == (m, n)
    ours, theirs = ((c.double() - exact).abs().max().item(), (expected - exact).abs().max().item())
    # As close to the exact product as cuBLAS, up to the rounding of the output.
    assert ours / scale < TOLERANCE[dtype] and ours <= theirs + scale * TOLERANCE[dtype] / 4
    assert again is given and torch.equal(c, again)


# ==========================================================================
# torch.ops.mlirgpu.matmul (where torch is installed)

def test_the_torch_op_has_a_fake_implementation_of_the_output_shape():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = gemm.register_torch()
    assert op is gemm.register_torch() is torch.ops.mlirgpu.matmul
    with FakeTensorMode():
        c = op(torch.empty((7, 5), dtype=torch.bfloat16), torch.empty((5, 3), dtype=torch.bfloat16))
        assert (tuple(c.shape), c.dtype) == ((7, 3), torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"multiplies \(M, K\) by \(K, N\)"):
            op(torch.empty((7, 5), dtype=torch.bfloat16), torch.empty((4, 3), dtype=torch.bfloat16))
        with pytest.raises(RuntimeError, match="one dtype, f16 or bf16"):
            op(torch.empty((7, 5), dtype=torch.float32), torch.empty((5, 3), dtype=torch.float32))


@pytest.mark.gpu
def test_matmul_under_torch_compile_has_no_graph_break():
    torch = pytest.importorskip("torch")
    with current_backend("cuda"):
        a = torch.randn((300, 512), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((512, 264), device="cuda", dtype=torch.bfloat16)

        def f(a, b):
            return mlirgpu.ops.matmul(a, b).float() * 2 + 1

        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)   # a graph break is an error
        got = compiled(a, b)
        torch.cuda.synchronize()
        expected = f(a, b)
        assert torch.equal(got, expected)
        assert torch.equal(torch.ops.mlirgpu.matmul(a, b), mlirgpu.ops.matmul(a, b))


@pytest.mark.gpu
def test_matmul_launches_on_torchs_current_stream():
    torch = pytest.importorskip("torch")
    with current_backend("cuda"):
        a = torch.randn((300, 512), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((512, 264), device="cuda", dtype=torch.bfloat16)
        late = torch.zeros_like(a)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            # The side stream is busy for a while before `late` gets a's values: a
            # launch on another stream would multiply zeros.
            torch.cuda._sleep(200_000_000)
            late.copy_(a)
            c = mlirgpu.ops.matmul(late, b)
        side.synchronize()
        expected = mlirgpu.ops.matmul(a, b)   # on the default stream, after the side stream's work
        torch.cuda.synchronize()
    assert torch.equal(c, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", [(256, 4096, 4096), (64, 512, 64)], ids=["wgmma", "mma.sync"])
def test_launches_from_c_follow_moved_arrays_and_torchs_stream(m, k, n):
    # After the first call, calls with arrays of the same signature launch from C: the Hopper GEMM's
    # maps are encoded anew where an array moved, and each launch goes to torch's current stream.
    torch = pytest.importorskip("torch")
    with current_backend("cuda"):
        b = torch.randn((k, n), device="cuda", dtype=torch.bfloat16)
        a = [torch.randn((m, k), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        expected = [torch.matmul(x, b).float() for x in a]
        results = on_two_streams(torch, len(a), lambda step, i, out: mlirgpu.ops.matmul(a[i], b, out=out),
                                 lambda: torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
        kept = len(gemm._KEPT)
    assert kept >= 1
    assert_each_close(results, lambda step, i: expected[i])

# Products that split K on an H200, one on each GEMM.
SPLIT_K_SHAPES = [(64, 14336, 4096), (16, 4096, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", SPLIT_K_SHAPES, ids=["wgmma", "mma.sync"])
def test_split_k_matmuls_on_two_streams_keep_their_partial_sums_apart(m, k, n):
    torch = pytest.importorskip("torch")
    with current_backend("cuda"):
        a = [torch.randn((m, k), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        b = torch.randn((k, n), device="cuda", dtype=torch.bfloat16)
        if gemm.choose(m, k, n, *gemm._device()).mode != "split_k":
            pytest.skip("this GPU does not split K at this shape")
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        results = [[], []]
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream())
        # Both streams' launches in flight at once: one workspace would mix their partial sums.
        for _ in range(8):
            for i, stream in enumerate(streams):
                with torch.cuda.stream(stream):
                    results[i].append(mlirgpu.ops.matmul(a[i], b))
        torch.cuda.synchronize()
        for i in range(2):
            expected = mlirgpu.ops.matmul(a[i], b)
            torch.cuda.synchronize()
            assert all(torch.equal(c, expected) for c in results[i])


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", SPLIT_K_SHAPES, ids=["wgmma", "mma.sync"])
def test_a_captured_split_k_matmul_replays_on_a_workspace_of_its_own(m, k, n):
    # A CUDA graph keeps the addresses it was captured with: a workspace it used must not be one
    # that eager calls share, or that goes (and is freed) once newer ones are kept.
    torch = pytest.importorskip("torch")
    hopper_gemm = sys.modules["mlirgpu.ops.hopper_gemm"]
    with current_backend("cuda"):
        a = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((k, n), device="cuda", dtype=torch.bfloat16)
        if gemm.choose(m, k, n, *gemm._device()).mode != "split_k":
            pytest.skip("this GPU does not split K at this shape")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):    # warm-up: compiles the kernels outside the capture
            mlirgpu.ops.matmul(a, b)
        torch.cuda.current_stream().wait_stream(side)
        kept = [module._WORKSPACES._kept for module in (gemm, hopper_gemm)]
        before = [cache.cache_info().currsize for cache in kept]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mlirgpu.ops.matmul(a, b)
        assert [cache.cache_info().currsize for cache in kept] == before
        for cache in kept:
            cache.cache_clear()
        gc.collect()
        a.copy_(torch.randn_like(a))
        eager = mlirgpu.ops.matmul(a, b)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)
