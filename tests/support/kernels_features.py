"""The kernels of the device-feature tests (test_device_features.py, run on
both backends; test_cpu_features.py, the CPU backend's own checks;
test_cpu_matches_gpu.py) and of benchmarks/cpu_backend.py: a block reduction
(shared memory, barriers, warp shuffles, an atomic add), the shared-memory tiled
matmul with dynamic and static shared memory, vector copies, device functions,
printf, atomics and shuffles. The tiled matmul's home is
examples/tiled_matmul.py."""
import os
import sys

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

sys.path.insert(0, os.path.abspath(os.path.join(__file__, os.pardir, os.pardir, os.pardir, "examples")))
from tiled_matmul import TILE, matmul_dynamic, matmul_static  # noqa: E402, F401  (re-exported)

M, K, N, S = mg.generics("M K N S")
BLOCK = 256


@mg.kernel
def block_sum(A: mg.memref[N, mg.f32], out: mg.memref[1, mg.f32]):
    partial = mg.shared.array(BLOCK, mg.f32)
    t = thread_idx.x
    i = block_idx.x * BLOCK + t
    x = mg.constant(0.0, mg.f32)
    if i < N:
        x = A[i]
    partial[t] = x
    mg.syncthreads()
    for stride in (128, 64, 32):  # unrolled: a Python tuple
        if t < stride:
            partial[t] = partial[t] + partial[t + stride]
        mg.syncthreads()
    if t < 32:  # the first warp, all of its lanes
        v = partial[t]
        for offset in (16, 8, 4, 2, 1):
            v += mg.warp.shfl_down(v, offset)
        if t == 0:
            mg.atomic.add(out, 0, v)


@mg.kernel
def dynamic_reverse(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32], size: mg.memref[1, mg.i32]):
    smem = mg.shared.dynamic(mg.f32)
    base = block_idx.x * 0 + 4  # a traced offset
    window = smem[base:base + BLOCK]
    t = thread_idx.x
    i = block_idx.x * BLOCK + t
    window[t] = A[i]
    mg.syncthreads()
    B[i] = window[BLOCK - 1 - t]
    if i == 0:
        size[0] = mg.cast(mg.shared.size(smem), mg.i32)


@mg.kernel(generics=(M, N))
def copy_float4(A: mg.memref[M, N, mg.f32], B: mg.memref[M, N, mg.f32], C: mg.memref[M, N, mg.f32]):
    i = block_idx.x
    j = thread_idx.x * 4
    v = mg.vload(A, (i, j), 4)
    mg.vstore(B, (i, j), v)
    w = v * 2.0 + 1.0
    mg.vstore(C, (i, j), (w[3], w[2], w[1], w[0]))


@mg.kernel
def copy_half8(A: mg.memref[N, mg.f16], B: mg.memref[N, mg.f16]):
    j = (block_idx.x * block_dim.x + thread_idx.x) * 8
    mg.vstore(B, j, mg.vload(A, j, 8))


@mg.func
def axpy(a, x, y):
    return a * x + y


@mg.func
def ordered(a, b):
    return mg.math.min(a, b), mg.math.max(a, b)


@mg.func
def clamp_store(out, i, value, lo, hi):
    out[i] = mg.math.max(mg.math.min(value, hi), lo)


@mg.kernel
def use_device_functions(X: mg.memref[N, mg.f32], Y: mg.memref[N, mg.f32], Out: mg.memref[N, mg.f32],
                         Lo: mg.memref[N, mg.f32], Hi: mg.memref[N, mg.f32], Clamped: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        x, y = X[i], Y[i]
        Out[i] = axpy(2.5, x, axpy(x, y, 1.0))
        lo, hi = ordered(x, y)
        Lo[i] = lo
        Hi[i] = hi
        clamp_store(Clamped, i, x, -0.5, 0.5)


@mg.func
def rotate_left(X):
    """A device function that reads the thread's index and waits at a barrier."""
    i = block_idx.x * block_dim.x + thread_idx.x
    v = X[(i + 1) % N]
    mg.syncthreads()
    X[i] = v


@mg.kernel
def rotate_through_device_function(X: mg.memref[N, mg.f32]):
    rotate_left(X)


@mg.kernel
def hello(A: mg.memref[N, mg.f32]):
    t = thread_idx.x
    if t < 4:
        mg.printf("thread %d of block %ld: %.2f\n", mg.cast(t, mg.i32), block_idx.x, A[t])


@mg.kernel
def extrema(X: mg.memref[N, mg.f32], I: mg.memref[N, mg.i32], U: mg.memref[N, mg.u32],
            F_out: mg.memref[2, mg.f32], I_out: mg.memref[2, mg.i32], U_out: mg.memref[2, mg.u32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        mg.atomic.max(F_out, 0, X[i])
        mg.atomic.min(F_out, 1, X[i])
        mg.atomic.max(I_out, 0, I[i])
        mg.atomic.min(I_out, 1, I[i])
        mg.atomic.max(U_out, 0, U[i])
        mg.atomic.min(U_out, 1, U[i])


@mg.kernel
def take_tickets(counter: mg.memref[1, mg.i32], tickets: mg.memref[N, mg.i32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        tickets[i] = mg.atomic.add(counter, 0, 1)


@mg.kernel
def claim_slots(slots: mg.memref[S, mg.i32], old: mg.memref[N, mg.i32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        old[i] = mg.atomic.cas(slots, i % S, 0, mg.cast(i, mg.i32) + 1)


@mg.kernel
def float_sum_and_exchange(X: mg.memref[N, mg.f64], total: mg.memref[1, mg.f64], last: mg.memref[1, mg.i32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        mg.atomic.add(total, 0, X[i])
        mg.atomic.exchange(last, 0, mg.cast(i, mg.i32))


@mg.kernel
def warp_ops(X: mg.memref[N, mg.f32], I: mg.memref[N, mg.i32], total: mg.memref[N, mg.f32],
             lane3: mg.memref[N, mg.i32], down: mg.memref[N, mg.f32], up: mg.memref[N, mg.f32],
             lane: mg.memref[N, mg.i32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    x = X[i]
    s = x
    for mask in (16, 8, 4, 2, 1):  # butterfly: every lane gets the warp's sum
        s += mg.warp.shfl_xor(s, mask)
    total[i] = s
    lane3[i] = mg.warp.shfl_idx(I[i], 3)
    down[i] = mg.warp.shfl_down(x, 1)
    up[i] = mg.warp.shfl_up(x, 2)
    lane[i] = mg.cast(mg.warp.lane_id(), mg.i32)
