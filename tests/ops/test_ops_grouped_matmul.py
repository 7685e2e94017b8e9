"""mlirgpu.ops.grouped_matmul: groups of odd sizes (empty ones, ones smaller
than a tile, a single group) on the CPU backend against a float64 NumPy
product per group, each bad input's exception, the torch op's fake
implementation, and on a GPU against torch._grouped_mm (per-group
torch.matmul where torch has none) at mixture-of-experts sizes."""
import sys

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops

from support.backends import current_backend
from support.checks import assert_each_close, on_two_streams

ml_dtypes = pytest.importorskip("ml_dtypes")
gemm = sys.modules["mlirgpu.ops.gemm"]
grouped_gemm = sys.modules["mlirgpu.ops.grouped_gemm"]

DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
# f32 sums of products of rounded inputs, the result rounded to the output type: relative to max |C|.
TOLERANCE = {"f16": 2e-3, "bf16": 1e-2}


def operands(sizes, k, n, dtype, extra_rows=0, seed=0):
    """a (rows of every group, then `extra_rows` of no group), b (G, K, N), offsets."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(sizes).astype(np.int32)
    total = int(offsets[-1]) + extra_rows if len(sizes) else extra_rows
    return (rng.standard_normal((total, k)).astype(DTYPES[dtype]),
            rng.standard_normal((len(sizes), k, n)).astype(DTYPES[dtype]), offsets)


def expected(a, b, offsets):
    """Each group's rows times its matrix, in float64; rows past the last group NaN."""
    c = np.full((a.shape[0], b.shape[2]), np.nan)
    begin = 0
    for g, end in enumerate(offsets.tolist()):
        c[begin:end] = a[begin:end].astype(np.float64) @ b[g].astype(np.float64)
        begin = end
    return c


# ==========================================================================
# On the CPU backend, against NumPy

CPU_CASES = [
    # (chip, multiprocessors, group sizes, k, n, dtype, rows past the last group, kernel)
    ("sm_80", 4, [70, 0, 130, 5], 72, 136, "bf16", 3, "mma.sync"),  # an empty group, one under a tile, partial tiles
    ("sm_86", 1, [300], 150, 100, "f16", 0, "mma.sync"),       # G = 1: a plain product through one persistent block
    ("sm_80", 2, [0, 1, 129, 0], 33, 7, "bf16", 0, "mma.sync"),  # K and N of no 16-byte rows (no cp.async), empty ends
    ("sm_90a", 1, [70, 0, 200, 5], 72, 264, "bf16", 3, "wgmma"),  # TMA past a group's rows, a partial column of tiles
    ("sm_90a", 1, [130], 200, 8, "f16", 0, "wgmma"),           # G = 1, K past the last stage, one 8-column tile
]


@pytest.mark.parametrize("chip, multiprocessors, sizes, k, n, dtype, extra, kernel", CPU_CASES,
                         ids=[f"{c[7]}-{len(c[2])}-groups-{c[3]}x{c[4]}-{c[5]}" for c in CPU_CASES])
def test_grouped_matmul_on_the_cpu(device, chip, multiprocessors, sizes, k, n, dtype, extra, kernel):
    device(chip, multiprocessors)
    a, b, offsets = operands(sizes, k, n, dtype, extra)
    out = np.full((a.shape[0], n), np.nan, DTYPES[dtype])
    c = mlirgpu.ops.grouped_matmul(a, b, offsets, out=out)
    (call,) = grouped_gemm._CALLS.values()
    assert call.kernel == kernel
    assert c is out and c.dtype == a.dtype
    exact = expected(a, b, offsets)
    rows = int(offsets[-1])
    assert np.isnan(c[rows:].astype(np.float64)).all()    # rows of no group are not written
    error = np.abs(c[:rows].astype(np.float64) - exact[:rows]).max() / np.abs(exact[:rows]).max()
    assert error < TOLERANCE[dtype]
    # Again, into a new array, through the kept plan.
    again = mlirgpu.ops.grouped_matmul(a, b, offsets)
    assert len(grouped_gemm._CALLS) == 1
    np.testing.assert_array_equal(again[:rows], c[:rows])


def test_other_offsets_of_the_same_shapes_need_no_new_plan(device):
    device("sm_80", 4)
    a, b, offsets = operands([40, 60, 28], 16, 24, "bf16")
    first = mlirgpu.ops.grouped_matmul(a, b, offsets)
    moved = np.array([0, 100, 128], np.int32)    # group 0 empty, group 1 takes what groups 0 and 1 had
    second = mlirgpu.ops.grouped_matmul(a, b, moved)
    assert len(grouped_gemm._CALLS) == 1
    exact = expected(a, b, moved)
    assert np.abs(second.astype(np.float64) - exact).max() / np.abs(exact).max() < TOLERANCE["bf16"]
    np.testing.assert_array_equal(second[100:], first[100:])   # group 2's rows, the same in both


def test_an_empty_k_gives_zeros_and_no_rows_nothing(device):
    device("sm_80", 4)
    a, b, offsets = operands([3, 2], 0, 5, "bf16")
    np.testing.assert_array_equal(mlirgpu.ops.grouped_matmul(a, b, offsets, out=np.ones((5, 5), a.dtype)), 0)
    a, b, offsets = operands([0, 0], 8, 5, "bf16")
    assert mlirgpu.ops.grouped_matmul(a, b, offsets).shape == (0, 5)


# ==========================================================================
# Bad input

def test_shapes_that_do_not_multiply_are_a_launch_error(device):
    device("sm_80", 4)
    a, b, offsets = operands([3, 4], 8, 5, "bf16")
    with pytest.raises(mg.LaunchError, match=r"do not multiply: a has 8 columns, b's matrices 5 rows"):
        mlirgpu.ops.grouped_matmul(a, b.transpose(0, 2, 1).copy(), offsets)
    with pytest.raises(mg.LaunchError, match=r"takes a \(total_M, K\), b \(G, K, N\) and offs \(G,\)"):
        mlirgpu.ops.grouped_matmul(a, b[0], offsets)
    with pytest.raises(mg.LaunchError, match="one row end per group of b: 2, not 3"):
        mlirgpu.ops.grouped_matmul(a, b, np.array([1, 2, 7], np.int32))


def test_k_and_n_off_multiples_of_8_are_a_launch_error_on_sm_90a(device):
    device("sm_90a", 132)
    for k, n in ((33, 8), (8, 7)):
        a, b, offsets = operands([3, 4], k, n, "bf16")
        with pytest.raises(mg.LaunchError, match=f"on sm_90a needs K and N multiples of 8.*K = {k}, N = {n}"):
            mlirgpu.ops.grouped_matmul(a, b, offsets)


def test_bad_dtypes_are_a_launch_error(device):
    device("sm_80", 4)
    a, b, offsets = operands([3, 4], 8, 5, "bf16")
    with pytest.raises(mg.LaunchError, match="one dtype, f16 or bf16"):
        mlirgpu.ops.grouped_matmul(a, b.astype(np.float16), offsets)
    with pytest.raises(mg.LaunchError, match="offs are int32, not int64"):
        mlirgpu.ops.grouped_matmul(a, b, offsets.astype(np.int64))


def test_host_offsets_that_decrease_or_overrun_are_a_launch_error(device):
    device("sm_80", 4)
    a, b, offsets = operands([3, 4], 8, 5, "bf16")
    with pytest.raises(mg.LaunchError, match=r"must not decrease: offs\[1\] = 2 < 3"):
        mlirgpu.ops.grouped_matmul(a, b, np.array([3, 2], np.int32))
    with pytest.raises(mg.LaunchError, match=r"must not decrease: offs\[0\] = -1 < 0"):
        mlirgpu.ops.grouped_matmul(a, b, np.array([-1, 2], np.int32))
    with pytest.raises(mg.LaunchError, match="end at row 8, past a's 7 rows"):
        mlirgpu.ops.grouped_matmul(a, b, np.array([3, 8], np.int32))
    assert issubclass(mg.LaunchError, ValueError)


def test_a_bad_out_and_non_contiguous_arrays_are_a_launch_error(device):
    device("sm_80", 4)
    a, b, offsets = operands([3, 4], 8, 5, "bf16")
    for out in (np.zeros((7, 4), a.dtype), np.zeros((7, 5), np.float32), np.zeros((5, 7), a.dtype).T):
        with pytest.raises(mg.LaunchError, match=r"out is a C-contiguous bf16 array of shape \(7, 5\)"):
            mlirgpu.ops.grouped_matmul(a, b, offsets, out=out)
    with pytest.raises(mg.LaunchError, match="C-contiguous"):
        mlirgpu.ops.grouped_matmul(np.zeros((7, 16), a.dtype)[:, ::2], b, offsets)


def test_what_is_no_array_is_a_type_error(device):
    device("sm_80", 4)
    with pytest.raises(TypeError, match="grouped_matmul's a is an array"):
        mlirgpu.ops.grouped_matmul([[1.0]], [[[2.0]]], [1])


# ==========================================================================
# torch.ops.mlirgpu.grouped_matmul (where torch is installed)

def test_the_torch_op_has_a_fake_implementation_of_the_output_shape():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = grouped_gemm.register_torch()
    assert op is grouped_gemm.register_torch() is torch.ops.mlirgpu.grouped_matmul
    with FakeTensorMode():
        a, b = torch.empty((7, 5), dtype=torch.bfloat16), torch.empty((2, 5, 3), dtype=torch.bfloat16)
        offsets = torch.empty((2,), dtype=torch.int32)
        c = op(a, b, offsets)
        assert (tuple(c.shape), c.dtype) == ((7, 3), torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"multiplies \(total_M, K\) by \(G, K, N\)"):
            op(a, torch.empty((2, 4, 3), dtype=torch.bfloat16), offsets)
        with pytest.raises(RuntimeError, match="int32 offs of shape"):
            op(a, b, torch.empty((3,), dtype=torch.int32))
        with pytest.raises(RuntimeError, match="one dtype, f16 or bf16"):
            op(a.float(), b.float(), offsets)


# ==========================================================================
# On a GPU, against torch._grouped_mm (per-group torch.matmul without it)

GPU_CASES = [(8, 16384, 4096, 14336), (64, 32768, 2048, 1408), (4, 1000, 520, 1000), (1, 777, 512, 264)]


def _reference(torch, a, b, offsets):
    """torch._grouped_mm's product (b as given, or its matrices column-major,
    which some versions want), else a loop of torch.matmul."""
    for operand in (b, b.transpose(1, 2).contiguous().transpose(1, 2)):
        try:
            return torch._grouped_mm(a, operand, offs=offsets)
        except (AttributeError, RuntimeError):
            continue
    c, begin = torch.zeros((a.shape[0], b.shape[2]), dtype=a.dtype, device=a.device), 0
    for g, end in enumerate(offsets.tolist()):
        c[begin:end] = a[begin:end] @ b[g]
        begin = end
    return c


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("groups, tokens, k, n", GPU_CASES, ids=[f"{g}x{t}x{k}x{n}" for g, t, k, n in GPU_CASES])
def test_grouped_matmul_on_the_gpu(groups, tokens, k, n, dtype):
    torch = pytest.importorskip("torch")
    kind = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with current_backend("cuda"):
        generator = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn((tokens, k), device="cuda", dtype=kind, generator=generator)
        b = torch.randn((groups, k, n), device="cuda", dtype=kind, generator=generator)
        # Uneven groups ending at the last row, group 1 empty where there are more than 2.
        cuts = torch.sort(torch.randint(0, tokens, (groups - 1,), generator=torch.Generator().manual_seed(0)))[0]
        if groups > 2:
            cuts[1] = cuts[0]
        offsets = torch.cat([cuts, torch.tensor([tokens])]).to(torch.int32).cuda()
        c = mlirgpu.ops.grouped_matmul(a, b, offs=offsets)
        again = torch.ops.mlirgpu.grouped_matmul(a, b, offsets)
        torch.cuda.synchronize()
        theirs = _reference(torch, a, b, offsets).double()
        exact = torch.zeros((tokens, n), dtype=torch.float64, device="cuda")
        begin = 0
        for g, end in enumerate(offsets.tolist()):
            exact[begin:end] = a[begin:end].double() @ b[g].double()
            begin = end
        scale = exact.abs().max().item()
    assert c.dtype == kind and tuple(c.shape) == (tokens, n)
    ours = (c.double() - exact).abs().max().item()
    assert ours / scale < TOLERANCE[dtype]
    # As close to the exact products as torch, up to the rounding of the output.
    assert ours <= (theirs - exact).abs().max().item() + scale * TOLERANCE[dtype] / 4
    assert torch.equal(c, again)


def two_routings(torch, tokens):
    """Two routings of `tokens` rows to 4 groups, as device offsets: one with an empty group."""
    return [torch.tensor(ends, dtype=torch.int32, device="cuda") for ends in ([100, 100, 600, tokens],
                                                                              [0, 500, 999, tokens])]


def grouped_products(torch, a, b, offsets, row_scales=None, column_scales=None):
    """The grouped product in float32 (rows past the last group 0), each group's rows times
    row_scales and its columns times column_scales[g] where given."""
    c, begin = torch.zeros((a.shape[0], b.shape[2]), device="cuda"), 0
    for g, end in enumerate(offsets.tolist()):
        product = a[begin:end].float() @ b[g].float()
        if row_scales is not None:
            product = row_scales[begin:end, None] * column_scales[g][None, :] * product
        c[begin:end] = product
        begin = end
    return c


@pytest.mark.gpu
def test_launches_from_c_follow_moved_arrays_and_torchs_stream():
    # After the first call, calls with arrays of the same signature launch from C (on sm_90a): the
    # Hopper kernel's maps are encoded anew where an array moved, and each launch goes to torch's
    # current stream.
    torch = pytest.importorskip("torch")
    groups, tokens, k, n = 4, 1000, 512, 264
    with current_backend("cuda"):
        a = [torch.randn((tokens, k), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        b = [torch.randn((groups, k, n), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        offsets = two_routings(torch, tokens)
        expected = [grouped_products(torch, x, b[i % 2], offsets[i // 2]) for i, x in enumerate(a)]
        results = on_two_streams(
            torch, len(a), lambda step, i, out: mlirgpu.ops.grouped_matmul(a[i], b[i % 2], offsets[i // 2], out=out),
            lambda: torch.empty((tokens, n), device="cuda", dtype=torch.bfloat16))
        kept = len(grouped_gemm._KEPT)
    assert kept >= 1
    assert_each_close(results, lambda step, i: expected[i])