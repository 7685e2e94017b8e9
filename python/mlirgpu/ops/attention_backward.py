"""Scaled dot-product attention, backward: dQ, dK and dV of
O = softmax(scale * Q K^T + mask) V from dO, O and the forward's log-sum-exp,
FlashAttention-2's way, on mma.sync like the forward.

    P = exp(scale * Q K^T - lse)          recomputed a tile at a time, never stored
    dV = P^T dO        dP = dO V^T        dS = P * (dP - D),  D = rowsum(dO * O)
    dK = scale * dS^T Q                   dQ = scale * dS K

Three kernels:

- `attention_backward_rows` computes D, a warp a (token, head).
- `attention_backward_kv`: a block owns 64 keys of a (batch, key/value head),
  each warp 16 of them, and streams Q and dO tiles of 64 queries of every
  query head that reads that key/value head (grouped-query attention sums
  there), double-buffered through cp.async. It computes S^T = K Q^T, so
  that P^T, dP^T and dS^T come out as C fragments whose rows are the
  warp's keys: as A fragments they give dV += P^T dO and dK += dS^T Q in
  registers. By default it also adds each tile's dQ (dS K, dS through
  shared memory) to a float32 dQ with atomics, converted at the end.
- With `deterministic`, `attention_backward_q` instead computes dQ a query
  block at a time over the key tiles (the forward's loop, with dS for P
  and K for V): no atomics, the same bits every run.

On an sm_90a GPU, dK, dV and dQ (added by the copy engine) come from
attention_backward_sm90's kernel instead (wgmma, TMA, warp specialization),
except for packed sequences and `deterministic`.
"""
import functools

from .. import language as lang
from .._mlirgpu import LaunchError, f16, f32, i32, index
from ..layout import Swizzle, composition, row_major
from ..runtime.kernel import kernel
from . import attention_backward_sm90
from .attention import (BM, CHUNK, LOG2E, THREADS, WARPS, Problem, add_products, as_array, copy_rows, head_and_row,
                        hidden, key_tiles, new_like, next_stage, query_block, query_tiles, rounded, scores, sequence,
                        smaller)

__all__ = ["attention_backward", "HEAD_DIMS"]

HEAD_DIMS = (64, 128)
BN = 64          # keys a dK/dV block owns, and keys a tile in the dQ kernel
DS_STRIDE = BM + CHUNK    # dS rows padded by 16 bytes: ldmatrix's 8 rows fall in different banks


def shared_bytes(head_dim):
    """K and V once, two stages each of Q and dO, and dS (queries x keys)."""
    return ((2 * BN + 4 * BM) * head_dim + BN * DS_STRIDE) * 2


def _build_rows(head_dim, varlen):
    D = head_dim
    T = lang.generics("T")

    @kernel(generics=(T,), max_threads=THREADS)
    def attention_backward_rows(o: lang.memref[None, None, D, T].readonly(),
                                do: lang.memref[None, None, D, T].readonly(),
                                delta: lang.memref[None, None, f32].noalias()):
        """delta[row] = sum(dO * O) over each (token, head), delta shaped as the
        forward's lse: (B x Hq, Lq), or (Hq, tokens) with `varlen`."""
        tokens, hq = o.shape[0], o.shape[1]
        lane = lang.thread_idx.x % 32
        item = lang.block_idx.x * WARPS + lang.thread_idx.x // 32
        if item < tokens * hq:
            token, h = item // hq, item % hq
            total = lang.constant(0.0, f32)
            for j in lang.static_range(D // 32):
                total += lang.cast(o[token, h, j * 32 + lane], f32) * lang.cast(do[token, h, j * 32 + lane], f32)
            total = lang.warp.reduce(total, "add")
            if lane == 0:
                if varlen:
                    delta[h, token] = total
                else:
                    delta[token // delta.shape[1] * hq + h, token % delta.shape[1]] = total

    return attention_backward_rows


def _build_kv(head_dim, banded, varlen, atomic):
    """dK and dV (and with `atomic` dQ by atomics) for one head dimension,
    mask and layout, generic over the dtype."""
    D = head_dim
    SWIZZLE = Swizzle(3, 3, D.bit_length() - 4)
    KV_TILE = composition(SWIZZLE, row_major((BN, D)))
    QO_TILE = composition(SWIZZLE, row_major((BM, D)))
    DS_TILE = row_major((BM, DS_STRIDE))
    V_AT, Q_AT = BN * D, 2 * BN * D
    DO_AT = Q_AT + 2 * BM * D
    DS_AT = DO_AT + 2 * BM * D
    T = lang.generics("T")

    @kernel(generics=(T,), max_threads=THREADS)
    def attention_backward_kv(q: lang.memref[None, None, D, T].readonly(),
                              k: lang.memref[None, None, D, T].readonly(),
                              v: lang.memref[None, None, D, T].readonly(),
                              do: lang.memref[None, None, D, T].readonly(),
                              lse: lang.memref[None, None, f32].readonly(),
                              delta: lang.memref[None, None, f32].readonly(),
                              dq: lang.memref[None, None, D, f32],
                              dk: lang.memref[None, None, D, T].noalias(),
                              dv: lang.memref[None, None, D, T].noalias(),
                              cu_q: lang.memref[None, i32].readonly(),
                              cu_k: lang.memref[None, i32].readonly(),
                              scale_log2: f32, left: i32, right: i32, scale: f32):
        """The forward's layout; dq (float32, q's shape) is added to, dk and dv written."""
        atom = lang.mma.M16N8K16_F16 if q.dtype == f16 else lang.mma.M16N8K16_BF16
        hq, hk = q.shape[1], k.shape[1]
        group = hq // hk
        batch = lang.grid_dim.y // hk
        tid = lang.thread_idx.x
        lane, warp = tid % 32, tid // 32
        b, kv_head = lang.block_idx.y // hk, lang.block_idx.y % hk
        q0, lq, k0, lk = sequence(varlen, b, cu_q, cu_k, q.shape[0] // batch, k.shape[0] // batch)
        n0 = lang.block_idx.x * BN
        left, right = lang.cast(left, index), lang.cast(right, index)
        smem = lang.shared.dynamic(q.dtype)
        k_tile, v_tile = lang.mma.tile(smem, KV_TILE), lang.mma.tile(smem, KV_TILE).at(V_AT)
        q_tile, do_tile = lang.mma.tile(smem, QO_TILE).at(Q_AT), lang.mma.tile(smem, QO_TILE).at(DO_AT)
        ds_tile = lang.mma.tile(smem, DS_TILE).at(DS_AT)

        first, count = query_tiles(n0, n0 + BN - 1, lq, lk, left, right, banded, BM)
        if varlen:
            count = lang.select(n0 < lk, count, 0)    # blocks past this sequence's keys
        steps = count * group     # (query head, query tile) pairs, heads outer

        copy_rows(k_tile, BN, k, k0, n0, lk, kv_head, tid)
        copy_rows(v_tile, BN, v, k0, n0, lk, kv_head, tid)
        h, m0 = head_and_row(0, kv_head, group, first, count)
        copy_rows(q_tile, BM, q, q0, m0, lq, h, tid)
        copy_rows(do_tile, BM, do, q0, m0, lq, h, tid)
        lang.mma.commit_group()

        r, c = lang.mma.coordinate(atom, "c", 0)
        krow0 = warp * 16
        keys = [n0 + krow0 + r, n0 + krow0 + r + 8]
        dk_acc = [lang.mma.zeros(atom) for _ in lang.static_range(D // 8)]
        dv_acc = [lang.mma.zeros(atom) for _ in lang.static_range(D // 8)]

        for step in range(steps):
            stage = step % 2 * (BM * D)
            h, m0 = head_and_row(step, kv_head, group, first, count)
            h_next, m_next = head_and_row(step + 1, kv_head, group, first, count)
            next_stage(stage, BM, [(q_tile, q), (do_tile, do)], q0, m_next, lq, h_next, tid)

            # S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys x the tile's BM queries.
            s, dp = scores(atom, [((k_tile, krow0), q_tile.at(stage)), ((v_tile, krow0), do_tile.at(stage))], BM, D,
                           lane)

            # P^T = exp2(S^T scale log2(e) - lse log2(e)), 0 where masked (also queries past Lq);
            # dS^T = P^T (dP^T - D). Each lane's columns are queries m0 + 8j + c and +1.
            stat_row, stat_at = b * hq + h, 0
            if varlen:
                stat_row, stat_at = h, q0
            for j in lang.static_range(BM // 8):
                for e in lang.static_range(4):
                    query = m0 + j * 8 + c + e % 2
                    masked = (query >= lq) | hidden(query, keys[e // 2], lq, lk, left, right, banded)
                    at = stat_at + smaller(query, lq - 1)
                    p = lang.math.exp2_approx(s[j][e] * scale_log2 - lse[stat_row, at] * LOG2E)
                    s[j][e] = lang.select(masked, lang.constant(0.0, f32), p)
                    dp[j][e] = s[j][e] * (dp[j][e] - delta[stat_row, at])

            # dV += P^T dO and dK += dS^T Q: C fragments of 16 queries are A fragments as they stand.
            dv_acc, dk_acc = add_products(atom, [(dv_acc, rounded(atom, s, q.dtype), do_tile.at(stage)),
                                                 (dk_acc, rounded(atom, dp, q.dtype), q_tile.at(stage))], BM, D, lane)

            if atomic:
                # dQ += dS K: dS^T goes to shared memory as dS (queries x keys), each warp then
                # takes 16 queries over the block's 64 keys and adds them to dq.
                for j in lang.static_range(BM // 8):
                    for e in lang.static_range(4):
                        ds_tile[j * 8 + c + e % 2, krow0 + r + e // 2 * 8] = lang.cast(dp[j][e], q.dtype)
                lang.syncthreads()
                zeros = [lang.mma.zeros(atom) for _ in lang.static_range(D // 8)]
                dq_acc = add_products(atom, [(zeros, (ds_tile, krow0), k_tile)], BN, D, lane)[0]
                # Queries past Lq have dS = 0: adding it to the last real row changes nothing.
                for j in lang.static_range(D // 8):
                    for e in lang.static_range(4):
                        query = smaller(m0 + krow0 + r + e // 2 * 8, lq - 1)
                        lang.atomic.add(dq, (q0 + query, h, j * 8 + c + e % 2), dq_acc[j][e] * scale)
        lang.mma.wait_group(0)

        for half in lang.static_range(2):
            key = keys[half]
            if key < lk:
                for j in lang.static_range(D // 8):
                    at = (k0 + key, kv_head, j * 8 + c)
                    lang.vstore(dk, at, (lang.cast(dk_acc[j][2 * half] * scale, dk.dtype),
                                         lang.cast(dk_acc[j][2 * half + 1] * scale, dk.dtype)))
                    lang.vstore(dv, at, (lang.cast(dv_acc[j][2 * half], dv.dtype),
                                         lang.cast(dv_acc[j][2 * half + 1], dv.dtype)))

    return attention_backward_kv


def _build_q(head_dim, banded, varlen):
    """dQ without atomics: the forward's loop over key tiles, with dS for P and K for V."""
    D = head_dim
    SWIZZLE = Swizzle(3, 3, D.bit_length() - 4)
    Q_TILE = composition(SWIZZLE, row_major((BM, D)))
    KV_TILE = composition(SWIZZLE, row_major((BN, D)))
    DO_AT, K_AT = BM * D, 2 * BM * D
    V_AT = K_AT + 2 * BN * D
    T = lang.generics("T")

    @kernel(generics=(T,), max_threads=THREADS)
    def attention_backward_q(q: lang.memref[None, None, D, T].readonly(),
                             k: lang.memref[None, None, D, T].readonly(),
                             v: lang.memref[None, None, D, T].readonly(),
                             do: lang.memref[None, None, D, T].readonly(),
                             lse: lang.memref[None, None, f32].readonly(),
                             delta: lang.memref[None, None, f32].readonly(),
                             dq: lang.memref[None, None, D, T].noalias(),
                             cu_q: lang.memref[None, i32].readonly(),
                             cu_k: lang.memref[None, i32].readonly(),
                             scale_log2: f32, left: i32, right: i32, scale: f32):
        """The forward's layout and grid; dq written."""
        atom = lang.mma.M16N8K16_F16 if q.dtype == f16 else lang.mma.M16N8K16_BF16
        tid = lang.thread_idx.x
        lane, warp = tid % 32, tid // 32
        _, h, kv_head, m0, q0, lq, k0, lk = query_block(varlen, q, k, cu_q, cu_k)
        left, right = lang.cast(left, index), lang.cast(right, index)
        smem = lang.shared.dynamic(q.dtype)
        q_tile, do_tile = lang.mma.tile(smem, Q_TILE), lang.mma.tile(smem, Q_TILE).at(DO_AT)
        k_tile, v_tile = lang.mma.tile(smem, KV_TILE).at(K_AT), lang.mma.tile(smem, KV_TILE).at(V_AT)

        first, end = key_tiles(m0, smaller(m0 + BM, lq) - 1, lq, lk, left, right, banded, BN)
        if varlen:
            end = lang.select(m0 < lq, end, first)    # blocks past this sequence's queries

        copy_rows(q_tile, BM, q, q0, m0, lq, h, tid)
        copy_rows(do_tile, BM, do, q0, m0, lq, h, tid)
        copy_rows(k_tile, BN, k, k0, first * BN, lk, kv_head, tid)
        copy_rows(v_tile, BN, v, k0, first * BN, lk, kv_head, tid)
        lang.mma.commit_group()

        r, c = lang.mma.coordinate(atom, "c", 0)
        qrow0 = warp * 16
        rows = [m0 + qrow0 + r, m0 + qrow0 + r + 8]
        stat_row, stat_at = lang.block_idx.y, 0
        if varlen:
            stat_row, stat_at = h, q0
        lse2 = [lse[stat_row, stat_at + smaller(row, lq - 1)] * LOG2E for row in rows]
        deltas = [delta[stat_row, stat_at + smaller(row, lq - 1)] for row in rows]
        acc = [lang.mma.zeros(atom) for _ in lang.static_range(D // 8)]

        for t in range(first, end):
            stage = (t - first) % 2 * (BN * D)
            n0 = t * BN
            next_stage(stage, BN, [(k_tile, k), (v_tile, v)], k0, n0 + BN, lk, kv_head, tid)

            s, dp = scores(atom, [((q_tile, qrow0), k_tile.at(stage)), ((do_tile, qrow0), v_tile.at(stage))], BN, D,
                           lane)

            for j in lang.static_range(BN // 8):
                for e in lang.static_range(4):
                    row = rows[e // 2]
                    masked = (row >= lq) | hidden(row, n0 + j * 8 + c + e % 2, lq, lk, left, right, banded)
                    p = lang.math.exp2_approx(s[j][e] * scale_log2 - lse2[e // 2])
                    dp[j][e] = lang.select(masked, lang.constant(0.0, f32), p * (dp[j][e] - deltas[e // 2]))

            # dQ += dS K: dS's C fragments as A fragments, K (keys x D) as V is read in the forward.
            acc = add_products(atom, [(acc, rounded(atom, dp, q.dtype), k_tile.at(stage))], BN, D, lane)[0]
        lang.mma.wait_group(0)

        for half in lang.static_range(2):
            row = rows[half]
            if row < lq:
                for j in lang.static_range(D // 8):
                    lang.vstore(dq, (q0 + row, h, j * 8 + c), (lang.cast(acc[j][2 * half] * scale, dq.dtype),
                                                            lang.cast(acc[j][2 * half + 1] * scale, dq.dtype)))

    return attention_backward_q


def _build_convert():
    T = lang.generics("T")

    @kernel(generics=(T,), max_threads=THREADS)
    def attention_backward_convert(source: lang.memref[None, f32].readonly(), target: lang.memref[None, T].noalias()):
        """target = source rounded to T, an element a thread."""
        i = lang.block_idx.x * THREADS + lang.thread_idx.x
        if i < source.shape[0]:
            target[i] = lang.cast(source[i], target.dtype)

    return attention_backward_convert


@functools.cache
def kernel_for(name, *key):
    """The backward kernel `name` ("rows", "kv", "q", "convert") of `key`, built once."""
    return {"rows": _build_rows, "kv": _build_kv, "q": _build_q, "convert": _build_convert}[name](*key)


def attention_backward(dout, q, k, v, out, lse, *, causal=False, scale=None, window=None, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, deterministic=False,
                       dq=None, dk=None, dv=None):
    """(dq, dk, dv), the gradients of `attention`'s output `out` with respect
    to q, k and v, given dout (the gradient of that output, its shape and
    dtype) and the forward's log-sum-exp `lse` (attention(...,
    return_lse=True)). The other arguments are the forward's; head_dim is 64
    or 128. dq, dk and dv are new arrays in q's library or the given ones
    (C-contiguous, q's and k's shapes and dtype).

    dQ is summed in float32 with atomics by default, in an order that can
    change from run to run; `deterministic` computes it by a separate pass
    instead (the same bits every run, about a third more work).

        o, lse = mlirgpu.ops.attention(q, k, v, causal=True, return_lse=True)
        dq, dk, dv = mlirgpu.ops.attention_backward(do, q, k, v, o, lse, causal=True)
    """
    what = "attention_backward"
    p = Problem(what, q, k, v, causal, scale, window, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if p.d not in HEAD_DIMS:
        raise LaunchError(f"{what}'s head_dim is one of {', '.join(map(str, HEAD_DIMS))}, not {p.d}")
    o_array = p.check_output(what, "out", out, tuple(p.q.shape), p.dtype)
    do_array = p.check_output(what, "dout", dout, tuple(p.q.shape), p.dtype)
    lse_array = p.check_output(what, "lse", lse, p.lse_shape(), f32)
    grads = []
    for name, given, like in (("dq", dq, p.q), ("dk", dk, p.k), ("dv", dv, p.v)):
        # Without queries the gradients are zeros, which no kernel writes.
        given = new_like(q, like.shape, p.dtype, zeros=p.tokens_q == 0) if given is None else given
        grads.append((given, p.check_output(what, name, given, tuple(like.shape), p.dtype)))
    if p.tokens_q * p.hq == 0:
        return tuple(g for g, _ in grads)
    (dq, dq_array), (dk, dk_array), (dv, dv_array) = grads
    qt, kt, vt = p.tokens(p.q, p.tokens_q), p.tokens(p.k, p.tokens_k), p.tokens(p.v, p.tokens_k)
    ot, dot, lset = p.tokens(o_array, p.tokens_q), p.tokens(do_array, p.tokens_q), p.stats(lse_array)
    delta = as_array(new_like(q, tuple(lset.shape), f32), "delta")
    rows = p.tokens_q * p.hq
    kernel_for("rows", p.d, p.varlen)(ot, dot, delta, grid=((rows + WARPS - 1) // WARPS,), block=THREADS,
                                        stream=p.stream)
    dq_sum = as_array(new_like(q, (1 if deterministic else p.tokens_q, p.hq, p.d), f32, zeros=True), "dq")
    cu_q, cu_k, scale_log2, left, right = p.launch_args()
    if not deterministic and not p.varlen and attention_backward_sm90.supported((p.q, p.k, p.v, do_array), p.d):
        attention_backward_sm90.backward(p.q, p.k, p.v, do_array, lse_array, delta, dq_sum, dk_array, dv_array,
                                         p.scale, left, right, p.banded, stream=p.stream)
    else:
        kernel_for("kv", p.d, p.banded, p.varlen, not deterministic)(
            qt, kt, vt, dot, lset, delta, dq_sum, p.tokens(dk_array, p.tokens_k), p.tokens(dv_array, p.tokens_k),
            cu_q, cu_k, scale_log2, left, right, p.scale, grid=((p.lk + BN - 1) // BN, p.batch * p.hk),
            block=THREADS, shared_mem=shared_bytes(p.d), stream=p.stream)
    if deterministic:
        kernel_for("q", p.d, p.banded, p.varlen)(
            qt, kt, vt, dot, lset, delta, p.tokens(dq_array, p.tokens_q), cu_q, cu_k, scale_log2, left, right,
            p.scale, grid=((p.lq + BM - 1) // BM, p.batch * p.hq), block=THREADS,
            shared_mem=(2 * BM + 4 * BN) * p.d * 2, stream=p.stream)
    else:
        count = p.tokens_q * p.hq * p.d
        kernel_for("convert")(dq_sum.reshape(count), dq_array.reshape(count), grid=((count + THREADS - 1) // THREADS,),
                              block=THREADS, stream=p.stream)
    return dq, dk, dv
