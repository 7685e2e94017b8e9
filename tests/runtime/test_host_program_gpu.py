"""mg.HostProgram on the GPU: the two-matmul program against NumPy and its two
matmuls overlapping, every runtime operation, failures that leave the
process and the context usable (only non-sticky errors: an invalid launch
configuration, an allocation far too big), and no growth over many calls."""
import gc

import numpy as np
import pytest

import mlirgpu as mg
from support.checks import PYTHON_DIR
from test_host_program import PROGRAM, example, two_matmuls_program
from support.leaks import MB, rss

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def program():
    return mg.HostProgram(PROGRAM)


def inputs(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)


def relative_error(got, A, B):
    reference = 2 * (A.astype(np.float64) @ B.astype(np.float64))
    return np.abs(got - reference).max() / np.abs(reference).max()


def test_two_matmuls_program_equals_numpy():
    prog = mg.HostProgram(two_matmuls_program())
    A, B = inputs(256, 1024, 256)
    C = prog("test_parallel", A, B)
    assert C.shape == (256, 256) and C.dtype == np.float32
    assert relative_error(C, A, B) < 1e-5
    # DeviceArrays in: the program copies from device memory.
    assert relative_error(prog("test_parallel", mg.to_device(A), mg.to_device(B)), A, B) < 1e-5


def test_the_two_matmuls_overlap():
    # K = 16384: each matmul runs for milliseconds, far longer than the launch
    # of the second, and both grids (256 blocks each) fit on the GPU at once.
    prog = mg.HostProgram(two_matmuls_program(256, 16384, 256))
    A, B = inputs(256, 16384, 256)
    prog("test_parallel", A, B)                        # loads the kernels
    C = prog.run("test_parallel", A, B, timeline=True)
    assert relative_error(C, A, B) < 1e-4
    names = [entry[0] for entry in prog.timeline]
    assert names == ["matmul", "matmul", "add"]
    (_, stream1, start1, end1), (_, stream2, start2, end2), (_, _, start3, end3) = prog.timeline
    assert stream1 != stream2
    assert max(start1, start2) < min(end1, end2), prog.timeline     # the intervals intersect
    assert example.overlap(prog.timeline) > 0
    assert start3 >= max(end1, end2) - 1e-3                        # the add waited for both


@pytest.mark.device_memory
def test_every_runtime_operation(program):
    np.testing.assert_array_equal(program("filled", 1000, 1.5, 128), np.full(1000, 1.5, np.float32))
    a, b = program("memsets", 777)
    np.testing.assert_array_equal(a, np.full(777, 2.5, np.float32))
    np.testing.assert_array_equal(b, np.full(777, 1.5, np.float16))
    np.testing.assert_array_equal(program("doubled", np.arange(300, dtype=np.float32)), 2 * np.arange(300))
    x = mg.to_device(np.arange(50, dtype=np.float32))
    np.testing.assert_array_equal(program("doubled", x), 2 * np.arange(50))
    free = mg.cuda.Device(mg.cuda.current_device()).mem_info()[0]
    program("leaky", 1 << 24)                                       # 2 x 64 MB left behind, then freed
    assert mg.cuda.Device(mg.cuda.current_device()).mem_info()[0] >= free - 4 * MB


def test_host_shared_memory_written_by_host_code_is_read_by_a_kernel(program):
    out = program("host_shared_roundtrip", 4096)
    np.testing.assert_array_equal(out, 2 * np.arange(4096, dtype=np.float32))


def test_invalid_launch_raises_and_the_next_call_works(program):
    with pytest.raises(mg.CudaError) as caught:
        program("filled", 64, 1.0, 2048)                           # more threads than a block can have
    assert caught.value.name == "CUDA_ERROR_INVALID_VALUE"
    assert "kernel 'fill' grid=(1, 1, 1) block=(2048, 1, 1)" in str(caught.value)
    np.testing.assert_array_equal(program("filled", 64, 3.0, 32), np.full(64, 3.0, np.float32))


def test_allocation_far_too_big_raises_and_the_next_call_works(program):
    with pytest.raises(mg.CudaError) as caught:
        program("oversized", 1 << 40)                              # 4 TiB
    assert caught.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert "mgpuMemAlloc: cuMemAlloc failed" in str(caught.value)
    np.testing.assert_array_equal(program("filled", 8, 2.0, 8), np.full(8, 2.0, np.float32))


def test_freeing_what_the_program_does_not_own_raises(program):
    with pytest.raises(mg.CudaError, match="was not allocated by this call"):
        program("free_argument", np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="GPU memory the program freed"):
        program("freed_result", 16)
    np.testing.assert_array_equal(program("filled", 8, 2.0, 8), np.full(8, 2.0, np.float32))


def test_a_gpu_launch_body_is_outlined_and_runs():
    prog = mg.HostProgram("""
    module attributes {gpu.container_module} {
      func.func @doubled_in_place(%a: memref<16xf32>) -> memref<16xf32> {
        %c1 = arith.constant 1 : index
        %c16 = arith.constant 16 : index
        %t0 = gpu.wait async
        %d, %t1 = gpu.alloc async [%t0] () : memref<16xf32>
        %t2 = gpu.memcpy async [%t1] %d, %a : memref<16xf32>, memref<16xf32>
        gpu.wait [%t2]
        gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
                   threads(%tx, %ty, %tz) in (%u = %c16, %v = %c1, %w = %c1) {
          %v0 = memref.load %d[%tx] : memref<16xf32>
          %v1 = arith.addf %v0, %v0 : f32
          memref.store %v1, %d[%tx] : memref<16xf32>
          gpu.terminator
        }
        return %d : memref<16xf32>
      }
    }""")
    a = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(prog("doubled_in_place", a), 2 * a)


@pytest.mark.device_memory
def test_many_calls_do_not_grow_device_or_host_memory(program):
    prog = mg.HostProgram(two_matmuls_program(64, 128, 64))
    A, B = inputs(64, 128, 64)
    device = mg.cuda.Device(mg.cuda.current_device())

    def cycle():
        prog("test_parallel", A, B)
        program("leaky", 4096)
        program.run("host_shared_roundtrip", 1024, timeline=True)

    for _ in range(50):
        cycle()
    gc.collect()
    free, before = device.mem_info()[0], rss()
    for _ in range(1000):
        cycle()
    gc.collect()
    assert free - device.mem_info()[0] < 16 * MB
    assert rss() - before < 32 * MB


def test_the_example_reports_overlap():
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    done = subprocess.run([sys.executable, example.__file__, "256", "16384", "256"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    error = float(done.stdout.split("relative error against NumPy (float64) ")[1].split()[0])
    assert error < 1e-4
    assert "the two matmuls overlapped for" in done.stdout
