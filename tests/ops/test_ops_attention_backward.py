"""mlirgpu.ops.attention_backward: dQ, dK and dV on the CPU backend against
float64 NumPy at small, odd sizes (tails of the query and key tiles, causal
with Lq < Lk and Lq > Lk, grouped-query heads, f16 and bf16, dQ by atomics
and by the deterministic pass), the kernels' PTX through ptxas, bad input,
and on a GPU against torch's SDPA (math backend, float32) at full sizes."""
import sys

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops

from support.backends import current_backend
from support.checks import ptxas_accepts

pytest.importorskip("ml_dtypes")
from support.attention import DTYPES, gradients, operands, packed, sequences  # noqa: E402

# The largest difference from float64, relative to the largest gradient: P and dS are rounded to the inputs' type.
TOLERANCE = {"f16": 4e-3, "bf16": 3e-2}
backward_module = sys.modules["mlirgpu.ops.attention_backward"]


def check_gradients(got, expected, dtype):
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        assert g.dtype == DTYPES[dtype] and g.shape == e.shape, name
        error = np.abs(g.astype(np.float64) - e).max()
        assert error <= TOLERANCE[dtype] * max(1.0, np.abs(e).max()), f"{name}: max |error| {error}"


def run(batch, lq, lk, hq, hk, d, dtype, causal=False, deterministic=False, window=None, scale=None):
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    dout = operands(batch, lq, lk, hq, hk, d, dtype, seed=1)[0]
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, window=window, scale=scale, return_lse=True)
        got = mlirgpu.ops.attention_backward(dout, q, k, v, out, lse, causal=causal, window=window, scale=scale,
                                             deterministic=deterministic)
    check_gradients(got, gradients(q, k, v, dout, causal, scale, window), dtype)
    return got


# (batch, Lq, Lk, Hq, Hk, causal): tails, GQA 2:1 and 4:1 (MQA), Lq < Lk and Lq > Lk under the causal mask.
CASES = [(2, 37, 77, 2, 2, False), (1, 70, 130, 4, 1, True), (1, 130, 45, 4, 2, True), (1, 1, 70, 2, 1, False)]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:5])) + ("-causal" if c[5] else "") for c in CASES])
def test_backward_on_the_cpu(case, deterministic):
    *shape, causal = case
    run(*shape, 64, "f16", causal=causal, deterministic=deterministic)


def test_backward_bf16_d128_and_scale():
    run(1, 50, 66, 2, 1, 128, "bf16", causal=True, scale=0.2)


def test_deterministic_gives_the_same_dq_as_atomics():
    atomic = run(1, 40, 90, 2, 2, 64, "f16")
    deterministic = run(1, 40, 90, 2, 2, 64, "f16", deterministic=True)
    for a, b in zip(atomic, deterministic):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=0, atol=2e-3)


def test_given_gradient_arrays_are_filled():
    q, k, v = operands(1, 20, 20, 2, 2, 64, "f16")
    dq, dk, dv = (np.full(x.shape, np.nan, np.float16) for x in (q, k, v))
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, return_lse=True)
        got = mlirgpu.ops.attention_backward(q, q, k, v, out, lse, dq=dq, dk=dk, dv=dv)
    assert got[0] is dq and got[1] is dk and got[2] is dv
    check_gradients(got, gradients(q, k, v, q), "f16")


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_backward_with_a_sliding_window(deterministic):
    run(1, 90, 100, 2, 1, 64, "f16", causal=True, window=(20, 0), deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_backward_of_packed_sequences(deterministic):
    lengths_q, lengths_k = [37, 1, 90], [50, 70, 65]
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, 4, 2, 64, "f16")
    dout = packed(lengths_q, lengths_k, 4, 2, 64, "f16", seed=1)[0]
    lengths = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=True, return_lse=True, **lengths)
        dq, dk, dv = mlirgpu.ops.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=deterministic,
                                                    **lengths)
    for rows, keys in sequences(cu_q, cu_k):
        expected = gradients(q[None, rows], k[None, keys], v[None, keys], dout[None, rows], causal=True)
        check_gradients((dq[None, rows], dk[None, keys], dv[None, keys]), expected, "f16")


# ==========================================================================
# PTX of each kernel for Ampere and Hopper, without a GPU

@pytest.mark.parametrize("name, key, chip", [("kv", (64, True, False, True), "sm_80"),
                                             ("q", (128, False, False), "sm_90a")], ids=["kv-atomic", "q"])
def test_ptx(name, key, chip, tmp_path):
    ptx = backward_module.kernel_for(name, *key)[mg.bf16].ptx(chip=chip)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert ("red.global.add.f32" in ptx or "atom.global.add.f32" in ptx) == (name == "kv")
    ptxas_accepts(ptx, chip, tmp_path)


# ==========================================================================
# Bad input

def test_head_dim_256_is_refused():
    q, k, v = operands(1, 8, 8, 2, 2, 256, "f16")
    with current_backend("cpu"), pytest.raises(mg.LaunchError, match="head_dim is one of 64, 128, not 256"):
        mlirgpu.ops.attention_backward(q, q, k, v, q, np.zeros((1, 2, 8), np.float32))


def test_wrong_lse():
    q, k, v = operands(1, 8, 8, 2, 2, 64, "f16")
    with current_backend("cpu"), pytest.raises(mg.LaunchError, match="lse is a C-contiguous f32 array of shape "
                                                                       "\\(1, 2, 8\\)"):
        mlirgpu.ops.attention_backward(q, q, k, v, q, np.zeros((1, 8, 2), np.float32))


def test_wrong_dout():
    q, k, v = operands(1, 8, 8, 2, 2, 64, "f16")
    with current_backend("cpu"), pytest.raises(mg.LaunchError, match="dout is a C-contiguous f16 array"):
        mlirgpu.ops.attention_backward(q[:, :4], q, k, v, q, np.zeros((1, 2, 8), np.float32))


# ==========================================================================
# On a GPU, against torch's SDPA backward (math backend, float32)

GPU_CASES = [(2, 16, 1024, 64, False), (2, 16, 1000, 128, True), (1, 8, 2048, 128, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("batch, heads, length, d, causal", GPU_CASES,
                         ids=[f"{b}x{h}x{n}-d{d}{'-causal' if c else ''}" for b, h, n, d, c in GPU_CASES])
def test_backward_on_the_gpu(batch, heads, length, d, causal, deterministic):
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.from_numpy(x.astype(np.float32)).cuda()
               for x in operands(batch, length, length, heads, heads // 4, d, "bf16"))
    dout = torch.randn(q.shape, device="cuda").bfloat16().float()
    with current_backend("cuda"):
        out, lse = mlirgpu.ops.attention(*(x.bfloat16() for x in (q, k, v)), causal=causal, return_lse=True)
        got = mlirgpu.ops.attention_backward(dout.bfloat16(), *(x.bfloat16() for x in (q, k, v)), out, lse,
                                             causal=causal, deterministic=deterministic)
        torch.cuda.synchronize()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        expected = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in leaves), is_causal=causal, enable_gqa=True).transpose(1, 2)
    expected.backward(dout)
    for name, g, leaf in zip(("dq", "dk", "dv"), got, leaves):
        error = (g.float() - leaf.grad).abs().max().item()
        assert error <= TOLERANCE["bf16"] * max(1.0, leaf.grad.abs().max().item()), f"{name}: {error}"
