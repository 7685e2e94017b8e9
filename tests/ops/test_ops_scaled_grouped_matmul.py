"""mlirgpu.ops.scaled_grouped_matmul: groups of odd sizes (an empty one, one
smaller than a tile, rows past the last group) on the CPU backend, which
emulates the Hopper kernel's TMA copies and 8-bit wgmmas, against a float64
NumPy product per group with its row and column scales; each bad input's
exception; the kernel's PTX through ptxas; the torch op's fake
implementation; and on an sm_90a GPU against torch (float32 products of the
8-bit values per group, and torch._scaled_grouped_mm where torch has it)."""
import re
import sys

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops

from support.backends import current_backend
from support.checks import assert_each_close, on_two_streams, ptxas_accepts
from test_ops_grouped_matmul import grouped_products, two_routings

ml_dtypes = pytest.importorskip("ml_dtypes")
grouped_gemm = sys.modules["mlirgpu.ops.grouped_gemm"]
hopper_gemm = sys.modules["mlirgpu.ops.hopper_gemm"]
scaled_grouped_gemm = sys.modules["mlirgpu.ops.scaled_grouped_gemm"]

E4M3 = ml_dtypes.float8_e4m3fn
OUT_DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}
# The CPU backend sums the exact products in float32: what is left is the output's rounding.
ROUNDING = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11, "f32": 1e-6}


def operands(sizes, k, n, extra_rows=0, seed=0):
    """a (rows of every group, then `extra_rows` of no group), b (G, K, N) with
    its matrices column-major, scale_a, scale_b and the offsets."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(sizes).astype(np.int32)
    total = int(offsets[-1]) + extra_rows
    a = rng.standard_normal((total, k)).astype(E4M3)
    w = rng.standard_normal((len(sizes), n, k)).astype(E4M3)
    # Scales of no common factor: a kernel that swapped rows, columns or groups would show.
    scale_a = rng.uniform(0.25, 4.0, total).astype(np.float32)
    scale_b = rng.uniform(0.25, 4.0, (len(sizes), n)).astype(np.float32)
    return a, w.transpose(0, 2, 1), scale_a, scale_b, offsets


def expected(a, b, scale_a, scale_b, offsets):
    """Each group's scaled product, in float64; rows past the last group NaN."""
    c = np.full((a.shape[0], b.shape[2]), np.nan)
    begin = 0
    for g, end in enumerate(offsets.tolist()):
        product = a[begin:end].astype(np.float64) @ b[g].astype(np.float64)
        c[begin:end] = scale_a[begin:end, None] * scale_b[g][None, :] * product
        begin = end
    return c


# ==========================================================================
# On the CPU backend, against NumPy

CPU_CASES = [
    # (group sizes, k, n, rows past the last group, out_dtype)
    ([70, 0, 200, 5], 144, 272, 3, "bf16"),   # an empty group, one under a tile, a partial column of tiles, K past a step
    ([0, 1, 129, 0], 32, 48, 0, "f16"),       # empty ends, a 1-row group, a K of a quarter step
    ([130], 256, 16, 5, "f32"),               # G = 1, 2 steps of K, one narrow column of tiles
]


@pytest.mark.parametrize("sizes, k, n, extra, out_dtype", CPU_CASES,
                         ids=[f"{len(c[0])}-groups-{c[1]}x{c[2]}-{c[4]}" for c in CPU_CASES])
def test_scaled_grouped_matmul_on_the_cpu(device, sizes, k, n, extra, out_dtype):
    device("sm_90a", 1)
    a, b, scale_a, scale_b, offsets = operands(sizes, k, n, extra)
    out = np.full((a.shape[0], n), np.nan, OUT_DTYPES[out_dtype])
    c = mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, out_dtype=out_dtype, out=out)
    assert c is out
    exact = expected(a, b, scale_a, scale_b, offsets)
    rows = int(offsets[-1])
    assert np.isnan(c[rows:].astype(np.float64)).all()    # rows of no group are not written
    rounding = ROUNDING[out_dtype]
    np.testing.assert_allclose(c[:rows].astype(np.float64), exact[:rows], rtol=rounding,
                               atol=rounding * np.abs(exact[:rows]).max())
    # Again, into a new array of out_dtype given as an mlirgpu dtype, through the kept plan.
    again = mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, out_dtype=out_dtype)
    assert len(grouped_gemm._CALLS) == 1
    assert again.dtype == np.dtype(OUT_DTYPES[out_dtype])
    np.testing.assert_array_equal(again[:rows], c[:rows])


def test_an_empty_k_gives_zeros_and_no_rows_nothing(device):
    device("sm_90a", 1)
    a, b, scale_a, scale_b, offsets = operands([3, 2], 0, 16)
    out = np.ones((5, 16), ml_dtypes.bfloat16)
    np.testing.assert_array_equal(mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, out=out), 0)
    a, b, scale_a, scale_b, offsets = operands([0, 0], 16, 16)
    assert mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets).shape == (0, 16)


# ==========================================================================
# Bad input

def test_bad_shapes_layouts_and_dtypes_are_a_launch_error(device):
    device("sm_90a")
    a, b, scale_a, scale_b, offsets = operands([3, 4], 32, 48)
    call = mlirgpu.ops.scaled_grouped_matmul
    with pytest.raises(mg.LaunchError, match=r"scaled_grouped_matmul's a \(7, 32\) and b \(2, 48, 32\) do not multiply"):
        call(a, b.transpose(0, 2, 1), scale_a, scale_b, offsets)
    with pytest.raises(mg.LaunchError, match=r"scaled_grouped_matmul takes a \(total_M, K\), b \(G, K, N\)"):
        call(a, b[0], scale_a, scale_b, offsets)
    with pytest.raises(mg.LaunchError, match="scaled_grouped_matmul's offs has one row end per group of b: 2, not 3"):
        call(a, b, scale_a, scale_b, np.array([1, 2, 7], np.int32))
    with pytest.raises(mg.LaunchError, match="scaled_grouped_matmul takes a and b of one dtype, f8e4m3"):
        call(a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16), scale_a, scale_b, offsets)
    with pytest.raises(mg.LaunchError, match="scaled_grouped_matmul's offs are int32, not int64"):
        call(a, b, scale_a, scale_b, offsets.astype(np.int64))
    with pytest.raises(mg.LaunchError, match=r"b's matrices column-major \(b.transpose\(-2, -1\) C-contiguous\)"):
        call(a, np.ascontiguousarray(b), scale_a, scale_b, offsets)     # the matrices row-major
    with pytest.raises(mg.LaunchError, match="a and offs must be C-contiguous"):
        call(np.zeros((7, 64), E4M3)[:, ::2], b, scale_a, scale_b, offsets)
    with pytest.raises(mg.LaunchError, match=r"must not decrease: offs\[1\] = 2 < 3"):
        call(a, b, scale_a, scale_b, np.array([3, 2], np.int32))
    with pytest.raises(mg.LaunchError, match="scaled_grouped_matmul's offs end at row 8, past a's 7 rows"):
        call(a, b, scale_a, scale_b, np.array([3, 8], np.int32))
    for k, n in ((40, 48), (32, 24)):
        a, b, scale_a, scale_b, offsets = operands([3, 4], k, n)
        with pytest.raises(mg.LaunchError, match=f"needs K and N multiples of 16.*K = {k}, N = {n}"):
            call(a, b, scale_a, scale_b, offsets)
    assert issubclass(mg.LaunchError, ValueError)


def test_bad_scales_and_output_dtypes_are_a_launch_error(device):
    device("sm_90a")
    a, b, scale_a, scale_b, offsets = operands([3, 4], 32, 48)
    call = mlirgpu.ops.scaled_grouped_matmul
    for wrong in (scale_a[:6], scale_a.astype(np.float64), np.ones((7, 1), np.float32)):
        with pytest.raises(mg.LaunchError, match=r"scale_a is a C-contiguous float32 array of shape \(7,\)"):
            call(a, b, wrong, scale_b, offsets)
    for wrong in (scale_b[0], scale_b.astype(np.float16), np.ones((48, 2), np.float32).T):
        with pytest.raises(mg.LaunchError, match=r"scale_b is a C-contiguous float32 array of shape \(2, 48\)"):
            call(a, b, scale_a, wrong, offsets)
    with pytest.raises(mg.LaunchError, match="scaled_grouped_matmul's out_dtype is bf16, f16 or f32"):
        call(a, b, scale_a, scale_b, offsets, out_dtype=mg.i32)
    with pytest.raises(mg.LaunchError, match=r"scaled_grouped_matmul's out is a C-contiguous f16 array of shape"):
        call(a, b, scale_a, scale_b, offsets, out_dtype=mg.f16, out=np.zeros((7, 48), np.float32))


def test_what_is_no_array_is_a_type_error(device):
    device("sm_90a")
    a, b, scale_a, scale_b, offsets = operands([3, 4], 32, 48)
    with pytest.raises(TypeError, match="scaled_grouped_matmul's a is an array"):
        mlirgpu.ops.scaled_grouped_matmul([[1.0]], b, scale_a, scale_b, offsets)
    with pytest.raises(TypeError, match="scaled_grouped_matmul's scale_a is an array"):
        mlirgpu.ops.scaled_grouped_matmul(a, b, 0.5, scale_b, offsets)


def test_a_gpu_other_than_sm_90a_is_a_launch_error(device, monkeypatch):
    device("sm_80", 108)
    # The planning on a GPU (the CPU backend runs the kernel whatever gemm._device says).
    gpu = type("Backend", (), {"name": "cuda"})()
    monkeypatch.setattr(grouped_gemm, "backend", type("Backends", (), {"current": staticmethod(lambda: gpu)}))
    a, b, scale_a, scale_b, offsets = operands([3, 4], 32, 48)
    with pytest.raises(mg.LaunchError, match="scaled_grouped_matmul needs an sm_90a GPU .*, not sm_80"):
        mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets)


# ==========================================================================
# The kernel's PTX

def spilled_bytes(log):
    return int(re.search(r"(\d+) bytes spill stores", log).group(1))


@pytest.mark.parametrize("n", [4096, 1408])
def test_the_8bit_grouped_kernel_spills_no_more_than_the_2_byte_one(tmp_path, n):
    config = hopper_gemm.GROUPED.replace(b_major="K")
    ptx = hopper_gemm.kernel_for(config, mg.f8e4m3, grouped=True)[4096, n, mg.bf16].ptx(chip="sm_90a")
    # 128 x 256 tiles: every wgmma an 8-bit m64n256k32, B read through a 3-d map.
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+)", ptx)
    assert wgmmas and set(wgmmas) == {"m64n256k32.f32.e4m3.e4m3"}
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.shared::cluster\.global", ptx)
    spilled = spilled_bytes(ptxas_accepts(ptx, "sm_90a", tmp_path, verbose=True))
    # The scales' loads add no spills: none where N fills whole tiles, and no more than the
    # bf16 grouped kernel's where the last column of tiles is partial (ptxas spills 64 bytes
    # of that one at N = 1408, and of both at some other N, 14336 for one).
    two_bytes = hopper_gemm.kernel_for(hopper_gemm.GROUPED, mg.bf16, grouped=True)[4096, n, mg.bf16]
    assert spilled <= spilled_bytes(ptxas_accepts(two_bytes.ptx(chip="sm_90a"), "sm_90a", tmp_path,
                                                  verbose=True))
    if n % 256 == 0:
        assert spilled == 0


def test_the_grouped_kernel_takes_b_k_major_in_8_bits_only():
    with pytest.raises(ValueError, match=r"B as G x K x N \(2-byte inputs\) or G x N x K \(8-bit ones\)"):
        hopper_gemm.build(hopper_gemm.GROUPED, mg.f8e4m3, grouped=True)
    with pytest.raises(ValueError, match=r"B as G x K x N \(2-byte inputs\) or G x N x K \(8-bit ones\)"):
        hopper_gemm.build(hopper_gemm.GROUPED.replace(b_major="K"), mg.bf16, grouped=True)


# ==========================================================================
# torch.ops.mlirgpu.scaled_grouped_matmul (where torch is installed)

def test_the_torch_op_has_a_fake_implementation_of_the_output_shape():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = scaled_grouped_gemm.register_torch()
    assert op is scaled_grouped_gemm.register_torch() is torch.ops.mlirgpu.scaled_grouped_matmul
    with FakeTensorMode():
        a = torch.empty((7, 32), dtype=torch.float8_e4m3fn)
        b = torch.empty((2, 48, 32), dtype=torch.float8_e4m3fn).transpose(-2, -1)
        scale_a, scale_b = torch.empty((7,)), torch.empty((2, 48))
        offsets = torch.empty((2,), dtype=torch.int32)
        c = op(a, b, scale_a, scale_b, offsets, torch.float16)
        assert (tuple(c.shape), c.dtype) == ((7, 48), torch.float16)
        with pytest.raises(RuntimeError, match=r"multiplies \(total_M, K\) by \(G, K, N\)"):
            op(a, b.transpose(-2, -1), scale_a, scale_b, offsets, torch.float16)
        with pytest.raises(RuntimeError, match=r"scale_a \(total_M,\) and scale_b \(G, N\)"):
            op(a, b, scale_a, scale_b.t(), offsets, torch.float16)
        with pytest.raises(RuntimeError, match="float8_e4m3fn"):
            op(a.half(), b.half(), scale_a, scale_b, offsets, torch.float16)


# ==========================================================================
# On an sm_90a GPU, against torch

GPU_CASES = [(8, 16384, 4096, 14336), (64, 32768, 2048, 1408), (4, 1000, 512, 1024), (1, 777, 512, 272)]


def _their_product(torch, a, b, scale_a, scale_b, offsets):
    """torch._scaled_grouped_mm's product with use_fast_accum (the accumulation
    wgmma's FP8 sums have), None where torch has no such op or it does not run
    here."""
    try:
        return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offsets, out_dtype=torch.bfloat16,
                                        use_fast_accum=True)
    except (AttributeError, RuntimeError, TypeError):
        return None


@pytest.mark.gpu
@pytest.mark.parametrize("groups, tokens, k, n", GPU_CASES, ids=[f"{g}x{t}x{k}x{n}" for g, t, k, n in GPU_CASES])
def test_scaled_grouped_matmul_on_the_gpu(groups, tokens, k, n):
    torch = pytest.importorskip("torch")
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            zeros = torch.zeros((16, 16), device="cuda").to(torch.float8_e4m3fn)
            with pytest.raises(mg.LaunchError, match="needs an sm_90a GPU"):
                mlirgpu.ops.scaled_grouped_matmul(zeros, zeros.reshape(1, 16, 16).transpose(-2, -1),
                                                  torch.ones(16, device="cuda"), torch.ones((1, 16), device="cuda"),
                                                  torch.tensor([16], dtype=torch.int32, device="cuda"))
            return
        generator = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn((tokens, k), device="cuda", generator=generator).to(torch.float8_e4m3fn)
        w = torch.randn((groups, n, k), device="cuda", generator=generator).to(torch.float8_e4m3fn)
        b = w.transpose(-2, -1)
        scale_a = torch.rand(tokens, device="cuda", generator=generator) + 0.5
        scale_b = torch.rand((groups, n), device="cuda", generator=generator) + 0.5
        # Uneven groups, group 1 empty where there are more than 2, the last ending 3 rows before a's end.
        cuts = torch.sort(torch.randint(0, tokens - 3, (groups - 1,), generator=torch.Generator().manual_seed(0)))[0]
        if groups > 2:
            cuts[1] = cuts[0]
        offsets = torch.cat([cuts, torch.tensor([tokens - 3])]).to(torch.int32).cuda()
        out = torch.full((tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        c = mlirgpu.ops.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, out=out)
        op = torch.ops.mlirgpu.scaled_grouped_matmul(a, b, scale_a, scale_b, offsets, torch.bfloat16)
        theirs = _their_product(torch, a, b, scale_a, scale_b, offsets)
        exact = torch.zeros((tokens, n), dtype=torch.float64, device="cuda")
        begin = 0
        for g, end in enumerate(offsets.tolist()):
            # The 8-bit values are exact in float32; their products summed in float32.
            product = (a[begin:end].float() @ b[g].float()).double()
            exact[begin:end] = scale_a[begin:end, None].double() * scale_b[g][None, :].double() * product
            begin = end
        torch.cuda.synchronize()
    assert c is out and c.dtype == torch.bfloat16
    assert torch.isnan(c[tokens - 3:].float()).all()      # rows of no group are not written
    rows = tokens - 3
    scale = exact[:rows].abs().max().item()
    ours = (c[:rows].double() - exact[:rows]).abs().max().item()
    # Exact products of 8-bit values, summed by wgmma's FP8 accumulator, which keeps fewer bits than float32.
    assert ours / scale < 1e-2
    assert torch.equal(c[:rows], op[:rows])
    if theirs is not None:
        # As close to the float32 sums as torch's grouped FP8 GEMM with the same accumulation.
        assert ours <= (theirs[:rows].double() - exact[:rows]).abs().max().item() + scale * 1e-3


@pytest.mark.gpu
def test_launches_from_c_follow_moved_arrays_and_torchs_stream():
    # After the first call, calls with arrays of the same signature launch from C: the maps are encoded
    # anew where an array moved, the scales and offsets passed as they are, and each launch goes to
    # torch's current stream.
    torch = pytest.importorskip("torch")
    groups, tokens, k, n = 4, 1000, 512, 256
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("scaled_grouped_matmul runs on sm_90a GPUs")
        a = [torch.randn((tokens, k), device="cuda").to(torch.float8_e4m3fn) for _ in range(4)]
        b = [torch.randn((groups, n, k), device="cuda").to(torch.float8_e4m3fn).transpose(-2, -1) for _ in range(2)]
        scale_a = [torch.rand(tokens, device="cuda") + 0.5 for _ in range(4)]
        scale_b = [torch.rand((groups, n), device="cuda") + 0.5 for _ in range(2)]
        offsets = two_routings(torch, tokens)
        expected = [grouped_products(torch, x, b[i % 2], offsets[i // 2], scale_a[i], scale_b[i % 2])
                    for i, x in enumerate(a)]
        results = on_two_streams(
            torch, len(a), lambda step, i, out: mlirgpu.ops.scaled_grouped_matmul(
                a[i], b[i % 2], scale_a[i], scale_b[i % 2], offsets[i // 2], out=out),
            lambda: torch.empty((tokens, n), device="cuda", dtype=torch.bfloat16))
        kept = len(scaled_grouped_gemm._KEPT)
    assert kept >= 1
    assert_each_close(results, lambda step, i: expected[i])