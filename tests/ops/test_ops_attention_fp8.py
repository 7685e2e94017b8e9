"""The FP8 forward of mlirgpu.ops.attention (attention_sm90's kernel with
8-bit inputs): on the CPU backend, which runs its TMA copies, mbarriers and
8-bit wgmmas, against float64 NumPy on the dequantized inputs at small, odd
sizes (the tail of Lk, several key tiles, causal with Lq < Lk and Lq > Lk,
grouped-query heads, the log-sum-exp) and against the bf16 kernel on the
same values; V^T's key order; each bad input's exception; its PTX through
ptxas; and on an sm_90a GPU against torch's SDPA on the dequantized inputs.

Compiling one kernel for the CPU takes about a minute: the CPU cases share
two FP8 kernels (d = 64 causal, d = 128 without the mask, bf16 output) and
one bf16 kernel (d = 64 causal)."""
import math
import re

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops
from mlirgpu.ops import attention_sm90

from support.attention import reference
from support.backends import current_backend
from support.checks import ptxas_accepts

ml_dtypes = pytest.importorskip("ml_dtypes")
E4M3 = ml_dtypes.float8_e4m3fn
# Powers of two: the dequantized values are exact in bf16 too, for the comparison with its kernel.
DESCALES = (0.5, 0.25, 2.0)
# P is rounded to e4m3 (3 bits of mantissa) before O += P V, each value by up to 2^-4 of itself:
# a row that sees few keys (causal) passes that to its output as up to 2^-4 of V's largest value;
# then the bf16 output's rounding, 2^-8 of it.
RELATIVE_TOLERANCE = 2 ** -4 + 2 ** -8


def operands(batch, lq, lk, hq, hk, d, seed=0):
    """q, k and v of e4m3 (B, L, H, d), and their real values (times DESCALES) in float64."""
    rng = np.random.default_rng(seed)
    stored = [(rng.standard_normal(shape) * 3).astype(E4M3)
              for shape in ((batch, lq, hq, d), (batch, lk, hk, d), (batch, lk, hk, d))]
    return stored, [x.astype(np.float64) * s for x, s in zip(stored, DESCALES)]


def run_on_the_cpu(batch, lq, lk, hq, hk, d, causal, seed=0):
    (q, k, v), real = operands(batch, lq, lk, hq, hk, d, seed)
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, return_lse=True, descale_q=DESCALES[0],
                                         descale_k=np.array([DESCALES[1]], np.float32), descale_v=DESCALES[2])
    return real, out, lse


def check(real, out, lse, causal):
    expected, expected_lse = reference(*real, causal)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0,
                               atol=RELATIVE_TOLERANCE * np.abs(real[2]).max())
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


# (batch, Lq, Lk, Hq, Hk): 3 key tiles and 3 row blocks, 2:1 heads; Lq > Lk (the first rows see no key).
CAUSAL_CASES = [(1, 260, 300, 2, 1), (1, 130, 77, 4, 2)]
# Tails of one row block and of 3 key tiles, two sequences; one query against 130 keys, all:1 heads.
FULL_CASES = [(2, 17, 300, 2, 2), (1, 1, 130, 4, 1)]
CASES = [(shape, 64, True) for shape in CAUSAL_CASES] + [(shape, 128, False) for shape in FULL_CASES]


@pytest.mark.parametrize("shape, d, causal", CASES,
                         ids=[f"{'x'.join(map(str, s))}-d{d}{'-causal' if c else ''}" for s, d, c in CASES])
def test_on_the_cpu(shape, d, causal):
    check(*run_on_the_cpu(*shape, d, causal), causal)


def test_matches_the_bf16_kernel_on_the_same_values():
    shape, d = CAUSAL_CASES[0], 64
    real, out, lse = run_on_the_cpu(*shape, d, True, seed=1)
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in real)     # exact: e4m3 values times powers of two
    bf16_out, bf16_lse = np.full(q.shape, np.nan, ml_dtypes.bfloat16), np.full((1, 2, shape[1]), np.nan, np.float32)
    with current_backend("cpu"):
        attention_sm90.forward(q, k, v, bf16_out, bf16_lse, True, math.log2(math.e) / math.sqrt(d))
    np.testing.assert_allclose(out.astype(np.float64), bf16_out.astype(np.float64), rtol=0,
                               atol=RELATIVE_TOLERANCE * np.abs(real[2]).max())
    np.testing.assert_allclose(lse, bf16_lse, rtol=1e-5, atol=1e-5)


# (Lk, d): each head dim, Lk's tail within a group of 32 keys after several groups; at d = 128
# (key tiles of 128) a block's 64 keys all past Lk.
TRANSPOSE_CASES = [(77, 64), (45, 128), (150, 256)]


@pytest.mark.parametrize("lk, d", TRANSPOSE_CASES, ids=[f"lk{lk}-d{d}" for lk, d in TRANSPOSE_CASES])
def test_v_transposed_holds_keys_where_the_fragments_of_p_hold_them(lk, d):
    assert tuple(attention_sm90.permuted_key(j) for j in range(32)) == mg.wgmma.fragment_columns(mg.f8e4m3)
    batch, hk = 2, 3
    v = np.random.default_rng(2).standard_normal((batch, lk, hk, d)).astype(E4M3)
    # 0x7f is e4m3's NaN: an element the kernel does not write stays one, the padded keys' included.
    vt = np.full((batch, hk, d, attention_sm90.padded_keys(lk, d)), 0x7f, np.uint8).view(E4M3)
    with current_backend("cpu"):
        attention_sm90.transposed_values(v, vt)
    keys = [j // 32 * 32 + attention_sm90.permuted_key(j % 32) for j in range(vt.shape[3])]
    expected = np.zeros(vt.shape, np.float32)
    for column, key in enumerate(keys):
        if key < lk:
            expected[:, :, :, column] = v[:, key].astype(np.float32)
    np.testing.assert_array_equal(vt.astype(np.float32), expected)     # past Lk: zeros


def test_v_transposed_in_16_byte_vectors():
    ptx = attention_sm90.transpose_kernel(128)[()].ptx(chip="sm_90a")
    assert re.search(r"ld\.global(\.nc)?\.v4\.b32", ptx) and "st.global.v4.b32" in ptx
    assert "st.shared.v4.b32" in ptx


def test_no_query_rows_launch_nothing_and_out_dtype_picks_the_outputs():
    q = np.zeros((1, 0, 2, 64), E4M3)
    k = np.zeros((1, 5, 2, 64), E4M3)
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, k, return_lse=True, out_dtype="f16")
    assert out.dtype == np.float16 and out.shape == q.shape and lse.shape == (1, 2, 0)


@pytest.mark.parametrize("options, error, message", [
    (dict(window=(8, 0)), ValueError, "no window and one split; not window"),
    (dict(num_splits=2), ValueError, "not num_splits > 1"),
    (dict(descale_q=0.0), mg.LaunchError, "descale_q is a finite number > 0"),
    (dict(descale_v=-1.0), mg.LaunchError, "descale_v is a finite number > 0"),
    (dict(descale_k=np.ones(2, np.float32)), mg.LaunchError, r"descale_k is a per-tensor scale.*shape \(2,\)"),
    (dict(out_dtype=mg.f32), mg.LaunchError, r"out_dtype \(for f8e4m3 inputs\) is bf16 or f16, not f32"),
])
def test_bad_options_are_errors(options, error, message):
    (q, k, v), _ = operands(1, 8, 8, 2, 1, 64)
    with current_backend("cpu"), pytest.raises(error, match=message):
        mlirgpu.ops.attention(q, k, v, **options)


def test_bad_arrays_are_launch_errors():
    (q, k, v), _ = operands(1, 8, 8, 2, 1, 64)
    with current_backend("cpu"):
        with pytest.raises(mg.LaunchError, match="q, k and v have one dtype"):
            mlirgpu.ops.attention(q, k.astype(ml_dtypes.bfloat16), v)
        with pytest.raises(mg.LaunchError, match="head_dim is one of 64, 128, 256, not 32"):
            mlirgpu.ops.attention(q[..., :32].copy(), k[..., :32].copy(), v[..., :32].copy())
        with pytest.raises(mg.LaunchError, match="descale_v and out_dtype go with f8e4m3 q, k and v"):
            mlirgpu.ops.attention(*(x.astype(ml_dtypes.bfloat16) for x in (q, k, v)), descale_v=2.0)
        with pytest.raises(mg.LaunchError, match="attention's out is a C-contiguous bf16 array"):
            mlirgpu.ops.attention(q, k, v, out=np.zeros(q.shape, np.float16))
        with pytest.raises(TypeError, match="attention's q is an array"):
            mlirgpu.ops.attention([1.0], k, v, descale_q=1.0)
    assert issubclass(mg.LaunchError, ValueError)


def test_autograd_is_a_value_error():
    torch = pytest.importorskip("torch")
    (q, k, v), _ = operands(1, 8, 8, 2, 1, 64)
    q, k, v = (torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn) for x in (q, k, v))
    with torch.enable_grad(), pytest.raises(ValueError, match="has no backward"):
        mlirgpu.ops.attention(q.requires_grad_(), k, v)


def test_shared_memory_fits_a_block():
    for d in attention_sm90.HEAD_DIMS:
        assert attention_sm90.shared_bytes(d, fp8=True) <= 227 * 1024


@pytest.mark.parametrize("d, causal", [(64, True), (128, False), (128, True), (256, True)])
def test_ptx(d, causal, tmp_path):
    bn = attention_sm90.key_tile(d)
    ptx = attention_sm90.kernel_for(d, causal, True)[mg.bf16].ptx(chip="sm_90a")
    # S = Q K^T (D/32 k32 wgmmas by descriptor) and O += P V (BN/32, P from registers), each in the
    # pipeline's prologue or epilogue and its loop; P's words rounded a pair at a time.
    by_descriptor = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn}k32\.f32\.e4m3\.e4m3 \{{[^}}]*\}}, %rd", ptx)
    from_registers = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{d}k32\.f32\.e4m3\.e4m3 \{{[^}}]*\}}, \{{",
                                ptx)
    assert (len(by_descriptor), len(from_registers)) == (2 * (d // 32), 2 * (bn // 32))
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 2 * (bn // 4)
    log = ptxas_accepts(ptx, "sm_90a", tmp_path, verbose=True)
    assert "0 bytes spill stores, 0 bytes spill loads" in log
    assert "warning" not in log


# On an sm_90a GPU, through torch tensors: realistic sizes against SDPA (float32, on the
# dequantized values), non-causal and causal, grouped-query heads, each head dim.
GPU_CASES = [(2, 1024, 1024, 16, 4, 128, False), (1, 4096, 4096, 8, 8, 128, True), (2, 1000, 1500, 8, 2, 64, True),
             (1, 2048, 2048, 8, 8, 64, False), (1, 1000, 1000, 4, 2, 256, True), (4, 1, 777, 8, 8, 128, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("batch, lq, lk, hq, hk, d, causal", GPU_CASES,
                         ids=[f"{b}x{lq}x{lk}x{hq}x{hk}-d{d}{'-causal' if c else ''}"
                              for b, lq, lk, hq, hk, d, c in GPU_CASES])
def test_against_sdpa_on_the_gpu(batch, lq, lk, hq, hk, d, causal):
    torch = pytest.importorskip("torch")
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("the FP8 forward runs on sm_90a GPUs")
        (q, k, v), real = operands(batch, lq, lk, hq, hk, d)
        q, k, v = (torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn) for x in (q, k, v))
        descales = [torch.tensor([s], dtype=torch.float32, device="cuda") for s in DESCALES]
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, return_lse=True, descale_q=descales[0],
                                         descale_k=descales[1], descale_v=descales[2])
        assert out.dtype == torch.bfloat16 and out.shape == q.shape
        # SDPA's layout is (B, H, L, d); its causal mask is at the top left, ours at the bottom right.
        rq, rk, rv = (torch.from_numpy(x).cuda().float().transpose(1, 2) for x in real)
        rk, rv = (x.repeat_interleave(hq // hk, dim=1) for x in (rk, rv))
        mask = None
        if causal:
            mask = torch.ones(lq, lk, dtype=torch.bool, device="cuda").tril(lk - lq)
        expected = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, attn_mask=mask).transpose(1, 2)
        seen = mask.any(-1) if causal else torch.ones(lq, dtype=torch.bool, device="cuda")
        error = (out.float() - expected).abs()[:, seen]      # rows that see no key: SDPA's NaN, our 0
        assert error.max().item() <= RELATIVE_TOLERANCE * np.abs(real[2]).max()
        scores = torch.einsum("bhqd,bhkd->bhqk", rq, rk) / math.sqrt(d)
        if causal:
            scores = scores.masked_fill(~mask, float("-inf"))
        expected_lse = torch.logsumexp(scores, -1)[:, :, seen]
        # Hopper's 8-bit wgmma sums its products with fewer bits of mantissa than float32: a row
        # that sees one key or a few has for its log-sum-exp about that score, off by 1e-3 or so.
        torch.testing.assert_close(lse[:, :, seen], expected_lse, rtol=1e-3, atol=1e-3)
