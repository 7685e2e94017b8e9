"""mg.HostProgram on the CPU: lowering the two-matmul program and others to the llvm
dialect, the errors of bad programs and bad arguments, pure host functions,
and the mgpu* runtime against no driver and against the fake driver
(tests/support/fake_cuda, in subprocesses: the driver is loaded once per process).
The fake driver cannot read cubins, so those programs are built with
format="ptx"; it runs the kernels below by name (matmul, add, fill, twice)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import ir
from support.checks import PYTHON_DIR, TEST_PATH
from mlirgpu.runtime import host_program
from support.leaks import MB, growth

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("host_program_example", ROOT / "examples" / "host_program.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
two_matmuls_program = example.two_matmuls_program

PROGRAM = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    // A[i] = v for i < dim(A)
    gpu.func @fill(%A: memref<?xf32>, %v: f32) kernel {
      %c0 = arith.constant 0 : index
      %b = gpu.block_id x
      %d = gpu.block_dim x
      %t = gpu.thread_id x
      %o = arith.muli %b, %d : index
      %i = arith.addi %o, %t : index
      %n = memref.dim %A, %c0 : memref<?xf32>
      %inside = arith.cmpi ult, %i, %n : index
      scf.if %inside {
        memref.store %v, %A[%i] : memref<?xf32>
      }
      gpu.return
    }
    // Y[i] = 2 X[i]
    gpu.func @twice(%X: memref<?xf32>, %Y: memref<?xf32>) kernel {
      %c0 = arith.constant 0 : index
      %b = gpu.block_id x
      %d = gpu.block_dim x
      %t = gpu.thread_id x
      %o = arith.muli %b, %d : index
      %i = arith.addi %o, %t : index
      %n = memref.dim %X, %c0 : memref<?xf32>
      %inside = arith.cmpi ult, %i, %n : index
      scf.if %inside {
        %x = memref.load %X[%i] : memref<?xf32>
        %y = arith.addf %x, %x : f32
        memref.store %y, %Y[%i] : memref<?xf32>
      }
      gpu.return
    }
  }

  // n values v, filled on the device with blocks of `block` threads, copied into host memory.
  func.func @filled(%n: index, %v: f32, %block: index) -> memref<?xf32> {
    %c1 = arith.constant 1 : index
    %grid = arith.ceildivui %n, %block : index
    %t0 = gpu.wait async
    %d, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
    %t2 = gpu.launch_func async [%t1] @kernels::@fill blocks in (%grid, %c1, %c1) threads in (%block, %c1, %c1)
        args(%d : memref<?xf32>, %v : f32)
    %h = memref.alloc(%n) : memref<?xf32>
    %t3 = gpu.memcpy async [%t2] %h, %d : memref<?xf32>, memref<?xf32>
    %t4 = gpu.dealloc async [%t3] %d : memref<?xf32>
    gpu.wait [%t4]
    return %h : memref<?xf32>
  }

  // Device memory returned as it is, set by memsets on two streams joined through events.
  func.func @memsets(%n: index) -> (memref<?xf32>, memref<?xf16>) {
    %v32 = arith.constant 2.5 : f32
    %v16 = arith.constant 1.5 : f16
    %s1 = gpu.wait async
    %s2 = gpu.wait async
    %a, %t1 = gpu.alloc async [%s1] (%n) : memref<?xf32>
    %b, %t2 = gpu.alloc async [%s2] (%n) : memref<?xf16>
    %t3 = gpu.memset async [%t1] %a, %v32 : memref<?xf32>, f32
    %t4 = gpu.memset async [%t2] %b, %v16 : memref<?xf16>, f16
    %joined = gpu.wait async [%t3, %t4]
    gpu.wait [%joined]
    return %a, %b : memref<?xf32>, memref<?xf16>
  }

  // Host code writes host_shared memory, a kernel reads it into more.
  func.func @host_shared_roundtrip(%n: index) -> memref<?xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c256 = arith.constant 256 : index
    %in = gpu.alloc host_shared (%n) : memref<?xf32>
    %out = gpu.alloc host_shared (%n) : memref<?xf32>
    scf.for %i = %c0 to %n step %c1 {
      %i32 = arith.index_cast %i : index to i32
      %f = arith.sitofp %i32 : i32 to f32
      memref.store %f, %in[%i] : memref<?xf32>
    }
    %grid = arith.ceildivui %n, %c256 : index
    gpu.launch_func @kernels::@twice blocks in (%grid, %c1, %c1) threads in (%c256, %c1, %c1)
        args(%in : memref<?xf32>, %out : memref<?xf32>)
    %t0 = gpu.wait async
    %t1 = gpu.dealloc async [%t0] %in : memref<?xf32>
    gpu.wait [%t1]
    return %out : memref<?xf32>
  }

  // An array from the caller (a DeviceArray or NumPy), doubled on the device.
  func.func @doubled(%x: memref<?xf32>) -> memref<?xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c128 = arith.constant 128 : index
    %n = memref.dim %x, %c0 : memref<?xf32>
    %grid = arith.ceildivui %n, %c128 : index
    %t0 = gpu.wait async
    %dx, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
    %dy, %t2 = gpu.alloc async [%t1] (%n) : memref<?xf32>
    %t3 = gpu.memcpy async [%t2] %dx, %x : memref<?xf32>, memref<?xf32>
    %t4 = gpu.launch_func async [%t3] @kernels::@twice blocks in (%grid, %c1, %c1) threads in (%c128, %c1, %c1)
        args(%dx : memref<?xf32>, %dy : memref<?xf32>)
    %t5 = gpu.dealloc async [%t4] %dx : memref<?xf32>
    gpu.wait [%t5]
    return %dy : memref<?xf32>
  }

  // Memory far too big: the allocation fails and the rest of the call is skipped.
  func.func @oversized(%n: index) {
    %t0 = gpu.wait async
    %d, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
    %t2 = gpu.dealloc async [%t1] %d : memref<?xf32>
    gpu.wait [%t2]
    return
  }

  // The same for host_shared memory, which host code then reads and writes.
  func.func @oversized_shared(%n: index) -> f32 {
    %c0 = arith.constant 0 : index
    %v = arith.constant 4.0 : f32
    %s = gpu.alloc host_shared (%n) : memref<?xf32>
    memref.store %v, %s[%c0] : memref<?xf32>
    %x = memref.load %s[%c0] : memref<?xf32>
    return %x : f32
  }

  // Frees memory it does not own.
  func.func @free_argument(%a: memref<4xf32>) {
    %t0 = gpu.wait async
    %t1 = gpu.dealloc async [%t0] %a : memref<4xf32>
    gpu.wait [%t1]
    return
  }

  // Returns memory it freed.
  func.func @freed_result(%n: index) -> memref<?xf32> {
    %t0 = gpu.wait async
    %d, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
    %t2 = gpu.dealloc async [%t1] %d : memref<?xf32>
    gpu.wait [%t2]
    return %d : memref<?xf32>
  }

  // Leaves two allocations and a stream behind.
  func.func @leaky(%n: index) {
    %t0 = gpu.wait async
    %a, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
    %b, %t2 = gpu.alloc async [%t1] (%n) : memref<?xf32>
    return
  }

  // Host code only: a * s in fresh memory, and the sum of a.
  func.func @host_only(%a: memref<?xf32>, %s: f32) -> (memref<?xf32>, f32) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %zero = arith.constant 0.0 : f32
    %n = memref.dim %a, %c0 : memref<?xf32>
    %out = memref.alloc(%n) : memref<?xf32>
    %sum = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> f32 {
      %x = memref.load %a[%i] : memref<?xf32>
      %y = arith.mulf %x, %s : f32
      memref.store %y, %out[%i] : memref<?xf32>
      %next = arith.addf %acc, %x : f32
      scf.yield %next : f32
    }
    return %out, %sum : memref<?xf32>, f32
  }

  // out[i] = a[i] + 1 over any strides.
  func.func @host_strided(%a: memref<?xf32, strided<[?], offset: ?>>, %out: memref<?xf32, strided<[?], offset: ?>>) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %one = arith.constant 1.0 : f32
    %n = memref.dim %out, %c0 : memref<?xf32, strided<[?], offset: ?>>
    scf.for %i = %c0 to %n step %c1 {
      %x = memref.load %a[%i] : memref<?xf32, strided<[?], offset: ?>>
      %y = arith.addf %x, %one : f32
      memref.store %y, %out[%i] : memref<?xf32, strided<[?], offset: ?>>
    }
    return
  }

  // out[i, j] = v + 3 i + j, into an identity-layout memref.
  func.func @host_fill(%out: memref<2x3xf32>, %v: f32) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %c3 = arith.constant 3 : index
    scf.for %i = %c0 to %c2 step %c1 {
      scf.for %j = %c0 to %c3 step %c1 {
        %r = arith.muli %i, %c3 : index
        %k = arith.addi %r, %j : index
        %k32 = arith.index_cast %k : index to i32
        %kf = arith.sitofp %k32 : i32 to f32
        %x = arith.addf %kf, %v : f32
        memref.store %x, %out[%i, %j] : memref<2x3xf32>
      }
    }
    return
  }

  // a + (b ? 100 : 0) + d, and c + e.
  func.func @scalars(%a: i8, %b: i1, %c: f16, %d: index, %e: f64) -> (i64, f64) {
    %hundred = arith.constant 100 : i64
    %zero = arith.constant 0 : i64
    %a64 = arith.extsi %a : i8 to i64
    %flag = arith.select %b, %hundred, %zero : i64
    %d64 = arith.index_cast %d : index to i64
    %s0 = arith.addi %a64, %flag : i64
    %s = arith.addi %s0, %d64 : i64
    %c64 = arith.extf %c : f16 to f64
    %f = arith.addf %c64, %e : f64
    return %s, %f : i64, f64
  }

  func.func private @not_callable(%x: f32) -> f32 {
    return %x : f32
  }
}
"""


@pytest.fixture(scope="module")
def program():
    return mg.HostProgram(PROGRAM)


@pytest.fixture(scope="module")
def two_matmuls():
    return mg.HostProgram(two_matmuls_program())


def declared(llvm_ir):
    return {line.split("@")[1].split("(")[0] for line in llvm_ir.splitlines() if line.startswith("declare")}


# ---------------------------------------------------------------------------
# Lowering

def test_two_matmuls_program_lowers_to_the_llvm_dialect(two_matmuls):
    assert two_matmuls.functions == ("test_parallel",)
    assert two_matmuls.chip == ("sm_90a" if not mg.cuda.is_available() else mg.cuda.Device(0).chip)
    lowered = two_matmuls.lowered
    assert "gpu.binary @kernels" in lowered and "gpu.module" not in lowered
    assert "func.func" not in lowered and "gpu.alloc" not in lowered and "gpu.wait" not in lowered
    for declaration in ("llvm.func @mgpuStreamCreate() -> !llvm.ptr",
                        "llvm.func @mgpuMemAlloc(i64, !llvm.ptr, i8) -> !llvm.ptr",
                        "llvm.func @mgpuMemcpy(!llvm.ptr, !llvm.ptr, i64, !llvm.ptr)",
                        "llvm.func @mgpuStreamSynchronize(!llvm.ptr)",
                        "llvm.func @mgpuStreamDestroy(!llvm.ptr)",
                        "llvm.func @mgpuMemFree(!llvm.ptr, !llvm.ptr)"):
        assert declaration in lowered
    assert "llvm.func @_mlir_ciface_test_parallel" in lowered
    # What the translation of gpu.binary and gpu.launch_func adds:
    assert declared(two_matmuls.llvm_ir) == {
        "mgpuStreamCreate", "mgpuMemAlloc", "mgpuMemcpy", "mgpuStreamSynchronize", "mgpuStreamDestroy",
        "mgpuMemFree", "mgpuModuleLoad", "mgpuModuleUnload", "mgpuModuleGetFunction", "mgpuLaunchKernel"}
    assert "declare void @mgpuLaunchKernel(ptr, i64, i64, i64, i64, i64, i64, i32, ptr, ptr, ptr, i64)" in two_matmuls.llvm_ir
    # A stream for the copies, one per matmul token, one the add's launch without async makes, one
    # for the deallocs.
    assert two_matmuls.llvm_ir.count("call ptr @mgpuStreamCreate()") == 5
    assert ".entry matmul(" in two_matmuls.ptx and ".entry add(" in two_matmuls.ptx
    assert "gpu.launch_func" in two_matmuls.gpu and "llvm.emit_c_interface" not in two_matmuls.gpu
    assert "nvvm.target" in two_matmuls.outlined and "llvm.func @matmul" in two_matmuls.nvvm


def test_every_gpu_operation_lowers(program):
    assert set(program.functions) == {"filled", "memsets", "host_shared_roundtrip", "doubled", "oversized",
                                      "oversized_shared", "free_argument", "freed_result", "leaky", "host_only",
                                      "host_strided", "host_fill", "scalars"}
    assert declared(program.llvm_ir) >= {
        "mgpuStreamCreate", "mgpuStreamDestroy", "mgpuStreamSynchronize", "mgpuStreamWaitEvent",
        "mgpuEventCreate", "mgpuEventRecord", "mgpuEventDestroy", "mgpuMemAlloc", "mgpuMemFree", "mgpuMemcpy",
        "mgpuMemset32", "mgpuMemset16", "mgpuModuleLoad", "mgpuModuleGetFunction", "mgpuLaunchKernel"}
    assert "call ptr @mgpuMemAlloc(i64 %" in program.llvm_ir and ", i8 1)" in program.llvm_ir  # host_shared


def test_ptx_format_loads_through_the_drivers_jit():
    prog = mg.HostProgram(two_matmuls_program(32, 64, 32), format="ptx")
    assert "mgpuModuleLoadJIT" in declared(prog.llvm_ir) and "mgpuModuleLoad" not in declared(prog.llvm_ir)


def test_a_module_is_cloned_not_changed():
    module = ir.Module.parse(two_matmuls_program(32, 64, 32))
    before = str(module)
    prog = mg.HostProgram(module, chip="sm_80")
    assert str(module) == before and prog.chip == "sm_80" and ".target sm_80" in prog.ptx


# ---------------------------------------------------------------------------
# Bad programs

def test_malformed_text_raises_mlir_error():
    with pytest.raises(mg.MLIRError) as caught:
        mg.HostProgram("func.func @f( {")
    assert caught.value.diagnostics


def test_a_program_that_does_not_verify_raises_mlir_error():
    with pytest.raises(mg.MLIRError, match=r"enclosing function \(@f\) returns 1"):
        mg.HostProgram("func.func @f(%x: f32) -> f32 { return }")
    module = ir.Module.parse("func.func @f() { return }")
    with ir.InsertionPoint.at_block_begin(module.body), ir.Location.unknown(context=module.context):
        ir.Operation.create("arith.constant", results=[ir.Type.f32(context=module.context)])
    with pytest.raises(mg.MLIRError):
        mg.HostProgram(module)


def test_a_lowering_failure_raises_compile_error_with_the_stage():
    text = two_matmuls_program(32, 64, 32).replace("%t5 = gpu.memcpy async [%t4] %dA, %A", "gpu.memcpy %dA, %A") \
                                   .replace("[%t5]", "[%t4]")
    with pytest.raises(mg.CompileError, match=r"host stage failed: loc\(.*\): 'gpu.memcpy' was not lowered(.|\n)*"
                                              r"only when they are `async` with exactly one dependency"):
        mg.HostProgram(text)


def test_bad_options():
    with pytest.raises(mg.CompileError, match="unknown or unsupported chip"):
        mg.HostProgram(two_matmuls_program(32, 64, 32), chip="sm_42")
    with pytest.raises(ValueError, match="format"):
        mg.HostProgram(two_matmuls_program(32, 64, 32), format="sass")
    with pytest.raises(TypeError):
        mg.HostProgram(b"module {}")


def test_unresolvable_runtime_functions_raise_compile_error():
    text = """
    module attributes {gpu.container_module} {
      func.func @f() {
        %c = arith.constant 0 : i32
        gpu.set_default_device %c
        return
      }
    }"""
    with pytest.raises(mg.CompileError, match="mgpuSetDefaultDevice"):
        mg.HostProgram(text)


# ---------------------------------------------------------------------------
# Arguments

A, B = np.ones((256, 1024), np.float32), np.ones((1024, 256), np.float32)


@pytest.mark.parametrize("args, match", [
    ((A,), "takes 2 arguments, got 1"),
    ((A.astype(np.float64), B), r"argument 0 of @test_parallel \(memref<256x1024xf32>\): expected elements of f32"),
    ((A, B[:1000]), r"argument 1 .*expected shape 1024x256, got \(1000, 256\)"),
    ((A, B.reshape(-1)), "argument 1 .*expected shape 1024x256"),
    ((A, B.tolist()), "argument 1 .*expected a numpy.ndarray or an mlirgpu.DeviceArray, not list"),
    ((A, 3.0), "argument 1 .*not float"),
])
def test_argument_mismatches_raise_launch_error(two_matmuls, args, match):
    with pytest.raises(mg.LaunchError, match=match):
        two_matmuls("test_parallel", *args)


def test_unknown_function_raises_launch_error(two_matmuls):
    with pytest.raises(mg.LaunchError, match=r"no public host function @nonesuch \(it has: test_parallel\)"):
        two_matmuls("nonesuch")
    with pytest.raises(ValueError):   # LaunchError is a ValueError
        two_matmuls.run("nonesuch")


def test_private_functions_are_not_callable(program):
    with pytest.raises(mg.LaunchError, match="not_callable"):
        program("not_callable", 1.0)


@pytest.mark.parametrize("args, match", [
    ((300, True, 1.0, 0, 0.0), r"argument 0 of @scalars \(i8\): 300 is out of range \[-128, 127\]"),
    ((1.5, True, 1.0, 0, 0.0), r"argument 0 .*expected an integer"),
    ((1, 2, 1.0, 0, 0.0), r"argument 1 of @scalars \(bool_\): 2 is out of range \[0, 1\]"),
    ((1, True, 1e6, 0, 0.0), r"argument 2 of @scalars \(f16\): 1000000.0 is out of range"),
    ((1, True, "1", 0, 0.0), r"argument 2 .*expected a scalar, got str"),
    ((1, True, 1.0, -1 << 70, 0.0), r"argument 3 of @scalars \(index\)"),
    ((1, True, 1.0, 0, np.zeros(1)), r"argument 4 .*expected a scalar, got ndarray"),
])
def test_scalar_mismatches_raise_launch_error(program, args, match):
    with pytest.raises(mg.LaunchError, match=match):
        program("scalars", *args)


# ---------------------------------------------------------------------------
# Pure host functions run anywhere

def test_scalars_in_and_out(program):
    total, f = program("scalars", np.int8(-5), True, 0.5, 7, 0.25)
    assert total == 102 and isinstance(total, np.int64)
    assert f == 0.75 and isinstance(f, np.float64)
    assert program("scalars", 3, False, np.float16(2), np.int64(1), 1)[0] == 4


def test_a_pure_host_function_returns_numpy(program):
    a = np.arange(12, dtype=np.float32)[::3]           # not contiguous: runs on a contiguous copy
    out, total = program("host_only", a, np.float32(2.0))
    np.testing.assert_array_equal(out, a * 2)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and total == a.sum()


def test_strided_layouts_take_views_and_identity_layouts_copies(program):
    base = np.arange(10, dtype=np.float32)
    out_buffer = np.zeros(10, np.float32)
    assert program("host_strided", base[::-2], out_buffer[1::2]) is None
    np.testing.assert_array_equal(out_buffer[1::2], base[::-2] + 1)   # written in place, through strides
    np.testing.assert_array_equal(out_buffer[::2], 0)
    grid = np.zeros((3, 2), np.float32)
    program("host_fill", grid.T, 10.0)                  # a transposed view: a copy, copied back
    np.testing.assert_array_equal(grid.T, [[10, 11, 12], [13, 14, 15]])


def test_static_layouts():
    prog = mg.HostProgram("""
    func.func @corner(%y: memref<2x3xf32, strided<[1, 2]>>) -> f32 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %v = memref.load %y[%c1, %c0] : memref<2x3xf32, strided<[1, 2]>>
      return %v : f32
    }
    func.func @offset(%x: memref<4xf32, strided<[1], offset: 2>>) {
      return
    }
    func.func @first(%x: memref<f32, strided<[], offset: ?>>) -> f32 {
      %v = memref.load %x[] : memref<f32, strided<[], offset: ?>>
      return %v : f32
    }""")
    column_major = np.arange(6, dtype=np.float32).reshape(3, 2).T     # strides (1, 2) elements
    assert prog("corner", column_major) == column_major[1, 0]
    with pytest.raises(mg.LaunchError, match=r"strides \(12, 4\) \(bytes\) do not fit its layout"):
        prog("corner", np.zeros((2, 3), np.float32))                 # a copy would not fit either
    with pytest.raises(mg.LaunchError, match="a static offset other than 0 cannot be passed"):
        prog("offset", np.zeros(4, np.float32))
    assert prog("first", np.array(2.5, np.float32)) == 2.5


def test_host_calls_do_not_leak(program):
    a = np.ones(50_000, np.float32)

    def host_program_cycle(i):
        out, total = program("host_only", a, 3.0)
        assert total == 50_000
        with pytest.raises(mg.LaunchError):
            program("host_only", a.astype(np.float64), 3.0)

    assert growth(host_program_cycle, 300, 30) < 8 * MB


def test_building_programs_does_not_leak():
    text = two_matmuls_program(32, 64, 32)
    bad = text.replace("%t5 = gpu.memcpy async [%t4] %dA, %A", "gpu.memcpy %dA, %A").replace("[%t5]", "[%t4]")

    def build_cycle(i):
        prog = mg.HostProgram(text)
        assert "mgpuLaunchKernel" in prog.llvm_ir
        with pytest.raises(mg.CompileError):
            mg.HostProgram(bad)

    # Engines are never torn down: builds of one text must share one (the
    # lowered module differs between builds by its compile timings, so it
    # cannot be the key), and then the process stays flat. A leaked engine
    # per build was 0.1-0.6 MB, 3-17 MB over 30 builds.
    engines = host_program._engines
    mg.HostProgram(text)
    before = len(engines)
    assert growth(build_cycle, 30, 5) < 2 * MB
    assert len(engines) == before


# ---------------------------------------------------------------------------
# The runtime, without a driver and on the fake one

def run_script(code, libcuda):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, *TEST_PATH]),
               MLIRGPU_LIBCUDA=libcuda)
    env.pop("MLIRGPU_BACKEND", None)
    proc = subprocess.run([sys.executable, "-c", "import json, numpy as np, mlirgpu as mg\n"
                           "from test_host_program import PROGRAM, two_matmuls_program\nout = {}\n" + code
                           + "\nprint(json.dumps(out))"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_a_driver_gpu_functions_raise_and_host_functions_run():
    out = run_script('''
prog = mg.HostProgram(PROGRAM)                      # no GPU needed to build it
for attempt in range(2):
    try:
        prog("filled", 8, 1.0, 4)
    except mg.CudaError as e:
        out.setdefault("errors", []).append([e.code, e.name])
    result, total = prog("host_only", np.arange(4, dtype=np.float32), 2.0)
    out.setdefault("host", []).append([result.tolist(), float(total)])
''', "/nonexistent/libcuda.so.1")
    assert out["errors"] == [[-1, "MLIRGPU_NO_DRIVER"]] * 2
    assert out["host"] == [[[0, 2, 4, 6], 6.0]] * 2


def test_two_matmuls_program_on_the_fake_driver(fake_libcuda):
    out = run_script('''
prog = mg.HostProgram(two_matmuls_program(64, 128, 32), format="ptx")
rng = np.random.default_rng(1)
A = rng.standard_normal((64, 128), dtype=np.float32)
B = rng.standard_normal((128, 32), dtype=np.float32)
free_before = mg.cuda.Device(0).mem_info()[0]
C = prog.run("test_parallel", A, B, timeline=True)
reference = 2 * (A.astype(np.float64) @ B)
out["error"] = float(np.abs(C - reference).max() / np.abs(reference).max())
out["result"] = [C.shape, str(C.dtype), C.flags.c_contiguous]
out["timeline"] = [[name, stream, start, end] for name, stream, start, end in prog.timeline]
for i in range(20):
    prog("test_parallel", A, B)
out["leaked"] = free_before - mg.cuda.Device(0).mem_info()[0]
out["untimed"] = [list(entry) for entry in prog.timeline] == out["timeline"]   # kept until the next timed run
dA, dB = mg.to_device(A), mg.to_device(B)
out["device_args"] = bool(np.array_equal(prog("test_parallel", dA, dB), C))
''', fake_libcuda)
    assert out["error"] < 1e-5
    assert out["result"] == [[64, 32], "float32", True]
    names = [entry[0] for entry in out["timeline"]]
    assert names == ["matmul", "matmul", "add"]
    (_, s1, a1, b1), (_, s2, a2, b2), (_, _, a3, b3) = out["timeline"]
    assert s1 != s2                                               # the matmuls ran on two streams
    assert min(a1, a2, a3) == 0.0 and all(start <= end for start, end in [(a1, b1), (a2, b2), (a3, b3)])
    assert a3 >= max(b1, b2)                                      # add after the gpu.wait
    assert out["leaked"] == 0 and out["untimed"] and out["device_args"]


def test_runtime_operations_on_the_fake_driver(fake_libcuda):
    out = run_script('''
prog = mg.HostProgram(PROGRAM, format="ptx")
out["filled"] = prog("filled", 10, 1.5, 4).tolist()
a, b = prog("memsets", 5)
out["memsets"] = [a.tolist(), str(a.dtype), b.tolist(), str(b.dtype)]
out["roundtrip"] = prog("host_shared_roundtrip", 6).tolist()
out["doubled"] = prog("doubled", np.arange(5, dtype=np.float32)).tolist()
out["doubled_device"] = prog("doubled", mg.to_device(np.arange(3, dtype=np.float32))).tolist()
free = mg.cuda.Device(0).mem_info()[0]
prog("leaky", 1000)
out["leaky_freed"] = mg.cuda.Device(0).mem_info()[0] == free
''', fake_libcuda)
    assert out["filled"] == [1.5] * 10
    assert out["memsets"] == [[2.5] * 5, "float32", [1.5] * 5, "float16"]
    assert out["roundtrip"] == [0, 2, 4, 6, 8, 10]
    assert out["doubled"] == [0, 2, 4, 6, 8] and out["doubled_device"] == [0, 2, 4]
    assert out["leaky_freed"]


def test_runtime_failures_raise_and_the_next_call_works(fake_libcuda):
    out = run_script('''
prog = mg.HostProgram(PROGRAM, format="ptx")
free = mg.cuda.Device(0).mem_info()[0]
def attempt(key, *args):
    try:
        prog(*args)
        out[key] = "no error"
    except (mg.CudaError, ValueError) as e:
        out[key] = [type(e).__name__, getattr(e, "name", None), str(e)]
    out[key + " then"] = prog("filled", 3, 2.0, 4).tolist()
attempt("launch", "filled", 8, 1.0, 2048)
attempt("oversized", "oversized", 1 << 40)
attempt("oversized_shared", "oversized_shared", 1 << 40)
attempt("free_argument", "free_argument", np.zeros(4, np.float32))
attempt("freed_result", "freed_result", 4)
out["leaked"] = free - mg.cuda.Device(0).mem_info()[0]
# The fake driver loads a cubin as text and finds no kernel in it.
cubin = mg.HostProgram(PROGRAM)
try:
    cubin("filled", 3, 2.0, 4)
except mg.CudaError as e:
    out["cubin"] = [e.name, str(e)]
out["cubin host"] = float(cubin("host_only", np.ones(3, np.float32), 1.0)[1])
''', fake_libcuda)
    kind, name, message = out["launch"]
    assert (kind, name) == ("CudaError", "CUDA_ERROR_INVALID_VALUE")
    assert "mgpuLaunchKernel: cuLaunchKernel failed" in message
    assert "kernel 'fill' grid=(1, 1, 1) block=(2048, 1, 1) shared_mem=0" in message
    kind, name, message = out["oversized"]
    assert (kind, name) == ("CudaError", "CUDA_ERROR_OUT_OF_MEMORY")
    assert "mgpuMemAlloc: cuMemAlloc failed" in message and "4398046511104 bytes" in message
    kind, name, message = out["oversized_shared"]            # host code wrote and read a stand-in
    assert (kind, name) == ("CudaError", "CUDA_ERROR_OUT_OF_MEMORY") and "cuMemAllocManaged" in message
    kind, name, message = out["free_argument"]
    assert (kind, name) == ("CudaError", "CUDA_ERROR_INVALID_VALUE") and "was not allocated by this call" in message
    assert out["freed_result"][0] == "ValueError" and "GPU memory the program freed" in out["freed_result"][2]
    name, message = out["cubin"]
    assert name == "CUDA_ERROR_NOT_FOUND" and "mgpuModuleGetFunction: cuModuleGetFunction failed" in message
    assert "kernel 'fill'" in message and out["cubin host"] == 3.0
    for key in ("launch", "oversized", "oversized_shared", "free_argument", "freed_result"):
        assert out[key + " then"] == [2.0, 2.0, 2.0]
    assert out["leaked"] == 0


def test_an_engine_releases_the_kernel_modules_it_loaded(fake_libcuda):
    # An engine made with the runtime unloads its kernel modules when it dies, once each.
    out = run_script(f'''
import ctypes, gc
fake = ctypes.CDLL({fake_libcuda!r})
fake.fake_log.restype = ctypes.c_char_p
prog = mg.HostProgram(two_matmuls_program(32, 64, 32), format="ptx")
A, B = np.ones((32, 64), np.float32), np.ones((64, 32), np.float32)
engine = mg._mlirgpu.ExecutionEngine(prog._lowered, runtime=True)
fake.fake_log_clear()
for _ in range(3):
    (C,) = engine.invoke("test_parallel", [A, B], [("memref", 2, "f32")])
out["result"] = float(C[0, 0])
del engine
gc.collect()
log = fake.fake_log().decode().splitlines()
out["loads"] = sum(line.startswith("cuModuleLoad ") for line in log)
out["unloads"] = sum(line.startswith("cuModuleUnload ") for line in log)
out["same"] = [line.split()[1] for line in log if line.startswith("cuModuleLoad ")] == \\
    [line.split()[1] for line in log if line.startswith("cuModuleUnload ")]
''', fake_libcuda)
    assert out == {"result": 128.0, "loads": 1, "unloads": 1, "same": True}


def test_engines_of_programs_no_one_uses_are_torn_down(fake_libcuda):
    # Programs from new texts keep at most ENGINE_CACHE_SIZE engines between them once dropped; each
    # torn down unloads its modules once, and programs made after run on memory the old ones freed.
    out = run_script(f'''
import ctypes, gc
from mlirgpu.runtime import host_program
fake = ctypes.CDLL({fake_libcuda!r})
fake.fake_log.restype = ctypes.c_char_p
A = np.arange(8, dtype=np.float32)
fake.fake_log_clear()
results = []
for i in range(3 * host_program.ENGINE_CACHE_SIZE):
    prog = mg.HostProgram(PROGRAM.replace("gpu.func @fill", "gpu.func @fill_%d" % i)
                          .replace("@kernels::@fill ", "@kernels::@fill_%d " % i), format="ptx")
    results.append(prog("doubled", A).tolist() == (2 * A).tolist())
    del prog
    gc.collect()
log = fake.fake_log().decode().splitlines()
out["kept"] = len(host_program._engines)
out["all right"] = all(results)
loads = [line.split()[1] for line in log if line.startswith("cuModuleLoad ")]
unloads = [line.split()[1] for line in log if line.startswith("cuModuleUnload ")]
out["unloaded"] = len(loads) - len(unloads)
out["once"] = len(set(unloads)) == len(unloads)
''', fake_libcuda)
    assert out == {"kept": 8, "all right": True, "unloaded": 8, "once": True}


def test_gpu_calls_do_not_leak_on_the_fake_driver(fake_libcuda):
    out = run_script('''
import gc
prog = mg.HostProgram(PROGRAM, format="ptx")
A = np.arange(4096, dtype=np.float32)
def cycle():
    prog("doubled", A)
    prog("filled", 4096, 1.0, 256)
    prog("leaky", 4096)
    prog.run("host_shared_roundtrip", 512, timeline=True)
    try:
        prog("oversized", 1 << 40)
    except mg.CudaError:
        pass
for i in range(50):
    cycle()
gc.collect()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
before, free = rss(), mg.cuda.Device(0).mem_info()[0]
for i in range(500):
    cycle()
gc.collect()
out["rss"] = rss() - before
out["device"] = free - mg.cuda.Device(0).mem_info()[0]
''', fake_libcuda)
    assert out["device"] == 0
    # The fake driver itself mallocs a little per cuModuleGetFunction.
    assert out["rss"] < 8 * MB


@pytest.mark.parametrize("libcuda", ["none", "fake"])
def test_the_example_runs(libcuda, request):
    if libcuda == "fake":
        # The fake driver cannot load the example's cubin: its main() gets PTX.
        code = ("import runpy, mlirgpu as mg\nbuild = mg.HostProgram\n"
                "mg.HostProgram = lambda text: build(text, format='ptx')\n"
                f"runpy.run_path({str(ROOT / 'examples' / 'host_program.py')!r}, run_name='__main__')")
        path = request.getfixturevalue("fake_libcuda")
    else:
        code, path = f"import runpy; runpy.run_path({str(ROOT / 'examples' / 'host_program.py')!r}, " \
                     "run_name='__main__')", "/nonexistent/libcuda.so.1"
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MLIRGPU_LIBCUDA=path)
    done = subprocess.run([sys.executable, "-c", code, "64", "128", "32"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "the host code calls mgpuLaunchKernel, mgpuMemAlloc" in done.stdout
    if libcuda == "none":
        assert "no GPU" in done.stdout and "relative error" not in done.stdout
    else:
        error = float(done.stdout.split("relative error against NumPy (float64) ")[1].split()[0])
        assert error < 1e-5
        assert done.stdout.count("\nmatmul ") == 2 and "\nadd " in done.stdout


@pytest.mark.parametrize("body", ["""
      scf.for %i = %c0 to %c4 step %c1 {
        memref.store %f, %m[%i] : memref<4xf32>
      }""", """
      cf.br ^next
    ^next:
      memref.store %f, %m[%c0] : memref<4xf32>"""], ids=["scf.for", "cf.br"])
def test_a_kernels_loops_and_branches_have_no_ctrl_c_poll(body):
    # The poll is the host's (Ctrl-C ends a call there): a kernel calling it would not load.
    program = mg.HostProgram("""
func.func @main(%m: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %f = arith.constant 1.0 : f32
  gpu.launch blocks(%bx, %by, %bz) in (%x = %c1, %y = %c1, %z = %c1)
             threads(%tx, %ty, %tz) in (%a = %c1, %b = %c1, %c = %c1) {""" + body + """
      gpu.terminator
  }
  return
}""", format="ptx")
    assert ".entry" in program.ptx and "mg_host_poll" not in program.ptx
