"""Scaled dot-product attention, forward: a FlashAttention-2-style kernel on
the tensor cores of sm_80 and later (mma.sync, ldmatrix, cp.async).

    O = softmax(scale * Q K^T + mask) V        per batch and query head

Layout, as FlashAttention's (torch SDPA's with dimensions 1 and 2 swapped):
q is (B, Lq, Hq, d), k and v (B, Lk, Hk, d), the output (B, Lq, Hq, d); the
log-sum-exp of each row, (B, Hq, Lq) in float32, is what a backward pass
needs. Hk divides Hq (grouped-query attention; Hk == 1 is multi-query): query
head h reads key/value head h // (Hq // Hk).

The kernel, for a head dimension D (64, 128 or 256):

- A block of 4 warps owns BM = 64 query rows of one (batch, head), each warp
  16 of them: one row of m16n8k16 atoms. Q's tile is copied to shared memory
  once (cp.async) and, for D <= 128, kept in registers as A fragments
  (ldmatrix .x4).
- K and V stream through two shared-memory stages of BN keys: the copies of
  tile t + 1 (cp.async, zeros past Lk) are issued before tile t's
  products, so they land while the tensor cores work.
- S = Q K^T: K's rows are B's columns as mma.sync wants them (N x K, K
  fastest), so ldmatrix .x4 without transpose gives two B fragments.
- The online softmax runs on S's accumulators where they are: each lane holds
  2 values of rows r and r + 8 per 8 keys, the 4 lanes of a quad hold a row,
  two shuffles give the row's maximum. Scores are scaled by scale * log2(e)
  in the one multiply before exp2. O is rescaled by exp2(m_old - m_new) when
  a row's maximum grows; the row sums l stay per lane until the end.
- P = exp2(...) is rounded to the inputs' type in registers: the C fragments
  of two neighbouring 8-key atoms are exactly the A fragment of a 16-key
  slice, so O += P V needs no shared memory for P. V is K x N (keys x d,
  row-major), read with ldmatrix .x4.trans as B fragments.
- Masking is applied only where it can change something: the last key tile
  (keys past Lk) and, with `causal`, the tiles that cross the diagonal; tiles
  entirely above the diagonal are never loaded. The causal diagonal is aligned
  at the bottom right: query i sees keys j <= i + Lk - Lq (FlashAttention
  2.1+, torch SDPA's convention for decoding). A row that sees no key (Lq > Lk,
  causal) gets zeros and a log-sum-exp of -inf.
- Shared tiles (rows of D 16-bit elements) are swizzled so that cp.async's
  16-byte stores and ldmatrix's row reads have no bank conflicts.
"""
import functools
import math

from .. import language as lang
from .._mlirgpu import LaunchError, bf16, f16, f32
from ..layout import Swizzle, composition, row_major
from ..runtime.kernel import kernel
from .arrays import as_array, dtype_of, is_contiguous, new_like

__all__ = ["attention", "HEAD_DIMS"]

HEAD_DIMS = (64, 128, 256)
BM = 64             # query rows a block owns: 4 warps of 16
WARPS = BM // 16
THREADS = WARPS * 32
CHUNK = 8           # 16-bit elements in a 16-byte cp.async, and in an ldmatrix row
LOG2E = math.log2(math.e)


def key_tile(head_dim):
    """Keys per shared-memory stage: 64, and 32 at D = 256, where the
    registers of O (128 f32 a thread) leave less room for S."""
    return 32 if head_dim == 256 else 64


def shared_bytes(head_dim):
    """Q's tile and two stages each of K and V, 16-bit elements."""
    return (BM + 4 * key_tile(head_dim)) * head_dim * 2


def _build(head_dim, causal):
    """The kernel for one head dimension and masking, generic over the dtype."""
    D, BN = head_dim, key_tile(head_dim)
    # (row, col) -> element of a row-major tile of D-wide rows, 16-byte chunks swizzled by the row's low 3 bits.
    Q_TILE = composition(Swizzle(3, 3, D.bit_length() - 4), row_major((BM, D)))
    KV_TILE = composition(Swizzle(3, 3, D.bit_length() - 4), row_major((BN, D)))
    K_AT, V_AT = BM * D, BM * D + 2 * BN * D    # stage 0 of K and of V; stage 1 is BN * D further
    Q_IN_REGISTERS = D <= 128
    T = lang.generics("T")

    def copy_rows(tile, rows, source, first, count, b, head, tid):
        """`rows` rows of sequence b of `source` ((batch x sequence, heads, D)),
        first + row of `count` at `head`, into `tile`, 16 bytes a cp.async;
        rows at or past `count` are zeros."""
        for i in lang.static_range(rows * D // CHUNK // THREADS):
            chunk = tid + i * THREADS
            row, col = chunk // (D // CHUNK), chunk % (D // CHUNK) * CHUNK
            ok = first + row < count
            lang.mma.cp_async(tile, (row, col), source, (b * count + lang.select(ok, first + row, 0), head, col), 16,
                              ok)

    def q_fragment(q_tile, row, kk, lane):
        """Columns 16kk .. 16kk+15 of Q's 16 rows from `row`, an A fragment:
        lanes 8j .. 8j+7 address matrix j, at block (j % 2, j // 2)."""
        return lang.mma.ldmatrix(q_tile, (row + lane % 8 + lane // 8 % 2 * 8, kk * 16 + lane // 16 * 8), 4)

    @kernel(generics=(T,), max_threads=THREADS)
    def attention_forward(q: lang.memref[None, None, D, T].readonly(),
                          k: lang.memref[None, None, D, T].readonly(),
                          v: lang.memref[None, None, D, T].readonly(),
                          o: lang.memref[None, None, D, T].noalias(),
                          lse: lang.memref[None, None, f32].noalias(),
                          scale_log2: f32):
        """q and o are (B x Lq, Hq, D), k and v (B x Lk, Hk, D), lse (B x Hq, Lq):
        the layout's batch and sequence dimensions as one."""
        atom = lang.mma.M16N8K16_F16 if q.dtype == f16 else lang.mma.M16N8K16_BF16
        hq, hk, lq = q.shape[1], k.shape[1], lse.shape[1]
        lk = k.shape[0] // (lse.shape[0] // hq)
        tid = lang.thread_idx.x
        lane, warp = tid % 32, tid // 32
        b, h = lang.block_idx.y // hq, lang.block_idx.y % hq
        kv_head = h // (hq // hk)
        m0 = lang.block_idx.x * BM
        smem = lang.shared.dynamic(q.dtype)
        q_tile = lang.mma.tile(smem, Q_TILE)
        k_tile, v_tile = lang.mma.tile(smem, KV_TILE).at(K_AT), lang.mma.tile(smem, KV_TILE).at(V_AT)

        # Key tiles this block reads: all of them, or with `causal` those up to
        # the last key its last row sees (none if that row sees no key).
        tiles = (lk + BN - 1) // BN
        if causal:
            tiles = max(min(tiles, (min(m0 + BM, lq) + lk - lq + BN - 1) // BN), 0)

        copy_rows(q_tile, BM, q, m0, lq, b, h, tid)
        copy_rows(k_tile, BN, k, 0, lk, b, kv_head, tid)
        copy_rows(v_tile, BN, v, 0, lk, b, kv_head, tid)
        lang.mma.commit_group()

        # Lanes 8j .. 8j+7 address matrix j's rows, matrix j at block (j // 2, j % 2) (row order), B fragments
        # in each half. For S, K's 16 keys x 16 of D as they are; for O, V's 16 keys x 16 of D transposed.
        k_row, k_col = lane % 8 + lane // 16 * 8, lane // 8 % 2 * 8
        v_row, v_col = lane % 8 + lane // 8 % 2 * 8, lane // 16 * 8
        qrow0 = warp * 16

        lang.mma.wait_group(0)
        lang.syncthreads()
        q_frags = [q_fragment(q_tile, qrow0, kk, lane) for kk in lang.static_range(D // 16)] if Q_IN_REGISTERS else None

        # This lane's rows of the warp's 16 (values 0, 1: row r; 2, 3: row r + 8) and its first column in an atom.
        r, c = lang.mma.coordinate(atom, "c", 0)
        rows = [m0 + qrow0 + r, m0 + qrow0 + r + 8]
        minus_inf = lang.constant(float("-inf"), f32)
        m = [minus_inf, minus_inf]                  # running maximum of scaled scores, log2 units
        l = [lang.constant(0.0, f32), lang.constant(0.0, f32)]    # this lane's share of the row sums
        acc = [lang.mma.zeros(atom) for _ in lang.static_range(D // 8)]

        for t in range(tiles):
            stage = t % 2 * (BN * D)
            n0 = t * BN
            # Tile t has landed, and every warp is done with tile t - 1's stage, which tile t + 1 now fills.
            lang.mma.wait_group(0)
            lang.syncthreads()
            after = BN * D - stage
            copy_rows(k_tile.at(after), BN, k, n0 + BN, lk, b, kv_head, tid)
            copy_rows(v_tile.at(after), BN, v, n0 + BN, lk, b, kv_head, tid)
            lang.mma.commit_group()

            # S = Q K^T for the warp's 16 rows and the tile's BN keys: BN / 8 C fragments.
            s = [lang.mma.zeros(atom) for _ in lang.static_range(BN // 8)]
            for kk in lang.static_range(D // 16):
                a = q_frags[kk] if Q_IN_REGISTERS else q_fragment(q_tile, qrow0, kk, lane)
                for nj in lang.static_range(BN // 16):
                    pair = lang.mma.ldmatrix(k_tile.at(stage), (nj * 16 + k_row, kk * 16 + k_col), 4, order="row")
                    s[2 * nj] = lang.mma.sync(atom, a, pair.select(0, 1, 2, 3), s[2 * nj])
                    s[2 * nj + 1] = lang.mma.sync(atom, a, pair.select(4, 5, 6, 7), s[2 * nj + 1])

            # Keys past Lk, and with `causal` keys past a row's diagonal, are -inf.
            edge = n0 + BN > lk
            if causal:
                edge = edge | (n0 + BN - 1 > m0 + lk - lq)
            if edge:
                for j in lang.static_range(BN // 8):
                    for e in lang.static_range(4):
                        key = n0 + j * 8 + c + e % 2
                        hidden = key >= lk
                        if causal:
                            hidden = hidden | (key + lq > rows[e // 2] + lk)
                        s[j][e] = lang.select(hidden, minus_inf, s[j][e])

            # The online softmax, row by row: the quad's maximum, then P and the rescaling of O and l.
            for half in lang.static_range(2):
                mine = [x for j in lang.static_range(BN // 8) for x in s[j][2 * half:2 * half + 2]]
                top = functools.reduce(lang.math.max, mine)
                top = lang.math.max(top, lang.warp.shfl_xor(top, 1))
                top = lang.math.max(top, lang.warp.shfl_xor(top, 2))
                new_m = lang.math.max(m[half], top * scale_log2)
                # A row that has seen only masked keys keeps -inf; subtracting 0 then gives exp2(-inf) = 0.
                base = lang.select(new_m == minus_inf, lang.constant(0.0, f32), new_m)
                alpha = lang.math.exp2(m[half] - base)
                total = lang.constant(0.0, f32)
                for j in lang.static_range(BN // 8):
                    for e in lang.static_range(2 * half, 2 * half + 2):
                        s[j][e] = lang.math.exp2(s[j][e] * scale_log2 - base)
                        total += s[j][e]
                l[half] = l[half] * alpha + total
                m[half] = new_m
                for j in lang.static_range(D // 8):
                    for e in lang.static_range(2 * half, 2 * half + 2):
                        acc[j][e] = acc[j][e] * alpha

            # O += P V: P's C fragments of keys 16i .. 16i+15, rounded to T, are an A fragment as they stand.
            for i in lang.static_range(BN // 16):
                p = lang.mma.fragment(atom, "a", [lang.cast(x, q.dtype) for x in s[2 * i] + s[2 * i + 1]])
                for dj in lang.static_range(D // 16):
                    pair = lang.mma.ldmatrix(v_tile.at(stage), (i * 16 + v_row, dj * 16 + v_col), 4,
                                             transpose=True, order="row")
                    acc[2 * dj] = lang.mma.sync(atom, p, pair.select(0, 1, 2, 3), acc[2 * dj])
                    acc[2 * dj + 1] = lang.mma.sync(atom, p, pair.select(4, 5, 6, 7), acc[2 * dj + 1])
        lang.mma.wait_group(0)

        # O / l and the log-sum-exp (natural log), row by row; a row that saw no key gets 0 and -inf.
        for half in lang.static_range(2):
            total = l[half]
            total += lang.warp.shfl_xor(total, 1)
            total += lang.warp.shfl_xor(total, 2)
            empty = total == 0.0
            inverse = lang.select(empty, lang.constant(0.0, f32), 1.0 / total)
            row = rows[half]
            if row < lq:
                for j in lang.static_range(D // 8):
                    lang.vstore(o, (b * lq + row, h, j * 8 + c), (lang.cast(acc[j][2 * half] * inverse, q.dtype),
                                                            lang.cast(acc[j][2 * half + 1] * inverse, q.dtype)))
                if lane % 4 == 0:
                    lse[lang.block_idx.y, row] = lang.select(empty, minus_inf,
                                                 (m[half] + lang.math.log2(total)) * math.log(2.0))

    return attention_forward


_KERNELS = {}


def kernel_for(head_dim, causal):
    """The kernel of (head dimension, causal), built once; its dtype is a generic."""
    key = (head_dim, bool(causal))
    if key not in _KERNELS:
        _KERNELS[key] = _build(head_dim, causal)
    return _KERNELS[key]


def attention(q, k, v, *, causal=False, scale=None, out=None, return_lse=False):
    """softmax(scale * q k^T) v for q (B, Lq, Hq, d) and k, v (B, Lk, Hk, d)
    of f16 or bf16, d 64, 128 or 256, Hk dividing Hq; returns the output
    (B, Lq, Hq, d) in q's dtype, with its log-sum-exp (B, Hq, Lq) in float32
    (natural log) when `return_lse`.

    `causal` masks key j for query i when j > i + Lk - Lq (the diagonal at
    the bottom right); `scale` (>= 0) defaults to 1 / sqrt(d). The arrays are torch
    tensors, CuPy or JAX arrays or DeviceArrays on the current backend (NumPy
    arrays on the CPU backend), each C-contiguous; the output (`out`, or a new
    array in q's library: torch for a tensor, NumPy for a NumPy array, else a
    DeviceArray) too. Bad shapes and dtypes are a LaunchError (a ValueError),
    what is no array a TypeError.

        o = mlirgpu.ops.attention(q, k, v, causal=True)
    """
    arrays = [as_array(x, f"attention's {name}") for name, x in (("q", q), ("k", k), ("v", v))]
    for name, array in zip("qkv", arrays):
        if len(array.shape) != 4:
            raise LaunchError(f"attention's {name} is (batch, sequence, heads, head_dim), 4-d; got shape "
                              f"{tuple(array.shape)}")
        if not is_contiguous(array):
            raise LaunchError(f"attention's {name} must be C-contiguous (copy it first)")
    (batch, lq, hq, d), (kb, lk, hk, kd), vshape = (tuple(a.shape) for a in arrays)
    dtype = dtype_of(arrays[0])
    if dtype not in (f16, bf16):
        raise LaunchError(f"attention takes f16 or bf16 q, k and v, not {arrays[0].dtype}")
    if dtype_of(arrays[1]) != dtype or dtype_of(arrays[2]) != dtype:
        raise LaunchError(f"attention's q, k and v have one dtype; got {', '.join(str(a.dtype) for a in arrays)}")
    if vshape != (kb, lk, hk, kd):
        raise LaunchError(f"attention's k and v have one shape; got {(kb, lk, hk, kd)} and {vshape}")
    if kb != batch or kd != d:
        raise LaunchError(f"attention's q {(batch, lq, hq, d)} and k {(kb, lk, hk, kd)} differ in batch or "
                          f"head_dim")
    if d not in HEAD_DIMS:
        raise LaunchError(f"attention's head_dim is one of {', '.join(map(str, HEAD_DIMS))}, not {d}")
    if hk == 0 or hq % hk:
        raise LaunchError(f"attention's key/value heads ({hk}) must divide its query heads ({hq})")
    if lk == 0:
        raise LaunchError("attention needs at least one key: k and v have sequence length 0")
    if scale is not None and not float(scale) >= 0:
        raise ValueError(f"attention's scale is a number >= 0 (the row maximum is taken before it), not {scale}")
    if batch * hq > 65535:
        raise LaunchError(f"attention runs a block row per (batch, head): batch x heads is at most 65535, "
                          f"not {batch * hq}")
    if out is None:
        out = new_like(q, (batch, lq, hq, d), dtype)
    target = as_array(out, "attention's out")
    if tuple(target.shape) != (batch, lq, hq, d) or dtype_of(target) != dtype or not is_contiguous(target):
        raise LaunchError(f"attention's out is a C-contiguous {dtype.name} array of shape {(batch, lq, hq, d)}, "
                          f"not {target.dtype} of shape {tuple(target.shape)}")
    lse = new_like(q, (batch, hq, lq), f32)
    if batch * hq * lq:
        scale_log2 = (1.0 / math.sqrt(d) if scale is None else float(scale)) * LOG2E
        # The kernel sees batch and sequence as one dimension (views, no copies).
        kernel_for(d, causal)(arrays[0].reshape(batch * lq, hq, d), arrays[1].reshape(batch * lk, hk, d),
                              arrays[2].reshape(batch * lk, hk, d), target.reshape(batch * lq, hq, d),
                              as_array(lse, "attention's lse").reshape(batch * hq, lq), scale_log2,
                              grid=((lq + BM - 1) // BM, batch * hq), block=THREADS, shared_mem=shared_bytes(d))
    return (out, lse) if return_lse else out
