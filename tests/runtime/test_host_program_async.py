"""Host programs that use the async dialect (async.execute regions with gpu
ops, joined by their tokens, values and groups), lowered as MLIR's own
async GPU tests are and run over mlirgpu's async runtime, on the fake driver
(tests/support/fake_cuda)."""
import mlirgpu as mg
from test_host_program_memory import run

ASYNC = """
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
  // Two regions fill a buffer each (independent: free to overlap); a third,
  // waiting for both, copies them into the caller's arrays.
  func.func @main(%x: memref<?xf32>, %y: memref<?xf32>) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %n = memref.dim %x, %c0 : memref<?xf32>
    %one = arith.constant 1.5 : f32
    %two = arith.constant 2.5 : f32
    %t0, %f0 = async.execute () -> !async.value<memref<?xf32>> {
      %a = gpu.alloc(%n) : memref<?xf32>
      gpu.launch_func @kernels::@fill blocks in (%c1, %c1, %c1) threads in (%n, %c1, %c1)
          args(%a : memref<?xf32>, %one : f32)
      async.yield %a : memref<?xf32>
    }
    %t1, %f1 = async.execute () -> !async.value<memref<?xf32>> {
      %b = gpu.alloc(%n) : memref<?xf32>
      gpu.launch_func @kernels::@fill blocks in (%c1, %c1, %c1) threads in (%n, %c1, %c1)
          args(%b : memref<?xf32>, %two : f32)
      async.yield %b : memref<?xf32>
    }
    %t2 = async.execute [%t0, %t1] (%f0 as %a : !async.value<memref<?xf32>>,
                                    %f1 as %b : !async.value<memref<?xf32>>) {
      gpu.memcpy %x, %a : memref<?xf32>, memref<?xf32>
      gpu.memcpy %y, %b : memref<?xf32>, memref<?xf32>
      gpu.dealloc %a : memref<?xf32>
      gpu.dealloc %b : memref<?xf32>
      async.yield
    }
    async.await %t2 : !async.token
    return
  }

  // Three regions fill three rows of %out, joined by a group.
  func.func @grouped(%out: memref<3x8xf32>) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c3 = arith.constant 3 : index
    %c8 = arith.constant 8 : index
    %group = async.create_group %c3 : !async.group
    scf.for %i = %c0 to %c3 step %c1 {
      %token = async.execute {
        %ii = arith.index_cast %i : index to i32
        %v = arith.sitofp %ii : i32 to f32
        %d = gpu.alloc(%c8) : memref<?xf32>
        gpu.launch_func @kernels::@fill blocks in (%c1, %c1, %c1) threads in (%c8, %c1, %c1)
            args(%d : memref<?xf32>, %v : f32)
        %row = memref.subview %out[%i, 0] [1, 8] [1, 1] : memref<3x8xf32> to memref<8xf32, strided<[1], offset: ?>>
        %h = memref.alloc() : memref<8xf32>
        gpu.memcpy %h, %d : memref<8xf32>, memref<?xf32>
        memref.copy %h, %row : memref<8xf32> to memref<8xf32, strided<[1], offset: ?>>
        memref.dealloc %h : memref<8xf32>
        gpu.dealloc %d : memref<?xf32>
        async.yield
      }
      %rank = async.add_to_group %token, %group : !async.token
    }
    async.await_all %group
    return
  }

  // A token nothing will ever complete, awaited.
  func.func @never() {
    %t = async.runtime.create : !async.token
    async.runtime.await %t : !async.token
    return
  }
}
"""


def test_async_lowers_to_the_async_runtime():
    prog = mg.HostProgram(ASYNC, format="ptx")
    declared = {line.split("@")[1].split("(")[0] for line in prog.llvm_ir.splitlines() if line.startswith("declare")}
    assert {"mlirAsyncRuntimeExecute", "mlirAsyncRuntimeAwaitToken", "mlirAsyncRuntimeCreateToken",
            "mgpuLaunchKernel", "mgpuStreamCreate", "mgpuStreamWaitEvent"} <= declared
    assert "async." not in prog.lowered


def test_async_program_on_the_fake_driver(fake_libcuda):
    out = run('''
from test_host_program_async import ASYNC
prog = mg.HostProgram(ASYNC, format="ptx")
free = mg.cuda.Device(0).mem_info()[0]
for attempt in range(3):
    x, y = np.zeros(6, np.float32), np.zeros(6, np.float32)
    prog("main", x, y)
    out.setdefault("results", []).append([x.tolist(), y.tolist()])
out["leaked"] = free - mg.cuda.Device(0).mem_info()[0]
''', fake_libcuda)
    assert out["results"] == [[[1.5] * 6, [2.5] * 6]] * 3
    assert out["leaked"] == 0


def test_groups_and_an_await_that_could_never_end(fake_libcuda):
    out = run('''
from test_host_program_async import ASYNC
prog = mg.HostProgram(ASYNC, format="ptx")
grid = np.zeros((3, 8), np.float32)
prog("grouped", grid)
out["grid"] = grid.tolist()
try:
    prog("never")
except mg.CudaError as e:
    out["never"] = [e.name, str(e)]
again = np.zeros((3, 8), np.float32)
prog("grouped", again)
out["again"] = again.tolist()
''', fake_libcuda)
    assert out["grid"] == out["again"] == [[float(i)] * 8 for i in range(3)]
    name, message = out["never"]
    assert name == "CUDA_ERROR_ILLEGAL_STATE" and "mlirAsyncRuntimeAwaitToken" in message
    assert "awaits what no async.execute region can complete" in message


def test_async_objects_do_not_leak(fake_libcuda):
    out = run('''
from test_host_program_async import ASYNC
prog = mg.HostProgram(ASYNC, format="ptx")
x, y, grid = np.zeros(64, np.float32), np.zeros(64, np.float32), np.zeros((3, 8), np.float32)
def cycle():
    prog("main", x, y)
    prog("grouped", grid)
    try:
        prog("never")
    except mg.CudaError:
        pass
for i in range(30):
    cycle()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
before = rss()
for i in range(300):
    cycle()
out["rss"] = rss() - before
''', fake_libcuda)
    assert out["rss"] < 4 << 20
