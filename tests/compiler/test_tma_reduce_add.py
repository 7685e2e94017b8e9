"""mg.tma.reduce_add: a box of shared memory added to a float32 array's box,
element by element, skipping what lies past the array's far edges; blocks
adding into the same box all count. On the CPU backend and on a Hopper GPU,
whose faults (negative coordinates) the CPU backend reports instead."""
import re

import numpy as np
import pytest

import mlirgpu as mg
from support.backends import current_backend
from support.checks import ptxas_accepts
from mlirgpu.runtime.tensormap import box_layout


@pytest.fixture
def hopper_backend(backend):
    """conftest.py's `backend`, the GPU's only where it is a Hopper (sm_90a)."""
    if backend == "cuda" and mg.cuda.Device(mg.cuda.current_device()).chip != "sm_90a":
        pytest.skip("needs a Hopper GPU (sm_90a)")
    return backend


@mg.kernel
def add_box(c_map: mg.TensorMap, row: mg.i32, col: mg.i32):
    """Each block adds the box whose shared element i holds i + the block's index, from
    the first 1024-byte boundary of dynamic shared memory (the 128-byte swizzle's)."""
    smem = mg.shared.dynamic(mg.f32)
    base = mg.shared.address(smem)
    first = mg.cast(((base + 1023) & 0xFFFFFC00) - base, mg.index) // 4
    for i in range(mg.thread_idx.x, 8 * 32, 64):
        smem[first + i] = mg.cast(i + mg.block_idx.x, mg.f32)
    mg.tma.fence_proxy_async()
    mg.syncthreads()
    if mg.thread_idx.x == 0:
        mg.tma.reduce_add(c_map, smem, (row, col), offset=first)
        mg.tma.commit_group()
        mg.tma.wait_group(0)


@pytest.mark.parametrize("row, col", [(0, 0), (5, 20), (3, 24)])
@pytest.mark.parametrize("blocks", [1, 7])
def test_reduce_add_adds_every_block_inside_the_array_only(hopper_backend, row, col, blocks):
    start = np.arange(10 * 44, dtype=np.float32).reshape(10, 44) / 8
    C = mg.to_device(start)
    add_box(mg.tensor_map(C, box=(8, 32), swizzle="128B"), row, col, grid=blocks, block=64,
            shared_mem=8 * 32 * 4 + 1024)
    layout = box_layout((8, 32), mg.f32, "128B")
    expected = start.copy()
    for r in range(8):
        for c in range(32):
            if 0 <= row + r < 10 and 0 <= col + c < 44:
                # Shared element layout(r, c) holds layout(r, c) + b in block b; sums of small integers
                # and eighths are exact in float32 whatever the order of the additions.
                expected[row + r, col + c] += blocks * layout(r, c) + blocks * (blocks - 1) // 2
    np.testing.assert_array_equal(C.get(), expected)


@mg.kernel
def add_halves(c_map: mg.TensorMap):
    smem = mg.shared.dynamic(mg.f16)
    base = mg.shared.address(smem)
    first = mg.cast(((base + 127) & 0xFFFFFF80) - base, mg.index) // 2
    if mg.thread_idx.x < 64:
        smem[first + mg.thread_idx.x] = mg.cast(1.0, mg.f16)
    mg.tma.fence_proxy_async()
    mg.syncthreads()
    if mg.thread_idx.x == 0:
        mg.tma.reduce_add(c_map, smem, (0, 0), offset=first)
        mg.tma.commit_group()
        mg.tma.wait_group(0)


def test_the_cpu_backend_adds_float32_only():
    with current_backend("cpu"):
        C = np.zeros((8, 8), np.float16)
        with pytest.raises(mg.KernelError, match="mg.tma.reduce_add: the array's elements are float32, not of "
                                                 "tensor map data type 6"):
            add_halves(mg.tensor_map(C, box=(8, 8)), grid=1, block=64, shared_mem=128 + 128)
        assert not C.any()


@pytest.mark.parametrize("row, col, which, value", [(-2, 0, 0, -2), (0, -4, 1, -4)])
def test_a_negative_coordinate_is_a_kernel_error(row, col, which, value):
    # A Hopper GPU stops such an addition with an illegal instruction, which leaves its context unusable.
    with current_backend("cpu"):
        C = np.zeros((10, 44), np.float32)
        with pytest.raises(mg.KernelError, match=f"mg.tma.reduce_add: coordinate {which} is {value}: an "
                                                 "addition's box starts inside the array"):
            add_box(mg.tensor_map(C, box=(8, 32), swizzle="128B"), row, col, grid=1, block=64,
                    shared_mem=8 * 32 * 4 + 1024)
        assert not C.any()


def test_reduce_add_to_a_read_only_array_is_a_kernel_error():
    with current_backend("cpu"):
        C = np.zeros((10, 44), np.float32)
        C.flags.writeable = False
        with pytest.raises(mg.KernelError, match="mg.tma.reduce_add: the tensor map's array is read-only"):
            add_box(mg.tensor_map(C, box=(8, 32), swizzle="128B"), 0, 0, grid=1, block=64,
                    shared_mem=8 * 32 * 4 + 1024)
        assert not C.any()


def test_reduce_add_ptx(tmp_path):
    ptx = add_box.specialize({}).ptx("sm_90a")
    assert re.search(r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add\.tile\.bulk_group", ptx)
    ptxas_accepts(ptx, "sm_90a", tmp_path)
