"""The Hopper attention backward kernel (mlirgpu.ops.attention_backward_sm90):
on the CPU backend, which runs its TMA copies, mbarriers, named barriers and
wgmmas, against float64 NumPy at small, odd sizes (tails of the key block
and of the query tiles, several of each, causal with Lq < Lk and Lq > Lk, a
sliding window, grouped-query heads, d = 64 and 128, f16 and bf16), through
mlirgpu.ops.attention_backward as it picks the kernel; its PTX through
ptxas; and on an sm_90a GPU, through mlirgpu.ops.attention_backward, at
sizes the CPU would take minutes for."""
import re
from unittest import mock

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops
from mlirgpu.ops import attention_backward_sm90
from mlirgpu.ops.attention import Problem

from support.backends import current_backend
from support.checks import ptxas_accepts

pytest.importorskip("ml_dtypes")
from support.attention import DTYPES, gradients, operands, reference  # noqa: E402
from test_ops_attention_backward import TOLERANCE, check_gradients  # noqa: E402


def inputs(batch, lq, lk, hq, hk, d, dtype):
    """q, k and v, and dO (seeded apart)."""
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    dout = operands(batch, lq, lk, hq, hk, d, dtype, seed=1)[0]
    return q, k, v, dout


def run_on_the_cpu(shape, d, dtype, causal, window=None):
    q, k, v, dout = inputs(*shape, d, dtype)
    # The forward's lse and delta = rowsum(dO * O), (B, Hq, Lq), from float64 NumPy.
    out, lse = reference(q, k, v, causal, None, window)
    delta = np.ascontiguousarray((np.asarray(dout, np.float64) * out).sum(-1).transpose(0, 2, 1), np.float32)
    dq = np.zeros(q.shape, np.float32)
    dk, dv = (np.full(k.shape, np.nan, DTYPES[dtype]) for _ in range(2))
    with current_backend("cpu"):
        p = Problem("attention_backward", q, k, v, causal, None, window, None, None, None, None)
        attention_backward_sm90.backward(q, k, v, dout, lse.astype(np.float32), delta, dq, dk, dv, p.scale, p.left,
                                         p.right, p.banded)
    expected = gradients(q, k, v, dout, causal, None, window)
    # dq is the float32 sum, not yet rounded to the inputs' type.
    for name, got, e in zip(("dq", "dk", "dv"), (dq, dk, dv), expected):
        error = np.abs(got.astype(np.float64) - e).max()
        assert error <= TOLERANCE[dtype] * max(1.0, np.abs(e).max()), f"{name}: max |error| {error}"


# (batch, Lq, Lk, Hq, Hk): the kernels are shared, d = 64 f16 banded and d = 128 bf16 without the mask.
# Causal: 2:1 heads and Lq < Lk (key tails of both consumers: 130 keys are a full block and 2 keys);
# Lq > Lk (the first queries see no key) with 4 query tiles and a tail, 4:2 heads.
CAUSAL_CASES = [(1, 70, 130, 2, 1), (1, 200, 77, 4, 2)]
# Three key blocks (the last's second consumer has no key) and a tail of one query tile;
# several query tiles, one key block's tail, 2:1 heads; one query.
FULL_CASES = [(2, 33, 300, 2, 2), (1, 130, 45, 2, 1), (1, 1, 70, 2, 1)]
CASES = ([(shape, 64, "f16", True, None) for shape in CAUSAL_CASES]
         + [((1, 150, 260, 2, 1), 64, "f16", True, (40, 0))]
         + [(shape, 128, "bf16", False, None) for shape in FULL_CASES]
         + [((2, 67, 140, 4, 2), 128, "f16", True, None), ((1, 100, 90, 2, 2), 64, "bf16", False, None)])


@pytest.mark.parametrize("shape, d, dtype, causal, window", CASES,
                         ids=[f"{'x'.join(map(str, s))}-d{d}-{t}{'-causal' if c else ''}{'-window' if w else ''}"
                              for s, d, t, c, w in CASES])
def test_on_the_cpu(shape, d, dtype, causal, window):
    run_on_the_cpu(shape, d, dtype, causal, window)


def test_attention_backward_takes_it_where_supported():
    # On the CPU backend, as if it were an sm_90a GPU: delta from the rows kernel, dq rounded by the convert one.
    q, k, v, dout = inputs(1, 40, 90, 2, 1, 64, "f16")
    with current_backend("cpu"):
        out, lse = mlirgpu.ops.attention(q, k, v, causal=True, return_lse=True)
        with mock.patch.object(attention_backward_sm90, "supported", return_value=True), \
                mock.patch.object(attention_backward_sm90, "backward", wraps=attention_backward_sm90.backward) as run:
            got = mlirgpu.ops.attention_backward(dout, q, k, v, out, lse, causal=True)
    assert run.call_count == 1
    check_gradients(got, gradients(q, k, v, dout, causal=True), "f16")


def test_shared_memory_fits_a_block():
    # An H100's or H200's block may have 227 KB of shared memory.
    for d in attention_backward_sm90.HEAD_DIMS:
        assert attention_backward_sm90.shared_bytes(d) <= 227 * 1024


def test_the_warpgroups_registers_add_up_to_the_blocks():
    launched = 65536 // attention_backward_sm90.THREADS // 8 * 8
    assert attention_backward_sm90.PRODUCER_REGISTERS + 2 * attention_backward_sm90.CONSUMER_REGISTERS == 3 * launched


def test_only_hopper_takes_it():
    q = np.zeros((1, 8, 1, 64), np.float16)
    with current_backend("cpu"):
        assert not attention_backward_sm90.supported((q, q, q, q), 64)


@pytest.mark.parametrize("d", attention_backward_sm90.HEAD_DIMS)
def test_ptx(d, tmp_path):
    ptx = attention_backward_sm90.kernel_for(d, True)[mg.bf16].ptx(chip="sm_90a")
    # S^T and dP^T (N = 64 queries, d/16 wgmmas each), dV and dK (N = d, 64/16 each, A in registers),
    # dQ (N = d/2, 128/16).
    counts = {}
    for n, count in ((64, 2 * (d // 16)), (d, 2 * 4), (d // 2, 8)):
        counts[n] = counts.get(n, 0) + count
    for n, count in counts.items():
        assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16") == count, n
    assert "cp.async.bulk.tensor.4d" in ptx
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    # dQ's boxes added by the copy engine, no atomic an element.
    assert "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group" in ptx
    assert "red.global.add.f32" not in ptx and "atom.global.add.f32" not in ptx
    log = ptxas_accepts(ptx, "sm_90a", tmp_path, verbose=True)
    assert "0 bytes spill stores, 0 bytes spill loads" in log
    assert "warning" not in log
    assert "C75" not in log    # e.g. C7512: wgmmas serialized for want of registers


# On an sm_90a GPU, through mlirgpu.ops.attention_backward (the forward's lse and output from
# mlirgpu.ops.attention): (batch, Lq, Lk, Hq, Hk, d, causal, window).
GPU_CASES = [(2, 1000, 1000, 4, 2, 128, True, None), (2, 1024, 1024, 4, 4, 64, False, None),
             (1, 2048, 2048, 8, 2, 128, True, None), (2, 700, 1300, 4, 2, 64, True, None),
             (1, 1300, 700, 4, 1, 128, True, None), (1, 1000, 1000, 4, 2, 64, True, (100, 0)),
             (2, 77, 300, 2, 2, 128, False, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("batch, lq, lk, hq, hk, d, causal, window", GPU_CASES,
                         ids=[f"{b}x{lq}x{lk}x{hq}x{hk}-d{d}{'-causal' if c else ''}{'-window' if w else ''}"
                              for b, lq, lk, hq, hk, d, c, w in GPU_CASES])
def test_on_the_gpu(batch, lq, lk, hq, hk, d, causal, window, dtype):
    q, k, v, dout = inputs(batch, lq, lk, hq, hk, d, dtype)
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("the Hopper kernel runs on sm_90a GPUs")
        arrays = [mg.to_device(x) for x in (q, k, v, dout)]
        assert attention_backward_sm90.supported(arrays, d)
        out, lse = mlirgpu.ops.attention(*arrays[:3], causal=causal, window=window, return_lse=True)
        with mock.patch.object(attention_backward_sm90, "backward", wraps=attention_backward_sm90.backward) as run:
            got = mlirgpu.ops.attention_backward(arrays[3], *arrays[:3], out, lse, causal=causal, window=window)
        assert run.call_count == 1
        got = [g.get() for g in got]
    check_gradients(got, gradients(q, k, v, dout, causal, None, window), dtype)
