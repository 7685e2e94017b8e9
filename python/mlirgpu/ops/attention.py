"""Scaled dot-product attention, forward: a FlashAttention-2-style kernel on
the tensor cores of sm_80 and later (mma.sync, ldmatrix, cp.async); the
backward pass is attention_backward.py, the torch custom op attention_torch.py.

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
  (keys past Lk) and the tiles that cross an edge of the band
  -left <= key - query - (Lk - Lq) <= right, which is both the causal mask
  (right = 0: the diagonal at the bottom right, FlashAttention 2.1+ and
  torch SDPA's convention for decoding) and a sliding window; tiles outside
  the band are never loaded. A row that sees no key gets zeros and a
  log-sum-exp of -inf.
- Packed sequences (varlen) read each sequence's first token and length from
  cu_seqlens; split keys (decoding) give each of grid.z blocks a share of the
  key tiles and a second kernel merges their partial outputs.
- Packed query heads (decoding: a few queries, grouped-query heads): a
  block's rows are the (query, query head) pairs of one (batch, key/value
  head), query-major, row r being query r // group of query head
  kv_head * group + r % group; a token's heads of a group are adjacent in
  q, so Q's tile is still copied as rows of D elements, and the group reads
  its K and V once instead of once per query head. The mask takes each
  row's query, the key tiles run from the first row's query to the last
  row's, and O and the log-sum-exp go to each row's (token, head).
- Shared tiles (rows of D 16-bit elements) are swizzled so that cp.async's
  16-byte stores and ldmatrix's row reads have no bank conflicts.
"""
import contextlib
import functools
import math
import sys
import threading

from .. import language as lang
from .._mlirgpu import DType, Dispatcher, LaunchError, bf16, current_device, dtype, f8e4m3, f16, f32, i32, index
from ..layout import Swizzle, composition, row_major
from ..runtime import backend
from ..runtime.compiled import default_chip
from ..runtime.kernel import kernel
from . import arrays, attention_decode_sm90, attention_sm90, attention_torch, kept
from .arrays import Workspaces, dtype_of, is_contiguous, new_like, output, per_tensor_scale, placeholder, torch_stream

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


def packed_row(row, group, head):
    """(query, head) of a block's row: the row itself of `head`, or with a
    `group` (a key/value head's query heads packed, query-major) query
    row // group of head `head` + row % group."""
    if group is None:
        return row, head
    return row // group, head + row % group


def copy_rows(tile, rows, source, start, first, count, head, tid, group=None):
    """`rows` rows of `source` ((tokens, heads, D)) into `tile`, 16 bytes a
    cp.async: row `row` is block row first + row (packed_row of `group` and
    `head`) of the sequence at token `start`, or zeros where first + row is
    at or past `count` (the sequence's block rows)."""
    D = source.shape[2]
    for i in lang.static_range(rows * D // CHUNK // THREADS):
        chunk = tid + i * THREADS
        row, col = chunk // (D // CHUNK), chunk % (D // CHUNK) * CHUNK
        ok = first + row < count
        token, h = packed_row(lang.select(ok, first + row, 0), group, head)
        lang.mma.cp_async(tile, (row, col), source, (start + token, h, col), 16, ok)


def a_fragment(tile, row, kk, lane):
    """Columns 16kk .. 16kk+15 of `tile`'s 16 rows from `row`, an A fragment:
    lanes 8j .. 8j+7 address matrix j, at block (j % 2, j // 2)."""
    return lang.mma.ldmatrix(tile, (row + lane % 8 + lane // 8 % 2 * 8, kk * 16 + lane // 16 * 8), 4)


def b_fragments(tile, row, col, lane, transpose):
    """Two B fragments (8 columns of N each) of 16 x 16 elements of `tile` at
    (row, col): rows as N x K, K fastest (a K tile for Q K^T), or with
    `transpose` as K x N, N fastest (a V tile for P V)."""
    if transpose:
        index = (row + lane % 8 + lane // 8 % 2 * 8, col + lane // 16 * 8)
    else:
        index = (row + lane % 8 + lane // 16 * 8, col + lane // 8 % 2 * 8)
    pair = lang.mma.ldmatrix(tile, index, 4, transpose=transpose, order="row")
    return pair.select(0, 1, 2, 3), pair.select(4, 5, 6, 7)


def next_stage(stage, rows, copies, start, first, count, head, tid):
    """The top of a step of a double-buffered loop: waits until the tiles at
    `stage` have landed and every warp is done with the other stage, then
    fills that one with `rows` rows from `first` of each (tile, source) of
    `copies` (copy_rows) and commits them, to land during this step."""
    lang.mma.wait_group(0)
    lang.syncthreads()
    after = rows * copies[0][1].shape[2] - stage
    for tile, source in copies:
        copy_rows(tile.at(after), rows, source, start, first, count, head, tid)
    lang.mma.commit_group()


def a_operand(a, kk, lane):
    """The A fragment of columns 16kk .. 16kk+15 of an A operand: a list of
    fragments held in registers, or a (tile, first row) read by a_fragment."""
    return a[kk] if isinstance(a, list) else a_fragment(a[0], a[1], kk, lane)


def scores(atom, operands, rows, depth, lane):
    """A B^T for each (A, tile) of `operands`: the rows / 8 C fragments of 16
    rows of A (a_operand) times `rows` rows of the tile (N x K, K fastest, as
    b_fragments reads it), over `depth` columns."""
    products = [[lang.mma.zeros(atom) for _ in lang.static_range(rows // 8)] for _ in operands]
    for kk in lang.static_range(depth // 16):
        for (a, tile), acc in zip(operands, products):
            fragment = a_operand(a, kk, lane)
            for nj in lang.static_range(rows // 16):
                low, high = b_fragments(tile, nj * 16, kk * 16, lane, False)
                acc[2 * nj] = lang.mma.sync(atom, fragment, low, acc[2 * nj])
                acc[2 * nj + 1] = lang.mma.sync(atom, fragment, high, acc[2 * nj + 1])
    return products


def add_products(atom, products, depth, width, lane):
    """acc + A B for each (acc, A, tile) of `products`: 16 rows of A (a_operand)
    over `depth` columns times the tile's `depth` rows (K x N, N fastest: read
    transposed) of `width` columns; the new accumulators, in that order."""
    sums = [list(acc) for acc, _, _ in products]
    for i in lang.static_range(depth // 16):
        for (_, a, tile), acc in zip(products, sums):
            fragment = a_operand(a, i, lane)
            for dj in lang.static_range(width // 16):
                low, high = b_fragments(tile, i * 16, dj * 16, lane, True)
                acc[2 * dj] = lang.mma.sync(atom, fragment, low, acc[2 * dj])
                acc[2 * dj + 1] = lang.mma.sync(atom, fragment, high, acc[2 * dj + 1])
    return sums


def rounded(atom, c, dtype):
    """C fragments (of 8 columns each) rounded to `dtype` as A fragments of 16
    columns: two neighbouring C fragments are exactly an A fragment's layout."""
    return [lang.mma.fragment(atom, "a", [lang.cast(x, dtype) for x in c[2 * i] + c[2 * i + 1]])
            for i in lang.static_range(len(c) // 2)]


def larger(a, b):
    """max of two signed indices (mg.math.max reads index values as unsigned)."""
    return lang.select(a > b, a, b)


def smaller(a, b):
    """min of two signed indices."""
    return lang.select(a < b, a, b)


def sequence(varlen, b, cu_q, cu_k, lq, lk):
    """(first query token, Lq, first key token, Lk) of sequence b: from the
    offsets with `varlen`, else b times the common lengths."""
    if varlen:
        q0, k0 = lang.cast(cu_q[b], index), lang.cast(cu_k[b], index)
        return q0, lang.cast(cu_q[b + 1], index) - q0, k0, lang.cast(cu_k[b + 1], index) - k0
    return b * lq, lq, b * lk, lk


def query_block(varlen, q, k, cu_q, cu_k, packed=False):
    """Where a block of the forward's grid (row tiles, batch x query heads, or
    with `packed` batch x key/value heads) works: its sequence b, its query
    head (packed: the group's first), the key/value head that one reads, its
    first row m0, and its sequence's first query token, Lq, first key token
    and Lk (`sequence`)."""
    hq, hk = q.shape[1], k.shape[1]
    heads = hk if packed else hq
    batch = lang.grid_dim.y // heads
    b, y = lang.block_idx.y // heads, lang.block_idx.y % heads
    q0, lq, k0, lk = sequence(varlen, b, cu_q, cu_k, q.shape[0] // batch, k.shape[0] // batch)
    h, kv_head = (y * (hq // hk), y) if packed else (y, y // (hq // hk))
    return b, h, kv_head, lang.block_idx.x * BM, q0, lq, k0, lk


def key_tiles(first_query, last_query, lq, lk, left, right, banded, tile):
    """(first, end): the key tiles of `tile` keys that a block's queries
    first_query .. last_query read: all of them, or within the band those
    from the first key the first query sees to the last the last one sees."""
    first, end = 0, (lk + tile - 1) // tile
    if banded:
        first = larger(first_query + lk - lq - left, 0) // tile
        end = larger(smaller(last_query + lk - lq + right, lk - 1) + tile, 0) // tile
        end = larger(end, first)
    return first, end


def query_tiles(first_key, last_key, lq, lk, left, right, banded, tile):
    """(first, count): the query tiles of `tile` queries that see any of the
    keys first_key .. last_key: all of them, or within the band those from
    the first query that sees the first key to the last that sees the last."""
    first, count = 0, (lq + tile - 1) // tile
    if banded:
        first = larger(first_key - (lk - lq) - right, 0) // tile
        end = larger(smaller(smaller(last_key, lk - 1) - (lk - lq) + left, lq - 1) + tile, 0) // tile
        count = larger(end, first) - first
    return first, count


def head_and_row(step, kv_head, group, first, count):
    """The query head and first query of step `step` of a backward loop over
    the query tiles that see a block's keys (query heads of the group outer,
    `count` tiles of BM queries from `first` inner); past the last step, the
    last head (a copy that is never used)."""
    tiles = larger(count, 1)
    return kv_head * group + smaller(step // tiles, group - 1), (first + step % tiles) * BM


def hidden(query, key, lq, lk, left, right, banded):
    """Whether `query` does not see `key`: keys past Lk, and with `banded`
    keys outside -left <= key - query - (Lk - Lq) <= right."""
    out = key >= lk
    if banded:
        diff = key - query - (lk - lq)
        out = out | (diff > right) | (diff < -left)
    return out


def _build(head_dim, banded, varlen, split, packed):
    """The forward kernel for one head dimension, mask (`banded`: a causal
    or sliding-window band), layout (`varlen`: packed sequences), `split`
    (the keys shared among grid.z blocks, partial outputs in float32, for
    decoding) and `packed` (a block's rows are the (query, query head) pairs
    of one key/value head), generic over the dtype."""
    D, BN = head_dim, key_tile(head_dim)
    # (row, col) -> element of a row-major tile of D-wide rows, 16-byte chunks swizzled by the row's low 3 bits.
    Q_TILE = composition(Swizzle(3, 3, D.bit_length() - 4), row_major((BM, D)))
    KV_TILE = composition(Swizzle(3, 3, D.bit_length() - 4), row_major((BN, D)))
    K_AT, V_AT = BM * D, BM * D + 2 * BN * D    # stage 0 of K and of V; stage 1 is BN * D further
    Q_IN_REGISTERS = D <= 128
    T = lang.generics("T")
    OUT = f32 if split else T

    @kernel(generics=(T,), max_threads=THREADS)
    def attention_forward(q: lang.memref[None, None, D, T].readonly(),
                          k: lang.memref[None, None, D, T].readonly(),
                          v: lang.memref[None, None, D, T].readonly(),
                          o: lang.memref[None, None, D, OUT].noalias(),
                          lse: lang.memref[None, None, f32].noalias(),
                          cu_q: lang.memref[None, i32].readonly(),
                          cu_k: lang.memref[None, i32].readonly(),
                          scale_log2: f32, left: i32, right: i32):
        """q is (tokens, Hq, D), k and v (tokens, Hk, D): sequences one after
        the other, at cu_q[b] and cu_k[b] with `varlen`, else B of equal length.
        o is q's shape (grid.z times over with `split`), lse (B x Hq, Lq), or
        (Hq, tokens) with `varlen` (grid.z times over with `split`)."""
        atom = lang.mma.M16N8K16_F16 if q.dtype == f16 else lang.mma.M16N8K16_BF16
        tid = lang.thread_idx.x
        lane, warp = tid % 32, tid // 32
        b, h, kv_head, m0, q0, lq, k0, lk = query_block(varlen, q, k, cu_q, cu_k, packed)
        group = q.shape[1] // k.shape[1] if packed else None
        count = lq * group if packed else lq     # the sequence's block rows
        left, right = lang.cast(left, index), lang.cast(right, index)
        smem = lang.shared.dynamic(q.dtype)
        q_tile = lang.mma.tile(smem, Q_TILE)
        k_tile, v_tile = lang.mma.tile(smem, KV_TILE).at(K_AT), lang.mma.tile(smem, KV_TILE).at(V_AT)

        # The band is the queries', so a block's key tiles follow from its first and last row's queries.
        first_query = packed_row(m0, group, h)[0]
        last_query = packed_row(smaller(m0 + BM, count) - 1, group, h)[0]
        first, end = key_tiles(first_query, last_query, lq, lk, left, right, banded, BN)
        if split:
            share = (end - first + lang.grid_dim.z - 1) // lang.grid_dim.z
            first = smaller(first + lang.block_idx.z * share, end)
            end = smaller(first + share, end)
        if varlen:
            end = lang.select(m0 < count, end, first)    # blocks past this sequence's queries

        copy_rows(q_tile, BM, q, q0, m0, count, h, tid, group)
        copy_rows(k_tile, BN, k, k0, first * BN, lk, kv_head, tid)
        copy_rows(v_tile, BN, v, k0, first * BN, lk, kv_head, tid)
        lang.mma.commit_group()
        qrow0 = warp * 16
        lang.mma.wait_group(0)
        lang.syncthreads()
        q_frags = [a_fragment(q_tile, qrow0, kk, lane) for kk in lang.static_range(D // 16)] if Q_IN_REGISTERS else None

        # This lane's rows of the warp's 16 (values 0, 1: row r; 2, 3: row r + 8) and its first column in an atom.
        r, c = lang.mma.coordinate(atom, "c", 0)
        rows = [m0 + qrow0 + r, m0 + qrow0 + r + 8]
        queries = [packed_row(row, group, h) for row in rows]    # each row's (query, head)
        minus_inf = lang.constant(float("-inf"), f32)
        m = [minus_inf, minus_inf]                  # running maximum of scaled scores, log2 units
        l = [lang.constant(0.0, f32), lang.constant(0.0, f32)]    # this lane's share of the row sums
        acc = [lang.mma.zeros(atom) for _ in lang.static_range(D // 8)]

        for t in range(first, end):
            stage = (t - first) % 2 * (BN * D)
            n0 = t * BN
            # Tile t has landed, and every warp is done with tile t - 1's stage, which tile t + 1 now fills.
            next_stage(stage, BN, [(k_tile, k), (v_tile, v)], k0, n0 + BN, lk, kv_head, tid)

            # S = Q K^T for the warp's 16 rows and the tile's BN keys: BN / 8 C fragments.
            s = scores(atom, [(q_frags if Q_IN_REGISTERS else (q_tile, qrow0), k_tile.at(stage))], BN, D, lane)[0]

            # Keys past Lk, and outside the band, are -inf: only in tiles where that can happen.
            edge = n0 + BN > lk
            if banded:
                edge = edge | (n0 + BN - 1 > first_query + lk - lq + right) | (last_query + lk - lq - left > n0)
            if edge:
                for j in lang.static_range(BN // 8):
                    for e in lang.static_range(4):
                        masked = hidden(queries[e // 2][0], n0 + j * 8 + c + e % 2, lq, lk, left, right, banded)
                        s[j][e] = lang.select(masked, minus_inf, s[j][e])

            # The online softmax, row by row: the quad's maximum, then P and the rescaling of O and l.
            for half in lang.static_range(2):
                mine = [x for j in lang.static_range(BN // 8) for x in s[j][2 * half:2 * half + 2]]
                top = functools.reduce(lang.math.max, mine)
                top = lang.math.max(top, lang.warp.shfl_xor(top, 1))
                top = lang.math.max(top, lang.warp.shfl_xor(top, 2))
                new_m = lang.math.max(m[half], top * scale_log2)
                # A row that has seen only masked keys keeps -inf; subtracting 0 then gives exp2(-inf) = 0.
                base = lang.select(new_m == minus_inf, lang.constant(0.0, f32), new_m)
                alpha = lang.math.exp2_approx(m[half] - base)
                total = lang.constant(0.0, f32)
                for j in lang.static_range(BN // 8):
                    for e in lang.static_range(2 * half, 2 * half + 2):
                        s[j][e] = lang.math.exp2_approx(s[j][e] * scale_log2 - base)
                        total += s[j][e]
                l[half] = l[half] * alpha + total
                m[half] = new_m
                for j in lang.static_range(D // 8):
                    for e in lang.static_range(2 * half, 2 * half + 2):
                        acc[j][e] = acc[j][e] * alpha

            # O += P V: P's C fragments, rounded to T, are its A fragments as they stand.
            acc = add_products(atom, [(acc, rounded(atom, s, q.dtype), v_tile.at(stage))], BN, D, lane)[0]
        lang.mma.wait_group(0)

        # O / l and the log-sum-exp (natural log), row by row; a row that saw no key gets 0 and -inf.
        # lse's row of head 0 and column of query 0: (B x Hq, Lq), or (Hq, tokens) with varlen.
        out_row, lse_row, lse_at = q0, b * q.shape[1], 0
        if varlen:
            lse_row, lse_at = 0, q0
        if split:    # this block's share of the keys: partial rows, grid.z times over
            out_row = out_row + lang.block_idx.z * (o.shape[0] // lang.grid_dim.z)
            lse_row = lse_row + lang.block_idx.z * (lse.shape[0] // lang.grid_dim.z)
        for half in lang.static_range(2):
            total = l[half]
            total += lang.warp.shfl_xor(total, 1)
            total += lang.warp.shfl_xor(total, 2)
            empty = total == 0.0
            inverse = lang.select(empty, lang.constant(0.0, f32), 1.0 / total)
            query, head = queries[half]
            if rows[half] < count:
                for j in lang.static_range(D // 8):
                    lang.vstore(o, (out_row + query, head, j * 8 + c),
                                (lang.cast(acc[j][2 * half] * inverse, o.dtype),
                                 lang.cast(acc[j][2 * half + 1] * inverse, o.dtype)))
                if lane % 4 == 0:
                    lse[lse_row + head, lse_at + query] = lang.select(
                        empty, minus_inf, (m[half] + lang.math.log2(total)) * math.log(2.0))

    return attention_forward


def _build_combine(head_dim):
    """The kernel that merges the partial outputs of a split forward: one warp
    a (token, head), out = sum_s exp(lse_s - lse) out_s with lse the log of
    sum_s exp(lse_s)."""
    D = head_dim
    T = lang.generics("T")

    @kernel(generics=(T,), max_threads=THREADS)
    def attention_combine(parts: lang.memref[None, None, D, f32].readonly(),
                          part_lse: lang.memref[None, None, f32].readonly(),
                          o: lang.memref[None, None, D, T].noalias(),
                          lse: lang.memref[None, None, f32].noalias()):
        """parts is o's shape grid-of-splits times over, part_lse lse's: (B x Hq, Lq) each."""
        tokens, hq, lq, rows = o.shape[0], o.shape[1], lse.shape[1], lse.shape[0]
        splits = parts.shape[0] // tokens
        lane = lang.thread_idx.x % 32
        item = lang.block_idx.x * WARPS + lang.thread_idx.x // 32
        if item < tokens * hq:
            token, h = item // hq, item % hq
            row, i = token // lq * hq + h, token % lq
            minus_inf = lang.constant(float("-inf"), f32)
            # The lanes take splits lane, lane + 32, ...; shuffles then give the warp's maximum and sum.
            top = minus_inf
            for z in range(lane, splits, 32):
                top = lang.math.max(top, part_lse[z * rows + row, i])
            for s in lang.static_range(5):
                top = lang.math.max(top, lang.warp.shfl_xor(top, 16 >> s))
            # Every split empty (a row that sees no key): weights exp(-inf - 0) = 0, output 0.
            base = lang.select(top == minus_inf, lang.constant(0.0, f32), top)
            total = lang.constant(0.0, f32)
            for z in range(lane, splits, 32):
                total += lang.math.exp(part_lse[z * rows + row, i] - base)
            for s in lang.static_range(5):
                total += lang.warp.shfl_xor(total, 16 >> s)
            inverse = lang.select(total == 0.0, lang.constant(0.0, f32), 1.0 / total)
            # A lane's D / 32 columns: each split's weight and values are loaded together, one
            # memory latency a split rather than one a split and column.
            values = [lang.constant(0.0, f32) for _ in lang.static_range(D // 32)]
            for z in range(splits):
                weight = lang.math.exp(part_lse[z * rows + row, i] - base)
                for j in lang.static_range(D // 32):
                    values[j] = values[j] + weight * parts[z * tokens + token, h, j * 32 + lane]
            for j in lang.static_range(D // 32):
                o[token, h, j * 32 + lane] = lang.cast(values[j] * inverse, o.dtype)
            if lane == 0:
                lse[row, i] = lang.select(total == 0.0, minus_inf, base + lang.math.log(total))

    return attention_combine


@functools.cache
def kernel_for(head_dim, banded=False, varlen=False, split=False, packed=False):
    """The forward kernel of (head dimension, banded mask, packed sequences,
    split keys, packed query heads), built once; its dtype is a generic."""
    return _build(head_dim, bool(banded), bool(varlen), bool(split), bool(packed))


@functools.cache
def combine_kernel_for(head_dim):
    """The kernel merging a split forward's partial outputs, built once."""
    return _build_combine(head_dim)


def as_array(x, name):
    """x as an array the kernels take (arrays.as_array), named as attention's `name`."""
    return arrays.as_array(x, f"attention's {name}")


class Problem:
    """An attention call's arguments, checked: the arrays as the kernels take
    them and the sizes, band and offsets they need."""

    def __init__(self, what, q, k, v, causal, scale, window, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, float8=False):
        self.varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        rank = 3 if self.varlen else 4
        layout = "(tokens, heads, head_dim)" if self.varlen else "(batch, sequence, heads, head_dim)"
        arrays = [as_array(x, name) for name, x in (("q", q), ("k", k), ("v", v))]
        for name, array in zip("qkv", arrays):
            if len(array.shape) != rank:
                raise LaunchError(f"{what}'s {name} is {layout}, {rank}-d; got shape {tuple(array.shape)}")
            if not is_contiguous(array):
                raise LaunchError(f"{what}'s {name} must be C-contiguous (copy it first)")
        self.q, self.k, self.v = arrays
        qshape, kshape, vshape = (tuple(a.shape) for a in arrays)
        self.dtype = dtype_of(self.q)
        if self.dtype not in ((f8e4m3,) if float8 else (f16, bf16)):
            raise LaunchError(f"{what} takes {'f8e4m3' if float8 else 'f16 or bf16'} q, k and v, not {self.q.dtype}")
        if dtype_of(self.k) != self.dtype or dtype_of(self.v) != self.dtype:
            raise LaunchError(f"{what}'s q, k and v have one dtype; got "
                              f"{', '.join(str(a.dtype) for a in arrays)}")
        if vshape != kshape:
            raise LaunchError(f"{what}'s k and v have one shape; got {kshape} and {vshape}")
        self.hq, self.d = qshape[-2:]
        self.hk = kshape[-2]
        if qshape[:-3] != kshape[:-3] or kshape[-1] != self.d:
            raise LaunchError(f"{what}'s q {qshape} and k {kshape} differ in batch or head_dim")
        if self.d not in HEAD_DIMS:
            raise LaunchError(f"{what}'s head_dim is one of {', '.join(map(str, HEAD_DIMS))}, not {self.d}")
        if self.hk == 0 or self.hq % self.hk:
            raise LaunchError(f"{what}'s key/value heads ({self.hk}) must divide its query heads ({self.hq})")
        if scale is not None and not float(scale) >= 0:
            raise ValueError(f"{what}'s scale is a number >= 0 (the row maximum is taken before it), not {scale}")
        self.scale = 1.0 / math.sqrt(self.d) if scale is None else float(scale)
        if self.varlen:
            self._offsets(what, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        else:
            for name, value in (("cu_seqlens", None), ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
                if value is not None:
                    raise ValueError(f"{what}'s {name} goes with cu_seqlens_q and cu_seqlens_k")
            self.batch, self.lq, self.lk = qshape[0], qshape[1], kshape[1]
            self.tokens_q, self.tokens_k = self.batch * self.lq, self.batch * self.lk
            if self.lk == 0:
                raise LaunchError(f"{what} needs at least one key: k and v have sequence length 0")
            self.cu_q = self.cu_k = placeholder()    # read only with packed sequences
        if self.batch * self.hq > 65535:
            raise LaunchError(f"{what} runs a block row per (batch, head): batch x heads is at most 65535, "
                              f"not {self.batch * self.hq}")
        self._band(what, causal, window)
        self.stream = torch_stream(q)

    def _offsets(self, what, cu_q, cu_k, max_q, max_k):
        if cu_q is None or cu_k is None or max_q is None or max_k is None:
            raise ValueError(f"{what} with packed sequences takes cu_seqlens_q, cu_seqlens_k, max_seqlen_q and "
                             f"max_seqlen_k together")
        self.cu_q, self.cu_k = as_array(cu_q, "cu_seqlens_q"), as_array(cu_k, "cu_seqlens_k")
        for name, array in (("cu_seqlens_q", self.cu_q), ("cu_seqlens_k", self.cu_k)):
            if len(array.shape) != 1 or dtype_of(array) != i32 or not is_contiguous(array) or array.shape[0] < 2:
                raise LaunchError(f"{what}'s {name} is a contiguous 1-d int32 array of batch + 1 offsets, not "
                                  f"{array.dtype} of shape {tuple(array.shape)}")
        if self.cu_q.shape != self.cu_k.shape:
            raise LaunchError(f"{what}'s cu_seqlens_q and cu_seqlens_k have one length (batch + 1); got "
                              f"{self.cu_q.shape[0]} and {self.cu_k.shape[0]}")
        for name, value in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{what}'s {name} is an int >= 1 (the longest sequence), not {value!r}")
        self.batch, self.lq, self.lk = self.cu_q.shape[0] - 1, max_q, max_k
        self.tokens_q, self.tokens_k = self.q.shape[0], self.k.shape[0]

    def _band(self, what, causal, window):
        """left and right of the band -left <= key - query - (Lk - Lq) <= right, as
        i32 (a bound no sequence reaches stands for none)."""
        unbounded = self.lq + self.lk
        left = right = None
        if window is not None:
            if not isinstance(window, (tuple, list)) or len(window) != 2 or not all(
                    w is None or isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window):
                raise ValueError(f"{what}'s window is (left, right): ints >= 0, or -1 or None for no bound; "
                                 f"not {window!r}")
            left, right = (None if w is None or w < 0 else w for w in window)
        if causal:
            right = 0 if right is None else min(right, 0)
        self.banded = left is not None or right is not None
        self.left = unbounded if left is None else min(left, unbounded)
        self.right = unbounded if right is None else min(right, unbounded)

    def launch_args(self):
        return self.cu_q, self.cu_k, self.scale * LOG2E, self.left, self.right

    def lse_shape(self):
        """(B, Hq, Lq), or (Hq, tokens) for packed sequences."""
        return (self.hq, self.tokens_q) if self.varlen else (self.batch, self.hq, self.lq)

    @staticmethod
    def check_output(what, name, array, shape, dtype):
        """`array` (given by the caller) as a kernel's array of `shape` and `dtype`."""
        target = as_array(array, name)
        if tuple(target.shape) != shape or dtype_of(target) != dtype or not is_contiguous(target):
            raise LaunchError(f"{what}'s {name} is a C-contiguous {dtype.name} array of shape {shape}, "
                              f"not {target.dtype} of shape {tuple(target.shape)}")
        return target

    def tokens(self, array, count):
        """A view of `array` (..., heads, d) as (tokens, heads, d)."""
        return array.reshape(count, array.shape[-2], self.d)

    def stats(self, array):
        """A view of an lse-shaped array as the kernels' 2-d (B x Hq, Lq) or (Hq, tokens)."""
        return array if self.varlen else array.reshape(self.batch * self.hq, self.lq)


DECODE_QUERIES = 16      # at most this many queries a sequence: split the keys (decoding)
TARGET_BLOCKS = 264      # blocks enough to fill 132 SMs twice over


def packs_heads(problem):
    """Whether a block's rows are (query, query head) pairs of one key/value
    head: for decoding (at most DECODE_QUERIES queries of equal-length
    sequences) with grouped-query heads, where blocks of one query head would
    be mostly empty rows and read the cache once per query head. With one
    query head a group the packed rows are the unpacked ones; with more
    queries a head's own blocks fill up and read the cache as often as packed
    ones would, and the sm_90a kernel takes them."""
    return not problem.varlen and problem.lq <= DECODE_QUERIES and problem.hq > problem.hk


def grid_for(problem, packed, splits):
    """The forward's grid: (row tiles, sequences x heads, splits), the rows
    and heads being queries and query heads, or with `packed` the queries x
    group and the key/value heads."""
    group = problem.hq // problem.hk if packed else 1
    heads = problem.hk if packed else problem.hq
    return (problem.lq * group + BM - 1) // BM, problem.batch * heads, splits


def splits_for(problem):
    """How many blocks share the key tiles of one block's rows: one, except
    where few blocks (packed ones when packs_heads) leave SMs idle and there
    are many key tiles (decoding)."""
    if problem.varlen or problem.lq > DECODE_QUERIES:
        return 1
    tiles_x, tiles_y, _ = grid_for(problem, packs_heads(problem), 1)
    tiles = (problem.lk + key_tile(problem.d) - 1) // key_tile(problem.d)
    return max(1, min(tiles // 4, TARGET_BLOCKS // (tiles_x * tiles_y), 64))


def attention(q, k, v, *, causal=False, scale=None, window=None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q=None, max_seqlen_k=None, num_splits=None, out=None, return_lse=False,
              descale_q=None, descale_k=None, descale_v=None, out_dtype=None):
    """softmax(scale * q k^T + mask) v for q (B, Lq, Hq, d) and k, v (B, Lk, Hk, d)
    of f16 or bf16, d 64, 128 or 256, Hk dividing Hq; returns the output
    (B, Lq, Hq, d) in q's dtype, with its log-sum-exp (B, Hq, Lq) in float32
    (natural log) when `return_lse`.

    FP8: q, k and v of f8e4m3 (torch.float8_e4m3fn) hold values divided by
    their per-tensor descales: the real q is q * descale_q, and so on (each
    a number > 0 or an array of one float32 element, read on the host, a
    device array's copied back; 1 where not given). The output is bf16, or
    `out_dtype` f16; the log-sum-exp that of the real values. These run on an
    sm_90a GPU (or the CPU backend, which emulates it), with neither packed
    sequences, `window` nor `num_splits` > 1, and have no backward: on torch
    tensors that autograd is to differentiate, or under torch.compile, they
    are a ValueError. Each call first writes V^T (transposed, its keys
    permuted as the kernel reads them) to a new array: attention_sm90.

    `causal` masks key j for query i when j > i + Lk - Lq (the diagonal at
    the bottom right); `window=(left, right)` keeps only keys with
    -left <= j - i - (Lk - Lq) <= right (-1 or None: no bound; with `causal`,
    right is 0). `scale` (>= 0) defaults to 1 / sqrt(d).

    Packed sequences (varlen): q (total_q, Hq, d) and k, v (total_k, Hk, d)
    hold B sequences one after the other, sequence b at tokens
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] (int32 arrays of B + 1 offsets, on
    the device, with max_seqlen_q and max_seqlen_k the longest lengths as
    ints); the output is q's shape, the log-sum-exp (Hq, total_q).

    `num_splits` blocks share the keys of each (batch, head), their partial
    results merged by a second kernel: by default more than one only for a
    few queries against many keys (decoding). The partial results go to
    float32 arrays kept between calls, a set per shape and stream, as does
    the log-sum-exp of a call that does not return it; a call's
    checks of q, k, v and the options are kept too, for later calls of the
    same shapes, strides, dtypes and options.

    The arrays are torch tensors, CuPy or JAX arrays or DeviceArrays on the
    current backend (NumPy arrays on the CPU backend), each C-contiguous; the
    output (`out`, or a new array in q's library: torch for a tensor, NumPy
    for a NumPy array, else a DeviceArray) too. On torch tensors that
    autograd is to differentiate, or torch.compile traces, this is the torch
    custom op torch.ops.mlirgpu.attention, differentiable (see
    attention_backward); other calls on torch tensors (inference) launch the
    kernels directly, on torch's current stream. Bad shapes and dtypes are a
    LaunchError (a ValueError), what is no array a TypeError.

        o = mlirgpu.ops.attention(q, k, v, causal=True)
    """
    if _float8(q) or (descale_q, descale_k, descale_v, out_dtype) != (None, None, None, None):
        return forward_fp8(q, k, v, causal=causal, scale=scale, window=window, cu_seqlens_q=cu_seqlens_q,
                           cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                           num_splits=num_splits, out=out, return_lse=return_lse, descale_q=descale_q,
                           descale_k=descale_k, descale_v=descale_v, out_dtype=out_dtype)
    if out is None and attention_torch.takes(q) and attention_torch.needs_op(q, k, v):
        o, lse = attention_torch.attention(q, k, v, causal, scale, window, cu_seqlens_q, cu_seqlens_k,
                                           max_seqlen_q, max_seqlen_k, num_splits)
        return (o, lse) if return_lse else o
    if (scale is window is cu_seqlens_q is cu_seqlens_k is max_seqlen_q is max_seqlen_k is num_splits is None
            and not return_lse and (causal is True or causal is False)):
        if out is None:
            try:    # a torch tensor's: torch makes the output in q's dtype, on its device
                out = q.new_empty(q.shape)
            except AttributeError:
                return forward(q, k, v, causal=causal)
        return _KEPT[causal](q, k, v, out)
    return forward(q, k, v, causal=causal, scale=scale, window=window, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                   num_splits=num_splits, out=out, return_lse=return_lse)


def _float8(x):
    """Whether x is an array of f8e4m3 (what the FP8 forward takes). A torch
    tensor's dtype is compared with torch's own: torch.compile traces this
    (it cannot trace mlirgpu's dtype lookup, and would break the graph)."""
    kind = getattr(x, "dtype", None)
    if type(kind).__module__ == "torch":
        return kind == getattr(sys.modules["torch"], "float8_e4m3fn", None)
    return kind is not None and dtype_of(x) == f8e4m3


def _out_dtype(kind):
    """The FP8 forward's out_dtype as an mlirgpu dtype (bf16 by default): given as one,
    a name or a torch dtype."""
    if kind is None:
        return bf16
    given = kind
    if type(kind).__module__ == "torch":
        kind = str(kind).removeprefix("torch.")    # torch.float16 -> "float16"
    try:
        kind = kind if isinstance(kind, DType) else dtype(kind)
    except (TypeError, ValueError):
        kind = None
    if kind not in (bf16, f16):
        raise LaunchError(f"attention's out_dtype (for f8e4m3 inputs) is bf16 or f16, not "
                          f"{getattr(kind, 'name', given)}")
    return kind


def forward_fp8(q, k, v, *, causal=False, scale=None, window=None, cu_seqlens_q=None, cu_seqlens_k=None,
                max_seqlen_q=None, max_seqlen_k=None, num_splits=None, out=None, return_lse=False,
                descale_q=None, descale_k=None, descale_v=None, out_dtype=None):
    """attention of f8e4m3 q, k and v (as it documents): the checks, then V^T and
    the Hopper kernel (attention_sm90.forward_fp8)."""
    if not _float8(q):
        as_array(q, "q")    # a TypeError for what is no array
        raise LaunchError("attention's descale_q, descale_k, descale_v and out_dtype go with f8e4m3 q, k and v, "
                          f"not {getattr(q, 'dtype', type(q).__name__)}")
    unsupported = [name for name, given in (("cu_seqlens (packed sequences)", cu_seqlens_q is not None
                                             or cu_seqlens_k is not None), ("window", window is not None),
                                            ("num_splits > 1", num_splits not in (None, 1)))
                   if given]
    if unsupported or max_seqlen_q is not None or max_seqlen_k is not None:
        raise ValueError(f"attention of f8e4m3 inputs takes equal-length sequences, with no window and one split; "
                         f"not {', '.join(unsupported) or 'max_seqlen'}")
    if attention_torch.takes(q) and attention_torch.needs_op(q, k, v):
        raise ValueError("attention of f8e4m3 inputs has no backward and no torch custom op: call it on tensors "
                         "that need no gradient (or under torch.no_grad()), outside torch.compile")
    p = Problem("attention", q, k, v, causal, scale, None, None, None, None, None, float8=True)
    descales = [per_tensor_scale(1.0 if x is None else x, f"attention's {name}")
                for name, x in (("descale_q", descale_q), ("descale_k", descale_k), ("descale_v", descale_v))]
    for name, x in zip(("descale_q", "descale_k", "descale_v"), descales):
        if not (0 < x < math.inf):
            raise LaunchError(f"attention's {name} is a finite number > 0 (the row maximum is taken before it), "
                              f"not {x}")
    kind = _out_dtype(out_dtype)
    where = backend.backend()
    if where == "cuda":
        chip = default_chip()
        if chip != "sm_90a":
            raise LaunchError(f"attention of f8e4m3 inputs needs an sm_90a GPU (8-bit wgmma), not {chip}")
        if any(x.ptr % 16 for x in (p.q, p.k, p.v)):
            raise LaunchError("attention of f8e4m3 inputs reads q, k and v by TMA: their memory is 16-byte aligned")
    out = output(q, out, tuple(p.q.shape), kind, "attention")
    lse = new_like(q, p.lse_shape(), f32)
    vt = new_like(q, (p.batch, p.hk, p.d, attention_sm90.padded_keys(p.lk, p.d)), f8e4m3)
    if p.tokens_q * p.hq:
        attention_sm90.forward_fp8(p.q, p.k, p.v, as_array(vt, "V^T"), as_array(out, "out"), as_array(lse, "lse"),
                                   causal, descales[0] * descales[1] * p.scale * LOG2E, descales[2],
                                   stream=torch_stream(q))
    return (out, lse) if return_lse else out


def forward(q, k, v, *, causal=False, scale=None, window=None, cu_seqlens_q=None, cu_seqlens_k=None,
            max_seqlen_q=None, max_seqlen_k=None, num_splits=None, out=None, return_lse=False):
    """attention's kernels launched on the arrays as they are (no torch op).
    Without packed sequences, the checks of q, k, v and the options, and
    what follows from them (the Plan), are done once per key (_plan_key)
    and kept: a call whose key is known checks only its `out`."""
    key = plan = None
    if cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None and max_seqlen_k is None:
        views = [as_array(x, name) for name, x in (("q", q), ("k", k), ("v", v))]
        key = _plan_key(views, causal, scale, window, num_splits)
        plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        p = Problem("attention", q, k, v, causal, scale, window, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k)
        plan, views = Plan(p, window, num_splits), (p.q, p.k, p.v)
        if key is not None:
            _keep(key, plan)
    given = out
    if out is None:
        out = new_like(q, plan.shape, plan.dtype)
        target = as_array(out, "out")
    else:
        target = Problem.check_output("attention", "out", out, plan.shape, plan.dtype)
    stream = torch_stream(q)
    if return_lse:
        lse = new_like(q, plan.lse_shape, f32)
        lse_array, guard = as_array(lse, "lse"), contextlib.nullcontext()
    else:
        # The kernels write a log-sum-exp the caller does not want: to a kept array, not a new one each call.
        (lse_array,), guard = _UNWANTED_LSE.get(((*plan.lse_shape, f32),), stream, q)
    with guard:
        plan.launch(*views, target, lse_array, causal, stream, q)
    # A call with an `out` (as _KEPT's are) and no option but `causal`: later ones may launch from C.
    if key is not None and given is not None and scale is window is num_splits is None and not return_lse:
        kept.keep(_KEPT[causal], plan.plans, (q, k, v, out), stream,
                  lambda source: plan.launch_plan(*views, target, lse_array, causal, stream, q, source))
    return (out, lse) if return_lse else out


class Plan:
    """What forward launches for a Problem and `num_splits`, checked: the
    output's and the log-sum-exp's shapes, the views and grids of the
    kernels, and their scalar arguments. It holds no array of the call's
    but the offsets of packed sequences, whose plans are not kept."""

    __slots__ = ("shape", "dtype", "lse_shape", "d", "rows", "q_tokens", "kv_tokens", "lse_rows", "sm90",
                 "decode", "scale_log2", "args", "splits", "kernel", "grid", "shared", "combine", "combine_grid",
                 "partials", "plans")

    def __init__(self, p, window, num_splits):
        packed = packs_heads(p)
        # Decoding (heads packed, or keys split) on an sm_90a GPU: its own kernel, and its own
        # default splits. Where the arrays' addresses do not allow it (supported, at each launch),
        # the mma.sync kernel takes the same splits; one split of unpacked rows is the sm90 kernel's.
        decode = (not p.varlen and window is None and (packed or splits_for(p) > 1)
                  and attention_decode_sm90.takes(p.lq, p.hq, p.hk, p.d) and attention_decode_sm90.available())
        if num_splits is not None:
            splits = num_splits
        elif decode:
            splits = attention_decode_sm90.splits_for(p.batch, p.lq, p.lk, p.hq, p.hk, p.d)
        else:
            splits = splits_for(p)
        if not isinstance(splits, int) or isinstance(splits, bool) or not 1 <= splits <= 65535:
            raise ValueError(f"attention's num_splits is an int from 1 to 65535, not {num_splits!r}")
        if splits > 1 and p.varlen:
            raise ValueError("attention splits the keys of equal-length sequences only: num_splits is 1 with "
                             "cu_seqlens")
        self.decode = decode and (packed or splits > 1)
        self.shape, self.dtype, self.lse_shape, self.d = tuple(p.q.shape), p.dtype, p.lse_shape(), p.d
        self.rows = p.tokens_q * p.hq
        self.q_tokens, self.kv_tokens = (p.tokens_q, p.hq, p.d), (p.tokens_k, p.hk, p.d)
        self.lse_rows = self.lse_shape if p.varlen else (p.batch * p.hq, p.lq)
        # The sm_90a kernel where the arrays allow it: supported() reads their addresses, so each launch asks.
        self.sm90 = splits == 1 and not packed and not p.varlen and window is None
        self.scale_log2, self.args, self.splits = p.scale * LOG2E, p.launch_args(), splits
        self.kernel = kernel_for(p.d, p.banded, p.varlen, splits > 1, packed)
        self.grid, self.shared = grid_for(p, packed, splits), shared_bytes(p.d)
        self.combine = combine_kernel_for(p.d) if splits > 1 else None
        self.combine_grid = ((self.rows + WARPS - 1) // WARPS,)
        self.partials = ((splits * p.tokens_q, p.hq, p.d, f32), (splits * self.lse_rows[0], self.lse_rows[1], f32))
        self.plans = {}    # by stream: the launch plans kept.keep registered

    def launch_plan(self, q, k, v, out, lse, causal, stream, like, source):
        """What `launch` has just launched for these arrays, as launch plans
        for calls (q, k, v, out) on `stream`, read from `source` (kept.keep's
        `make`): decoding on sm_90a only, its kernel then, with split keys,
        the merge of the splits. None where launch took another path."""
        if not (self.rows and self.decode and attention_decode_sm90.aligned(q, k, v)):
            return None
        options = dict(stream=source, stream_only=stream, capture=False, result=3)
        if self.splits == 1:
            return attention_decode_sm90.launch_plan(q, k, v, out, lse, causal, self.scale_log2, out_argument=3,
                                                     **options)
        (parts, part_lse), lock = _WORKSPACES.get(self.partials, stream, like)
        lset = lse.reshape(self.lse_rows)
        merge = self.combine.launch_plan(
            [parts, part_lse, out.reshape(self.q_tokens), lset],
            [("value", parts), ("value", part_lse), ("view", 3, self.q_tokens), ("value", lset)],
            grid=self.combine_grid, block=THREADS, **options)
        decode = merge and attention_decode_sm90.launch_plan(q, k, v, parts, part_lse, causal, self.scale_log2,
                                                             self.splits, then=merge[0], lock=lock, **options)
        return decode and (decode[0], decode[1] + merge[1], decode[2])

    def launch(self, q, k, v, out, lse, causal, stream, like):
        """The kernels on q, k, v, out and lse as they take them (as_array's
        views), on `stream`: torch_stream of `like`, the caller's q (None
        unless it is a CUDA tensor)."""
        if not self.rows:
            return
        if self.sm90 and attention_sm90.supported(q, k, v, self.d):
            attention_sm90.forward(q, k, v, out, lse, causal, self.scale_log2, stream=stream)
            return
        # The plan checked the device (its key holds it); each call's addresses need checking.
        decode = self.decode and attention_decode_sm90.aligned(q, k, v)
        qt, kt, vt = q.reshape(self.q_tokens), k.reshape(self.kv_tokens), v.reshape(self.kv_tokens)
        ot, lset = out.reshape(self.q_tokens), lse.reshape(self.lse_rows)
        if self.splits == 1:
            if decode:
                attention_decode_sm90.forward(q, k, v, out, lse, causal, self.scale_log2, stream=stream)
            else:
                self.kernel(qt, kt, vt, ot, lset, *self.args, grid=self.grid, block=THREADS, shared_mem=self.shared,
                            stream=stream)
            return
        (parts, part_lse), guard = _WORKSPACES.get(self.partials, stream, like)
        with guard:
            if decode:
                attention_decode_sm90.forward(q, k, v, parts, part_lse, causal, self.scale_log2, self.splits, stream)
            else:
                self.kernel(qt, kt, vt, parts, part_lse, *self.args, grid=self.grid, block=THREADS,
                            shared_mem=self.shared, stream=stream)
            self.combine(parts, part_lse, ot, lset, grid=self.combine_grid, block=THREADS, stream=stream)


# Calls attention(q, k, v, causal=False or True[, out]) with no other option, by `causal`: the launches
# of those whose arrays' signature (types, dtypes, shapes, devices) a call has kept (Plan.launch_plan),
# run from C; any other call is attention's.
_KEPT = {causal: Dispatcher(lambda args, kwargs, causal=causal: forward(*args[:3], causal=causal, out=args[3]),
                            "attention") for causal in (False, True)}

# Keys of forward's kept Plans: a growing K/V cache gives every decoding step a key of its own,
# so the oldest goes once there are this many.
PLANS_KEPT = 64
_PLANS = {}
_PLANS_LOCK = threading.Lock()


def _keep(key, plan):
    with _PLANS_LOCK:    # one thread at a time drops the oldest key: two would drop one twice
        if len(_PLANS) >= PLANS_KEPT:
            del _PLANS[next(iter(_PLANS))]
        _PLANS[key] = plan


def _plan_key(views, causal, scale, window, num_splits):
    """What a Plan is a function of: the type, shape, strides and dtype of
    the views of q, k and v (not their addresses), the options (_option), the
    backend and its device (a Plan holds the device's placeholder arrays);
    None where an option has no key (such calls are checked each time)."""
    options = _option(causal), _option(scale), _option(window), _option(num_splits)
    if None in options:
        return None
    (q, k, v), where = views, backend.backend()
    return (type(q), q.shape, q.strides, q.dtype, type(k), k.shape, k.strides, k.dtype, type(v), v.shape,
            v.strides, v.dtype, options, where, current_device() if where == "cuda" else None)


def _option(value):
    """A key equal only for values the checks and kernels take alike: with
    their type (True and 1 differ to the checks) and floats by their bits
    (a kernel is passed the very float a call gave); None for other kinds
    of value."""
    kind = type(value)
    if kind is float:
        return kind, value.hex()
    if value is None or kind is bool or kind is int:
        return kind, value
    if kind is tuple or kind is list:
        items = tuple(_option(x) for x in value)
        return None if None in items else (kind, items)
    return None


# The split forward's float32 partial outputs and log-sum-exps, per shape and stream (arrays.Workspaces):
# the lock keeps another thread's split forward on the stream from writing them between this one's
# two launches.
_WORKSPACES = Workspaces(kept=8)
# The log-sum-exps of calls that do not return them, per shape and stream.
_UNWANTED_LSE = Workspaces(kept=8)
