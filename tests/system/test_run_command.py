"""python -m mlirgpu.run FILE.mlir: what mlir-runner does for GPU programs.
It prints what the program prints and exits 0, or names the error on
standard error and exits 1. Run without a driver, and on the fake driver
(tests/support/fake_cuda) for a program whose kernel writes host-registered memory
that the host then prints with printMemrefF32, as MLIR's own GPU tests do."""
import os
import subprocess
import sys

import pytest

from support.checks import PYTHON_DIR

PRINTING = """
module {
  func.func @main() {
    %v = arith.constant dense<[1.0, 2.5]> : vector<2xf32>
    vector.print %v : vector<2xf32>
    return
  }
  func.func @answer() -> i32 {
    %c = arith.constant 42 : i32
    return %c : i32
  }
}
"""

# A kernel fills registered host memory; the host prints it.
REGISTERED = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @fill(%A: memref<?xf32>, %v: f32) kernel {
      %c0 = arith.constant 0 : index
      %t = gpu.thread_id x
      %n = memref.dim %A, %c0 : memref<?xf32>
      %inside = arith.cmpi ult, %t, %n : index
      scf.if %inside {
        memref.store %v, %A[%t] : memref<?xf32>
      }
      gpu.return
    }
  }
  func.func @main() {
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %v = arith.constant 3.5 : f32
    %a = memref.alloc(%c4) : memref<?xf32>
    %u = memref.cast %a : memref<?xf32> to memref<*xf32>
    gpu.host_register %u : memref<*xf32>
    gpu.launch_func @kernels::@fill blocks in (%c1, %c1, %c1) threads in (%c4, %c1, %c1)
        args(%a : memref<?xf32>, %v : f32)
    call @printMemrefF32(%u) : (memref<*xf32>) -> ()
    memref.dealloc %a : memref<?xf32>
    return
  }
  func.func private @printMemrefF32(memref<*xf32>)
}
"""


def run(tmp_path, text, *args, libcuda="/nonexistent/libcuda.so.1"):
    path = tmp_path / "program.mlir"
    path.write_text(text)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MLIRGPU_LIBCUDA=libcuda)
    return subprocess.run([sys.executable, "-m", "mlirgpu.run", str(path), *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_prints_what_the_program_prints(tmp_path):
    done = run(tmp_path, PRINTING)
    assert (done.returncode, done.stdout, done.stderr) == (0, "( 1, 2.5 )\n", "")
    done = run(tmp_path, PRINTING, "--entry", "answer")
    assert (done.returncode, done.stdout) == (0, "42\n")


@pytest.mark.parametrize("text, args, message", [
    (PRINTING, ["--entry", "missing"], "no public function @missing to call (the program has: main, answer)"),
    ("module { func.func @main( }", [], "MLIRError"),
    (PRINTING, ["--pipeline", "no-such-pass"], "CompileError: pipeline stage failed"),
    (REGISTERED, ["--format", "ptx"], "CudaError"),        # no driver
])
def test_failures_exit_1_with_the_error(tmp_path, text, args, message):
    done = run(tmp_path, text, *args)
    assert done.returncode == 1 and message in done.stderr, done.stderr


def test_a_missing_file(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mlirgpu.run", str(tmp_path / "none.mlir")], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=PYTHON_DIR), timeout=300)
    assert done.returncode == 1 and "No such file" in done.stderr


def test_registered_memory_printed_on_the_fake_driver(tmp_path, fake_libcuda):
    done = run(tmp_path, REGISTERED, "--format", "ptx", libcuda=fake_libcuda)
    assert done.returncode == 0, done.stderr
    header, data = done.stdout.splitlines()
    assert header.startswith("Unranked Memref base@ = 0x") and header.endswith(
        "rank = 1 offset = 0 sizes = [4] strides = [1] data = ")
    assert data == "[3.5,  3.5,  3.5,  3.5]"
