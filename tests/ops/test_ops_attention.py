"""mlirgpu.ops.attention, the FlashAttention-2-style forward kernel: on the
CPU backend against float64 NumPy at small, odd sizes (tails, causal with
Lq < Lk, Lq == Lk and Lq > Lk, grouped-query and multi-query heads, head dims
64 and 128, f16 and bf16, the log-sum-exp), decoding with a group's query
heads packed into one block, its PTX through ptxas, each bad input's
exception, what a call keeps for the next (its checked plan, the split
keys' workspace), and on a GPU against torch's SDPA (math backend, float32)
or float32 NumPy at full sizes.

Each (head dim, dtype, causal) is a kernel of its own, and compiling one for
the CPU takes seconds: the CPU cases share four of them."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops

from support.backends import current_backend
from support.checks import ptxas_accepts

ml_dtypes = pytest.importorskip("ml_dtypes")
from support.attention import DTYPES, operands, packed, reference, sequences, visible  # noqa: E402

# The largest difference from float64: P and the output are rounded to the inputs' type.
TOLERANCE = {"f16": 2e-3, "bf16": 1.5e-2}
attention_module = sys.modules["mlirgpu.ops.attention"]


def check(batch, lq, lk, hq, hk, d, dtype, causal, scale=None):
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    expected, expected_lse = reference(q, k, v, causal, scale)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (batch, hq, lq)
    assert lse.dtype == np.float32
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


# (batch, Lq, Lk, Hq, Hk): tails of both tiles, one query (decoding), one key, 4:1 and all:1 heads.
SHAPES = [(2, 17, 77, 2, 2), (1, 1, 130, 8, 2), (1, 130, 1, 4, 1), (1, 77, 130, 4, 1)]
# Causal: Lq < Lk (diagonal at the bottom right), Lq == Lk, and Lq > Lk (the first rows see no key).
CAUSAL_SHAPES = [(1, 17, 130, 2, 2), (2, 130, 130, 4, 1), (1, 130, 77, 4, 2), (1, 1, 77, 8, 2)]
# The four kernels: each (head dim, dtype) once without and once with the causal mask.
KERNELS = [(64, "f16"), (128, "bf16")]


@pytest.mark.parametrize("d, dtype", KERNELS, ids=[f"d{d}-{t}" for d, t in KERNELS])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_attention_on_the_cpu(shape, d, dtype):
    check(*shape, d, dtype, causal=False)


@pytest.mark.parametrize("d, dtype", KERNELS, ids=[f"d{d}-{t}" for d, t in KERNELS])
@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=["x".join(map(str, s)) for s in CAUSAL_SHAPES])
def test_causal_attention_on_the_cpu(shape, d, dtype):
    check(*shape, d, dtype, causal=True)


def test_scale_and_out():
    q, k, v = operands(1, 33, 40, 2, 2, 64, "f16")
    out = np.full(q.shape, np.nan, np.float16)
    with current_backend("cpu"):
        got = mlirgpu.ops.attention(q, k, v, scale=0.3, out=out)
    assert got is out
    np.testing.assert_allclose(out.astype(np.float64), reference(q, k, v, scale=0.3)[0], rtol=0,
                               atol=TOLERANCE["f16"])


def test_import_mlirgpu_does_not_import_ops():
    code = "import sys, mlirgpu; print(any(m.startswith('mlirgpu.ops') for m in sys.modules))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True).stdout.strip() == "False"


# ==========================================================================
# PTX: each head dim, with and without the mask, for Ampere and Hopper, without a GPU

# The last: decoding's kernel, query heads packed and keys split.
PTX_CASES = [(64, False, "sm_80", False), (128, True, "sm_90a", False), (256, False, "sm_90a", False),
             (128, False, "sm_90a", True)]


@pytest.mark.parametrize("d, causal, chip, decoding", PTX_CASES,
                         ids=[f"d{d}-{'causal' if c else 'full'}-{chip}{'-decoding' if p else ''}"
                              for d, c, chip, p in PTX_CASES])
def test_ptx(d, causal, chip, decoding, tmp_path):
    ptx = attention_module.kernel_for(d, causal, False, decoding, decoding)[mg.bf16].ptx(chip=chip)
    bn = attention_module.key_tile(d)
    # S = Q K^T and O += P V: D/16 x BN/8 and BN/16 x D/8 atoms a warp per key tile.
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == d * bn // 64
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx and "cp.async.cg.shared.global" in ptx
    assert "ex2.approx" in ptx
    ptxas_accepts(ptx, chip, tmp_path)


# ==========================================================================
# Bad input: each a documented exception, raised before anything compiles

def bad(message, *arrays, error=mg.LaunchError, **options):
    with current_backend("cpu"), pytest.raises(error, match=message):
        mlirgpu.ops.attention(*arrays, **options)


def test_wrong_rank():
    q, k, v = operands(1, 8, 8, 2, 2, 64, "f16")
    bad("attention's q is .* 4-d; got shape \\(8, 2, 64\\)", q[0], k, v)


def test_mismatched_head_dims():
    q, _, _ = operands(1, 8, 8, 2, 2, 64, "f16")
    _, k, v = operands(1, 8, 8, 2, 2, 128, "f16")
    bad("differ in batch or head_dim", q, k, v)


def test_mismatched_batch():
    q, _, _ = operands(2, 8, 8, 2, 2, 64, "f16")
    _, k, v = operands(1, 8, 8, 2, 2, 64, "f16")
    bad("differ in batch or head_dim", q, k, v)


def test_k_and_v_differ():
    q, k, _ = operands(1, 8, 8, 2, 2, 64, "f16")
    _, _, v = operands(1, 9, 9, 2, 2, 64, "f16")
    bad("k and v have one shape", q, k, v)


def test_heads_not_a_multiple():
    q, _, _ = operands(1, 8, 8, 6, 6, 64, "f16")
    _, k, v = operands(1, 8, 8, 4, 4, 64, "f16")
    bad("key/value heads \\(4\\) must divide its query heads \\(6\\)", q, k, v)


def test_unsupported_head_dim():
    bad("head_dim is one of 64, 128, 256, not 96", *operands(1, 8, 8, 2, 2, 96, "f16"))


def test_wrong_dtype():
    q, k, v = (x.astype(np.float32) for x in operands(1, 8, 8, 2, 2, 64, "f16"))
    bad("f16 or bf16 q, k and v, not float32", q, k, v)


def test_mixed_dtypes():
    q, k, v = operands(1, 8, 8, 2, 2, 64, "f16")
    bad("q, k and v have one dtype", q, k.astype(ml_dtypes.bfloat16), v)


def test_not_contiguous():
    q, k, v = operands(1, 8, 8, 2, 2, 128, "f16")
    bad("attention's q must be C-contiguous", q[..., ::2], k[..., ::2], v[..., ::2])


def test_no_keys():
    q, k, v = operands(1, 8, 0, 2, 2, 64, "f16")
    bad("at least one key", q, k, v)


def test_wrong_out():
    q, k, v = operands(1, 8, 8, 2, 2, 64, "f16")
    bad("attention's out is a C-contiguous f16 array of shape \\(1, 8, 2, 64\\)", q, k, v,
        out=np.empty((1, 8, 2, 64), np.float32))


def test_not_an_array():
    _, k, v = operands(1, 8, 8, 2, 2, 64, "f16")
    bad("attention's q is an array", [[1.0]], k, v, error=TypeError)


def test_negative_scale():
    bad("scale is a number >= 0", *operands(1, 8, 8, 2, 2, 64, "f16"), scale=-1.0, error=ValueError)


def test_errors_are_value_errors():
    assert issubclass(mg.LaunchError, ValueError)


# ==========================================================================
# On a GPU, at full sizes, against torch's SDPA in float32 (NumPy without torch)

GPU_CASES = [(2, 16, 1024, 64, False), (2, 16, 1024, 128, True), (2, 16, 4096, 128, False),
             (2, 16, 4096, 64, True), (1, 8, 1000, 128, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("batch, heads, length, d, causal", GPU_CASES,
                         ids=[f"{b}x{h}x{n}-d{d}{'-causal' if c else ''}" for b, h, n, d, c in GPU_CASES])
def test_attention_on_the_gpu(batch, heads, length, d, causal, dtype):
    q, k, v = operands(batch, length, length, heads, heads // 4, d, dtype)
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        torch = None
    with current_backend("cuda"):
        if torch is None:
            out, lse = mlirgpu.ops.attention(*(mg.to_device(x) for x in (q, k, v)), causal=causal, return_lse=True)
            got, got_lse = out.get().astype(np.float64), lse.get()
            expected, expected_lse = reference(q, k, v, causal)
        else:
            tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).cuda() for x in (q, k, v))
            out, lse = mlirgpu.ops.attention(*(x.to(getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[dtype]))
                                               for x in (tq, tk, tv)), causal=causal, return_lse=True)
            torch.cuda.synchronize()
            with sdpa_kernel(SDPBackend.MATH):
                # SDPA's layout is (B, H, L, d); its causal mask is the top-left one, which is the
                # bottom-right one when Lq == Lk.
                expected = torch.nn.functional.scaled_dot_product_attention(
                    tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2), is_causal=causal,
                    enable_gqa=True).transpose(1, 2)
                scores = (tq.transpose(1, 2) @ tk.repeat_interleave(4, dim=2).permute(0, 2, 3, 1)) / math.sqrt(d)
                if causal:
                    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool, device="cuda")
                                                .triu(1), float("-inf"))
                expected_lse = torch.logsumexp(scores, dim=-1)
            got, got_lse = out.float().cpu().numpy(), lse.cpu().numpy()
            expected, expected_lse = expected.cpu().numpy(), expected_lse.cpu().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(got_lse, expected_lse, rtol=1e-4, atol=1e-4)


# ==========================================================================
# Sliding windows, packed sequences and split keys, on the CPU backend

# (Lq, Lk, window, causal): a band inside one tile, across tiles, one-sided, with the causal mask
# (right capped at 0), and Lq > Lk with a window that leaves the first rows no key.
WINDOWS = [(70, 130, (5, 3), False), (130, 130, (70, 0), False), (77, 140, (None, 10), False),
           (100, 100, (20, 40), True), (90, 40, (3, -1), False)]


@pytest.mark.parametrize("lq, lk, window, causal", WINDOWS, ids=[f"{a}x{b}-{w}-{c}" for a, b, w, c in WINDOWS])
def test_sliding_window_on_the_cpu(lq, lk, window, causal):
    q, k, v = operands(1, lq, lk, 4, 2, 64, "f16")
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, window=window, return_lse=True)
    expected, expected_lse = reference(q, k, v, causal, window=window)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE["f16"])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


# Sequences of unequal lengths, a tail in each tile, one of a single token; with the causal mask,
# a window, and grouped-query heads.
VARLEN = [([37, 1, 130], [50, 70, 130], False, None), ([64, 100], [30, 200], True, None),
          ([80, 9], [80, 90], True, (16, 0))]


@pytest.mark.parametrize("lengths_q, lengths_k, causal, window", VARLEN, ids=["full", "causal", "window"])
def test_varlen_on_the_cpu(lengths_q, lengths_k, causal, window):
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, 4, 2, 64, "bf16")
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, window=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                         max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k), return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    for rows, keys in sequences(cu_q, cu_k):
        expected, expected_lse = reference(q[None, rows], k[None, keys], v[None, keys], causal, window=window)
        np.testing.assert_allclose(out[rows].astype(np.float64), expected[0], rtol=0, atol=TOLERANCE["bf16"])
        np.testing.assert_allclose(lse[:, rows], expected_lse[0], rtol=1e-5, atol=1e-5)


# Decoding: one and a few queries against a long cache, GQA 8:1, split among blocks; with the causal mask;
# 11 splits of one key tile each.
SPLITS = [(1, 700, None, False), (3, 700, 4, True), (16, 300, 3, False), (1, 700, 11, False)]


@pytest.mark.parametrize("lq, lk, splits, causal", SPLITS, ids=[f"{a}x{b}-{s}-{c}" for a, b, s, c in SPLITS])
def test_split_keys_on_the_cpu(lq, lk, splits, causal):
    q, k, v = operands(2, lq, lk, 8, 1, 64, "f16")
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, num_splits=splits, return_lse=True)
    expected, expected_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE["f16"])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


# Query heads packed (decoding), (batch, Lq, Lk, Hq, Hk, d, dtype, causal, window, num_splits): groups
# 8:1, 4:1 and 2:1; Lq 1, 3, 13 and 16 (Lq x group past a block's 64 rows); odd Lk; causal (Lq > Lk
# too: the first rows see no key) and windowed; split by default, explicitly, and not; d 64, 128 and
# 256; f16 and bf16.
PACKED = [(2, 1, 301, 8, 1, 64, "f16", False, None, 2), (1, 3, 333, 8, 2, 128, "bf16", True, None, 4),
          (1, 16, 257, 8, 1, 64, "f16", True, None, 1), (2, 13, 199, 8, 1, 256, "bf16", False, (40, 0), 3),
          (1, 16, 131, 8, 4, 128, "f16", False, (20, -1), 1), (1, 3, 517, 32, 4, 256, "f16", True, None, None),
          (3, 1, 1001, 16, 4, 128, "bf16", False, None, None), (1, 16, 9, 4, 1, 64, "f16", True, None, None)]


@pytest.mark.parametrize("batch, lq, lk, hq, hk, d, dtype, causal, window, splits", PACKED,
                         ids=[f"{b}x{lq}x{lk}x{hq}x{hk}-d{d}-{t}-{c}-{w}-{s}"
                              for b, lq, lk, hq, hk, d, t, c, w, s in PACKED])
def test_packed_decoding_on_the_cpu(batch, lq, lk, hq, hk, d, dtype, causal, window, splits):
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    problem = attention_module.Problem("attention", q, k, v, causal, None, window, None, None, None, None)
    assert attention_module.packs_heads(problem)
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, window=window, num_splits=splits, return_lse=True)
    expected, expected_lse = reference(q, k, v, causal, window=window)
    assert out.shape == q.shape and lse.shape == (batch, hq, lq)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


def problem_of(batch, lq, lk, hq, hk, d):
    """The Problem of shapes alone (zeros): decoding's sizes without drawing random numbers."""
    q = np.zeros((batch, lq, hq, d), DTYPES["bf16"])
    k = np.zeros((batch, lk, hk, d), DTYPES["bf16"])
    return attention_module.Problem("attention", q, k, k, False, None, None, None, None, None, None)


def test_decoding_packs_the_query_heads():
    # The decode row of benchmarks/attention.py: 8 x 4 packed blocks, the keys split 8 ways.
    problem = problem_of(8, 1, 16384, 32, 4, 128)
    assert attention_module.packs_heads(problem)
    assert attention_module.splits_for(problem) == 8
    assert attention_module.grid_for(problem, True, 8) == (1, 32, 8)
    # 16 queries of 8 heads a group: 128 rows, two blocks a (batch, key/value head).
    problem = problem_of(2, 16, 4096, 32, 4, 128)
    assert attention_module.packs_heads(problem)
    assert attention_module.grid_for(problem, True, 1) == (2, 8, 1)
    assert attention_module.splits_for(problem) == 16
    # One query head a key/value head, more queries than decoding's: one head a block.
    assert not attention_module.packs_heads(problem_of(8, 1, 16384, 32, 32, 128))
    assert not attention_module.packs_heads(problem_of(8, 17, 16384, 32, 4, 128))


def test_decoding_launches_the_packed_kernel(monkeypatch):
    # Even where the sm_90a kernel would take the call (one split, no window), decoding packs the heads.
    built = []
    kernel_for = attention_module.kernel_for
    monkeypatch.setattr(attention_module, "kernel_for", lambda *key: built.append(key) or kernel_for(*key))
    monkeypatch.setattr(attention_module.attention_sm90, "supported", lambda *arrays: True)
    q, k, v = operands(1, 5, 100, 8, 1, 64, "f16")
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=True, num_splits=1, return_lse=True)
    assert built == [(64, True, False, False, True)]
    expected, expected_lse = reference(q, k, v, True)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE["f16"])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


def grouped_reference(q, k, v, causal):
    """reference's output and log-sum-exp in float32 without repeating K and V per query head (a
    long cache): each key/value head's group of query heads as rows of one product."""
    (batch, lq, hq, d), (_, lk, hk, _) = q.shape, k.shape
    group = hq // hk
    rows = q.astype(np.float32).reshape(batch, lq, hk, group, d).transpose(0, 2, 1, 3, 4).reshape(
        batch, hk, lq * group, d)
    scores = rows @ k.astype(np.float32).transpose(0, 2, 3, 1) / np.float32(math.sqrt(d))
    scores = np.where(visible(lq, lk, causal)[np.arange(lq * group) // group], scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - top)
    total = weights.sum(-1, keepdims=True)
    out = (weights / total) @ v.astype(np.float32).transpose(0, 2, 1, 3)
    out = out.reshape(batch, hk, lq, group, d).transpose(0, 2, 1, 3, 4).reshape(batch, lq, hq, d)
    lse = (top + np.log(total))[..., 0].reshape(batch, hk, lq, group).transpose(0, 1, 3, 2)
    return out, lse.reshape(batch, hq, lq)


def test_grouped_reference_is_the_reference():
    q, k, v = operands(2, 3, 50, 8, 2, 64, "bf16")
    for causal in (False, True):
        out, lse = grouped_reference(q, k, v, causal)
        expected, expected_lse = reference(q, k, v, causal)
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)
        np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("lq, causal", [(1, False), (4, True)], ids=["1-query", "4-queries-causal"])
def test_packed_decoding_on_the_gpu(lq, causal):
    batch, lk, hq, hk, d = 4, 32768, 32, 4, 128
    q, k, v = operands(batch, lq, lk, hq, hk, d, "bf16")
    problem = attention_module.Problem("attention", q, k, v, causal, None, None, None, None, None, None)
    assert attention_module.packs_heads(problem) and attention_module.splits_for(problem) > 1
    with current_backend("cuda"):
        out, lse = mlirgpu.ops.attention(*(mg.to_device(x) for x in (q, k, v)), causal=causal, return_lse=True)
        got, got_lse = out.get().astype(np.float64), lse.get()
    expected, expected_lse = grouped_reference(q, k, v, causal)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE["bf16"])
    np.testing.assert_allclose(got_lse, expected_lse, rtol=1e-4, atol=1e-4)


def test_decoding_splits_the_keys_by_default():
    q, k, v = operands(1, 1, 4096, 8, 1, 128, "f16")
    problem = attention_module.Problem("attention", q, k, v, False, None, None, None, None, None, None)
    assert attention_module.splits_for(problem) > 1
    q, k, v = operands(1, 512, 4096, 8, 1, 128, "f16")
    problem = attention_module.Problem("attention", q, k, v, False, None, None, None, None, None, None)
    assert attention_module.splits_for(problem) == 1


# ==========================================================================
# What a call keeps for the next of its layout and options: the checked plan, and with split keys
# the partial outputs' workspace of its stream; on the CPU backend, in the kernels the cases above
# compiled (d 64, f16, query heads packed)

@pytest.fixture
def fresh():
    """No plan or workspace kept from other tests."""
    attention_module._PLANS.clear()
    attention_module._WORKSPACES._kept.cache_clear()
    yield
    attention_module._PLANS.clear()
    attention_module._WORKSPACES._kept.cache_clear()


def decode(q, k, v, **options):
    with current_backend("cpu"):
        return mlirgpu.ops.attention(q, k, v, return_lse=True, **options)


def assert_right(q, k, v, result, **options):
    out, lse = result
    expected, expected_lse = reference(q, k, v, **options)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE["f16"])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


@pytest.fixture
def checked(monkeypatch):
    """The arguments of each Problem attention makes: one a call that finds no plan kept."""
    made = []

    class Problem(attention_module.Problem):
        def __init__(self, *args):
            made.append(args)
            super().__init__(*args)

    monkeypatch.setattr(attention_module, "Problem", Problem)
    return made


def test_decoding_calls_in_a_row_each_give_their_own_result(fresh, checked):
    # The second call checks nothing but takes the first's plan and workspace, with its own arrays.
    first, second = (operands(2, 1, 700, 8, 1, 64, "f16", seed=seed) for seed in (1, 2))
    results = [decode(*first, num_splits=3), decode(*second, num_splits=3)]
    assert len(checked) == 1
    info = attention_module._WORKSPACES._kept.cache_info()
    assert (info.currsize, info.hits) == (1, 1)
    for arrays, result in zip((first, second), results):
        assert_right(*arrays, result)


def test_decoding_of_other_shapes_takes_other_workspaces(fresh):
    # The merge reads the splits off its partial outputs' shape: one of another call's would mix them up.
    q, k, v = operands(2, 1, 700, 8, 1, 64, "f16")
    single = operands(1, 1, 700, 8, 1, 64, "f16", seed=3)
    results = [decode(q, k, v, num_splits=5), decode(q, k, v, num_splits=3), decode(*single, num_splits=3),
               decode(q, k, v, num_splits=5)]
    info = attention_module._WORKSPACES._kept.cache_info()
    assert (info.currsize, info.hits) == (3, 1)
    for arrays, result in zip(((q, k, v), (q, k, v), single, (q, k, v)), results):
        assert_right(*arrays, result)


def test_a_bad_out_still_raises_after_a_good_call_of_its_shape(fresh):
    q, k, v = operands(2, 1, 700, 8, 1, 64, "f16")
    assert_right(q, k, v, decode(q, k, v, num_splits=3))
    message = "attention's out is a C-contiguous f16 array of shape \\(2, 1, 8, 64\\)"
    for out in (np.empty(q.shape, np.float32), np.empty((2, 1, 8, 32), np.float16),
                np.empty((2, 1, 8, 128), np.float16)[..., ::2]):
        bad(message, q, k, v, num_splits=3, out=out)
    out = np.full(q.shape, np.nan, np.float16)
    got = decode(q, k, v, num_splits=3, out=out)
    assert got[0] is out
    assert_right(q, k, v, got)


def test_bad_options_and_arrays_still_raise_after_a_good_call(fresh):
    # True == 1 (and hashes alike), yet num_splits and window take ints, not bools; a view of q's shape
    # that is not contiguous.
    q, k, v = operands(2, 1, 700, 8, 1, 64, "f16")
    assert_right(q, k, v, decode(q, k, v, causal=True, num_splits=1), causal=True)
    bad("num_splits is an int from 1 to 65535, not True", q, k, v, causal=True, num_splits=True, error=ValueError)
    bad("attention's q must be C-contiguous", np.zeros((2, 1, 8, 128), np.float16)[..., ::2], k, v, causal=True,
        num_splits=1)
    assert_right(q, k, v, decode(q, k, v, window=(1, 0), num_splits=1), window=(1, 0))
    bad("window is \\(left, right\\)", q, k, v, window=(True, 0), num_splits=1, error=ValueError)


def test_the_oldest_plan_goes(fresh, checked, monkeypatch):
    monkeypatch.setattr(attention_module, "PLANS_KEPT", 2)
    q, k, v = operands(2, 1, 700, 8, 1, 64, "f16")
    for splits in (2, 3, 4, 3, 4, 2):
        assert_right(q, k, v, decode(q, k, v, num_splits=splits))
    # 2, 3 and 4 checked, then 3 and 4 kept: 2, dropped for 4, is checked again.
    assert len(checked) == 4


@pytest.mark.gpu
def test_decoding_calls_in_a_row_on_the_gpu():
    # Launched back to back on one stream, the second's partial outputs in the first's workspace.
    inputs = [operands(4, 1, 8192, 32, 4, 128, "bf16", seed=seed) for seed in (1, 2)]
    with current_backend("cuda"):
        arrays = [[mg.to_device(x) for x in three] for three in inputs]
        results = [mlirgpu.ops.attention(*three, return_lse=True) for three in arrays]
        got = [(out.get().astype(np.float64), lse.get()) for out, lse in results]
    for three, (out, lse) in zip(inputs, got):
        expected, expected_lse = grouped_reference(*three, False)
        np.testing.assert_allclose(out, expected, rtol=0, atol=TOLERANCE["bf16"])
        np.testing.assert_allclose(lse, expected_lse, rtol=1e-4, atol=1e-4)


def test_bad_window():
    bad("window is \\(left, right\\)", *operands(1, 8, 8, 2, 2, 64, "f16"), window=(3,), error=ValueError)
    bad("window is \\(left, right\\)", *operands(1, 8, 8, 2, 2, 64, "f16"), window=(-2, 0), error=ValueError)


def test_bad_varlen():
    q, k, v, cu_q, cu_k = packed([5, 6], [7, 8], 2, 2, 64, "f16")
    bad("takes cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k together", q, k, v, cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k, error=ValueError)
    bad("cu_seqlens_q is a contiguous 1-d int32 array", q, k, v, cu_seqlens_q=cu_q.astype(np.int64), cu_seqlens_k=cu_k,
        max_seqlen_q=6, max_seqlen_k=8)
    bad("attention's q is \\(tokens, heads, head_dim\\), 3-d", q[None], k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=6, max_seqlen_k=8)
    bad("num_splits is 1 with cu_seqlens", q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=6,
        max_seqlen_k=8, num_splits=2, error=ValueError)
