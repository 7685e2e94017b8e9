"""Host memory that kernels of a host program read, on the fake driver
(tests/support/fake_cuda: host memory plays device memory, and its log says what
the runtime asked of the driver): gpu.host_register / gpu.host_unregister,
and NumPy arguments lent to a call in memory the GPU can reach."""
import numpy as np
import pytest

from test_host_program import run_script

# A kernel that doubles X into Y; host memory registered for it, and the
# example's matmul program in its first form: its inputs straight to the kernels.
REGISTERED = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @twice(%X: memref<?xf32>, %Y: memref<?xf32>) kernel {
      %c0 = arith.constant 0 : index
      %t = gpu.thread_id x
      %n = memref.dim %X, %c0 : memref<?xf32>
      %inside = arith.cmpi ult, %t, %n : index
      scf.if %inside {
        %x = memref.load %X[%t] : memref<?xf32>
        %y = arith.addf %x, %x : f32
        memref.store %y, %Y[%t] : memref<?xf32>
      }
      gpu.return
    }
  }

  // Y = 2 X over host memory (memref.alloc) registered with the GPU.
  func.func @registered(%n: index) -> memref<?xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %x = memref.alloc(%n) : memref<?xf32>
    %y = memref.alloc(%n) : memref<?xf32>
    scf.for %i = %c0 to %n step %c1 {
      %ii = arith.index_cast %i : index to i32
      %v = arith.sitofp %ii : i32 to f32
      memref.store %v, %x[%i] : memref<?xf32>
    }
    %ux = memref.cast %x : memref<?xf32> to memref<*xf32>
    %uy = memref.cast %y : memref<?xf32> to memref<*xf32>
    gpu.host_register %ux : memref<*xf32>
    gpu.host_register %uy : memref<*xf32>
    gpu.launch_func @kernels::@twice blocks in (%c1, %c1, %c1) threads in (%n, %c1, %c1)
        args(%x : memref<?xf32>, %y : memref<?xf32>)
    gpu.host_unregister %ux : memref<*xf32>
    memref.dealloc %x : memref<?xf32>
    return %y : memref<?xf32>
  }

  // A 2-d memref registered, as MLIR's own tests register theirs.
  func.func @registered_2d(%m: memref<2x3xf32>) {
    %c1 = arith.constant 1 : index
    %c6 = arith.constant 6 : index
    %u = memref.cast %m : memref<2x3xf32> to memref<*xf32>
    gpu.host_register %u : memref<*xf32>
    return
  }

  // Y = 2 X with both arrays given by the caller, straight to the kernel.
  func.func @doubled_in_place(%x: memref<?xf32>, %y: memref<?xf32>) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %n = memref.dim %x, %c0 : memref<?xf32>
    gpu.launch_func @kernels::@twice blocks in (%c1, %c1, %c1) threads in (%n, %c1, %c1)
        args(%x : memref<?xf32>, %y : memref<?xf32>)
    return
  }

  // Two registrations on one page (halves of one allocation): unregistering one keeps the page
  // registered for the other, and the kernel reads it after that.
  func.func @shared_page() -> memref<?xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c8 = arith.constant 8 : index
    %a = memref.alloc(%c8) : memref<?xf32>
    %b = memref.alloc(%c8) : memref<?xf32>
    scf.for %i = %c0 to %c8 step %c1 {
      %ii = arith.index_cast %i : index to i32
      %v = arith.sitofp %ii : i32 to f32
      memref.store %v, %a[%i] : memref<?xf32>
    }
    %lo = memref.subview %a[0] [4] [1] : memref<?xf32> to memref<4xf32, strided<[1]>>
    %hi = memref.subview %a[4] [4] [1] : memref<?xf32> to memref<4xf32, strided<[1], offset: 4>>
    %ulo = memref.cast %lo : memref<4xf32, strided<[1]>> to memref<*xf32>
    %uhi = memref.cast %hi : memref<4xf32, strided<[1], offset: 4>> to memref<*xf32>
    %ub = memref.cast %b : memref<?xf32> to memref<*xf32>
    gpu.host_register %ulo : memref<*xf32>
    gpu.host_register %uhi : memref<*xf32>
    gpu.host_register %ub : memref<*xf32>
    gpu.host_unregister %ulo : memref<*xf32>
    gpu.launch_func @kernels::@twice blocks in (%c1, %c1, %c1) threads in (%c8, %c1, %c1)
        args(%a : memref<?xf32>, %b : memref<?xf32>)
    gpu.host_unregister %uhi : memref<*xf32>
    memref.dealloc %a : memref<?xf32>
    return %b : memref<?xf32>
  }

  // Host memory unregistered that was never registered.
  func.func @unregistered() {
    %m = memref.alloc() : memref<4xf32>
    %u = memref.cast %m : memref<4xf32> to memref<*xf32>
    gpu.host_unregister %u : memref<*xf32>
    memref.dealloc %m : memref<4xf32>
    return
  }
}
"""


def direct_matmul_program(M, K, N, block=16):
    """The example's program (examples/host_program.py) as first written: A and B go straight to the matmul
    kernels, no gpu.alloc or gpu.memcpy of them."""
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kernels {{
    gpu.func @matmul(%A: memref<{M}x{K}xf32>, %B: memref<{K}x{N}xf32>, %C: memref<{M}x{N}xf32>) kernel {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %cK = arith.constant {K} : index
      %zero = arith.constant 0.0 : f32
      %bx = gpu.block_id x
      %by = gpu.block_id y
      %tx = gpu.thread_id x
      %ty = gpu.thread_id y
      %dx = gpu.block_dim x
      %dy = gpu.block_dim y
      %r0 = arith.muli %by, %dy : index
      %r = arith.addi %r0, %ty : index
      %c0_ = arith.muli %bx, %dx : index
      %c = arith.addi %c0_, %tx : index
      %acc = scf.for %k = %c0 to %cK step %c1 iter_args(%sum = %zero) -> (f32) {{
        %a = memref.load %A[%r, %k] : memref<{M}x{K}xf32>
        %b = memref.load %B[%k, %c] : memref<{K}x{N}xf32>
        %p = arith.mulf %a, %b : f32
        %s = arith.addf %sum, %p : f32
        scf.yield %s : f32
      }}
      memref.store %acc, %C[%r, %c] : memref<{M}x{N}xf32>
      gpu.return
    }}
    gpu.func @add(%X: memref<{M}x{N}xf32>, %Y: memref<{M}x{N}xf32>, %Z: memref<{M}x{N}xf32>) kernel {{
      %bx = gpu.block_id x
      %by = gpu.block_id y
      %tx = gpu.thread_id x
      %ty = gpu.thread_id y
      %dx = gpu.block_dim x
      %dy = gpu.block_dim y
      %r0 = arith.muli %by, %dy : index
      %r = arith.addi %r0, %ty : index
      %c0_ = arith.muli %bx, %dx : index
      %c = arith.addi %c0_, %tx : index
      %x = memref.load %X[%r, %c] : memref<{M}x{N}xf32>
      %y = memref.load %Y[%r, %c] : memref<{M}x{N}xf32>
      %z = arith.addf %x, %y : f32
      memref.store %z, %Z[%r, %c] : memref<{M}x{N}xf32>
      gpu.return
    }}
  }}
  func.func @test_parallel(%A: memref<{M}x{K}xf32>, %B: memref<{K}x{N}xf32>) -> memref<{M}x{N}xf32> {{
    %c1 = arith.constant 1 : index
    %block = arith.constant {block} : index
    %gx = arith.constant {N // block} : index
    %gy = arith.constant {M // block} : index
    %t0 = gpu.wait async
    %C1, %t1 = gpu.alloc async [%t0] () : memref<{M}x{N}xf32>
    %C2, %t2 = gpu.alloc async [%t1] () : memref<{M}x{N}xf32>
    gpu.wait [%t2]
    %s1 = gpu.wait async
    %s2 = gpu.wait async
    %m1 = gpu.launch_func async [%s1] @kernels::@matmul blocks in (%gx, %gy, %c1) threads in (%block, %block, %c1)
        args(%A : memref<{M}x{K}xf32>, %B : memref<{K}x{N}xf32>, %C1 : memref<{M}x{N}xf32>)
    %m2 = gpu.launch_func async [%s2] @kernels::@matmul blocks in (%gx, %gy, %c1) threads in (%block, %block, %c1)
        args(%A : memref<{M}x{K}xf32>, %B : memref<{K}x{N}xf32>, %C2 : memref<{M}x{N}xf32>)
    gpu.wait [%m1, %m2]
    %Out = gpu.alloc host_shared () : memref<{M}x{N}xf32>
    gpu.launch_func @kernels::@add blocks in (%gx, %gy, %c1) threads in (%block, %block, %c1)
        args(%C1 : memref<{M}x{N}xf32>, %C2 : memref<{M}x{N}xf32>, %Out : memref<{M}x{N}xf32>)
    %t3 = gpu.wait async
    %t4 = gpu.dealloc async [%t3] %C1 : memref<{M}x{N}xf32>
    %t5 = gpu.dealloc async [%t4] %C2 : memref<{M}x{N}xf32>
    gpu.wait [%t5]
    return %Out : memref<{M}x{N}xf32>
  }}
}}
"""


def log_lines(prefix):
    return f"[line for line in fake.fake_log().decode().splitlines() if line.startswith({prefix!r})]"


PRELUDE = '''
import ctypes
from test_host_program_memory import REGISTERED, direct_matmul_program
fake = ctypes.CDLL(FAKE)
fake.fake_log.restype = ctypes.c_char_p
'''


def run(code, fake_libcuda):
    return run_script(f"FAKE = {fake_libcuda!r}\n" + PRELUDE + code, fake_libcuda)


def test_host_register_declares_the_runtime_functions():
    import mlirgpu as mg
    prog = mg.HostProgram(REGISTERED, format="ptx")
    declared = [line for line in prog.llvm_ir.splitlines() if line.startswith("declare")]
    assert "declare void @mgpuMemHostRegisterMemRef(i64, ptr, i64)" in declared
    assert "declare void @mgpuMemHostUnregisterMemRef(i64, ptr, i64)" in declared


def test_host_register_pins_for_the_kernel_and_is_released(fake_libcuda):
    out = run(f'''
prog = mg.HostProgram(REGISTERED, format="ptx")
fake.fake_log_clear()
out["y"] = prog("registered", 6).tolist()
out["registered"] = {log_lines("cuMemHostRegister")}
out["unregistered"] = {log_lines("cuMemHostUnregister")}
fake.fake_log_clear()
out["shared"] = prog("shared_page").tolist()
out["shared_log"] = [line for line in fake.fake_log().decode().splitlines()
                     if line.startswith(("cuMemHost", "cuLaunchKernel"))]
fake.fake_log_clear()
m = np.zeros((2, 3), np.float32)
prog("registered_2d", m)          # a NumPy argument: lent to the call, nothing to register
out["lent"] = {log_lines("cuMemHostRegister")}
try:
    prog("unregistered")
except mg.CudaError as e:
    out["error"] = [e.name, str(e)]
''', fake_libcuda)
    assert out["y"] == [0, 2, 4, 6, 8, 10]
    # Whole pages registered, portable and mapped (flags 3), and all released: by gpu.host_unregister
    # or at the end of the call.
    pages = [dict(field.split("=") for field in line.split()[1:]) for line in out["registered"]]
    assert pages and all(int(p["ptr"]) % 4096 == 0 and int(p["bytes"]) % 4096 == 0 and p["flags"] == "3"
                         for p in pages)
    assert sorted(line.split()[1] for line in out["unregistered"]) == \
        sorted(line.split()[1] for line in out["registered"])
    assert out["shared"] == [2.0 * i for i in range(8)]
    calls = [line.split()[0] for line in out["shared_log"]]
    # The page stays registered until its last registered memory is unregistered, after the launch.
    assert calls.index("cuMemHostUnregister") > calls.index("cuLaunchKernel")
    assert calls.count("cuMemHostRegister") == calls.count("cuMemHostUnregister")
    assert out["lent"] == []
    name, message = out["error"]
    assert name == "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED" and "was not registered by this call" in message


def test_numpy_arguments_are_lent_and_written_back(fake_libcuda):
    out = run(f'''
prog = mg.HostProgram(REGISTERED, format="ptx")
x = np.arange(5, dtype=np.float32)
y = np.zeros(5, np.float32)
fake.fake_log_clear()
prog("doubled_in_place", x, y)
out["y"] = y.tolist()
out["x"] = x.tolist()
out["managed"] = {log_lines("cuMemAllocManaged")}
read_only = np.arange(3, dtype=np.float32)
read_only.flags.writeable = False
y3 = np.zeros(3, np.float32)
prog("doubled_in_place", read_only, y3)
out["y3"] = y3.tolist()
strided = np.zeros(10, np.float32)[::2]
prog("doubled_in_place", np.ones(5, np.float32), strided)
out["strided"] = strided.tolist()
''', fake_libcuda)
    assert out["y"] == [0, 2, 4, 6, 8] and out["x"] == [0, 1, 2, 3, 4]
    assert [line.split()[2] for line in out["managed"]] == ["bytes=20", "bytes=20"]
    assert out["y3"] == [0, 2, 4]
    assert out["strided"] == [2, 2, 2, 2, 2]


def test_the_direct_matmul_program_returns_twice_a_b(fake_libcuda):
    out = run('''
prog = mg.HostProgram(direct_matmul_program(32, 64, 32), format="ptx")
rng = np.random.default_rng(2)
A = rng.standard_normal((32, 64), dtype=np.float32)
B = rng.standard_normal((64, 32), dtype=np.float32)
free = mg.cuda.Device(0).mem_info()[0]
C = prog("test_parallel", A, B)
reference = 2 * (A.astype(np.float64) @ B)
out["error"] = float(np.abs(C - reference).max() / np.abs(reference).max())
out["leaked"] = free - mg.cuda.Device(0).mem_info()[0]
''', fake_libcuda)
    assert out["error"] < 1e-5 and out["leaked"] == 0


FAULTING = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @fault(%p: memref<?xf32>) kernel {
      %c0 = arith.constant 0 : index
      %v = arith.constant 1.0 : f32
      memref.store %v, %p[%c0] : memref<?xf32>
      gpu.return
    }
    gpu.func @fill(%p: memref<?xf32>, %v: f32) kernel {
      %c0 = arith.constant 0 : index
      memref.store %v, %p[%c0] : memref<?xf32>
      gpu.return
    }
  }
  // A kernel that faults on one stream, another kernel queued after it on a second stream.
  func.func @main(%n: index) {
    %c1 = arith.constant 1 : index
    %v = arith.constant 2.0 : f32
    %t0 = gpu.wait async
    %d, %t1 = gpu.alloc async [%t0] (%n) : memref<?xf32>
    %s = gpu.wait async
    %e, %t3 = gpu.alloc async [%s] (%n) : memref<?xf32>
    %t2 = gpu.launch_func async [%t1] @kernels::@fault blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%d : memref<?xf32>)
    %t4 = gpu.launch_func async [%t3] @kernels::@fill blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%e : memref<?xf32>, %v : f32)
    gpu.wait [%t2]
    gpu.wait [%t4]
    return
  }
}
"""


def test_a_kernel_fault_names_the_kernel_and_the_function(fake_libcuda):
    out = run(f'''
from test_host_program_memory import FAULTING
prog = mg.HostProgram(FAULTING, format="ptx")
for key in ("error", "next"):
    try:
        prog("main", 4)
    except mg.CudaError as e:
        out[key] = [e.name, str(e)]
''', fake_libcuda)
    name, message = out["error"]
    assert name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "mgpuStreamSynchronize" in message
    # The wait for the faulting kernel's stream reports it: that stream's last kernel, not the later one.
    assert "kernel 'fault' (the last one launched on stream" in message and "faulted in @main" in message
    assert "restart" in message
    # The next call fails at its first wait, before any kernel of its own faulted.
    name, message = out["next"]
    assert name == "CUDA_ERROR_ILLEGAL_ADDRESS" and "a kernel faulted before this call of @main" in message
