"""Every spelling of the kernel language's newer forms in one kernel, as a
user writes them, on both backends: dynamic extents read as A.shape[0], the
three fences, atomics with order= and scope=, shuffles with width=, votes,
warp and block reductions and scans, fastmath=True and mg.math on vectors."""
import numpy as np

import mlirgpu as mg
from mlirgpu import block_idx, thread_idx

N, M = mg.generics("N M")


@mg.kernel(fastmath=True)
def every_form(A: mg.memref[None, N, mg.f32], out: mg.memref[None, mg.f32], count: mg.memref[1, mg.u32]):
    t = thread_idx.x
    v = A[block_idx.x, t % N]
    rows = A.shape[0]
    mg.threadfence()
    mg.threadfence_block()
    mg.threadfence_system()
    mg.atomic.add(count, 0, 1, order="acq_rel", scope="gpu")
    mg.atomic.add(count, 0, 1, order="relaxed", scope="cta")
    mg.atomic.add(count, 0, 1, order="release", scope="sys")
    mg.atomic.add(count, 0, 1, order="acquire")
    x = mg.warp.shfl_xor(v, 1, width=32) + mg.warp.shfl_down(v, 1, width=16) + \
        mg.warp.shfl_up(v, 1, width=8) + mg.warp.shfl_idx(v, 0, width=4)
    votes = mg.cast(mg.warp.ballot(v > 0.0), mg.f32) + mg.cast(mg.warp.any(v > 0.0), mg.f32) + \
        mg.cast(mg.warp.all(v > 0.0), mg.f32)
    w = mg.warp.reduce(v, "add")
    e = mg.math.exp(mg.vload(out, 0, 4) * 0.0)   # a vector: exp(0) = 1 in each lane
    # (read before the block-wide reduction's barriers: threads 0-3 store to out[0:4] below)
    b = mg.block.reduce(v, "add") + mg.block.scan(v, "add", exclusive=False)
    out[block_idx.x * 64 + t] = x + votes + w + b + e[0] + mg.cast(rows, mg.f32)


def test_every_form(backend):
    A = np.ones((2, 8), np.float32)
    out, count = np.zeros(128, np.float32), np.zeros(1, np.uint32)
    every_form(A, out, count, grid=2, block=64)
    t = np.arange(64)
    # four shuffles of 1, ballot of all 32 lanes (2**32 - 1), any, all, warp sum 32, block sum 64 and
    # the inclusive prefix t + 1, exp(0), and the 2 rows.
    expected = 4 + (2.0 ** 32 - 1) + 1 + 1 + 32 + 64 + (t + 1) + 1 + 2
    np.testing.assert_allclose(out, np.tile(expected, 2).astype(np.float32), rtol=1e-6)
    assert count[0] == 2 * 64 * 4
