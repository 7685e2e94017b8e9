"""Scaled dot-product attention, forward, for Hopper (sm_90a): TMA copies,
mbarrier rings, wgmma and warp specialization (FlashAttention-3's plan).

mlirgpu.ops.attention runs this kernel on an sm_90a GPU for head dims 64,
128 and 256; the arrays, masks and results are the ones it documents. The grid
is persistent: a block per multiprocessor, each taking work units in turn
(units i, i + the grid, ...); a unit is BM = 128 query rows of one (batch,
head), a "row block", or in the causal case a pair of them (`place`). A
block has three warpgroups:

- warpgroup 0, the producer, gives its registers away (setmaxnreg) and has
  one thread issue the TMA copies: for each row block, Q's tile, then for
  each key tile K's and V's tiles into the next stage of a ring, each on a
  "full" mbarrier of its own, so that S = Q K^T starts before V has landed.
  The ring runs on from one row block to the next, and Q has two tiles
  (one at d = 256 in 16 bits: q_buffers), each refilled as soon as the
  consumers' last S = Q K^T has read it ("q_empty"): the next row block's
  Q lands while the consumers work on this one's, and its K and V tiles
  while they finish it and store its output. The 4-d tensor maps of (batch, sequence, heads, d)
  read zeros past Lq and Lk.
- warpgroups 1 and 2, the consumers, claim the registers and own 64 query
  rows each. Per key tile: S = Q K^T on wgmma (both operands K-major in
  shared memory), the online softmax on S's accumulators in registers (a
  row is spread over the 4 lanes of a quad: two shuffles; scale * log2(e)
  folded into the one multiply before exp2, which is one ex2.approx.ftz
  instruction: the accurate form's subnormal handling would take three
  more per score), P rounded to the inputs' type where it lies: S's
  accumulators are in the layout of wgmma's A operand in registers, so
  O += P V (V MN-major, as it lies in memory) reads P from registers with
  no trip through shared memory. A stage's K goes back to the producer
  as soon as S = Q K^T has read it (its "k_empty" mbarrier), its V once
  O += P V has ("v_empty"): the copy of a later tile's K starts while this
  tile's V is still being read.
- The causal mask and the tail of Lk are applied on the tiles that cross
  them only; key tiles wholly above the diagonal are never loaded. A causal
  unit pairs row blocks j and (row blocks - 1 - j), which read as many key
  tiles together whichever j, so that blocks taking units in turn finish
  together.

FP8 (`forward_fp8`, the same kernel built with `fp8`): q, k and v of e4m3,
the output bf16 or f16. A wgmma reads 32 bytes of K (k32), and 8-bit operands
K-major only, so O += P V needs V^T (d x keys) in shared memory: a small
kernel first writes V^T of the call's v to (B, Hk, d, keys rounded up to a
key tile), which TMA reads in boxes of (d, BN). P's 8-bit A fragments give a
lane 4 consecutive keys where S's accumulators give it pairs 8 apart; rather
than exchange P's bytes between lanes, V^T holds each 32 keys in the order
P's registers hold them (`permuted_key`; the sum over keys does not depend on
their order, only on P's and V's agreeing). The descales of q and k join the
softmax's scale in the one multiply before exp2; the row maximum is still
subtracted, so P <= 1 before it is rounded to e4m3; O is multiplied by v's
descale with 1 / l at the end.

Overlap: in each consumer the loop is software-pipelined (S of tile n is
issued before O += P V of tile n - 1, and at d = 256 (16-bit inputs) its softmax runs while
the tensor cores do that product: `orders_softmax`), and the two consumers
take turns at issuing their wgmmas (named barriers), so that one's softmax
runs under the other's.
"""
import functools
import math

from .. import cuda
from .. import language as lang
from .._mlirgpu import TensorMap, f8e4m3, f32, i32, index, u32
from ..layout import ComposedLayout, Layout
from ..layout import wgmma as wgmma_layout
from ..runtime import backend
from ..runtime.compiled import default_chip
from ..runtime.kernel import kernel
from ..runtime.tensormap import tensor_map

__all__ = ["HEAD_DIMS", "supported", "forward", "forward_fp8", "transposed_values"]

HEAD_DIMS = (64, 128, 256)
BM = 128                    # query rows a block owns: 64 per consumer warpgroup
CONSUMERS = 2
THREADS = 128 * (1 + CONSUMERS)
# After setmaxnreg the warpgroups hold what the launch gave the block, 168 a thread (65536 / 384,
# in steps of 8): 24 + 2 x 240 = 3 x 168. Asking for more would leave the consumers' increase
# waiting forever for registers no warpgroup gives back.
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 24, 240
BOX = 64                    # columns of a TMA box: one 128-byte row of 16-bit elements, the swizzle's
KEY_GROUP = 32              # keys of an 8-bit P fragment, within which V^T's keys are permuted (fp8)


def key_tile(head_dim):
    """Keys per stage, BN: 128, or 64 at d = 256, where O's accumulators take 128 of a
    consumer thread's registers and S's, P's and the next S's must fit beside them."""
    return 64 if head_dim == 256 else 128


def stages(head_dim, fp8=False):
    """K/V stages of the ring: 4 at d = 64, 2 at d = 128 and 256 in 16 bits (beside Q's
    tiles: q_buffers), 3 at d = 128 in 8 bits."""
    return {64: 4, 128: 3 if fp8 else 2, 256: 2}[head_dim]


def q_buffers(head_dim, fp8=False):
    """Q's tiles: two where they fit beside the K/V stages, so that the next row block's Q
    lands while this one's last products and epilogue run (with one, its copy starts only
    once this row block's last S = Q K^T is done); one at d = 256 in 16 bits."""
    return 1 if head_dim == 256 and not fp8 else 2


def orders_softmax(head_dim, fp8=False):
    """Whether the kernel stores a value of each softmax before waiting for the
    previous O += P V (see `order_softmax`): at d = 256 with 16-bit inputs, where
    that product is longest. On an H200 the overlap it gives measured faster at
    d = 256, the same at d = 128, and slower at d = 64, where the product is
    short. (8-bit shared memory takes no float the kernel could store.)"""
    return head_dim == 256 and not fp8


def shared_bytes(head_dim, fp8=False):
    """Q's tiles, the K and V stages (16-bit elements, or 8-bit with `fp8`), with
    orders_softmax an element per consumer thread, and 1 KB to put the first tile on
    a 1024-byte boundary (the swizzle's period)."""
    order = 128 * CONSUMERS if orders_softmax(head_dim, fp8) else 0
    tiles = q_buffers(head_dim, fp8) * BM * head_dim + 2 * stages(head_dim, fp8) * key_tile(head_dim) * head_dim
    return (tiles + order) * (1 if fp8 else 2) + 1024


def box_columns(head_dim, fp8):
    """Columns of d in a TMA box of Q or K: a 128-byte row (64 16-bit elements, 128
    8-bit ones), or the whole of d = 64 in 8-bit elements (a 64-byte row)."""
    return min(head_dim, 128) if fp8 else BOX


def swizzle(row_bytes):
    """The swizzle of a tile of rows of `row_bytes` (64 or 128) bytes, as wide as them."""
    return f"{row_bytes}B"


# The steps from here to _build serve both Hopper attention kernels, this module's
# forward and attention_decode_sm90's decoding kernel: they differ in their tile sizes
# and in what a row is (a query of one head, or a (query, query head) pair of a packed
# group), not in these steps. Each emits traced ops where a kernel calls it. Outside a
# kernel's body a Python `if` takes Python values only (sizes, `causal`); a traced
# condition there would need lang.select.

def pairwise(op, values):
    """op folded over `values` as a balanced tree: the 32 scores of a row a thread
    holds reduce in a chain of 5 dependent steps, not 31, each of which waits for
    the result of the one before."""
    while len(values) > 1:
        values = [op(x, y) for x, y in zip(values[::2], values[1::2])] + values[len(values) // 2 * 2:]
    return values[0]


def online_softmax(scores, m, l, scale_log2):
    """The online softmax's step on an m64nN accumulator S (`scores`, its N/2
    values of this thread), row by row (each row on the 4 lanes of a quad: two
    shuffles give its maximum): P = exp2(S * scale_log2 - m_new) and the running
    maxima m and row sums l of the thread's two rows; returns P, m, l and the
    factors exp2(m_old - m_new) that rescale O's rows."""
    minus_inf = lang.constant(float("-inf"), f32)
    p, m, l, alpha = list(scores), list(m), list(l), [None, None]
    for half in lang.static_range(2):
        top = pairwise(lang.math.max, [scores[e] for e in lang.static_range(len(scores)) if e // 2 % 2 == half])
        top = lang.math.max(top, lang.warp.shfl_xor(top, 1))
        top = lang.math.max(top, lang.warp.shfl_xor(top, 2))
        new_m = lang.math.max(m[half], top * scale_log2)
        # A row that has seen only masked keys keeps -inf; subtracting 0 then gives exp2(-inf) = 0.
        shift = lang.select(new_m == minus_inf, lang.constant(0.0, f32), new_m)
        alpha[half] = lang.math.exp2_approx(m[half] - shift)
        for e in lang.static_range(len(scores)):
            if e // 2 % 2 == half:
                p[e] = lang.math.exp2_approx(scores[e] * scale_log2 - shift)
        total = pairwise(lambda x, y: x + y, [p[e] for e in lang.static_range(len(scores)) if e // 2 % 2 == half])
        l[half] = l[half] * alpha[half] + total
        m[half] = new_m
    return p, m, l, alpha


def key_tiles(query0, queries, keys, lq, lk, causal):
    """Tiles of `keys` keys that `queries` queries from query0 read: all of Lk's, or with
    `causal` those up to the last key the last of them (before Lq) sees, none if it sees
    no key. A block never loads the tiles past them."""
    tiles = (lk + keys - 1) // keys
    if causal:
        seen = lang.math.min(query0 + queries, lq) + lk - lq     # keys the last query sees
        tiles = lang.math.max(lang.math.min(tiles, (seen + keys - 1) // keys), 0)
    return tiles


def issue_scores(smem, q_at, q_box_rows, k_at, keys, head_dim, columns):
    """Issues S = Q K^T (one wgmma group) for a warpgroup's 64 rows of Q at q_at and
    the `keys` keys of K at k_at; returns S's accumulators. Both lie in K-major boxes
    of `columns` columns of d (a 128-byte row, or 64 bytes for 8-bit d = 64), Q's boxes
    of `q_box_rows` rows (the block's, of which the warpgroup reads 64), K's of `keys`.
    A wgmma reads 32 bytes of d: 16 columns of smem's 16-bit elements, 32 of 8-bit."""
    size = smem.dtype.itemsize
    q_tile = wgmma_layout.tile_layout((64, columns), size, swizzle(columns * size))
    k_tile = wgmma_layout.tile_layout((keys, columns), size, swizzle(columns * size))
    per_box = columns // (32 // size)
    scores = lang.wgmma.zeros(keys)
    lang.wgmma.fence()
    for kk in lang.static_range(head_dim // (32 // size)):
        a = lang.wgmma.descriptor(smem, q_tile, offset=q_at + kk // per_box * (q_box_rows * columns),
                                  k_block=kk % per_box)
        b = lang.wgmma.descriptor(smem, k_tile, offset=k_at + kk // per_box * (keys * columns), k_block=kk % per_box)
        scores = lang.wgmma.mma(scores, a, b, n=keys)
    lang.wgmma.commit_group()
    return scores


def fragments(p, dtype):
    """P rounded to `dtype` as the A operand of O += P V, its fragments' words (4 per
    16 keys, or per 32 keys of 8-bit floats) in one list: what a loop carries."""
    return [word for fragment in lang.wgmma.fragments(p, dtype) for word in fragment.words]


def load_keys(k_map, smem, full, stage, b, n0, kv_head, k_at, keys, head_dim, box_columns):
    """Has the copy engine bring the K tile of `keys` keys from n0 (of batch b and
    key/value head kv_head) to k_at, as issue_scores reads it (head_dim / box_columns
    boxes of keys x box_columns), its bytes counted on barrier `stage` of `full`."""
    full.arrive_expect_tx(stage, keys * head_dim * smem.dtype.itemsize)
    for j in lang.static_range(head_dim // box_columns):
        lang.tma.load(k_map, smem, (b, n0, kv_head, j * box_columns), full, stage,
                      offset=k_at + j * (keys * box_columns))


def load_values(v_map, smem, full, stage, b, n0, kv_head, v_at, keys, head_dim):
    """As load_keys for 16-bit V, as issue_values reads it: per 64 keys, head_dim / 64
    boxes of 64 keys x 64 columns."""
    full.arrive_expect_tx(stage, keys * head_dim * smem.dtype.itemsize)
    for i in lang.static_range(keys // BOX):
        for j in lang.static_range(head_dim // BOX):
            lang.tma.load(v_map, smem, (b, n0 + i * BOX, kv_head, j * BOX), full, stage,
                          offset=v_at + i * (BOX * head_dim) + j * (BOX * BOX))


def issue_values(smem, acc, p, v_at, keys, head_dim):
    """Issues O += P V (one wgmma group) for P (`fragments`' words, of smem's dtype) and
    the `keys` keys of V at v_at; returns O's accumulators. 16-bit V lies as in memory,
    MN-major: per 64 keys, d/64 boxes of 64 keys x 64 columns. wgmma reads 8-bit B
    K-major only, so 8-bit V comes transposed, one box of d rows of `keys` keys, the
    keys within each 32 in the order of P's fragment columns (transposed_values)."""
    size = smem.dtype.itemsize
    if size == 1:
        v_tile = wgmma_layout.tile_layout((head_dim, keys), 1, swizzle(keys))
    else:
        v_tile = ComposedLayout(wgmma_layout.swizzle_for("128B", 2), 0,
                                Layout(((BOX, head_dim // BOX), (8, BOX // 8)),
                                       ((1, BOX * BOX), (BOX, 8 * BOX))))
    lang.wgmma.fence()
    for kk in lang.static_range(keys // (32 // size)):
        if size == 1:
            b = lang.wgmma.descriptor(smem, v_tile, offset=v_at, k_block=kk)
        else:
            b = lang.wgmma.descriptor(smem, v_tile, offset=v_at + kk // 4 * (BOX * head_dim), k_block=kk % 4,
                                      major="MN")
        acc = lang.wgmma.mma(acc, lang.wgmma.Fragment(p[4 * kk:4 * kk + 4], smem.dtype), b, n=head_dim)
    lang.wgmma.commit_group()
    return acc


def crosses(n0, keys, query0, lq, lk, causal):
    """Whether the key tile of `keys` keys from n0 has keys that a warpgroup's rows,
    of queries from query0 on, do not see: keys past Lk, or with `causal` past the
    first query's diagonal (bottom-right aligned). Only such tiles are `masked`."""
    edge = n0 + keys > lk
    if causal:
        edge = edge | (n0 + keys - 1 > query0 + lk - lq)
    return edge


def masked(scores, t, n0, queries, lq, lk, causal):
    """S (an m64nN accumulator of thread t, keys from n0) with -inf for the keys past
    Lk and, with `causal`, past the diagonal of each row's query (`queries`: those of
    the thread's two rows)."""
    minus_inf = lang.constant(float("-inf"), f32)
    result = []
    for e in lang.static_range(len(scores)):
        _, column = lang.wgmma.accumulator_coordinates(e, t)
        key = n0 + column
        hidden = key >= lk
        if causal:
            hidden = hidden | (key + lq > queries[e // 2 % 2] + lk)
        result.append(lang.select(hidden, minus_inf, scores[e]))
    return result


def row_normalizer(share, scale):
    """The sum of one of a thread's two rows, from the shares of it the 4 lanes of its
    quad hold (two shuffles), and what the row's O is multiplied by: scale / sum, or 0
    for a row that saw no key (sum 0)."""
    total = share
    total += lang.warp.shfl_xor(total, 1)
    total += lang.warp.shfl_xor(total, 2)
    return total, lang.select(total == 0.0, lang.constant(0.0, f32), scale / total)


def store_row(o, sequence, query, head, acc, half, t, inverse):
    """Stores thread t's values of one of its two rows of O (`half` 0: row r of the
    64, 1: row r + 8), times `inverse` and in o's dtype, to o[sequence + query, head]
    (`sequence`: o's row of the sequence's first query): pairs of adjacent columns, 8
    apart."""
    for e in lang.static_range(0, len(acc), 4):
        _, column = lang.wgmma.accumulator_coordinates(e + 2 * half, t)
        lang.vstore(o, (sequence + query, head, column), (lang.cast(acc[e + 2 * half] * inverse, o.dtype),
                                                          lang.cast(acc[e + 2 * half + 1] * inverse, o.dtype)))


def log_sum_exp(m, total):
    """A row's log-sum-exp, in natural log, from its running maximum m (of scaled scores,
    log2 units) and its sum (`row_normalizer`'s); -inf for a row that saw no key."""
    return lang.select(total == 0.0, lang.constant(float("-inf"), f32), (m + lang.math.log2(total)) * math.log(2.0))


def _build(head_dim, causal, fp8=False):
    """The kernel for one head dimension and masking, generic over the output's dtype:
    the inputs are of that dtype, or with `fp8` of f8e4m3 (V given as V^T,
    transposed_values)."""
    D, STAGES, BN, QB = head_dim, stages(head_dim, fp8), key_tile(head_dim), q_buffers(head_dim, fp8)
    SIZE = 1 if fp8 else 2                  # bytes of an input element
    KB = box_columns(D, fp8)                # columns of d in a box of Q or K
    # Element offsets from the first 1024-byte boundary: Q's QB tiles (D/KB boxes of BM
    # rows each), each stage's K (D/KB boxes of BN keys) and V (16-bit: per 64 keys, D/64
    # boxes of 64 keys; 8-bit: one box of V^T, D rows of BN keys).
    K_AT = QB * BM * D
    V_AT = K_AT + STAGES * BN * D
    ORDER_AT = V_AT + STAGES * BN * D     # an element per consumer thread (order_softmax)
    TILE_BYTES = BN * D * SIZE
    T = lang.generics("T")

    def order_softmax(smem, slot, l):
        """Stores a value of the softmax just computed (its row sums) to the thread's
        shared `slot`. ptxas moves no shared-memory access across a wgmma wait, but
        it does move arithmetic: without this store, it puts the wait for O += P V
        before the softmax, which then no longer runs while the tensor cores do that
        product."""
        smem[slot] = lang.cast(l[0] + l[1], smem.dtype)

    def place(unit, sub, row_blocks, hq):
        """(batch, head, batch x head, first row) of work unit `unit`'s `sub`-th row
        block: units take a head's row blocks one after the other (the blocks running
        together then share K and V in L2); with `causal`, a unit is the pair of row
        blocks j and row_blocks - 1 - j, the longer first, which together read the same
        number of key tiles whichever j: persistent blocks taking units in turn then
        get equal work."""
        unit = lang.cast(unit, i32)
        if causal:
            pairs = (row_blocks + 1) // 2
            bh, j = unit // pairs, unit % pairs
            row_block = lang.select(sub == 0, row_blocks - 1 - j, j)
        else:
            bh, row_block = unit // row_blocks, unit % row_blocks
        return bh // hq, bh % hq, bh, row_block * BM

    def row_blocks_of(unit, row_blocks):
        """The row blocks of work unit `unit`: 2, or 1 for the middle one of an odd number."""
        if not causal:
            return 1
        j = lang.cast(unit, i32) % ((row_blocks + 1) // 2)
        return lang.select(j == row_blocks - 1 - j, lang.constant(1, i32), lang.constant(2, i32))

    @kernel(generics=(T,), max_threads=THREADS, min_blocks=1)
    def attention_forward_sm90(q_map: TensorMap, k_map: TensorMap, v_map: TensorMap,
                               o: lang.memref[None, None, D, T].noalias(),
                               lse: lang.memref[None, None, f32].noalias(),
                               lq: i32, lk: i32, group: i32, scale_log2: f32, out_scale: f32):
        """o is (B x Lq, Hq, D), lse (B x Hq, Lq); the maps address q (B, Lq, Hq, D)
        and k (B, Lk, Hk, D) in boxes of (1, rows, 1, KB), and v (B, Lk, Hk, D) in
        boxes of (1, 64, 1, 64), or with `fp8` V^T (B, Hk, D, keys) in boxes of
        (1, 1, D, BN); query head h reads key/value head h // group. O is
        multiplied by out_scale (with `fp8`: V's descale; 1 otherwise, unread).
        Persistent: block i takes work units i, i + the grid, ... (`place`), and
        the K/V ring, its phases and Q's tile run on from one unit to the next."""
        inputs = f8e4m3 if fp8 else o.dtype
        smem = lang.shared.dynamic(inputs)
        base = lang.shared.address(smem)
        first = lang.cast(((base + 1023) & 0xFFFFFC00) - base, index) // SIZE
        q_full = lang.mbarrier.array(QB)
        q_empty = lang.mbarrier.array(QB)
        k_full = lang.mbarrier.array(STAGES)
        v_full = lang.mbarrier.array(STAGES)
        k_empty = lang.mbarrier.array(STAGES)
        v_empty = lang.mbarrier.array(STAGES)
        wg = lang.warpgroup.index()
        t = lang.warpgroup.thread_index()
        hq = lang.cast(o.shape[1], i32)
        row_blocks = (lq + BM - 1) // BM
        per_head = (row_blocks + 1) // 2 if causal else row_blocks
        units = lse.shape[0] * lang.cast(per_head, index)
        if lang.thread_idx.x == 0:
            for s in lang.static_range(QB):
                q_full.init(s, 1)
                q_empty.init(s, 4 * CONSUMERS)  # one arrival per consumer warp
            for s in lang.static_range(STAGES):
                k_full.init(s, 1)
                v_full.init(s, 1)
                k_empty.init(s, 4 * CONSUMERS)
                v_empty.init(s, 4 * CONSUMERS)
            lang.mbarrier.fence_init()
        lang.syncthreads()

        if wg == 0:
            lang.warpgroup.set_max_registers(PRODUCER_REGISTERS, increase=False)
            if t == 0:
                it = lang.constant(0, i32)      # key tiles loaded, over all units: the ring's position
                loaded = lang.constant(0, i32)  # Q tiles loaded
                for unit in range(lang.block_idx.x, units, lang.grid_dim.x):
                    for sub in range(row_blocks_of(unit, row_blocks)):
                        b, h, _, m0 = place(unit, sub, row_blocks, hq)
                        kv_head = h // group
                        q = loaded % QB
                        if loaded >= QB:
                            # The consumers' last S = Q K^T has read the tile's last Q.
                            q_empty.wait(q, (loaded // QB + 1) % 2)
                        q_full.arrive_expect_tx(q, BM * D * SIZE)
                        for j in lang.static_range(D // KB):
                            lang.tma.load(q_map, smem, (b, m0, h, j * KB), q_full, q,
                                          offset=first + lang.cast(q, index) * (BM * D) + j * (BM * KB))
                        loaded = loaded + 1
                        for n in range(key_tiles(m0, BM, BN, lq, lk, causal)):
                            s = it % STAGES
                            if it >= STAGES:
                                k_empty.wait(s, (it // STAGES + 1) % 2)   # the consumers are done with its last K
                            at = first + lang.cast(s, index) * (BN * D)
                            load_keys(k_map, smem, k_full, s, b, n * BN, kv_head, at + K_AT, BN, D, KB)
                            if it >= STAGES:
                                v_empty.wait(s, (it // STAGES + 1) % 2)   # and with its last V
                            if fp8:
                                v_full.arrive_expect_tx(s, TILE_BYTES)
                                lang.tma.load(v_map, smem, (b, kv_head, 0, n * BN), v_full, s, offset=at + V_AT)
                            else:
                                load_values(v_map, smem, v_full, s, b, n * BN, kv_head, at + V_AT, BN, D)
                            it = it + 1
        else:
            lang.warpgroup.set_max_registers(CONSUMER_REGISTERS, increase=True)
            # Read from lane 0, the warpgroup is visibly the same in the whole warp: ptxas then keeps
            # the wgmmas after the turn-taking branches asynchronous (else its warning C7520).
            w = lang.warp.shfl_idx(wg - 1, 0)
            lane = t % 32
            slot = first + ORDER_AT + lang.cast(w * 128 + t, index)
            minus_inf = lang.constant(float("-inf"), f32)
            # This thread's rows of the warpgroup's 64 (accumulator values 4i, 4i+1: row r; 4i+2, 4i+3: r + 8).
            r, _ = lang.wgmma.accumulator_coordinates(0, t)
            it = lang.constant(0, i32)          # key tiles consumed, over all units
            done = lang.constant(0, i32)        # row blocks done
            taken = lang.constant(0, i32)       # whether the warpgroups have taken turns yet
            for unit in range(lang.block_idx.x, units, lang.grid_dim.x):
                for sub in range(row_blocks_of(unit, row_blocks)):
                    # The row block's batch and head are placed again for the epilogue: kept live
                    # across the key loop, they made ptxas spill at d = 128 with the causal mask.
                    m0 = place(unit, sub, row_blocks, hq)[3]
                    tiles = key_tiles(m0, BM, BN, lq, lk, causal)
                    rows = [m0 + w * 64 + r, m0 + w * 64 + r + 8]
                    m = [minus_inf, minus_inf]      # running maximum of scaled scores, log2 units
                    l = [lang.constant(0.0, f32), lang.constant(0.0, f32)]    # this lane's share of the row sums
                    acc = lang.wgmma.zeros(D)
                    q = done % QB
                    q_at = first + lang.cast(q, index) * (BM * D) + lang.cast(w, index) * (64 * KB)
                    q_full.wait(q, done // QB % 2)
                    # Software-pipelined: S of tile n is issued before O += P V of tile n - 1, and its
                    # softmax runs while the tensor cores do that product. The two warpgroups take turns
                    # at issuing their wgmmas (named barriers 3 + w, which the other warpgroup arrives
                    # at once it has issued its own), so that one's softmax runs under the other's
                    # products. Each turn waits for the other warpgroup's last: the first warpgroup's
                    # first turn of a row block for the second's last turn of the one before, so that
                    # neither arrives twice at a barrier the other has not yet passed.
                    if tiles > 0:
                        if w == 1:
                            lang.warpgroup.barrier(4, 256)
                        elif taken > 0:
                            lang.warpgroup.barrier(3, 256)
                        taken = lang.constant(1, i32)
                        k_full.wait(it % STAGES, it // STAGES % 2)
                        scores = issue_scores(smem, q_at, BM,
                                              first + lang.cast(it % STAGES, index) * (BN * D) + K_AT, BN, D, KB)
                        lang.warpgroup.arrive(4 - w, 256)
                        scores = lang.wgmma.wait_group(0, scores)
                        if lane == 0:
                            k_empty.arrive(it % STAGES)
                        if crosses(0, BN, m0 + w * 64, lq, lk, causal):
                            scores = masked(scores, t, 0, rows, lq, lk, causal)
                        scores, m, l = online_softmax(scores, m, l, scale_log2)[:3]
                        p = fragments(scores, inputs)
                        for n in range(1, tiles):
                            g = it + n
                            s, before = g % STAGES, (g - 1) % STAGES
                            n0 = lang.cast(n, i32) * BN
                            lang.warpgroup.barrier(3 + w, 256)
                            k_full.wait(s, g // STAGES % 2)
                            scores = issue_scores(smem, q_at, BM, first + lang.cast(s, index) * (BN * D) + K_AT,
                                                  BN, D, KB)
                            v_full.wait(before, (g - 1) // STAGES % 2)
                            acc = issue_values(smem, acc, p, first + lang.cast(before, index) * (BN * D) + V_AT,
                                               BN, D)
                            lang.warpgroup.arrive(4 - w, 256)
                            scores = lang.wgmma.wait_group(1, scores)
                            if lane == 0:
                                k_empty.arrive(s)       # S = Q K^T, issued first, is done
                            if crosses(n0, BN, m0 + w * 64, lq, lk, causal):
                                scores = masked(scores, t, n0, rows, lq, lk, causal)
                            scores, m, l, alpha = online_softmax(scores, m, l, scale_log2)
                            if orders_softmax(D, fp8):
                                order_softmax(smem, slot, l)
                            acc = lang.wgmma.wait_group(0, acc)
                            if lane == 0:
                                v_empty.arrive(before)
                            acc = [acc[e] * alpha[e // 2 % 2] for e in lang.static_range(D // 2)]
                            # Only now: the product just waited for read the previous P's registers.
                            p = fragments(scores, inputs)
                        # Every S = Q K^T is done: Q's tile may take a later row block's.
                        if lane == 0:
                            q_empty.arrive(q)
                        last = it + tiles - 1
                        lang.warpgroup.barrier(3 + w, 256)
                        v_full.wait(last % STAGES, last // STAGES % 2)
                        acc = issue_values(smem, acc, p, first + lang.cast(last % STAGES, index) * (BN * D) + V_AT,
                                           BN, D)
                        # The second warpgroup's last turn; the first's next first turn.
                        lang.warpgroup.arrive(4 - w, 256)
                        acc = lang.wgmma.wait_group(0, acc)
                        if lane == 0:
                            v_empty.arrive(last % STAGES)
                    elif lane == 0:
                        q_empty.arrive(q)           # rows that see no key: Q is not read
                    it = it + tiles
                    done = done + 1
                    # O / l and the log-sum-exp (natural log), row by row; a row that saw no key gets 0 and -inf.
                    b, h, bh, _ = place(unit, sub, row_blocks, hq)
                    for half in lang.static_range(2):
                        total, inverse = row_normalizer(l[half], out_scale if fp8 else 1.0)
                        row = rows[half]
                        if row < lq:
                            store_row(o, b * lq, row, h, acc, half, t, inverse)
                            if lane % 4 == 0:
                                lse[bh, row] = log_sum_exp(m[half], total)
            if (w == 0) & (taken > 0):
                lang.warpgroup.barrier(3, 256)      # the second warpgroup's arrival after its last turn

    return attention_forward_sm90


@functools.cache
def kernel_for(head_dim, causal, fp8=False):
    """The kernel of (head dimension, causal, 8-bit inputs), built once; its output's
    dtype is a generic."""
    return _build(head_dim, bool(causal), bool(fp8))


TRANSPOSE_THREADS = 256
TRANSPOSE_KEYS = 64         # keys of V a block transposes: padded_keys is a multiple of them
VECTOR = 16                 # e4m3 elements of a 16-byte access


def permuted_key(j):
    """The key, of a group of KEY_GROUP, at column j of the group in V^T (an int or a
    traced index): P's 8-bit fragments hold a lane's columns of S 2q, 2q + 1, 2q + 8,
    2q + 9 (and 16 further) where the k32 A operand's columns 4q .. 4q + 3 are, so
    V^T's K rows follow them (mg.wgmma.fragment_columns). A key stays in its half of
    the group: a 16-byte vector of V^T's columns holds 16 keys that lie together in V."""
    return 16 * (j // 16) + 2 * (j % 16 // 4) + j % 2 + 8 * (j % 4 // 2)


def tile_column(key, d):
    """Where element d of a key's row of V lies in the transposing kernel's shared tile
    (TRANSPOSE_KEYS rows of D): its 16-byte vector XOR-ed with the key's 16 (0 to 3), so
    that a warp reading a key of each 16 at 8 d's meets 8 words in 8 banks; unswizzled,
    rows of 64 bytes or more would put the 4 keys in one bank."""
    return d ^ (key // VECTOR % (TRANSPOSE_KEYS // VECTOR) * VECTOR)


@functools.cache
def transpose_kernel(head_dim):
    """The kernel writing V^T for the 8-bit forward (transposed_values), built once."""
    D = head_dim
    ROW_VECTORS = D // VECTOR                   # of a key's row of V
    COLUMN_VECTORS = TRANSPOSE_KEYS // VECTOR   # of a row of V^T's tile

    @kernel(max_threads=TRANSPOSE_THREADS)
    def attention_values_fp8(v: lang.memref[None, None, D, f8e4m3].readonly(),
                             vt: lang.memref[None, D, None, f8e4m3].noalias(), lk: i32):
        """v is (B x Lk, Hk, D), vt (B x Hk, D, keys): block (x, y) writes V^T's
        columns of the TRANSPOSE_KEYS keys from TRANSPOSE_KEYS x of (batch, head) y,
        every element: the keys in permuted_key's order, zeros for keys past Lk. Both
        V and V^T are read and written in 16-byte vectors, consecutive threads on
        consecutive vectors of a row; the transpose goes through shared memory."""
        # The tile, TRANSPOSE_KEYS rows of D, and the same bytes as words: 8-bit floats have
        # no constants, so the zeros past Lk are written as words.
        tile, words = lang.shared.dynamic(f8e4m3), lang.shared.dynamic(u32)
        hk = v.shape[1]
        bh = lang.block_idx.y
        b, h = bh // hk, bh % hk
        keys = lang.cast(lk, index)
        first = lang.block_idx.x * TRANSPOSE_KEYS
        for step in lang.static_range(0, TRANSPOSE_KEYS * ROW_VECTORS, TRANSPOSE_THREADS):
            i = step + lang.thread_idx.x
            key, d = i // ROW_VECTORS, i % ROW_VECTORS * VECTOR
            at = key * D + tile_column(key, d)
            if first + key < keys:
                lang.vstore(tile, at, lang.vload(v, (b * keys + first + key, h, d), VECTOR))
            else:
                lang.vstore(words, at // 4, (0, 0, 0, 0))
        lang.syncthreads()
        for step in lang.static_range(0, D * COLUMN_VECTORS, TRANSPOSE_THREADS):
            i = step + lang.thread_idx.x
            d, column = i // COLUMN_VECTORS, i % COLUMN_VECTORS * VECTOR
            # column is a multiple of 16 and permuted_key keeps a key in its 16.
            row = [tile[(column + permuted_key(j)) * D + tile_column(column, d)] for j in lang.static_range(VECTOR)]
            lang.vstore(vt, (bh, d, first + column), tuple(row))

    return attention_values_fp8


def padded_keys(lk, head_dim):
    """Keys of V^T's rows: Lk rounded up to a whole key tile."""
    return (lk + key_tile(head_dim) - 1) // key_tile(head_dim) * key_tile(head_dim)


def transposed_values(v, vt, stream=None):
    """Writes V^T of v (B, Lk, Hk, d), f8e4m3, into every element of vt (B, Hk, d,
    padded_keys): each key tile's keys, 32 at a time, in permuted_key's order, so that
    the 8-bit wgmma of O += P V reads V K-major with P's fragments as they are, and
    zeros past Lk, where P's zeros must meet no NaN."""
    batch, lk, hk, d = tuple(v.shape)
    if batch * hk == 0 or lk == 0:
        return
    transpose_kernel(d)(v.reshape(batch * lk, hk, d), vt.reshape(batch * hk, d, vt.shape[3]), lk,
                        grid=(padded_keys(lk, d) // TRANSPOSE_KEYS, batch * hk), block=TRANSPOSE_THREADS,
                        shared_mem=TRANSPOSE_KEYS * d, stream=stream)


def supported(q, k, v, head_dim):
    """Whether this kernel takes the case: an sm_90a GPU, head dims 64, 128 and
    256, and q, k and v (their memory) 16-byte aligned, as TMA reads it.
    Arrays without a device pointer (NumPy's) are left to the other kernel,
    whose launch says what is wrong with them."""
    return (backend.backend() == "cuda" and head_dim in HEAD_DIMS
            and all(hasattr(x, "ptr") and x.ptr % 16 == 0 for x in (q, k, v)) and default_chip() == "sm_90a")


def units(lq, heads, causal):
    """The kernel's work units for Lq query rows and `heads` (batch x query heads):
    a row block each, or with `causal` a pair of them (`place`)."""
    row_blocks = (lq + BM - 1) // BM
    return heads * ((row_blocks + 1) // 2 if causal else row_blocks)


def _grid(batch, lq, hq, causal, blocks):
    """The persistent blocks to launch: `blocks` (by default one per multiprocessor of
    the GPU, 2 on the CPU backend), at most the work units."""
    if blocks is None:
        blocks = cuda.Device(cuda.current_device()).multiprocessor_count if backend.backend() == "cuda" else 2
    return min(blocks, units(lq, batch * hq, causal))


def forward(q, k, v, out, lse, causal, scale_log2, stream=None, blocks=None):
    """out and lse (as mlirgpu.ops.attention documents them) of q (B, Lq, Hq, d)
    and k, v (B, Lk, Hk, d), C-contiguous arrays of the current backend
    (DeviceArrays, or NumPy arrays on the CPU backend). `blocks`: the persistent
    blocks to launch (at most the work units); by default one per multiprocessor
    of the GPU, 2 on the CPU backend."""
    (batch, lq, hq, d), (_, lk, hk, _) = tuple(q.shape), tuple(k.shape)
    grid = _grid(batch, lq, hq, causal, blocks)
    if grid == 0:    # no query rows or heads: nothing to write
        return
    q_map = tensor_map(q, box=(1, BM, 1, BOX), swizzle="128B")
    k_map = tensor_map(k, box=(1, key_tile(d), 1, BOX), swizzle="128B")
    v_map = tensor_map(v, box=(1, BOX, 1, BOX), swizzle="128B")
    kernel_for(d, causal)(q_map, k_map, v_map, out.reshape(batch * lq, hq, d), lse.reshape(batch * hq, lq),
                          lq, lk, hq // hk, scale_log2, 1.0, grid=grid, block=THREADS, shared_mem=shared_bytes(d),
                          stream=stream)


def forward_fp8(q, k, v, vt, out, lse, causal, scale_log2, v_scale, stream=None, blocks=None):
    """forward for f8e4m3 q, k and v, whose stored values are scaled by scale_log2
    (the descales of q and k, the softmax's scale and log2(e)) and v_scale (v's
    descale); out is bf16 or f16. vt, (B, Hk, d, padded_keys) f8e4m3 of any
    contents, takes V^T (transposed_values) before the attention kernel reads it."""
    (batch, lq, hq, d), (_, lk, hk, _) = tuple(q.shape), tuple(k.shape)
    grid = _grid(batch, lq, hq, causal, blocks)
    if grid == 0:
        return
    transposed_values(v, vt, stream)
    columns, bn = box_columns(d, True), key_tile(d)
    q_map = tensor_map(q, box=(1, BM, 1, columns), swizzle=swizzle(columns))
    k_map = tensor_map(k, box=(1, bn, 1, columns), swizzle=swizzle(columns))
    v_map = tensor_map(vt, box=(1, 1, d, bn), swizzle=swizzle(bn))
    kernel_for(d, causal, True)(q_map, k_map, v_map, out.reshape(batch * lq, hq, d), lse.reshape(batch * hq, lq),
                                lq, lk, hq // hk, scale_log2, v_scale, grid=grid, block=THREADS,
                                shared_mem=shared_bytes(d, True), stream=stream)
