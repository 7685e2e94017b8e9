"""Hopper's operations on the CPU backend: mbarriers complete their phases as
the PTX ISA says (arrivals and transaction bytes, waits by parity), named
barriers hold one warpgroup for another, TMA boxes land in shared memory
with the hardware's swizzles and zero fill and are stored back clipped at
the array's edges, wgmma reads every operand layout through its descriptor
(8-bit floats too, and A from registers as mg.wgmma.fragments rounds it),
and the warp-specialized Hopper GEMM of examples/tensorcore matches float64
products at odd sizes. Each result is worked out on the host (NumPy, the
layout module), and the threads that would read too early run first. The
TMA boxes land the same on a Hopper GPU (conftest.py's `backend`)."""
import os
import re
import sys

import numpy as np
import pytest

import mlirgpu as mg
from support.backends import current_backend
from support.checks import ptxas_accepts
from mlirgpu.layout import wgmma as wgmma_layout
from mlirgpu.runtime.tensormap import box_layout

ml_dtypes = pytest.importorskip("ml_dtypes")  # NumPy's bf16
EXAMPLES = os.path.abspath(os.path.join(__file__, os.pardir, os.pardir, os.pardir, "examples", "tensorcore"))


@pytest.fixture(autouse=True)
def cpu():
    with current_backend("cpu"):
        yield


def line_of(function, text):
    """The line number of the first source line of `function` containing `text`."""
    import inspect
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


# --------------------------------------------------------------------------
# mbarriers and named barriers
# --------------------------------------------------------------------------

@mg.kernel
def handoff(X: mg.memref[64, mg.i32]):
    # Three rounds of one value from the writer to 63 readers: barrier 0
    # ("full") counts the writer's arrival, barrier 1 ("empty") the readers'.
    data = mg.shared.array((1,), mg.i32)
    bars = mg.mbarrier.array(2)
    t = mg.thread_idx.x
    if t == 0:
        bars.init(0, 1)
        bars.init(1, 63)
        mg.mbarrier.fence_init()
    mg.syncthreads()
    total = mg.constant(0, mg.i32)
    for r in mg.static_range(3):
        if t == 63:
            # The writer is the block's last thread: the readers reach their waits first.
            if r > 0:
                bars.wait(1, (r - 1) % 2)  # every reader has read the last value
            data[0] = 10 * (r + 1)
            bars.arrive(0)
        else:
            bars.wait(0, r % 2)
            total = total + data[0]
            bars.arrive(1)
    X[t] = total


def test_mbarrier_phases_hand_a_value_over_round_after_round():
    X = np.full(64, -1, np.int32)
    handoff(X, grid=1, block=64)
    # Each reader saw 10, 20 and 30: not a value before its phase completed, nor one after.
    assert X.tolist() == [60] * 63 + [0]


@mg.kernel
def dynamic_start(X: mg.memref[2, mg.i32]):
    bars = mg.mbarrier.array(2)      # 16 bytes of static shared memory
    if mg.thread_idx.x == 0:
        bars.init(0, 1)
        bars.init(1, 1)
        base = mg.shared.address(mg.shared.dynamic(mg.f16))
        X[0] = mg.cast(base % 1024, mg.i32)
        X[1] = mg.cast(base % 16, mg.i32)


def test_dynamic_shared_memory_follows_the_static_16_byte_aligned_as_on_a_gpu():
    # Not at a 1024-byte boundary, the 128-byte swizzle's period: a kernel that puts swizzled
    # tiles there finds the boundary itself, here as on the GPU, or reads the wrong bytes here too.
    X = np.full(2, -1, np.int32)
    dynamic_start(X, grid=1, block=32, shared_mem=2048)
    assert X.tolist() == [16, 0]


@mg.kernel
def waits(X: mg.memref[2, mg.i32], forever: mg.i32):
    bars = mg.mbarrier.array(1)
    bars.init(0, 2)
    bars.wait(0, 1)              # the phase before the first: complete already
    X[0] = 1
    bars.arrive(0)               # one of the two arrivals phase 0 expects
    if forever == 1:
        bars.wait(0, 0)
    X[1] = 1


def test_the_phase_before_the_first_is_complete_and_a_missing_arrival_is_a_deadlock():
    X = np.zeros(2, np.int32)
    waits(X, 0, grid=1, block=1)
    assert X.tolist() == [1, 1]
    X = np.zeros(2, np.int32)
    with pytest.raises(mg.KernelError, match=r"deadlock at .*:%d: thread \(0, 0, 0\) of block \(0, 0, 0\) waits "
                       r"on line \d+ for an mbarrier phase" % line_of(waits.function, "bars.wait(0, 0)")):
        waits(X, 1, grid=1, block=1)
    assert X.tolist() == [1, 0]


@mg.kernel
def arrive_uninitialised(X: mg.memref[1, mg.i32]):
    bars = mg.mbarrier.array(1)
    bars.arrive(0)
    X[0] = 1


def test_an_arrival_on_a_barrier_never_initialised_is_a_kernel_error():
    X = np.zeros(1, np.int32)
    with pytest.raises(mg.KernelError, match="never initialised .* at .*:%d" % line_of(
            arrive_uninitialised.function, "bars.arrive(0)")):
        arrive_uninitialised(X, grid=1, block=1)
    assert X[0] == 0


@mg.kernel(max_threads=256)
def relay(X: mg.memref[128, mg.i32]):
    S = mg.shared.array((128,), mg.i32)
    t = mg.warpgroup.thread_index()
    if mg.warpgroup.index() == 1:
        S[t] = 2 * t + 1
        mg.warpgroup.arrive(3, 256)      # warpgroup 1 signals and goes on
    else:
        mg.warpgroup.barrier(3, 256)     # warpgroup 0 (run first) waits for it
        X[t] = S[127 - t]
    mg.warpgroup.barrier(1 + mg.warpgroup.index())


def test_a_named_barrier_holds_one_warpgroup_until_the_other_arrives():
    X = np.zeros(128, np.int32)
    relay(X, grid=2, block=256)
    assert X.tolist() == [2 * (127 - t) + 1 for t in range(128)]


# --------------------------------------------------------------------------
# TMA
# --------------------------------------------------------------------------

@mg.kernel
def tma_box(a_map: mg.TensorMap, out: mg.memref[64 * 64, mg.f16], row: mg.i32, col: mg.i32, count: mg.i32):
    smem = mg.shared.dynamic(mg.f16)
    bars = mg.mbarrier.array(1)
    base = mg.shared.address(smem)
    first = mg.cast(((base + 1023) & 0xFFFFFC00) - base, mg.index) // 2
    if mg.thread_idx.x == 0:
        bars.init(0, 1)
        mg.mbarrier.fence_init()
    mg.syncthreads()
    if mg.thread_idx.x == 0:
        bars.arrive_expect_tx(0, count * 2)
        mg.tma.load(a_map, smem, (row, col), bars, 0, offset=first)
    bars.wait(0, 0)
    for i in range(mg.thread_idx.x, count, 128):
        out[i] = smem[first + i]


def box_of(A, row, col, rows, columns, fill=0.0):
    """The rows x columns box of A at (row, col), `fill` outside A."""
    box = np.full((rows, columns), fill, A.dtype)
    for r in range(rows):
        for c in range(columns):
            if 0 <= row + r < A.shape[0] and 0 <= col + c < A.shape[1]:
                box[r, c] = A[row + r, col + c]
    return box


@pytest.fixture
def hopper_backend(backend):
    """conftest.py's `backend`, the GPU's only where it is a Hopper (sm_90a)."""
    if backend == "cuda" and mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
        pytest.skip("needs a Hopper GPU (sm_90a)")
    return backend


@pytest.mark.parametrize("swizzle, columns", [("none", 64), ("32B", 16), ("64B", 32), ("128B", 64)])
@pytest.mark.parametrize("row, col", [(0, 0), (64, 0), (100, 40), (-3, -8)])
def test_a_tma_box_lands_as_its_layout_says(hopper_backend, swizzle, columns, row, col):
    A = np.arange(130 * 72, dtype=np.float32).reshape(130, 72).astype(np.float16)
    a_map = mg.tensor_map(mg.to_device(A), box=(64, columns), swizzle=swizzle)
    out = mg.to_device(np.full(64 * 64, np.nan, np.float16))
    tma_box(a_map, out, row, col, 64 * columns, grid=1, block=128, shared_mem=64 * 64 * 2 + 1024)
    layout = box_layout((64, columns), mg.f16, swizzle)
    box = box_of(A, row, col, 64, columns)  # zeros past the edges: the map's fill
    expected = np.empty(64 * columns, np.float16)
    for r in range(64):
        for c in range(columns):
            expected[layout(r, c)] = box[r, c]
    np.testing.assert_array_equal(out.get()[:64 * columns], expected)


def test_a_nan_filled_map_reads_nan_past_the_edges():
    A = np.ones((70, 40), np.float16)
    a_map = mg.tensor_map(mg.to_device(A), box=(64, 64), swizzle="128B", oob_fill="nan")
    out = np.zeros(64 * 64, np.float16)
    tma_box(a_map, out, 32, 0, 64 * 64, grid=1, block=128, shared_mem=64 * 64 * 2 + 1024)
    layout = box_layout((64, 64), mg.f16, "128B")
    got = np.empty((64, 64), np.float16)
    for r in range(64):
        for c in range(64):
            got[r, c] = out[layout(r, c)]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(box_of(A, 32, 0, 64, 64, np.nan)))
    assert (got[:38, :40] == 1).all()


def test_element_strides_take_every_other_column():
    A = np.arange(20 * 40, dtype=np.float32).reshape(20, 40).astype(np.float16)
    a_map = mg.tensor_map(A, box=(8, 16), swizzle="none", element_strides=(1, 2))
    assert a_map.info.box_bytes == 8 * 8 * 2
    out = np.zeros(64 * 64, np.float16)
    tma_box(a_map, out, 3, 32, 64, grid=1, block=128, shared_mem=64 * 64 * 2 + 1024)
    # Rows 3..10, columns 32, 34, ..., 46 (past 39: zeros), packed in shared memory.
    np.testing.assert_array_equal(out[:64].reshape(8, 8), box_of(A, 3, 32, 8, 16)[:, ::2])


def test_a_box_whose_rows_start_off_16_bytes_is_a_kernel_error():
    A = np.zeros((64, 64), np.float16)
    out = np.zeros(64 * 64, np.float16)
    with pytest.raises(mg.KernelError, match=r"mg\.tma\.load: the innermost coordinate -5 is -10 bytes into a row: "
                       r"the box's rows must start at a multiple of 16 bytes, by thread \(0, 0, 0\) of block "
                       r"\(0, 0, 0\) at .*:%d" % line_of(tma_box.function, "mg.tma.load(")):
        tma_box(mg.tensor_map(A, box=(64, 64)), out, 0, -5, 64 * 64, grid=1, block=128, shared_mem=9216)


def test_a_box_past_the_shared_memory_is_a_kernel_error():
    A = np.zeros((64, 64), np.float16)
    out = np.zeros(64 * 64, np.float16)
    with pytest.raises(mg.KernelError, match=r"mg\.tma\.load: 8192 bytes at byte \d+ of shared memory, past the "
                       r"block's \d+, by thread \(0, 0, 0\) of block \(0, 0, 0\) at .*:%d"
                       % line_of(tma_box.function, "mg.tma.load(")):
        tma_box(mg.tensor_map(A, box=(64, 64)), out, 0, 0, 64 * 64, grid=1, block=128, shared_mem=4096)


@mg.kernel
def tma_store_box(c_map: mg.TensorMap, row: mg.i32, col: mg.i32):
    smem = mg.shared.dynamic(mg.f32)
    for i in range(mg.thread_idx.x, 8 * 32, 64):
        smem[i] = mg.cast(i, mg.f32)
    mg.tma.fence_proxy_async()
    mg.syncthreads()
    if mg.thread_idx.x == 0:
        mg.tma.store(c_map, smem, (row, col))
        mg.tma.commit_group()
        mg.tma.wait_group(0)


@pytest.mark.parametrize("row, col", [(0, 0), (5, 20), (-2, 28)])
def test_a_tma_store_writes_the_box_inside_the_array_only(row, col):
    C = np.full((10, 44), -1, np.float32)
    c_map = mg.tensor_map(C, box=(8, 32), swizzle="128B")
    tma_store_box(c_map, row, col, grid=1, block=64, shared_mem=8 * 32 * 4)
    layout = box_layout((8, 32), mg.f32, "128B")
    expected = np.full((10, 44), -1, np.float32)
    for r in range(8):
        for c in range(32):
            if 0 <= row + r < 10 and 0 <= col + c < 44:
                expected[row + r, col + c] = layout(r, c)  # shared element layout(r, c) holds that number
    np.testing.assert_array_equal(C, expected)


# --------------------------------------------------------------------------
# wgmma: each operand layout through its descriptor
# --------------------------------------------------------------------------

def wgmma_kernel(a_tile, b_tile, b_major):
    """A kernel multiplying a 64 x 64 A by a 64 x 64 B whose shared-memory
    images (as the layouts place the elements) it is given."""
    @mg.kernel
    def tile_product(image: mg.memref[2 * 64 * 64, mg.f16], C: mg.memref[64, 64, mg.f32]):
        smem = mg.shared.dynamic(mg.f16)
        base = mg.shared.address(smem)
        first = mg.cast(((base + 1023) & 0xFFFFFC00) - base, mg.index) // 2
        for i in range(mg.thread_idx.x, 2 * 64 * 64, 128):
            smem[first + i] = image[i]
        mg.tma.fence_proxy_async()   # ordinary stores, read by the tensor cores
        mg.syncthreads()
        t = mg.warpgroup.thread_index()
        acc = mg.wgmma.zeros(64)
        mg.wgmma.fence()
        for k in mg.static_range(4):
            a = mg.wgmma.descriptor(smem, a_tile, offset=first, k_block=k)
            b = mg.wgmma.descriptor(smem, b_tile, offset=first + 64 * 64, k_block=k, major=b_major)
            acc = mg.wgmma.mma(acc, a, b, n=64)
        mg.wgmma.commit_group()
        acc = mg.wgmma.wait_group(0, acc)
        for r in mg.static_range(32):
            row, col = mg.wgmma.accumulator_coordinates(r, t)
            C[row, col] = acc[r]
    return tile_product


def wgmma_product(swizzle, b_major):
    """(C the kernel computes, A @ B) for small integer A and B laid out with `swizzle`."""
    a_tile = wgmma_layout.tile_layout((64, 64), 2, swizzle)
    b_tile = wgmma_layout.tile_layout((64, 64), 2, swizzle, major=b_major)
    rng = np.random.default_rng(1)
    a = rng.integers(-4, 5, (64, 64)).astype(np.float16)   # M x K
    b = rng.integers(-4, 5, (64, 64)).astype(np.float16)   # K x N
    image = np.zeros(2 * 64 * 64, np.float16)
    for i in range(64):
        for k in range(64):
            image[a_tile(i, k)] = a[i, k]
            image[64 * 64 + b_tile(i, k)] = b[k, i]          # B's tile is over (N, K)
    C = mg.to_device(np.zeros((64, 64), np.float32))
    wgmma_kernel(a_tile, b_tile, b_major)(mg.to_device(image), C, grid=1, block=128,
                                          shared_mem=2 * 64 * 64 * 2 + 1024)
    return C.get(), a.astype(np.float32) @ b.astype(np.float32)


@pytest.mark.parametrize("b_major", ["K", "MN"])
@pytest.mark.parametrize("swizzle", ["interleave", "32B", "64B", "128B"])
def test_wgmma_reads_each_layout_through_its_descriptor(swizzle, b_major):
    got, expected = wgmma_product(swizzle, b_major)
    np.testing.assert_array_equal(got, expected)  # small integers: exact


def chained_kernel(tile, v_tile, dtype, v_major="K"):
    """A kernel computing (A @ B) @ V of `dtype` (a 16-bit or an 8-bit float), given one shared-memory
    image of the three: A (64 x K) @ B (K x 64) read by descriptors, K being 128 bytes of `dtype`
    (four wgmmas of 32 bytes); that accumulator, rounded to `dtype` as fragments
    (mg.wgmma.fragments), is the second product's A, from registers, times V (64 x 64) given as
    V^T, `v_major` (wgmma reads 8-bit floats K-major only)."""
    inner = 128 // dtype.itemsize

    @mg.kernel
    def chained(image: mg.memref[3 * 64 * inner, dtype], C: mg.memref[64, 64, mg.f32]):
        smem = mg.shared.dynamic(dtype)
        base = mg.shared.address(smem)
        first = mg.cast(((base + 1023) & 0xFFFFFC00) - base, mg.index) // dtype.itemsize
        for i in range(mg.thread_idx.x, 3 * 64 * inner, 128):
            smem[first + i] = image[i]
        mg.tma.fence_proxy_async()
        mg.syncthreads()
        t = mg.warpgroup.thread_index()
        s = mg.wgmma.zeros(64)
        mg.wgmma.fence()
        for k in mg.static_range(4):
            a = mg.wgmma.descriptor(smem, tile, offset=first, k_block=k)
            b = mg.wgmma.descriptor(smem, tile, offset=first + 64 * inner, k_block=k)
            s = mg.wgmma.mma(s, a, b, n=64)
        mg.wgmma.commit_group()
        s = mg.wgmma.wait_group(0, s)
        p = mg.wgmma.fragments(s, dtype)
        acc = mg.wgmma.zeros(64)
        mg.wgmma.fence()
        for k in mg.static_range(64 * dtype.itemsize // 32):   # V's 64 keys, 32 bytes of them a wgmma
            v = mg.wgmma.descriptor(smem, v_tile, offset=first + 2 * 64 * inner, k_block=k, major=v_major)
            acc = mg.wgmma.mma(acc, p[k], v, n=64)
        mg.wgmma.commit_group()
        acc = mg.wgmma.wait_group(0, acc)
        for r in mg.static_range(32):
            row, col = mg.wgmma.accumulator_coordinates(r, t)
            C[row, col] = acc[r]
    return chained


@pytest.mark.parametrize("v_major", ["K", "MN"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_product_feeds_the_next_from_registers(dtype, v_major):
    element = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    tile = wgmma_layout.tile_layout((64, 64), 2, "128B")
    v_tile = wgmma_layout.tile_layout((64, 64), 2, "128B", major=v_major)
    rng = np.random.default_rng(2)
    # Integers in [-2, 2]: A @ B's within 256 and exact in bf16 too, so every product is exact.
    a, b, v = (rng.integers(-2, 3, (64, 64)).astype(np.float32) for _ in range(3))
    image = np.zeros(3 * 64 * 64, np.float32)
    for i in range(64):
        for k in range(64):
            image[tile(i, k)] = a[i, k]
            image[64 * 64 + tile(i, k)] = b[k, i]            # B's tile is over (N, K)
            image[2 * 64 * 64 + v_tile(i, k)] = v[k, i]
    C = mg.to_device(np.zeros((64, 64), np.float32))
    kernel = chained_kernel(tile, v_tile, getattr(mg, dtype), v_major)
    kernel(image.astype(element), C, grid=1, block=128, shared_mem=3 * 64 * 64 * 2 + 1024)
    np.testing.assert_array_equal(C.get(), (a @ b) @ v)


def test_a_fragment_operand_is_wgmmas_register_form(tmp_path):
    tile = wgmma_layout.tile_layout((64, 64), 2, "128B")
    ptx = chained_kernel(tile, tile, mg.bf16)[()].ptx(chip="sm_90a")
    # The first product reads A by descriptor, the second from 4 registers packed in pairs.
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{[^}]*\}, %rd", ptx)) == 4
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{[^}]*\}, "
                          r"\{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+, p, 1, 1, 0;", ptx)) == 4
    assert ptx.count("cvt.rn.bf16x2.f32") == 16
    ptxas_accepts(ptx, "sm_90a", tmp_path)


# --------------------------------------------------------------------------
# wgmma of 8-bit floats (k32, K-major)
# --------------------------------------------------------------------------

FLOAT8 = {mg.f8e4m3: ml_dtypes.float8_e4m3fn, mg.f8e5m2: ml_dtypes.float8_e5m2}


def fp8_kernel(tile, type_a, type_b):
    """A kernel multiplying a 64 x 128 A by a 128 x 64 B of 8-bit floats whose
    shared-memory images (K-major, as `tile` places the elements; B's over
    (N, K)) it is given."""
    @mg.kernel
    def fp8_product(a_image: mg.memref[64 * 128, type_a], b_image: mg.memref[64 * 128, type_b],
                    C: mg.memref[64, 64, mg.f32]):
        sa, sb = mg.shared.dynamic(type_a), mg.shared.dynamic(type_b)   # one window, two views
        base = mg.shared.address(sa)
        first = mg.cast(((base + 1023) & 0xFFFFFC00) - base, mg.index)
        for i in range(mg.thread_idx.x, 64 * 128, 128):
            sa[first + i] = a_image[i]
            sb[first + 64 * 128 + i] = b_image[i]
        mg.tma.fence_proxy_async()
        mg.syncthreads()
        t = mg.warpgroup.thread_index()
        acc = mg.wgmma.zeros(64)
        mg.wgmma.fence()
        for k in mg.static_range(4):
            a = mg.wgmma.descriptor(sa, tile, offset=first, k_block=k)
            b = mg.wgmma.descriptor(sb, tile, offset=first + 64 * 128, k_block=k)
            acc = mg.wgmma.mma(acc, a, b, n=64)
        mg.wgmma.commit_group()
        acc = mg.wgmma.wait_group(0, acc)
        for r in mg.static_range(32):
            row, col = mg.wgmma.accumulator_coordinates(r, t)
            C[row, col] = acc[r]
    return fp8_product


def staged_product(a, b, depth):
    """a @ b as wgmmas sum it: each k-slice of `depth` exactly (in float64, exact for these
    operands), then rounded to the float32 accumulator."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(0, a.shape[1], depth):
        acc = (acc.astype(np.float64) + a[:, k:k + depth] @ b[k:k + depth]).astype(np.float32)
    return acc


def float8_codes(kind, shape, rng, largest=None):
    """Random values of the 8-bit float `kind`, any code but NaN and infinity (and, with
    `largest`, none above it in magnitude): subnormals, zeros of both signs and the extremes."""
    values = np.arange(256, dtype=np.uint8).view(FLOAT8[kind]).astype(np.float64)
    values = values[np.isfinite(values)]
    if largest is not None:
        values = values[np.abs(values) <= largest]
    return rng.choice(values, shape)


@pytest.mark.parametrize("swizzle", ["interleave", "32B", "64B", "128B"])
@pytest.mark.parametrize("type_b", [mg.f8e4m3, mg.f8e5m2], ids=["e4m3", "e5m2"])
def test_8bit_wgmma_reads_each_layout_through_its_descriptor(swizzle, type_b):
    tile = wgmma_layout.tile_layout((64, 128), 1, swizzle)
    rng = np.random.default_rng(3)
    # Every finite e4m3 code in A; e5m2 in B up to 2^8 (and down to its subnormals' 2^-16), so that
    # each k32 slice's sum is exact in float64 and only the accumulator's rounding remains.
    a = float8_codes(mg.f8e4m3, (64, 128), rng)                                  # M x K
    b = float8_codes(type_b, (128, 64), rng, None if type_b == mg.f8e4m3 else 256.0)   # K x N
    a_image, b_image = (np.zeros(64 * 128, FLOAT8[kind]) for kind in (mg.f8e4m3, type_b))
    for i in range(64):
        for k in range(128):
            a_image[tile(i, k)] = a[i, k]
            b_image[tile(i, k)] = b[k, i]
    C = np.zeros((64, 64), np.float32)
    fp8_kernel(tile, mg.f8e4m3, type_b)(a_image, b_image, C, grid=1, block=128, shared_mem=2 * 64 * 128 + 1024)
    np.testing.assert_array_equal(C, staged_product(a, b, 32))


@mg.kernel
def float8_words(X: mg.memref[2, 16, mg.f32], W: mg.memref[2, 4, mg.i32]):
    # An accumulator of 16 values as one A fragment of e4m3 (X[0]) and of e5m2 (X[1]).
    for row, kind in ((0, mg.f8e4m3), (1, mg.f8e5m2)):
        fragment = mg.wgmma.fragments([X[row, i] for i in mg.static_range(16)], kind)[0]
        for j in mg.static_range(4):
            W[row, j] = fragment.words[j]


def test_fragments_round_to_8bit_floats_as_cvt_satfinite(tmp_path):
    # Ties to the even code (2^-10 between 0 and e4m3's 2^-9; 3 x 2^-10), past the largest finite
    # value and infinities to it, NaN to NaN.
    x = np.array([[1.0, -0.3, 17.0, 19.0, 2 ** -10, 3 * 2 ** -10, 464.0, 1e9, -np.inf, np.inf, -500.0, 0.0, -0.0,
                   np.nan, 0.1, 2 ** -7],
                  [1.0, -0.3, 17.0, 19.0, 2 ** -17, 3 * 2 ** -17, 61440.0, 1e9, -np.inf, np.inf, -70000.0, 0.0,
                   -0.0, np.nan, 0.1, 2 ** -15]], np.float32)
    words = np.zeros((2, 4), np.int32)
    float8_words(x, words, grid=1, block=1)
    got = words.view(np.uint8).reshape(2, 4, 4)
    # Word j's bytes, lowest first: accumulator values (0, 1, 4, 5), (2, 3, 6, 7), (8, 9, 12, 13), (10, 11, 14, 15).
    order = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    for row, (kind, largest) in enumerate(((mg.f8e4m3, 448.0), (mg.f8e5m2, 57344.0))):
        values = got[row].reshape(16).view(FLOAT8[kind]).astype(np.float32)
        expected = np.clip(x[row, order], -largest, largest).astype(FLOAT8[kind]).astype(np.float32)
        np.testing.assert_array_equal(values, expected, err_msg=kind.name)
        assert np.signbit(values[order.index(12)])   # -0.0 keeps its sign
    ptx = float8_words.specialize({}).ptx("sm_90a")
    # Two conversions of a pair a word.
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 8 and ptx.count("cvt.rn.satfinite.e5m2x2.f32") == 8
    ptxas_accepts(ptx, "sm_90a", tmp_path)


def chained_fp8_product(dtype, permuted):
    """(C the kernel computes, (A @ B rounded to `dtype`) @ V) with V^T's K rows (the keys) in
    fragment_columns' order within each 32, or with not `permuted` in their own."""
    kind = FLOAT8[dtype]
    tile = wgmma_layout.tile_layout((64, 128), 1, "128B")
    v_tile = wgmma_layout.tile_layout((64, 64), 1, "64B")
    rng = np.random.default_rng(4)
    # Integers in [-3, 3], exact in either type; row 0 of A and column 0 of B all 4s: A @ B's
    # element (0, 0) is 2048, past e4m3's largest 448, which the rounding saturates to.
    a, b, v = (rng.integers(-3, 4, shape).astype(np.float64) for shape in ((64, 128), (128, 64), (64, 64)))
    a[0], b[:, 0] = 4.0, 4.0
    order = mg.wgmma.fragment_columns(dtype)
    image = np.zeros(3 * 64 * 128, kind)
    for i in range(64):
        for k in range(128):
            image[tile(i, k)] = a[i, k]
            image[64 * 128 + tile(i, k)] = b[k, i]
        for j in range(64):        # V^T: N = d x K = keys; key j // 32 * 32 + order[j % 32] at K column j
            key = j // 32 * 32 + order[j % 32] if permuted else j
            image[2 * 64 * 128 + v_tile(i, j)] = v[key, i]
    C = np.zeros((64, 64), np.float32)
    chained_kernel(tile, v_tile, dtype)(image, C, grid=1, block=128, shared_mem=3 * 64 * 128 + 1024)
    largest = float(ml_dtypes.finfo(kind).max)
    p = np.clip(a @ b, -largest, largest).astype(kind).astype(np.float64)
    return C, staged_product(p, v, 32)


@pytest.mark.parametrize("dtype", [mg.f8e4m3, mg.f8e5m2], ids=["e4m3", "e5m2"])
def test_an_8bit_product_feeds_the_next_from_registers(dtype):
    got, expected = chained_fp8_product(dtype, permuted=True)
    np.testing.assert_array_equal(got, expected)
    # The check sees the fragments' order: with V^T's keys in their own order, the sums differ.
    got, expected = chained_fp8_product(dtype, permuted=False)
    assert not np.array_equal(got, expected)


def test_an_8bit_fragment_operand_is_wgmmas_register_form(tmp_path):
    ptx = chained_kernel(wgmma_layout.tile_layout((64, 128), 1, "128B"), wgmma_layout.tile_layout((64, 64), 1, "64B"),
                         mg.f8e4m3)[()].ptx(chip="sm_90a")
    # The first product reads A by descriptor, the second from 4 registers (no transpose operand).
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e4m3 \{[^}]*\}, %rd", ptx)) == 4
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e4m3 \{[^}]*\}, "
                          r"\{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+, p, 1, 1;", ptx)) == 2
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 16
    ptxas_accepts(ptx, "sm_90a", tmp_path)


# --------------------------------------------------------------------------
# The Hopper GEMM
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hopper_gemm():
    sys.path.insert(0, EXAMPLES)
    try:
        import hopper_gemm
    finally:
        sys.path.remove(EXAMPLES)
    return hopper_gemm


def run_gemm(hopper_gemm, M, N, K, config, dtype=mg.bf16):
    a, b, dA, dB = hopper_gemm._inputs(M, N, K, dtype, config.b_major)
    C = mg.to_device(np.full((M, N), np.nan, np.float32))  # poisoned: every element must be written
    hopper_gemm.matmul(dA, dB, mg.f32, config, C=C)
    got = C.get().astype(np.float64)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isfinite(got).all(), "elements of C were not written"
    # f32 sums of exact products of bf16 (or f16), against float64.
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-5


@pytest.mark.parametrize("b_major", ["MN", "K"])
@pytest.mark.parametrize("M, N, K", [(130, 72, 90), (128, 256, 64)])
def test_the_default_gemm_on_the_cpu(hopper_gemm, M, N, K, b_major):
    # C's rows are multiples of 16 bytes: the TMA-store epilogue, clipped at C's edges.
    run_gemm(hopper_gemm, M, N, K, hopper_gemm.CONFIGS[0].replace(b_major=b_major))


@pytest.mark.parametrize("config", [dict(bn=64, stages=8), dict(bn=128, stages=6, epilogue="tma", schedule="pingpong"),
                                    dict(bn=64, stages=8, split=2), dict(bn=256, stages=4, b_major="K")],
                         ids=["128x64", "pingpong-tma", "split-2", "k-major"])
def test_tiles_loading_64_rows_of_a_on_the_cpu(hopper_gemm, config):
    # At most 64 rows: each step loads A's 64 rows only, and the tiles' other rows are never stored.
    config = hopper_gemm.Config(**config, a_rows=64)
    run_gemm(hopper_gemm, 50, 136, 330, config)
    run_gemm(hopper_gemm, 64, 72, 64, config)


@pytest.mark.parametrize("M, a_rows", [(1, 8), (5, 8), (16, 16), (30, 32)])
def test_tiles_loading_fewer_rows_of_a_on_the_cpu(hopper_gemm, M, a_rows):
    # A's rows only, to a multiple of 8: the stage's rows past them keep what they held (its other
    # steps' rows, or nothing yet), which only feed accumulator rows that are never stored.
    run_gemm(hopper_gemm, M, 136, 330, hopper_gemm.Config(64, 64, 8, a_rows=a_rows))


def test_64_rows_of_a_is_a_config_of_its_own(hopper_gemm):
    ops_gemm = sys.modules["mlirgpu.ops.hopper_gemm"]
    config = hopper_gemm.Config(64, 64, 8, a_rows=64)
    assert "a_rows=64" in repr(config) and "a_rows" not in repr(hopper_gemm.Config(64, 64, 8))
    assert config.replace(split=2).a_rows == 64 and "64 rows of A" in config.name
    assert hopper_gemm.Config(64, 64, 8, a_rows=24).a_rows == 24
    for wrong in (dict(a_rows=36), dict(a_rows=0), dict(a_rows=72), dict(a_rows=True), dict(a_rows=64, multicast="A")):
        with pytest.raises(ValueError, match="a_rows"):
            hopper_gemm.Config(128, 64, 6, **wrong)
    with pytest.raises(ValueError, match="tiles of BM rows"):
        ops_gemm.build(config, mg.bf16, grouped=True)


@pytest.mark.parametrize("b_major", ["MN", "K"])
def test_the_register_epilogue_gemm_on_the_cpu(hopper_gemm, b_major):
    config = hopper_gemm.Config(256, 64, 4, b_major)
    assert config.epilogue == "registers"
    run_gemm(hopper_gemm, 130, 70, 90, config)


def test_the_ping_pong_gemm_on_the_cpu(hopper_gemm):
    config = hopper_gemm.CONFIGS[1].replace(b_major="K")
    assert config.schedule == "pingpong"
    run_gemm(hopper_gemm, 300, 136, 200, config)


@pytest.mark.parametrize("schedule, bn", [("cooperative", 256), ("pingpong", 128)])
@pytest.mark.parametrize("split", [2, 4])
def test_the_split_k_gemm_on_the_cpu(hopper_gemm, schedule, bn, split):
    # K = 330: 6 steps of 64, the last part-filled. Split 2: slices of 3 steps. Split 4: slices
    # of 2 steps, the fourth wholly past K (TMA's zeros).
    config = hopper_gemm.Config(bn, 64, 4, schedule=schedule, split=split)
    assert "split-K" in config.name and config.epilogue == "registers"
    run_gemm(hopper_gemm, 200, 136, 330, config)


@pytest.mark.parametrize("b_major", ["MN", "K"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("split", [1, 2])
def test_the_32_column_gemm_on_the_cpu(hopper_gemm, b_major, dtype, split):
    # 2 x 3 tiles, the last of each partial; N odd (unpaired stores, B's rows padded);
    # K = 330: 6 steps of 64, the last part-filled, in 2 slices of 3 with split 2.
    config = hopper_gemm.Config(32, 64, 8, b_major, split=split)
    run_gemm(hopper_gemm, 130, 75, 330, config, getattr(mg, dtype))


def test_a_32_column_tile_of_b_is_one_64_byte_swizzled_box(hopper_gemm):
    config = hopper_gemm.Config(32, 64, 4)
    _, _, dA, dB = hopper_gemm._inputs(130, 75, 90, mg.bf16, "MN")
    a_map, b_map = hopper_gemm.prepare(dA, dB, config)
    assert (b_map.info.box, b_map.info.swizzle) == ((64, 32), "64B")
    # The bytes a stage's "full" barrier expects are those its two copies deliver.
    assert a_map.info.box_bytes + b_map.info.box_bytes == config.stage_elements * 2
    # The tile wgmma reads (N x K, MN-major) is where TMA puts the box (K x N).
    tile = wgmma_layout.tile_layout((32, 64), 2, "64B", major="MN")
    assert all(tile(n, k) == b_map.info.layout(k, n) for n in range(32) for k in range(64))
    # One 64-byte row spans the 32 columns: no second group along N (LBO unused, 16 as
    # CuTe sets it); K's 8-row groups 512 bytes apart; each k16 wgmma 16 rows further.
    d = wgmma_layout.descriptor(tile, 2, major="MN")
    assert (d.swizzle, d.leading_byte_offset, d.stride_byte_offset) == ("64B", 16, 512)
    assert d.k_offsets == (0, 1024, 2048, 3072)
    # B given as N x K: 32 rows of BK, the 128-byte swizzle as for any BN.
    k_major = config.replace(b_major="K")
    _, _, dA, dB = hopper_gemm._inputs(130, 75, 90, mg.bf16, "K")
    a_map, b_map = hopper_gemm.prepare(dA, dB, k_major)
    assert (b_map.info.box, b_map.info.swizzle) == ((32, 64), "128B")
    assert a_map.info.box_bytes + b_map.info.box_bytes == k_major.stage_elements * 2
    # A stage: 128 rows of A and 32 columns of B, 128 bytes of K each.
    assert config.shared_bytes() == 4 * (128 + 32) * 128 + 1024


def test_the_grouped_gemm_takes_32_column_tiles_on_the_cpu():
    from mlirgpu.ops.hopper_gemm import Config, grouped_plan
    rng = np.random.default_rng(0)
    ends = np.array([70, 70, 220], np.int32)     # an empty group; 3 columns of tiles, the last partial
    a = rng.standard_normal((220, 72)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((3, 72, 88)).astype(ml_dtypes.bfloat16)
    C = np.full((220, 88), np.nan, np.float32)
    gemm, arguments, keywords = grouped_plan(a, b, ends, C, Config(32, 64, 4))
    assert (arguments[1].info.box, arguments[1].info.swizzle) == ((1, 64, 32), "64B")
    gemm(*arguments, **keywords)
    expected = np.concatenate([a[start:end].astype(np.float64) @ b[g].astype(np.float64)
                               for g, (start, end) in enumerate(zip([0, 70, 70], ends))])
    assert np.max(np.abs(C - expected)) / np.max(np.abs(expected)) < 1e-5


def test_split_k_is_a_register_epilogue_without_clusters(hopper_gemm):
    with pytest.raises(ValueError, match="split-K takes the register epilogue and no multicast"):
        hopper_gemm.Config(256, 64, 4, epilogue="tma", split=2)
    with pytest.raises(ValueError, match="split is an int >= 1"):
        hopper_gemm.Config(256, 64, 4, split=0)


def test_a_cluster_config_is_a_launch_error_on_the_cpu(hopper_gemm):
    config = hopper_gemm.CONFIGS[-1]
    assert config.multicast
    _, _, dA, dB = hopper_gemm._inputs(130, 70, 90, mg.bf16, config.b_major)
    with pytest.raises(mg.LaunchError, match=r"clusters of \(2, 1, 1\), which only the GPU has"):
        hopper_gemm.matmul(dA, dB, mg.f32, config)


@mg.kernel
def multicast_load(a_map: mg.TensorMap, X: mg.memref[8, mg.f16]):
    smem = mg.shared.dynamic(mg.f16)
    bars = mg.mbarrier.array(1)
    mg.tma.load(a_map, smem, (0, 0), bars, 0, multicast=0b11)
    X[0] = smem[0]


def test_a_multicast_copy_is_a_compile_error_on_the_cpu():
    with pytest.raises(mg.CompileError, match=r"mg\.tma\.load with multicast runs only on the GPU \(the CPU backend "
                       r"has no thread-block clusters\)") as info:
        multicast_load(mg.tensor_map(np.zeros((8, 64), np.float16), box=(8, 64)), np.zeros(8, np.float16),
                       grid=1, block=32, shared_mem=2048)
    assert info.value.lineno == line_of(multicast_load.function, "multicast=0b11")


def test_a_tensor_map_parameter_takes_a_tensor_map_on_the_cpu():
    with pytest.raises(mg.LaunchError, match="parameter 'a_map' is a tensor map: pass one made by mg.tensor_map"):
        tma_box(object(), np.zeros(64 * 64, np.float16), 0, 0, 64, grid=1, block=128, shared_mem=9216)


def test_a_tma_store_to_a_read_only_array_is_a_kernel_error():
    C = np.zeros((10, 44), np.float32)
    C.flags.writeable = False
    with pytest.raises(mg.KernelError, match="mg.tma.store: the tensor map's array is read-only, by thread "
                       r"\(0, 0, 0\) of block \(0, 0, 0\) at .*:%d" % line_of(tma_store_box.function, "mg.tma.store(")):
        tma_store_box(mg.tensor_map(C, box=(8, 32), swizzle="128B"), 0, 0, grid=1, block=64, shared_mem=8 * 32 * 4)
    assert not C.any()


# --------------------------------------------------------------------------
# The same kernels on a Hopper GPU: the CPU backend's results are the hardware's
# --------------------------------------------------------------------------

def tma_box_on_the_current_backend(swizzle, columns, row, col):
    A = np.arange(130 * 72, dtype=np.float32).reshape(130, 72).astype(np.float16)
    out = mg.to_device(np.full(64 * 64, np.nan, np.float16))
    tma_box(mg.tensor_map(mg.to_device(A), box=(64, columns), swizzle=swizzle), out, row, col, 64 * columns,
            grid=1, block=128, shared_mem=64 * 64 * 2 + 1024)
    return out.get()


@pytest.mark.gpu
def test_the_cpu_backend_agrees_with_a_hopper_gpu():
    with current_backend("cuda"):
        if mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
            pytest.skip("needs a Hopper GPU (sm_90a)")
    cases = [(swizzle, columns, row, col) for swizzle, columns in (("none", 64), ("32B", 16), ("64B", 32), ("128B", 64))
             for row, col in ((0, 0), (100, 40), (-3, -8))]
    for case in cases:
        with current_backend("cuda"):
            gpu = tma_box_on_the_current_backend(*case)
        np.testing.assert_array_equal(tma_box_on_the_current_backend(*case), gpu, err_msg=f"TMA box {case}")
    for swizzle in ("interleave", "32B", "64B", "128B"):
        for b_major in ("K", "MN"):
            with current_backend("cuda"):
                gpu, expected = wgmma_product(swizzle, b_major)
            np.testing.assert_array_equal(gpu, expected, err_msg=f"wgmma {swizzle} {b_major} on the GPU")
            np.testing.assert_array_equal(wgmma_product(swizzle, b_major)[0], gpu, err_msg=f"wgmma {swizzle} {b_major}")
