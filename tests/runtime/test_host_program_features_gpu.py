"""Host programs on the GPU, one per feature, with their results and printed
output checked: host-registered memory, NumPy inputs read by kernels as
they are (the example's matmul program in its first form), the runner utilities and
kernel printf in program order, TMA loads, cluster launches, the async
dialect, the options (a linalg pipeline, fatbin, bare pointers), a kernel
fault named where it happened, and python -m mlirgpu.run."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mlirgpu as mg
from support.checks import PYTHON_DIR, TEST_PATH
from test_host_program import example
from test_host_program_async import ASYNC
from test_host_program_hopper import CLUSTER
from test_host_program_memory import REGISTERED, direct_matmul_program
from test_host_program_options import LINALG, LINALG_TO_GPU, TRANSFORM, TRANSFORM_TO_GPU
from test_run_command import REGISTERED as REGISTERED_PRINTING

pytestmark = pytest.mark.gpu


def test_host_register():
    prog = mg.HostProgram(REGISTERED)
    assert prog("registered", 6).tolist() == [0, 2, 4, 6, 8, 10]
    assert prog("registered", 1000).tolist() == [2.0 * i for i in range(1000)]
    assert prog("shared_page").tolist() == [2.0 * i for i in range(8)]


@pytest.mark.parametrize("M, K, N", [(256, 1024, 256), (64, 128, 32)])
def test_the_direct_matmul_program_reads_numpy_inputs(M, K, N):
    prog = mg.HostProgram(direct_matmul_program(M, K, N))
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    for _ in range(3):
        C = prog("test_parallel", A, B)
        reference = 2 * (A.astype(np.float64) @ B.astype(np.float64))
        assert np.abs(C - reference).max() / np.abs(reference).max() < 1e-5


def test_numpy_arguments_written_by_kernels():
    prog = mg.HostProgram(REGISTERED)
    x, y = np.arange(100, dtype=np.float32), np.zeros(100, np.float32)
    prog("doubled_in_place", x, y)
    assert y.tolist() == [2.0 * i for i in range(100)] and x.tolist() == list(range(100))


PRINTING = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @hello(%A: memref<?xf32>) kernel {
      %t = gpu.thread_id x
      %i = arith.index_cast %t : index to i32
      gpu.printf "thread %d\\n", %i : i32
      %f = arith.sitofp %i : i32 to f32
      memref.store %f, %A[%t] : memref<?xf32>
      gpu.return
    }
  }
  func.func @main() {
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    vector.print str "before\\n"
    %a = gpu.alloc host_shared (%c2) : memref<?xf32>
    gpu.launch_func @kernels::@hello blocks in (%c1, %c1, %c1) threads in (%c2, %c1, %c1) args(%a : memref<?xf32>)
    %u = memref.cast %a : memref<?xf32> to memref<*xf32>
    call @printMemrefF32(%u) : (memref<*xf32>) -> ()
    %v = arith.constant dense<[1.5, 2.0]> : vector<2xf32>
    vector.print %v : vector<2xf32>
    %t0 = gpu.wait async
    %t1 = gpu.dealloc async [%t0] %a : memref<?xf32>
    gpu.wait [%t1]
    return
  }
  func.func private @printMemrefF32(memref<*xf32>)
}
"""


def test_printing_in_program_order(capfd):
    prog = mg.HostProgram(PRINTING)
    capfd.readouterr()
    print("python first")
    prog("main")
    print("python last")
    lines = capfd.readouterr().out.splitlines()
    assert lines[:2] == ["python first", "before"]
    assert sorted(lines[2:4]) == ["thread 0", "thread 1"]         # the kernel's printf, flushed by the launch's sync
    assert lines[4].startswith("Unranked Memref base@ = 0x") and lines[4].endswith(
        "rank = 1 offset = 0 sizes = [2] strides = [1] data = ")
    assert lines[5:] == ["[0,  1]", "( 1.5, 2 )", "python last"]


TMA_LOAD = """
!tile = memref<32x32xf32, 3>
!desc = !nvgpu.tensormap.descriptor<tensor = !tile, swizzle = none, l2promo = none, oob = zero, interleave = none>
!barrier = !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>>
module attributes {gpu.container_module} {
  memref.global "private" @tile : !tile
  // Out = the 32x32 tile of A at rows 0..31, columns 32..63 (TMA coordinates: innermost first).
  func.func @main(%A: memref<64x64xf32>, %Out: memref<32x32xf32>) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c32 = arith.constant 32 : index
    %u = memref.cast %A : memref<64x64xf32> to memref<*xf32>
    %d = nvgpu.tma.create.descriptor %u box[%c32, %c32] : memref<*xf32> -> !desc
    gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
               threads(%tx, %ty, %tz) in (%sx = %c32, %sy = %c1, %sz = %c1) {
      %smem = memref.get_global @tile : !tile
      %bar = nvgpu.mbarrier.create -> !barrier
      %first = arith.cmpi eq, %tx, %c0 : index
      scf.if %first {
        nvgpu.mbarrier.init %bar[%c0], %c1 : !barrier
      }
      gpu.barrier
      scf.if %first {
        %bytes = arith.constant 4096 : index
        nvgpu.tma.async.load %d[%c32, %c0], %bar[%c0] to %smem : !desc, !barrier -> !tile
        nvgpu.mbarrier.arrive.expect_tx %bar[%c0], %bytes : !barrier
      }
      %phase = arith.constant false
      %ticks = arith.constant 10000000 : index
      nvgpu.mbarrier.try_wait.parity %bar[%c0], %phase, %ticks : !barrier
      scf.for %j = %c0 to %c32 step %c1 {
        %v = memref.load %smem[%tx, %j] : !tile
        memref.store %v, %Out[%tx, %j] : memref<32x32xf32>
      }
      gpu.terminator
    }
    return
  }
}
"""


def test_tma_load():
    prog = mg.HostProgram(TMA_LOAD, "sm_90a")
    A = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    out = np.zeros((32, 32), np.float32)
    prog("main", A, out)
    np.testing.assert_array_equal(out, A[:32, 32:])


def test_cluster_launch():
    prog = mg.HostProgram(CLUSTER, "sm_90a")
    y = np.zeros(128, np.float32)
    prog.run("doubled", np.arange(128, dtype=np.float32), y, timeline=True)
    assert y.tolist() == [2.0 * i for i in range(128)]
    assert [entry[0] for entry in prog.timeline] == ["twice"]


# MLIR's own async GPU test program: h0 = b1 + b2 where b1 and b2 are copies of h0 made in two
# regions forked from a third.
UPSTREAM_ASYNC = """
module attributes {gpu.container_module} {
  func.func @main() {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %count = arith.constant 2 : index
    %h0 = memref.alloc(%count) : memref<?xi32>
    %h0_unranked = memref.cast %h0 : memref<?xi32> to memref<*xi32>
    gpu.host_register %h0_unranked : memref<*xi32>
    %v0 = arith.constant 42 : i32
    memref.store %v0, %h0[%c0] : memref<?xi32>
    memref.store %v0, %h0[%c1] : memref<?xi32>
    %t0, %f0 = async.execute () -> !async.value<memref<?xi32>> {
      %b0 = gpu.alloc(%count) : memref<?xi32>
      gpu.memcpy %b0, %h0 : memref<?xi32>, memref<?xi32>
      async.yield %b0 : memref<?xi32>
    }
    %t1, %f1 = async.execute [%t0] (%f0 as %b0 : !async.value<memref<?xi32>>) -> !async.value<memref<?xi32>> {
      %b1 = gpu.alloc(%count) : memref<?xi32>
      gpu.memcpy %b1, %b0 : memref<?xi32>, memref<?xi32>
      async.yield %b1 : memref<?xi32>
    }
    %t2, %f2 = async.execute [%t0] (%f0 as %b0 : !async.value<memref<?xi32>>) -> !async.value<memref<?xi32>> {
      %b2 = gpu.alloc(%count) : memref<?xi32>
      gpu.memcpy %b2, %b0 : memref<?xi32>, memref<?xi32>
      async.yield %b2 : memref<?xi32>
    }
    %t3 = async.execute [%t1, %t2] (%f1 as %b1 : !async.value<memref<?xi32>>,
                                    %f2 as %b2 : !async.value<memref<?xi32>>) {
      gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
                 threads(%tx, %ty, %tz) in (%sx = %count, %sy = %c1, %sz = %c1) {
        %v1 = memref.load %b1[%tx] : memref<?xi32>
        %v2 = memref.load %b2[%tx] : memref<?xi32>
        %sum = arith.addi %v1, %v2 : i32
        memref.store %sum, %h0[%tx] : memref<?xi32>
        gpu.terminator
      }
      async.yield
    }
    async.await %t3 : !async.token
    call @printMemrefI32(%h0_unranked) : (memref<*xi32>) -> ()
    return
  }
  func.func private @printMemrefI32(memref<*xi32>)
}
"""


def test_async(capfd):
    prog = mg.HostProgram(ASYNC)
    x, y = np.zeros(64, np.float32), np.zeros(64, np.float32)
    prog("main", x, y)
    assert x.tolist() == [1.5] * 64 and y.tolist() == [2.5] * 64
    upstream = mg.HostProgram(UPSTREAM_ASYNC)
    capfd.readouterr()
    upstream("main")
    assert capfd.readouterr().out.splitlines()[-1] == "[84,  84]"


def test_options():
    A = np.arange(1024, dtype=np.float32)
    B = np.zeros(1024, np.float32)
    mg.HostProgram(LINALG, pipeline=LINALG_TO_GPU)("scale", A, B)
    assert B.tolist() == [2.0 * i for i in range(1024)]
    B = np.zeros(1024, np.float32)
    mg.HostProgram(TRANSFORM, pipeline=TRANSFORM_TO_GPU)("scale", A, B)
    assert B.tolist() == [2.0 * i for i in range(1024)]
    rng = np.random.default_rng(1)
    A = rng.standard_normal((64, 128), dtype=np.float32)
    Bm = rng.standard_normal((128, 32), dtype=np.float32)
    reference = 2 * (A.astype(np.float64) @ Bm.astype(np.float64))
    for options in [{"format": "fatbin"}, {"kernel_bare_pointers": True}, {"ptxas_options": "--maxrregcount=32"}]:
        C = mg.HostProgram(example.two_matmuls_program(64, 128, 32), **options)("test_parallel", A, Bm)
        assert np.abs(C - reference).max() / np.abs(reference).max() < 1e-5, options


FAULT = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @wild(%A: memref<?xf32>) kernel {
      %far = arith.constant 1099511627776 : index
      %v = arith.constant 1.0 : f32
      memref.store %v, %A[%far] : memref<?xf32>
      gpu.return
    }
    gpu.func @fine(%A: memref<?xf32>) kernel {
      %c0 = arith.constant 0 : index
      %v = arith.constant 1.0 : f32
      memref.store %v, %A[%c0] : memref<?xf32>
      gpu.return
    }
  }
  func.func @main() {
    %c1 = arith.constant 1 : index
    %t0 = gpu.wait async
    %a, %t1 = gpu.alloc async [%t0] (%c1) : memref<?xf32>
    %s = gpu.wait async
    %b, %t3 = gpu.alloc async [%s] (%c1) : memref<?xf32>
    %t2 = gpu.launch_func async [%t1] @kernels::@wild blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%a : memref<?xf32>)
    %t4 = gpu.launch_func async [%t3] @kernels::@fine blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%b : memref<?xf32>)
    gpu.wait [%t2]
    gpu.wait [%t4]
    return
  }
}
"""


def test_a_kernel_fault_is_named():
    # In a process of its own: after a fault the context is lost for good.
    code = ("import json, mlirgpu as mg\nfrom test_host_program_features_gpu import FAULT\n"
            "prog = mg.HostProgram(FAULT)\n"
            "try:\n    prog('main')\nexcept mg.CudaError as e:\n    print(json.dumps([e.name, str(e)]))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, *TEST_PATH]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    name, message = json.loads(done.stdout.strip().splitlines()[-1])
    assert name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "kernel 'wild'" in message and "faulted in @main" in message and "restart" in message


def test_the_run_command(tmp_path):
    path = tmp_path / "program.mlir"
    path.write_text(REGISTERED_PRINTING)
    done = subprocess.run([sys.executable, "-m", "mlirgpu.run", str(path)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=PYTHON_DIR), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "[3.5,  3.5,  3.5,  3.5]"


def test_compiler_log():
    prog = mg.HostProgram(REGISTERED, format="ptx")
    assert prog.compiler_log == ""
    prog("registered", 4)
    assert "registers" in prog.compiler_log and "twice" in prog.compiler_log
