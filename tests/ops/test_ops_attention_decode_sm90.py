"""The Hopper decoding kernel (mlirgpu.ops.attention_decode_sm90): on the CPU
backend, which runs its TMA copies, mbarriers and wgmmas, against float64
NumPy at small, odd sizes (1, 3 and 16 queries; groups of 8, 7, 6, 4 and 1
query heads; tails of the key tiles; rings that wrap; causal, with rows
that see no key; one split and several, merged by attention's combine
kernel); mlirgpu.ops.attention's choice of it; its PTX through ptxas; and
on an sm_90a GPU, through mlirgpu.ops.attention, at decoding's sizes.

The CPU cases share five kernels: (d, causal, split, dtype) = (64, causal,
split, f16), (128, -, split, bf16), (128, causal, -, bf16), (64, -, -, f16)
and (256, causal, -, bf16)."""
import functools
import math
import sys
from unittest import mock

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops
from mlirgpu.ops import attention_decode_sm90 as decode

from support.backends import current_backend
from support.checks import assert_each_close, on_two_streams, ptxas_accepts
from support.attention import DTYPES, operands, reference
from test_ops_attention import TOLERANCE, grouped_reference

attention_module = sys.modules["mlirgpu.ops.attention"]


def run_on_the_cpu(batch, lq, lk, hq, hk, d, dtype, causal, splits):
    """decode.forward's output and log-sum-exp; with several splits, its partial
    results merged by attention's combine kernel."""
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    out = np.full(q.shape, np.nan, DTYPES[dtype])
    lse = np.full((batch, hq, lq), np.nan, np.float32)
    scale_log2 = math.log2(math.e) / math.sqrt(d)
    with current_backend("cpu"):
        if splits == 1:
            decode.forward(q, k, v, out, lse, causal, scale_log2)
        else:
            parts = np.full((splits * batch, lq, hq, d), np.nan, np.float32)
            part_lse = np.full((splits * batch, hq, lq), np.nan, np.float32)
            decode.forward(q, k, v, parts, part_lse, causal, scale_log2, splits)
            rows = batch * lq * hq
            attention_module.combine_kernel_for(d)(
                parts.reshape(splits * batch * lq, hq, d), part_lse.reshape(splits * batch * hq, lq),
                out.reshape(batch * lq, hq, d), lse.reshape(batch * hq, lq),
                grid=(-(-rows // attention_module.WARPS),), block=attention_module.THREADS)
    return (q, k, v), out, lse


# (batch, Lq, Lk, Hq, Hk, d, dtype, causal, splits). d = 64 has 128 keys a tile, the others 64; the
# ring has 6 stages (3 at d = 256).
CASES = [
    # 14 key tiles in 2 splits: each split's ring wraps; 16 queries of a group of 8: two row blocks;
    # 3 tiles in 3 splits; Lq > Lk: the first rows see no key, and the second split no key at all.
    (1, 3, 1700, 8, 2, 64, "f16", True, 2), (1, 16, 200, 8, 1, 64, "f16", True, 2),
    (2, 1, 333, 8, 1, 64, "f16", True, 3), (1, 5, 3, 2, 1, 64, "f16", True, 2),
    # A group of 6 (rows past the box's 60 zeroed); one query head a group; 16 tiles in 3 splits.
    (2, 3, 777, 12, 2, 128, "bf16", False, 4), (1, 3, 500, 3, 3, 128, "bf16", False, 5),
    (1, 1, 1000, 8, 1, 128, "bf16", False, 3),
    # One split: 16 tiles (the ring wraps twice), two row blocks, a group of 7.
    (1, 3, 1000, 8, 2, 128, "bf16", True, 1), (1, 16, 300, 16, 2, 128, "bf16", True, 1),
    (2, 1, 129, 7, 1, 128, "bf16", True, 1),
    # A group of 64: one query a row block; no grouping.
    (1, 2, 700, 64, 1, 64, "f16", False, 1), (2, 2, 130, 6, 6, 64, "f16", False, 1),
    # d = 256: 3 stages, 5 tiles.
    (1, 3, 300, 8, 2, 256, "bf16", True, 1),
]


@pytest.mark.parametrize("batch, lq, lk, hq, hk, d, dtype, causal, splits", CASES,
                         ids=[f"{b}x{lq}x{lk}x{hq}x{hk}-d{d}-{t}{'-causal' if c else ''}-{s}splits"
                              for b, lq, lk, hq, hk, d, t, c, s in CASES])
def test_on_the_cpu(batch, lq, lk, hq, hk, d, dtype, causal, splits):
    (q, k, v), out, lse = run_on_the_cpu(batch, lq, lk, hq, hk, d, dtype, causal, splits)
    expected, expected_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


@pytest.fixture
def hopper(monkeypatch):
    """The CPU backend, on which attention plans and launches as on an sm_90a GPU of 132
    multiprocessors: the decoding kernel for the cases it takes."""
    monkeypatch.setattr(decode, "available", lambda: True)
    monkeypatch.setattr(decode, "aligned", lambda q, k, v: True)
    monkeypatch.setattr(decode, "splits_for", functools.partial(decode.splits_for, multiprocessors=132))
    attention_module._PLANS.clear()
    with current_backend("cpu"):
        yield
    attention_module._PLANS.clear()


@pytest.mark.parametrize("lq, lk, causal, splits", [(3, 1700, True, 2), (3, 1000, True, 1)],
                         ids=["split", "one-split"])
def test_attention_launches_it(hopper, lq, lk, causal, splits):
    # Through the plan: the kernel into the split workspace and the combine, or into the output.
    d, dtype = (64, "f16") if splits > 1 else (128, "bf16")
    q, k, v = operands(1, lq, lk, 8, 2, d, dtype)
    with mock.patch.object(decode, "forward", wraps=decode.forward) as forward:
        out, lse = mlirgpu.ops.attention(q, k, v, causal=causal, num_splits=splits, return_lse=True)
    assert forward.call_count == 1
    expected, expected_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


def test_arrays_it_cannot_read_take_the_other_kernel(hopper, monkeypatch):
    # Arrays TMA cannot address (not 16-byte aligned): the mma.sync kernel, with the plan's splits.
    monkeypatch.setattr(decode, "aligned", lambda q, k, v: False)
    q, k, v = operands(1, 3, 1700, 8, 2, 64, "f16")
    with mock.patch.object(decode, "forward") as forward:
        out, lse = mlirgpu.ops.attention(q, k, v, causal=True, return_lse=True)
    forward.assert_not_called()
    expected, expected_lse = reference(q, k, v, True)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE["f16"])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


def plan_of(batch, lq, lk, hq, hk, d, window=None, num_splits=None):
    q = np.zeros((batch, lq, hq, d), DTYPES["bf16"])
    k = np.zeros((batch, lk, hk, d), DTYPES["bf16"])
    problem = attention_module.Problem("attention", q, k, k, False, None, window, None, None, None, None)
    return attention_module.Plan(problem, window, num_splits)


def test_decoding_on_hopper_takes_it(hopper):
    # The benchmark's decoding rows (64 query heads on 8): about a block a multiprocessor.
    plan = plan_of(1, 1, 131072, 64, 8, 128)
    assert plan.decode and plan.splits == 16 and not plan.sm90
    assert plan_of(8, 1, 8192, 64, 8, 128).splits == 2
    assert plan_of(64, 1, 8192, 64, 8, 128).splits == 1
    assert plan_of(8, 1, 8192, 64, 8, 128, num_splits=5).splits == 5
    # Without grouping: where the keys are split; one split of unpacked rows is attention_sm90's.
    assert plan_of(1, 4, 8192, 8, 8, 64).decode
    assert not plan_of(1, 1, 513, 8, 8, 128, num_splits=1).decode
    # Not: a sliding window, more queries than decoding's, a group past a block's rows.
    assert not plan_of(1, 1, 8192, 64, 8, 128, window=(100, 0)).decode
    assert not plan_of(1, 17, 8192, 64, 8, 128).decode
    assert not plan_of(1, 1, 8192, 128, 1, 128).decode


def test_splits_fill_the_multiprocessors():
    for batch, lk, hq, hk in [(1, 131072, 64, 8), (8, 8192, 64, 8), (3, 50000, 32, 4), (64, 32768, 64, 8)]:
        splits = decode.splits_for(batch, 1, lk, hq, hk, 128, 132)
        blocks = batch * hk * splits
        # A block a multiprocessor, in waves that leave few of them idle.
        assert blocks >= 0.9 * 132 * -(-blocks // 132)


def test_only_hopper_takes_it():
    q = np.zeros((1, 1, 8, 64), np.float16)
    with current_backend("cpu"):
        assert not decode.available() and not decode.supported(q, q, q)


def test_shared_memory_fits_a_block():
    # An H100's or H200's block may have 227 KB of shared memory, the mbarriers' included.
    for d in decode.HEAD_DIMS:
        assert decode.shared_bytes(d) + 8 * (1 + 3 * decode.stages(d)) <= 227 * 1024


@pytest.mark.parametrize("d", decode.HEAD_DIMS)
def test_ptx(d, tmp_path):
    bn = decode.key_tile(d)
    ptx = decode.kernel_for(d, True, True, mg.bf16)[()].ptx(chip="sm_90a")
    # S = Q K^T (D/16 wgmmas) and O += P V (BN/16), each in the pipeline's prologue or epilogue and its loop.
    assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16") == 2 * (d // 16)
    assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{d}k16.f32.bf16.bf16") == 2 * (bn // 16)
    assert "cp.async.bulk.tensor.4d" in ptx
    log = ptxas_accepts(ptx, "sm_90a", tmp_path, verbose=True)
    assert "0 bytes spill stores, 0 bytes spill loads" in log
    assert "warning" not in log


def test_no_query_rows_launch_nothing():
    q = np.zeros((1, 0, 8, 64), np.float16)
    k = np.zeros((1, 5, 2, 64), np.float16)
    out, lse = np.zeros(q.shape, np.float16), np.zeros((1, 8, 0), np.float32)
    with current_backend("cpu"), mock.patch.object(decode, "kernel_for") as kernel_for:
        decode.forward(q, k, k, out, lse, False, 1.0)
    kernel_for.assert_not_called()


# On an sm_90a GPU, through mlirgpu.ops.attention at decoding's sizes: 64 query heads on 8, d = 128,
# caches with a tail of the key tiles; by default the keys split to fill the GPU, and one split.
GPU_CASES = [(1, 1, 32771, False, None), (8, 1, 8195, False, None), (8, 4, 8195, True, None),
             (1, 16, 16387, True, None), (8, 1, 8195, False, 1), (2, 3, 20000, True, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("batch, lq, lk, causal, splits", GPU_CASES,
                         ids=[f"{b}x{lq}x{lk}{'-causal' if c else ''}-{s or 'default'}-splits"
                              for b, lq, lk, c, s in GPU_CASES])
def test_on_the_gpu(batch, lq, lk, causal, splits, dtype):
    hq, hk, d = 64, 8, 128
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("the Hopper decoding kernel runs on sm_90a GPUs")
        arrays = [mg.to_device(x) for x in (q, k, v)]
        assert decode.supported(*arrays)
        with mock.patch.object(decode, "forward", wraps=decode.forward) as forward:
            out, lse = mlirgpu.ops.attention(*arrays, causal=causal, num_splits=splits, return_lse=True)
        assert forward.call_count == 1
        got, got_lse = out.get().astype(np.float64), lse.get()
    expected, expected_lse = grouped_reference(q, k, v, causal)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(got_lse, expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("lk", [8195, 1000])
def test_calls_after_the_first_launch_from_c_on_torchs_stream(lk):
    # attention(q, k, v) on torch tensors, after a first call of that signature, launches its
    # kernels from C (a kept launch plan): on torch's current stream, with caches that move.
    torch = pytest.importorskip("torch")
    attention = sys.modules["mlirgpu.ops.attention"]
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("the Hopper decoding kernel runs on sm_90a GPUs")
        q = torch.randn(8, 1, 64, 128, device="cuda", dtype=torch.bfloat16)
        caches = [[torch.randn(8, lk, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
                  for _ in range(3)]
        expected = [torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
            enable_gqa=True).transpose(1, 2) for k, v in caches]
        results = on_two_streams(torch, len(caches), lambda step, i, out: mlirgpu.ops.attention(
            q, *caches[i], out=out), lambda: torch.empty_like(q))
        kept = len(attention._KEPT[False])
    assert kept >= 1
    assert_each_close(results, lambda step, i: expected[i])
