"""float64 NumPy references for mlirgpu.ops.attention and its backward, in
its layout: q (B, Lq, Hq, d), k and v (B, Lk, Hk, d)."""
import math

import numpy as np
import ml_dtypes

DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def operands(batch, lq, lk, hq, hk, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(DTYPES[dtype])
            for shape in ((batch, lq, hq, d), (batch, lk, hk, d), (batch, lk, hk, d))]


def visible(lq, lk, causal=False, window=None):
    """(Lq, Lk) booleans: which keys each query sees (the band aligned at the bottom right)."""
    diff = np.arange(lk)[None] - np.arange(lq)[:, None] - (lk - lq)
    left, right = (None, None) if window is None else (None if w is None or w < 0 else w for w in window)
    if causal:
        right = 0 if right is None else min(right, 0)
    keep = np.ones((lq, lk), bool)
    if left is not None:
        keep &= diff >= -left
    if right is not None:
        keep &= diff <= right
    return keep


def probabilities(q, k, causal=False, scale=None, window=None):
    """softmax(scale q k^T + mask) (B, Hq, Lq, Lk) in float64 (rows that see no key: 0) and the log-sum-exp."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    (_, lq, hq, d), (_, lk, hk, _) = q.shape, k.shape
    scores = np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, hq // hk, axis=2))
    scores *= 1 / math.sqrt(d) if scale is None else scale
    scores = np.where(visible(lq, lk, causal, window), scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    seen = np.isfinite(top)
    weights = np.exp(scores - np.where(seen, top, 0))
    total = weights.sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, top + np.log(total), -np.inf)[..., 0]
    return np.where(seen, weights / np.where(seen, total, 1), 0), lse


def reference(q, k, v, causal=False, scale=None, window=None):
    """Output and log-sum-exp in float64; a row that sees no key: 0 and -inf."""
    p, lse = probabilities(q, k, causal, scale, window)
    hq, hk = q.shape[2], k.shape[2]
    return np.einsum("bhqk,bkhd->bqhd", p, np.repeat(np.asarray(v, np.float64), hq // hk, axis=2)), lse


def gradients(q, k, v, dout, causal=False, scale=None, window=None):
    """(dq, dk, dv) in float64; key/value heads sum over the query heads that read them."""
    p, _ = probabilities(q, k, causal, scale, window)
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    (batch, _, hq, d), (_, lk, hk, _) = q.shape, k.shape
    group = hq // hk
    scale = 1 / math.sqrt(d) if scale is None else scale
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, np.repeat(v, group, axis=2))
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bkhd->bqhd", ds, np.repeat(k, group, axis=2)) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    return dq, dk.reshape(batch, lk, hk, group, d).sum(3), dv.reshape(batch, lk, hk, group, d).sum(3)


def packed(lengths_q, lengths_k, hq, hk, d, dtype, seed=0):
    """Sequences of the given lengths one after the other, varlen's layout:
    q (total_q, Hq, d), k and v (total_k, Hk, d), and the int32 offsets of each."""
    q, k, v = operands(1, sum(lengths_q), sum(lengths_k), hq, hk, d, dtype, seed)
    offsets = [np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32) for lengths in (lengths_q, lengths_k)]
    return q[0], k[0], v[0], offsets[0], offsets[1]


def sequences(cu_q, cu_k):
    """(slice of q's tokens, slice of k's tokens) of each packed sequence."""
    return [(slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])) for b in range(len(cu_q) - 1)]
