"""Scaled dot-product attention, backward, for Hopper (sm_90a): dK and dV,
and dQ added by the copy engine, on wgmma with TMA copies and warp
specialization (FlashAttention-3's plan). The formulas are attention_backward's:

    P = exp(scale * Q K^T - lse)          recomputed a tile at a time
    dV = P^T dO        dP = dO V^T        dS = P * (dP - D),  D = rowsum(dO * O)
    dK = scale * dS^T Q                   dQ = scale * dS K

mlirgpu.ops.attention_backward runs this kernel on an sm_90a GPU for head
dims 64 and 128 without packed sequences (varlen) or `deterministic`; D
comes from its "rows" kernel and dQ, summed here in float32, is rounded by
its "convert" kernel. A block owns BN = 128 keys of one (batch, key/value
head) and loops over the query tiles (BM = 64 queries) of every query head
of the group that see them, as attention_backward's dK/dV kernel does. It
has three warpgroups:

- warpgroup 0, the producer, gives its registers away (setmaxnreg). One
  thread has TMA copy K's and V's tiles once, then each query tile's Q and
  dO into the next stage of a 2-stage ring ("full" and "empty" mbarriers);
  the second warp copies the tile's 64 log-sum-exps (times log2(e)) and
  D values into the same stage, as plain loads and stores that count as
  arrivals on its "full" barrier. The 4-d tensor maps of (batch, sequence,
  heads, d) read zeros past Lq and Lk.
- warpgroups 1 and 2, the consumers, own keys 64w .. 64w + 63 of the block
  each (w = 0, 1). Per query tile: S^T = K_w Q^T, then dP^T = V_w dO^T on
  wgmma (64 keys x 64 queries, both operands K-major in shared memory), so
  that the rows of the accumulators are the consumer's keys; P^T follows
  in registers while the tensor cores do dP^T, then dS^T, 0 where masked.
  Their accumulators are in the layout of wgmma's A operand in registers:
  dV += P^T dO and dK += dS^T Q read them from registers, rounded to the
  inputs' type, with dO and Q MN-major (as they lie in memory). dS^T also
  goes to shared memory as dS (queries x keys, K-major, 128-byte swizzle, 2
  buffers by the tile's parity); dV is issued, and after a named barrier
  over both consumers, consumer w computes columns w d/2 .. (w + 1) d/2 of
  dQ = dS K over the block's 128 keys (K MN-major), then dK. K's tile is
  loaded with rows of d/2 elements (a 64-byte swizzle at d = 64, 128-byte
  at d = 128) so that each consumer's columns are whole boxes, as MN-major
  wgmma operands need.
- Once dQ is done, while the tensor cores do dK, the consumer stores its
  columns of it, times the scale, to shared memory as boxes of 32 float32
  columns, and one of its threads has the copy engine add them to the
  float32 dQ (mg.tma.reduce_add). Every block whose keys a query sees adds
  to its row; one instruction a box replaces an atomic an element, whose
  stores had kept both consumers' tensor cores idle.
- Varlen and `deterministic` stay with attention_backward's mma.sync
  kernels.
- The masks (keys past Lk, queries past Lq, the causal or sliding-window
  band) are applied on the tiles that cross them only; query tiles wholly
  outside the band are never loaded.

dS's two buffers make one barrier a tile enough: a consumer writes tile
n's dS into the buffer that tile n - 2's dQ read, and the other consumer
finished that product before it reached tile n - 1's barrier.
"""
import functools

from .. import language as lang
from .._mlirgpu import TensorMap, f32, i32, index
from ..layout import ComposedLayout, Layout
from ..layout import wgmma as wgmma_layout
from ..runtime import backend
from ..runtime.compiled import default_chip
from ..runtime.kernel import kernel
from ..runtime.tensormap import box_layout, tensor_map
from .attention import BM, LOG2E, head_and_row, hidden, query_tiles

__all__ = ["HEAD_DIMS", "supported", "backward"]

HEAD_DIMS = (64, 128)
BN = 128                    # keys a block owns: 64 per consumer warpgroup
CONSUMERS = 2
THREADS = 128 * (1 + CONSUMERS)
# As in attention_sm90: 24 + 2 x 240 = 3 x 168, the registers the launch gives a thread.
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 24, 240
STAGES = 2                  # Q/dO stages of the ring
BOX = 64                    # columns of a Q or dO box: one 128-byte row of 16-bit elements
DS_BARRIER = 1              # the named barrier after both consumers' dS stores


def key_box(head_dim):
    """Columns of a K or V box: d / 2, the dQ columns of one consumer."""
    return head_dim // 2


def key_swizzle(head_dim):
    """The swizzle of K's and V's boxes: as wide as their rows."""
    return {32: "64B", 64: "128B"}[key_box(head_dim)]


DQ_BOX = 32                 # float32 columns of a dQ box: one 128-byte row
DQ_BARRIER = 2              # + w: consumer w's barrier after its dQ stores


def shared_bytes(head_dim):
    """K and V, the stages of Q and dO, two buffers of dS (16-bit elements), the
    float32 dQ tile of both consumers, and 1 KB to put the first tile on a 1024-byte
    boundary (the swizzle's period)."""
    return (2 * BN * head_dim + 2 * STAGES * BM * head_dim + 2 * BM * BN) * 2 + BM * head_dim * 4 + 1024


def _build(head_dim, banded):
    """The kernel for one head dimension and mask, generic over the dtype."""
    D, KBOX = head_dim, key_box(head_dim)
    # Element offsets from the first 1024-byte boundary: K and V (D/KBOX boxes of BN keys each),
    # the stages of Q and of dO (D/64 boxes of BM queries each), the buffers of dS (two boxes of
    # BM queries x 64 keys each, a consumer's keys a box).
    V_AT = BN * D
    Q_AT = 2 * BN * D
    DO_AT = Q_AT + STAGES * BM * D
    DS_AT = DO_AT + STAGES * BM * D
    DQ_AT = (DS_AT + 2 * BM * BN) // 2     # in float32 elements: a consumer's KBOX / DQ_BOX boxes of BM rows
    # A consumer's 64 keys of K or V, and dS, are K-major A operands; Q and dO K-major B
    # operands of S^T and dP^T, MN-major ones of dK and dV (d x queries, D/64 boxes); K an
    # MN-major B operand of dQ (a consumer's KBOX columns x 64 keys).
    KV_A = wgmma_layout.tile_layout((64, KBOX), 2, key_swizzle(D))
    QO_K = wgmma_layout.tile_layout((BM, BOX), 2, "128B")
    QO_MN = ComposedLayout(wgmma_layout.swizzle_for("128B", 2), 0,
                           Layout(((BOX, D // BOX), (8, BM // 8)), ((1, BM * BOX), (BOX, 8 * BOX))))
    K_MN = wgmma_layout.tile_layout((KBOX, 64), 2, key_swizzle(D), major="MN")
    DS_A = wgmma_layout.tile_layout((BM, 64), 2, "128B")
    DQ_TILE = box_layout((BM, DQ_BOX), f32, "128B")
    T = lang.generics("T")

    def issue_transposed(smem, kv_at, qo_at, w):
        """Issues K_w Q^T or V_w dO^T (one wgmma group): the consumer's 64 keys of the
        K or V at kv_at times the queries of the Q or dO at qo_at; returns the accumulators."""
        acc = lang.wgmma.zeros(BM)
        lang.wgmma.fence()
        for kk in lang.static_range(D // 16):
            a = lang.wgmma.descriptor(smem, KV_A, offset=kv_at + kk // (KBOX // 16) * (BN * KBOX) + w * (64 * KBOX),
                                      k_block=kk % (KBOX // 16))
            b = lang.wgmma.descriptor(smem, QO_K, offset=qo_at + kk // 4 * (BM * BOX), k_block=kk % 4)
            acc = lang.wgmma.mma(acc, a, b, n=BM)
        lang.wgmma.commit_group()
        return acc

    def issue_update(smem, acc, words, dtype, qo_at):
        """Issues acc += A X (one wgmma group) for A in registers (`words`, the fragments'
        words of a 64 keys x BM queries product) and X the Q or dO of the stage at qo_at."""
        lang.wgmma.fence()
        for kk in lang.static_range(BM // 16):
            b = lang.wgmma.descriptor(smem, QO_MN, offset=qo_at, k_block=kk, major="MN")
            acc = lang.wgmma.mma(acc, lang.wgmma.Fragment(words[4 * kk:4 * kk + 4], dtype), b, n=D)
        lang.wgmma.commit_group()
        return acc

    def issue_dq(smem, ds_at, k_at, w):
        """Issues dS K (one wgmma group) for the consumer's KBOX columns of the K at
        k_at: BM queries x KBOX columns over the block's BN keys; returns the accumulators."""
        acc = lang.wgmma.zeros(KBOX)
        lang.wgmma.fence()
        for kk in lang.static_range(BN // 16):
            a = lang.wgmma.descriptor(smem, DS_A, offset=ds_at + kk // 4 * (BM * 64), k_block=kk % 4)
            b = lang.wgmma.descriptor(smem, K_MN, offset=k_at + w * (BN * KBOX) + kk // 4 * (64 * KBOX),
                                      k_block=kk % 4, major="MN")
            acc = lang.wgmma.mma(acc, a, b, n=KBOX)
        lang.wgmma.commit_group()
        return acc

    def words(values, dtype):
        """An accumulator rounded to `dtype` as A fragments, their words in one list."""
        return [word for fragment in lang.wgmma.fragments(values, dtype) for word in fragment.words]

    @kernel(generics=(T,), max_threads=THREADS, min_blocks=1)
    def attention_backward_sm90(q_map: TensorMap, k_map: TensorMap, v_map: TensorMap, do_map: TensorMap,
                                dq_map: TensorMap,
                                lse: lang.memref[None, None, f32].readonly(),
                                delta: lang.memref[None, None, f32].readonly(),
                                dk: lang.memref[None, None, D, T].noalias(),
                                dv: lang.memref[None, None, D, T].noalias(),
                                lq: i32, lk: i32, group: i32, scale_log2: f32, left: i32, right: i32, scale: f32):
        """The maps address q and dO (B, Lq, Hq, D) in boxes of (1, BM, 1, 64), k and v
        (B, Lk, Hk, D) in boxes of (1, BN, 1, D/2), and the float32 dQ (B, Lq, Hq, D),
        added to, in boxes of (1, BM, 1, DQ_BOX); lse and delta are (B x Hq, Lq), dk and
        dv (B x Lk, Hk, D); query head h reads key/value head h // group. The grid is
        (key blocks, B x Hk)."""
        smem = lang.shared.dynamic(dk.dtype)
        floats = lang.shared.dynamic(f32)       # the same bytes, for dQ
        base = lang.shared.address(smem)
        first_at = lang.cast(((base + 1023) & 0xFFFFFC00) - base, index) // 2
        stats = lang.shared.array((STAGES, 2, BM), f32)    # a stage's lse * log2(e) and D
        kv_full = lang.mbarrier.array(1)
        q_full = lang.mbarrier.array(STAGES)
        q_empty = lang.mbarrier.array(STAGES)
        wg = lang.warpgroup.index()
        t = lang.warpgroup.thread_index()
        hk = lang.cast(dk.shape[1], i32)
        hq = hk * group
        y = lang.cast(lang.block_idx.y, i32)
        b, kv_head = y // hk, y % hk
        n0 = lang.cast(lang.block_idx.x, i32) * BN
        first, count = query_tiles(n0, n0 + BN - 1, lq, lk, left, right, banded, BM)
        steps = count * group     # (query head, query tile) pairs, heads outer
        if lang.thread_idx.x == 0:
            kv_full.init(0, 1)
            for s in lang.static_range(STAGES):
                q_full.init(s, 1 + 32)              # the copying thread, and the lanes copying the stats
                q_empty.init(s, 4 * CONSUMERS)      # one arrival per consumer warp
            lang.mbarrier.fence_init()
        lang.syncthreads()

        if wg == 0:
            lang.warpgroup.set_max_registers(PRODUCER_REGISTERS, increase=False)
            lane = t % 32
            if t == 0:
                kv_full.arrive_expect_tx(0, 2 * BN * D * 2)
                for j in lang.static_range(D // KBOX):
                    lang.tma.load(k_map, smem, (b, n0, kv_head, j * KBOX), kv_full, 0,
                                  offset=first_at + j * (BN * KBOX))
                    lang.tma.load(v_map, smem, (b, n0, kv_head, j * KBOX), kv_full, 0,
                                  offset=first_at + V_AT + j * (BN * KBOX))
            if (t == 0) | (t // 32 == 1):
                for step in range(steps):
                    n = lang.cast(step, i32)
                    s = n % STAGES
                    h, m0 = head_and_row(n, kv_head, group, first, count)
                    if n >= STAGES:
                        q_empty.wait(s, (n // STAGES + 1) % 2)   # the consumers are done with the stage
                    if t == 0:
                        at = first_at + lang.cast(s, index) * (BM * D)
                        q_full.arrive_expect_tx(s, 2 * BM * D * 2)
                        for j in lang.static_range(D // BOX):
                            lang.tma.load(q_map, smem, (b, m0, h, j * BOX), q_full, s,
                                          offset=at + Q_AT + j * (BM * BOX))
                            lang.tma.load(do_map, smem, (b, m0, h, j * BOX), q_full, s,
                                          offset=at + DO_AT + j * (BM * BOX))
                    else:
                        row = b * hq + h
                        for i in lang.static_range(BM // 32):
                            # Queries past Lq read Lq - 1's: their P is masked to 0 anyway.
                            query = lang.math.min(m0 + lane + 32 * i, lq - 1)
                            stats[s, 0, lane + 32 * i] = lse[row, query] * LOG2E
                            stats[s, 1, lane + 32 * i] = delta[row, query]
                        q_full.arrive(s)
        else:
            lang.warpgroup.set_max_registers(CONSUMER_REGISTERS, increase=True)
            # Read from lane 0, the warpgroup is visibly the same in the whole warp: ptxas then keeps
            # the wgmmas after the branches asynchronous (else its warning C7520).
            w = lang.warp.shfl_idx(wg - 1, 0)
            lane = t % 32
            dtype = dk.dtype
            zero = lang.constant(0.0, f32)
            # This thread's rows of the warpgroup's 64 (accumulator values 4i, 4i+1: row r; 4i+2, 4i+3: r + 8).
            r, _ = lang.wgmma.accumulator_coordinates(0, t)
            keys = [n0 + w * 64 + r, n0 + w * 64 + r + 8]
            dk_acc = lang.wgmma.zeros(D)
            dv_acc = lang.wgmma.zeros(D)
            kv_full.wait(0, 0)
            for step in range(steps):
                # The warpgroup and the thread read again, through shuffles (which LLVM does not move
                # out of a loop): the descriptors, addresses and coordinates that follow from them are
                # then computed where they are used, not held in registers across the loop (over 60).
                here, thread = lang.warp.shfl_idx(w, 0), lang.warp.shfl_idx(t, lane)
                row0, _ = lang.wgmma.accumulator_coordinates(0, thread)
                step_keys = [n0 + here * 64 + row0, n0 + here * 64 + row0 + 8]
                n = lang.cast(step, i32)
                s = n % STAGES
                h, m0 = head_and_row(n, kv_head, group, first, count)
                q_at = first_at + Q_AT + lang.cast(s, index) * (BM * D)
                do_at = first_at + DO_AT + lang.cast(s, index) * (BM * D)
                ds_at = first_at + DS_AT + lang.cast(n % 2, index) * (BM * BN)
                q_full.wait(s, n // STAGES % 2)
                scores = issue_transposed(smem, first_at, q_at, here)

                # P^T = exp2(S^T scale log2(e) - lse log2(e)), 0 where masked (also queries past Lq);
                # dS^T = P^T (dP^T - D). The accumulators' columns are queries.
                edge = (m0 + BM > lq) | (n0 + BN > lk)
                if banded:
                    # The band's edges: the tile's first query and last key, or last query and first key.
                    edge = edge | (n0 + BN - 1 - m0 - (lk - lq) > right) | (n0 - (m0 + BM - 1) - (lk - lq) < -left)
                # dP^T is issued once S^T is done: its zeroed accumulators are register moves, and ptxas
                # would otherwise wait for S^T before them itself (its C7517). P's exponentials run
                # while the tensor cores do dP^T.
                scores = lang.wgmma.wait_group(0, scores)
                dp = issue_transposed(smem, first_at + V_AT, do_at, here)
                p = []
                for e in lang.static_range(BM // 2):
                    _, column = lang.wgmma.accumulator_coordinates(e, thread)
                    p.append(lang.math.exp2_approx(scores[e] * scale_log2 - stats[s, 0, column]))
                if edge:
                    for e in lang.static_range(BM // 2):
                        _, column = lang.wgmma.accumulator_coordinates(e, thread)
                        query = m0 + column
                        masked = (query >= lq) | hidden(query, step_keys[e // 2 % 2], lq, lk, left, right, banded)
                        p[e] = lang.select(masked, zero, p[e])
                dp = lang.wgmma.wait_group(0, dp)
                ds = []
                for e in lang.static_range(BM // 2):
                    _, column = lang.wgmma.accumulator_coordinates(e, thread)
                    ds.append(p[e] * (dp[e] - stats[s, 1, column]))

                # dS^T to shared memory as dS (queries x keys), the consumer's box of 64 keys: first,
                # so that dS^T's float32 values are dead before dK's and dV's products are in flight.
                # Queries 8 apart have one swizzle: the thread's 32 stores take 4 swizzled offsets and
                # constants past them (else LLVM keeps 32 addresses live across the loop).
                ds_tile = lang.mma.tile(smem, DS_A).at(ds_at + here * (BM * 64))
                for e in lang.static_range(BM // 2):
                    row, column = lang.wgmma.accumulator_coordinates(e % 4, thread)
                    ds_tile.at(e // 4 * (8 * 64))[column, row] = lang.cast(ds[e], dtype)
                lang.tma.fence_proxy_async()    # the stores above, before the tensor cores read them

                # dV += P^T dO (A from registers) before the barrier, which it does not need; after it dQ =
                # dS K, then dK += dS^T Q. Once dV and dQ are done, dQ's stores to shared memory run while
                # the tensor cores do dK, with P's registers free.
                dv_acc = issue_update(smem, dv_acc, words(p, dtype), dtype, do_at)
                if t == 0:
                    # The copy engine has read the last tile's dQ: the consumer's threads, past the
                    # barrier below only once this thread is, may write this tile's.
                    lang.tma.wait_group(0, read=True)
                lang.warpgroup.barrier(DS_BARRIER, 128 * CONSUMERS)

                dq_acc = issue_dq(smem, ds_at, first_at, here)
                dk_acc = issue_update(smem, dk_acc, words(ds, dtype), dtype, q_at)
                done = lang.wgmma.wait_group(1, dv_acc + dq_acc)
                dv_acc, dq_acc = done[:D // 2], done[D // 2:]

                # dQ += scale dS K, the consumer's columns: to shared memory as the boxes the copy engine
                # adds (rows past Lq fall outside the array, which the addition skips). A store of 8 bytes a
                # lane serves a half-warp at a time, 4 rows whose 32 bytes land, swizzled, on the same banks
                # for rows 2i and 2i + 1: there the odd rows store the values 16 columns away (value e ^ 8),
                # which the swizzle puts on other banks, and each store takes 2 wavefronts instead of 4.
                dq_at = first_at // 2 + DQ_AT + lang.cast(here, index) * (BM * KBOX)
                odd = thread // 4 % 2 == 1
                for e in lang.static_range(0, KBOX // 2, 2):
                    row, column = lang.wgmma.accumulator_coordinates(e, thread)
                    column = lang.select(odd, lang.wgmma.accumulator_coordinates(e ^ 8, thread)[1], column)
                    at = dq_at + column // DQ_BOX * (BM * DQ_BOX) + lang.mma.layout_index(DQ_TILE, row,
                                                                                         column % DQ_BOX)
                    low = lang.select(odd, dq_acc[e ^ 8], dq_acc[e])
                    high = lang.select(odd, dq_acc[(e ^ 8) + 1], dq_acc[e + 1])
                    lang.vstore(floats, at, (low * scale, high * scale))
                lang.tma.fence_proxy_async()    # the stores above, before the copy engine reads them
                lang.warpgroup.barrier(DQ_BARRIER + here, 128)
                if t == 0:
                    for j in lang.static_range(KBOX // DQ_BOX):
                        lang.tma.reduce_add(dq_map, floats, (b, m0, h, here * KBOX + j * DQ_BOX),
                                            offset=dq_at + j * (BM * DQ_BOX))
                    lang.tma.commit_group()
                dk_acc = lang.wgmma.wait_group(0, dk_acc)
                if lane == 0:
                    q_empty.arrive(s)           # every product that reads the stage's Q and dO is done

            if t == 0:
                lang.tma.wait_group(0, read=True)     # shared memory lives until the copy engine has read it
            # Through a wait (nothing is pending): LLVM cannot then move the conversions below into the
            # loop, where it carried dV rounded to 16 bits from one tile to the next, 32 registers more.
            both = lang.wgmma.wait_group(0, dk_acc + dv_acc)
            dk_acc, dv_acc = both[:D // 2], both[D // 2:]
            for half in lang.static_range(2):
                key = keys[half]
                if key < lk:
                    for e in lang.static_range(half * 2, D // 2, 4):
                        _, column = lang.wgmma.accumulator_coordinates(e, t)
                        at = (b * lk + key, kv_head, column)
                        lang.vstore(dk, at, (lang.cast(dk_acc[e] * scale, dtype), lang.cast(dk_acc[e + 1] * scale,
                                                                                              dtype)))
                        lang.vstore(dv, at, (lang.cast(dv_acc[e], dtype), lang.cast(dv_acc[e + 1], dtype)))

    return attention_backward_sm90


@functools.cache
def kernel_for(head_dim, banded):
    """The kernel of (head dimension, banded mask), built once; its dtype is a generic."""
    return _build(head_dim, bool(banded))


def supported(arrays, head_dim):
    """Whether this kernel takes the case: an sm_90a GPU, head dims 64 and
    128, and `arrays` (q, k, v and dO; their memory) 16-byte aligned, as
    TMA reads it. Arrays without a device pointer (NumPy's) are left to the
    other kernels, whose launch says what is wrong with them."""
    return (backend.backend() == "cuda" and head_dim in HEAD_DIMS
            and all(hasattr(x, "ptr") and x.ptr % 16 == 0 for x in arrays) and default_chip() == "sm_90a")


def backward(q, k, v, dout, lse, delta, dq, dk, dv, scale, left, right, banded, stream=None):
    """Adds scale * dS K to dq (float32, q's shape or (B x Lq, Hq, d)) and writes dk and dv, for
    q and dout (B, Lq, Hq, d), k and v (B, Lk, Hk, d), lse (the forward's)
    and delta (rowsum(dO * O)) (B, Hq, Lq): C-contiguous arrays of the
    current backend (DeviceArrays, or NumPy arrays on the CPU backend).
    `left` and `right` bound the band -left <= key - query - (Lk - Lq) <=
    right where `banded` (as mlirgpu.ops.attention's Problem gives them)."""
    (batch, lq, hq, d), (_, lk, hk, _) = tuple(q.shape), tuple(k.shape)
    q_map, do_map = (tensor_map(x, box=(1, BM, 1, BOX), swizzle="128B") for x in (q, dout))
    k_map, v_map = (tensor_map(x, box=(1, BN, 1, key_box(d)), swizzle=key_swizzle(d)) for x in (k, v))
    dq_map = tensor_map(dq.reshape(batch, lq, hq, d), box=(1, BM, 1, DQ_BOX), swizzle="128B")
    kernel_for(d, banded)(q_map, k_map, v_map, do_map, dq_map, lse.reshape(batch * hq, lq),
                          delta.reshape(batch * hq, lq), dk.reshape(batch * lk, hk, d), dv.reshape(batch * lk, hk, d),
                          lq, lk, hq // hk, scale * LOG2E, left, right, scale, grid=((lk + BN - 1) // BN, batch * hk),
                          block=THREADS, shared_mem=shared_bytes(d), stream=stream)
