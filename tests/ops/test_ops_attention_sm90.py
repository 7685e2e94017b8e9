"""The Hopper attention kernel (mlirgpu.ops.attention_sm90): on the CPU
backend, which runs its TMA copies, mbarriers and wgmmas, against float64
NumPy at small, odd sizes (tails of both tiles, several key tiles, causal
with Lq < Lk and Lq > Lk, grouped-query heads, the log-sum-exp); its PTX
through ptxas; and on an sm_90a GPU, through mlirgpu.ops.attention, against
the same reference at sizes the CPU would take minutes for.

Compiling one kernel for the CPU takes about a minute: the CPU cases share
two of them (d = 64 f16 causal, d = 128 bf16 without the mask)."""
import math
import re
from unittest import mock

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.ops
from mlirgpu.ops import attention_sm90

from support.backends import current_backend
from support.checks import ptxas_accepts
from support.attention import DTYPES, operands, reference
from test_ops_attention import TOLERANCE


def run_on_the_cpu(batch, lq, lk, hq, hk, d, dtype, causal):
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    out = np.full(q.shape, np.nan, DTYPES[dtype])
    lse = np.full((batch, hq, lq), np.nan, np.float32)
    with current_backend("cpu"):
        attention_sm90.forward(q, k, v, out, lse, causal, math.log2(math.e) / math.sqrt(d))
    return (q, k, v), out, lse


# (batch, Lq, Lk, Hq, Hk): 3 key tiles and 3 row blocks, 2:1 heads; Lq > Lk (the first rows see no key, 4:2 heads;
# then the first two row blocks, whose work units come before and after one that reads keys).
CAUSAL_CASES = [(1, 260, 300, 2, 1), (1, 130, 77, 4, 2), (1, 300, 40, 2, 1)]
# Tails of one row block and of 3 key tiles; one query against 130 keys, all:1 heads.
FULL_CASES = [(2, 17, 300, 2, 2), (1, 1, 130, 4, 1)]
CASES = [(shape, 64, "f16", True) for shape in CAUSAL_CASES] + [(shape, 128, "bf16", False) for shape in FULL_CASES]
# d = 256: 64 keys a stage (2 key tiles and a tail, the diagonal inside the second), 2 stages.
CASES += [((1, 150, 150, 2, 1), 256, "bf16", True), ((1, 17, 100, 2, 2), 256, "f16", False)]


@pytest.mark.parametrize("shape, d, dtype, causal", CASES,
                         ids=[f"{'x'.join(map(str, s))}-d{d}-{t}{'-causal' if c else ''}" for s, d, t, c in CASES])
def test_on_the_cpu(shape, d, dtype, causal):
    (q, k, v), out, lse = run_on_the_cpu(*shape, d, dtype, causal)
    expected, expected_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


def test_shared_memory_fits_a_block():
    # An H100's or H200's block may have 227 KB of shared memory.
    for d in attention_sm90.HEAD_DIMS:
        assert attention_sm90.shared_bytes(d) <= 227 * 1024


def test_the_warpgroups_registers_add_up_to_the_blocks():
    # setmaxnreg moves registers between the warpgroups of a block; the launch gave it 168 a
    # thread (65536 over 384 threads, in steps of 8): more in all and the increase never returns.
    launched = 65536 // attention_sm90.THREADS // 8 * 8
    assert attention_sm90.PRODUCER_REGISTERS + 2 * attention_sm90.CONSUMER_REGISTERS == 3 * launched


def test_only_hopper_takes_it():
    q = np.zeros((1, 8, 1, 64), np.float16)
    with current_backend("cpu"):
        assert not attention_sm90.supported(q, q, q, 64)


def test_ptx(tmp_path):
    d, bn = 128, attention_sm90.key_tile(128)
    ptx = attention_sm90.kernel_for(d, True)[mg.bf16].ptx(chip="sm_90a")
    # S = Q K^T (D/16 wgmmas) and O += P V (BN/16), each in the pipeline's prologue or epilogue and its loop.
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 2 * (d // 16 + bn // 16)
    assert "cp.async.bulk.tensor.4d" in ptx
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    log = ptxas_accepts(ptx, "sm_90a", tmp_path, verbose=True)
    assert "0 bytes spill stores, 0 bytes spill loads" in log
    assert "warning" not in log


@pytest.mark.parametrize("d", [64, 256])
def test_at_d_256_a_shared_store_keeps_the_softmax_before_the_wait_for_o(d):
    # ptxas keeps shared-memory accesses on their side of a wgmma wait, not arithmetic: a value
    # of each softmax in the key loop is stored to shared memory (orders_softmax) at d = 256
    # only, where the kernel stores nothing else there.
    ptx = attention_sm90.kernel_for(d, False)[mg.bf16].ptx(chip="sm_90a")
    assert ptx.count("st.shared.b16") == (1 if attention_sm90.orders_softmax(d) else 0)
    assert attention_sm90.orders_softmax(d) == (d == 256)


# On an sm_90a GPU: odd shapes through mlirgpu.ops.attention, which picks this kernel there (one
# query with grouped-query heads is decoding, which packs the heads into the mma.sync kernel).
GPU_CASES = [(1, 1000, 1000, 8, 2, 128, True), (2, 77, 300, 4, 4, 64, True), (1, 300, 77, 4, 1, 128, True),
             (2, 129, 129, 2, 2, 64, False), (1, 1, 513, 8, 8, 128, False), (1, 1000, 1000, 4, 2, 256, True),
             (2, 129, 300, 2, 2, 256, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("batch, lq, lk, hq, hk, d, causal", GPU_CASES,
                         ids=[f"{b}x{lq}x{lk}x{hq}x{hk}-d{d}{'-causal' if c else ''}"
                              for b, lq, lk, hq, hk, d, c in GPU_CASES])
def test_on_the_gpu(batch, lq, lk, hq, hk, d, causal, dtype):
    q, k, v = operands(batch, lq, lk, hq, hk, d, dtype)
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("the Hopper kernel runs on sm_90a GPUs")
        arrays = [mg.to_device(x) for x in (q, k, v)]
        assert attention_sm90.supported(*arrays, d)
        with mock.patch.object(attention_sm90, "forward", wraps=attention_sm90.forward) as forward:
            # One split: a decoding shape would otherwise share its keys among blocks of the other kernel.
            out, lse = mlirgpu.ops.attention(*arrays, causal=causal, return_lse=True, num_splits=1)
        assert forward.call_count == 1
        got, got_lse = out.get().astype(np.float64), lse.get()
    expected, expected_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(got_lse, expected_lse, rtol=1e-4, atol=1e-4)


# A few persistent blocks for many work units: each block's ring, Q tile and warpgroups' turns run on
# across row blocks (causal: pairs of them, the rows past Lk reading no key).
PERSISTENT_CASES = [(2, 1000, 1000, 8, 2, 128, True, 3), (3, 520, 700, 4, 4, 64, False, 5),
                    (1, 900, 200, 6, 3, 64, True, 4), (2, 700, 700, 4, 2, 256, True, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("batch, lq, lk, hq, hk, d, causal, blocks", PERSISTENT_CASES,
                         ids=[f"{b}x{lq}x{lk}x{hq}x{hk}-d{d}{'-causal' if c else ''}-{n}blocks"
                              for b, lq, lk, hq, hk, d, c, n in PERSISTENT_CASES])
def test_few_blocks_take_many_units_on_the_gpu(batch, lq, lk, hq, hk, d, causal, blocks):
    q, k, v = operands(batch, lq, lk, hq, hk, d, "bf16")
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("the Hopper kernel runs on sm_90a GPUs")
        assert attention_sm90.units(lq, batch * hq, causal) >= 4 * blocks
        arrays = [mg.to_device(x) for x in (q, k, v)]
        out = mg.to_device(np.full(q.shape, np.nan, q.dtype))
        lse = mg.to_device(np.full((batch, hq, lq), np.nan, np.float32))
        attention_sm90.forward(*arrays, out, lse, causal, math.log2(math.e) / math.sqrt(d), blocks=blocks)
        got, got_lse = out.get().astype(np.float64), lse.get()
    expected, expected_lse = reference(q, k, v, causal)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE["bf16"])
    np.testing.assert_allclose(got_lse, expected_lse, rtol=1e-4, atol=1e-4)


def test_no_query_rows_launch_nothing():
    q = np.zeros((1, 0, 2, 64), np.float16)
    k = np.zeros((1, 5, 2, 64), np.float16)
    out, lse = np.zeros(q.shape, np.float16), np.zeros((1, 2, 0), np.float32)
    with current_backend("cpu"), mock.patch.object(attention_sm90, "kernel_for") as kernel_for:
        attention_sm90.forward(q, k, k, out, lse, False, 1.0)
    kernel_for.assert_not_called()
