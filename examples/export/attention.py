"""Attention's forward pass (mlirgpu.ops: the FlashAttention-2-style kernel
on mma.sync) at head dimension 64 in float16, ready to export: without a
causal mask or packed sequences, so the C function takes q, k, v as
(B * L, H, 64) and the log-sum-exp as (B * H, Lq).

    O = softmax(scale * Q K^T) V        per batch and head
"""
import importlib

import mlirgpu as mg

forward = importlib.import_module("mlirgpu.ops.attention")   # the module: mlirgpu.ops.attention is the op

HEAD_DIM = 64
attention_forward = forward.kernel_for(HEAD_DIM)[mg.f16]

# Its launch shape, as mlirgpu.ops launches it: a block of 4 warps per 64 query rows of each (batch, head).
LAUNCH = {"attention_forward": {"grid": (f"(lse_extent1 + {forward.BM - 1}) / {forward.BM}", "lse_extent0"),
                                "block": (forward.THREADS,), "shared_mem": forward.shared_bytes(HEAD_DIM)}}
