"""Scaled dot-product attention for decoding on Hopper (sm_90a): a few
queries a sequence against a long K/V cache, read with TMA copies through a
deep mbarrier ring.

mlirgpu.ops.attention runs this kernel on an sm_90a GPU for at most 16
queries of equal-length sequences whose query heads it packs, or whose keys
it splits (see its module and `takes`). Decoding is bound by reading the
cache, not by arithmetic: the kernel's job is to keep enough bytes in flight
that every multiprocessor streams K and V at the memory's rate. So a block
has one copy engine feeding a ring of 6 stages (3 at d = 256) of K and V
tiles, about 200 KB of shared memory, one block a multiprocessor.

A block is one (row block, batch x key/value head, split) of the grid:

- Its rows are the (query, query head) pairs of one key/value head,
  query-major (row r: query r // group of query head kv_head x group +
  r % group), as many whole queries as fit in wgmma's 64 rows. The
  query heads of a group are adjacent in q, so one TMA box of
  (1, 64 // group, group, 64) elements of q (B, Lq, Hq, d) lands as these
  rows, 64 columns at a time; queries past Lq read zeros. Rows past them
  (when group does not divide 64) are zeroed once, so that every row the
  tensor cores read is a number; they are computed and never stored.
- Its keys are its split's share of the key tiles its rows see (the causal
  mask, bottom-right aligned, ends them at the last row's diagonal): split
  z of Z takes tiles [z T / Z, (z + 1) T / Z), shares that differ by one
  tile at most.
- Warpgroup 0, the producer, has one thread issue the copies: Q's rows once
  (the "q_full" mbarrier), then each key tile's K and V into the next stage
  of the ring, each on a "full" mbarrier of its own, after the stage's
  "empty" mbarrier says the consumer is done with what it held before.
- Warpgroup 1, the consumer, runs attention_sm90's loop over the tiles:
  S = Q K^T on wgmma (K-major K), the online softmax on S's accumulators
  in registers, and O += P V with P from registers (V MN-major, as it lies
  in memory). S of tile n is issued before O += P V of tile n - 1, so the
  softmax runs while the tensor cores do that product. Each of its warps
  arrives on a stage's "empty" mbarrier once O += P V has read it.
- Keys past Lk (TMA reads zeros there) and, with the causal mask, past a
  row's diagonal get -inf, in the tiles that cross one of those edges only.

The block writes its rows' O / l and log-sum-exp: the output and lse
themselves with one split, else float32 partial results in the layout of
attention's combine kernel, which merges them. The grid has about one block
a multiprocessor per wave (`splits_for`): few blocks for a small batch, each
taking a large share of the keys.
"""
import functools

from .. import cuda
from .. import language as lang
from .._mlirgpu import TensorMap, f32, i32, index
from ..runtime import backend
from ..runtime.compiled import default_chip
from ..runtime.kernel import kernel
from ..runtime.tensormap import tensor_map
from .arrays import dtype_of, geometry
from .attention_sm90 import (crosses, fragments, issue_scores, issue_values, key_tiles, load_keys, load_values,
                             log_sum_exp, masked, online_softmax, row_normalizer, store_row)

__all__ = ["HEAD_DIMS", "QUERIES", "takes", "available", "supported", "aligned", "splits_for", "forward"]

HEAD_DIMS = (64, 128, 256)
QUERIES = 16                # at most this many queries a sequence
ROWS = 64                   # a block's rows: wgmma's M
THREADS = 256               # the producer warpgroup and the consumer warpgroup
BOX = 64                    # columns of a TMA box: one 128-byte row of 16-bit elements, the swizzle's
# Blocks that start together wait for their first tiles about as long as it takes to stream
# this many: the cost splits_for adds to each block.
FILL_TILES = 2


def key_tile(head_dim):
    """Keys per stage, BN: 32 KB of K and V a stage at d = 64 and 128 (128 and 64 keys),
    64 keys at d = 256, where O's accumulators take 128 of a consumer thread's registers."""
    return 128 if head_dim == 64 else 64


def stages(head_dim):
    """Stages of the ring: as many as fit beside Q's rows in a multiprocessor's 227 KB."""
    return {64: 6, 128: 6, 256: 3}[head_dim]


def shared_bytes(head_dim):
    """Q's rows, the K and V stages (16-bit elements), and 1 KB to put the first tile on a
    1024-byte boundary (the swizzle's period)."""
    return (ROWS * head_dim + 2 * stages(head_dim) * key_tile(head_dim) * head_dim) * 2 + 1024


def queries_per_block(group):
    """Whole queries of `group` packed rows each in a block's 64 rows."""
    return ROWS // group


def _build(head_dim, causal, split, dtype):
    """The kernel for one head dimension, masking, `split` (float32 partial results
    for the combine kernel) and dtype of q, k and v (T). The dtype is no generic:
    with `split` no array parameter has it."""
    D, STAGES, BN = head_dim, stages(head_dim), key_tile(head_dim)
    # Element offsets from the first 1024-byte boundary: Q (D/64 boxes of 64 rows), each
    # stage's K (D/64 boxes of BN keys) and V (per 64 keys, D/64 boxes of 64 keys).
    K_AT = ROWS * D
    V_AT = K_AT + STAGES * BN * D
    T = dtype
    OUT = f32 if split else T

    @kernel(max_threads=THREADS, min_blocks=1)
    def attention_decode_sm90(q_map: TensorMap, k_map: TensorMap, v_map: TensorMap,
                              o: lang.memref[None, None, D, OUT].noalias(),
                              lse: lang.memref[None, None, f32].noalias(),
                              lq: i32, lk: i32, group: i32, scale_log2: f32):
        """The maps address q (B, Lq, Hq, D) in boxes of (1, 64 // group, group, 64)
        and k, v (B, Lk, Hk, D) in boxes of (1, BN, 1, 64) and (1, 64, 1, 64); o is
        (B x Lq, Hq, D) and lse (B x Hq, Lq), each grid.z times over with `split`.
        The grid is (row blocks, B x Hk, splits)."""
        smem = lang.shared.dynamic(T)
        base = lang.shared.address(smem)
        first = lang.cast(((base + 1023) & 0xFFFFFC00) - base, index) // 2
        q_full = lang.mbarrier.array(1)
        k_full = lang.mbarrier.array(STAGES)
        v_full = lang.mbarrier.array(STAGES)
        empty = lang.mbarrier.array(STAGES)
        wg = lang.warpgroup.index()
        t = lang.warpgroup.thread_index()
        hq = lang.cast(o.shape[1], i32)
        hk = hq // group
        b = lang.cast(lang.block_idx.y, i32) // hk
        kv_head = lang.cast(lang.block_idx.y, i32) % hk
        per_block = ROWS // group
        q0 = lang.cast(lang.block_idx.x, i32) * per_block
        # The key tiles this block's rows see, and its split's share of them.
        seen = lang.cast(key_tiles(q0, per_block, BN, lq, lk, causal), index)
        start = lang.cast(lang.block_idx.z * seen // lang.grid_dim.z, i32)
        count = lang.cast((lang.block_idx.z + 1) * seen // lang.grid_dim.z, i32) - start

        if lang.thread_idx.x == 0:
            q_full.init(0, 1)
            for s in lang.static_range(STAGES):
                k_full.init(s, 1)
                v_full.init(s, 1)
                empty.init(s, 4)            # one arrival per consumer warp
            lang.mbarrier.fence_init()
        if wg == 1:
            # Rows past the box's whole queries (group not dividing 64): zeros, read by the
            # tensor cores (the async proxy) once the fence and the barrier below order them.
            for e in range(lang.cast(per_block * group * BOX + t, index), ROWS * BOX, 128):
                for j in lang.static_range(D // BOX):
                    smem[first + j * (ROWS * BOX) + e] = lang.constant(0.0, T)
            lang.tma.fence_proxy_async()
        lang.syncthreads()

        if wg == 0:
            if t == 0:
                q_full.arrive_expect_tx(0, per_block * group * (D * 2))
                for j in lang.static_range(D // BOX):
                    lang.tma.load(q_map, smem, (b, q0, kv_head * group, j * BOX), q_full, 0,
                                  offset=first + j * (ROWS * BOX))
                for n in range(count):
                    s = n % STAGES
                    if n >= STAGES:
                        empty.wait(s, (n // STAGES + 1) % 2)    # the consumer is done with its last tile
                    at = first + lang.cast(s, index) * (BN * D)
                    n0 = (start + n) * BN
                    load_keys(k_map, smem, k_full, s, b, n0, kv_head, at + K_AT, BN, D, BOX)
                    load_values(v_map, smem, v_full, s, b, n0, kv_head, at + V_AT, BN, D)
        else:
            lane = t % 32
            minus_inf = lang.constant(float("-inf"), f32)
            # This thread's rows of the 64 (accumulator values 4i, 4i+1: row r; 4i+2, 4i+3: r + 8).
            r, _ = lang.wgmma.accumulator_coordinates(0, t)
            rows = [r, r + 8]
            queries = [q0 + row // group for row in rows]
            m = [minus_inf, minus_inf]      # running maximum of scaled scores, log2 units
            l = [lang.constant(0.0, f32), lang.constant(0.0, f32)]    # this lane's share of the row sums
            acc = lang.wgmma.zeros(D)
            q_full.wait(0, 0)
            if count > 0:
                # Software-pipelined: S of tile n is issued before O += P V of tile n - 1, and its
                # softmax runs while the tensor cores do that product.
                k_full.wait(0, 0)
                scores = lang.wgmma.wait_group(0, issue_scores(smem, first, ROWS, first + K_AT, BN, D, BOX))
                if crosses(start * BN, BN, q0, lq, lk, causal):
                    scores = masked(scores, t, start * BN, queries, lq, lk, causal)
                scores, m, l = online_softmax(scores, m, l, scale_log2)[:3]
                p = fragments(scores, T)
                for n in range(1, count):
                    s, before = n % STAGES, (n - 1) % STAGES
                    n0 = (start + n) * BN
                    k_full.wait(s, n // STAGES % 2)
                    scores = issue_scores(smem, first, ROWS, first + lang.cast(s, index) * (BN * D) + K_AT,
                                          BN, D, BOX)
                    v_full.wait(before, (n - 1) // STAGES % 2)
                    acc = issue_values(smem, acc, p, first + lang.cast(before, index) * (BN * D) + V_AT, BN, D)
                    scores = lang.wgmma.wait_group(1, scores)
                    if crosses(n0, BN, q0, lq, lk, causal):
                        scores = masked(scores, t, n0, queries, lq, lk, causal)
                    scores, m, l, alpha = online_softmax(scores, m, l, scale_log2)
                    acc = lang.wgmma.wait_group(0, acc)
                    if lane == 0:
                        empty.arrive(before)    # both products of the stage are done
                    acc = [acc[e] * alpha[e // 2 % 2] for e in lang.static_range(D // 2)]
                    # Only now: the product just waited for read the previous P's registers.
                    p = fragments(scores, T)
                last = (count - 1) % STAGES
                v_full.wait(last, (count - 1) // STAGES % 2)
                acc = issue_values(smem, acc, p, first + lang.cast(last, index) * (BN * D) + V_AT, BN, D)
                acc = lang.wgmma.wait_group(0, acc)
            # O / l and the log-sum-exp (natural log) of the rows that are (query, head) pairs;
            # a row that saw no key (of this split) gets 0 and -inf.
            out_row, lse_row = b * lq, b * hq
            if split:    # this block's split: partial results, grid.z times over
                out_row = out_row + lang.cast(lang.block_idx.z * (o.shape[0] // lang.grid_dim.z), i32)
                lse_row = lse_row + lang.cast(lang.block_idx.z * (lse.shape[0] // lang.grid_dim.z), i32)
            for half in lang.static_range(2):
                total, inverse = row_normalizer(l[half], 1.0)
                query, head = queries[half], kv_head * group + rows[half] % group
                if (rows[half] < per_block * group) & (query < lq):
                    store_row(o, out_row, query, head, acc, half, t, inverse)
                    if lane % 4 == 0:
                        lse[lse_row + head, query] = log_sum_exp(m[half], total)

    return attention_decode_sm90


@functools.cache
def kernel_for(head_dim, causal, split, dtype):
    """The kernel of (head dimension, causal, split, dtype), built once."""
    return _build(head_dim, bool(causal), bool(split), dtype)


def takes(lq, hq, hk, head_dim):
    """Whether the kernel takes a decoding problem of these sizes: at most QUERIES
    queries, a head dim of HEAD_DIMS, and a group of query heads that fits a block's
    rows. (Packed sequences and sliding windows are the other kernel's.)"""
    return 0 < lq <= QUERIES and head_dim in HEAD_DIMS and hq // hk <= ROWS


def available():
    """Whether the current device runs the kernel: an sm_90a GPU."""
    return backend.backend() == "cuda" and default_chip() == "sm_90a"


def supported(q, k, v):
    """Whether the kernel runs on these arrays: available(), and `aligned`."""
    return available() and aligned(q, k, v)


def aligned(q, k, v):
    """Whether q, k and v (their memory) are 16-byte aligned, as TMA reads it."""
    return all(hasattr(x, "ptr") and x.ptr % 16 == 0 for x in (q, k, v))


def splits_for(batch, lq, lk, hq, hk, head_dim, multiprocessors=None):
    """How many blocks share the key tiles of one block's rows. Blocks run one a
    multiprocessor, in waves; a block of T/Z key tiles takes about T/Z + FILL_TILES
    tiles' time (its first copies' latency), so the grid's time is about
    waves x (T/Z + FILL_TILES): the smallest Z of least time. `multiprocessors`:
    by default the current GPU's."""
    if multiprocessors is None:
        multiprocessors = cuda.Device(cuda.current_device()).multiprocessor_count
    units = -(-lq // queries_per_block(hq // hk)) * batch * hk
    tiles = -(-lk // key_tile(head_dim))
    best, least = 1, None
    for z in range(1, max(1, min(tiles, 4 * multiprocessors)) + 1):
        time = -(-units * z // multiprocessors) * (-(-tiles // z) + FILL_TILES)
        if least is None or time < least:
            best, least = z, time
    return best


def forward(q, k, v, out, lse, causal, scale_log2, splits=1, stream=None):
    """Attention of q (B, Lq, Hq, d) and k, v (B, Lk, Hk, d), C-contiguous arrays of
    the current backend (DeviceArrays, or NumPy arrays on the CPU backend), with
    the keys shared among `splits` blocks a row block. With one split, out
    (B, Lq, Hq, d) in q's dtype and lse (B, Hq, Lq) in float32 as
    mlirgpu.ops.attention documents them; with more, each split's float32
    partial results, out (splits x B, Lq, Hq, d) and lse (splits x B, Hq, Lq),
    for attention's combine kernel to merge.

    What a launch needs but out and lse (the kernel, the tensor maps of q, k and
    v, the grid) is kept for the most recent arrays' geometries (addresses
    included): a decoding step calls with the same q, k and v buffers again, and
    its time is mostly the host's."""
    key = (geometry(q), geometry(k), geometry(v), causal, splits)
    launch = _LAUNCHES.pop(key, None)
    if launch is None:
        launch = _launch(q, k, v, causal, splits)
    if len(_LAUNCHES) >= LAUNCHES_KEPT:
        _LAUNCHES.pop(next(iter(_LAUNCHES)), None)
    _LAUNCHES[key] = launch     # the most recent last
    if launch is not None:
        attend, maps, out_shape, lse_shape, lq, lk, group, keywords = launch
        attend(*maps, out.reshape(out_shape), lse.reshape(lse_shape), lq, lk, group, scale_log2, stream=stream,
             **keywords)


def launch_plan(q, k, v, out, lse, causal, scale_log2, splits=1, out_argument=None, **launch):
    """The launch forward keeps for arrays of q's, k's and v's geometry (it
    has just made it for these, with `out` and `lse`), as a
    Specialization.launch_plan for calls whose arguments start with (q, k,
    v): its maps re-encoded where they moved, out and lse kept by the plan,
    or out the call's argument `out_argument`; `launch`: LaunchPlan's
    keywords. None where forward keeps no launch."""
    kept = _LAUNCHES.get((geometry(q), geometry(k), geometry(v), causal, splits))
    if kept is None:
        return None
    attend, maps, out_shape, lse_shape, lq, lk, group, keywords = kept
    out, lse = out.reshape(out_shape), lse.reshape(lse_shape)
    params = ([("map", i, m) for i, m in enumerate(maps)]
              + [("value", out) if out_argument is None else ("view", out_argument, out_shape), ("value", lse)]
              + [("value", x) for x in (lq, lk, group, scale_log2)])
    return attend.launch_plan([*maps, out, lse, lq, lk, group, scale_log2], params, **launch, **keywords)


# forward's launches, by the geometry of q, k and v (arrays.geometry) and the options. A tensor map
# is a pure function of its array's geometry, so a launch made for arrays serves any arrays of that
# geometry since; its maps keep no array alive.
_LAUNCHES = {}
LAUNCHES_KEPT = 64


def _launch(q, k, v, causal, splits):
    """forward's kernel, tensor maps, views' shapes, scalars and launch keywords; None
    where there are no rows."""
    (batch, lq, hq, d), (_, lk, hk, _) = tuple(q.shape), tuple(k.shape)
    if batch * lq * hq == 0:     # no rows: nothing to write
        return None
    group = hq // hk
    per_block = queries_per_block(group)
    maps = (tensor_map(q, box=(1, per_block, group, BOX), swizzle="128B"),
            tensor_map(k, box=(1, key_tile(d), 1, BOX), swizzle="128B"),
            tensor_map(v, box=(1, BOX, 1, BOX), swizzle="128B"))
    keywords = {"grid": (-(-lq // per_block), batch * hk, splits), "block": THREADS, "shared_mem": shared_bytes(d)}
    # The specialization (the kernel has no generics): calling it goes straight to the C launch.
    return (kernel_for(d, causal, splits > 1, dtype_of(q))[()], tuple(m.with_owner(None) for m in maps),
            (splits * batch * lq, hq, d), (splits * batch * hq, lq), lq, lk, group, keywords)
