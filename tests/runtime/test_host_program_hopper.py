"""Hopper host programs on the CPU: TMA descriptors made on the host
(nvgpu.tma.create.descriptor: mgpuTensorMapEncodeTiledMemref over
cuTensorMapEncodeTiled) and thread-block cluster launches
(mgpuLaunchClusterKernel over cuLaunchKernelEx), lowered here and run on the
fake driver (tests/support/fake_cuda), whose log shows what reached the driver."""
import re

import mlirgpu as mg
from test_host_program_memory import run

TMA = """
!tile = memref<64x64xf16, 3>
!desc = !nvgpu.tensormap.descriptor<tensor = !tile, swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>
module attributes {gpu.container_module} {
  // A tensor map of a 128x256 f16 matrix in 64x64 tiles, captured by a kernel that prefetches it.
  func.func @main() {
    %c1 = arith.constant 1 : index
    %c64 = arith.constant 64 : index
    %t0 = gpu.wait async
    %a, %t1 = gpu.alloc async [%t0] () : memref<128x256xf16>
    gpu.wait [%t1]
    %u = memref.cast %a : memref<128x256xf16> to memref<*xf16>
    %d = nvgpu.tma.create.descriptor %u box[%c64, %c64] : memref<*xf16> -> !desc
    gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
               threads(%tx, %ty, %tz) in (%sx = %c1, %sy = %c1, %sz = %c1) {
      nvgpu.tma.prefetch.descriptor %d : !desc
      gpu.terminator
    }
    %t2 = gpu.wait async
    %t3 = gpu.dealloc async [%t2] %a : memref<128x256xf16>
    gpu.wait [%t3]
    return
  }
}
"""

CLUSTER = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
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
  // Y = 2 X in 4 blocks of 32 threads, launched as 2 clusters of 2 blocks.
  func.func @doubled(%x: memref<?xf32>, %y: memref<?xf32>) {
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %c4 = arith.constant 4 : index
    %c32 = arith.constant 32 : index
    gpu.launch_func @kernels::@twice clusters in (%c2, %c1, %c1) blocks in (%c4, %c1, %c1) threads in (%c32, %c1, %c1)
        args(%x : memref<?xf32>, %y : memref<?xf32>)
    return
  }
}
"""


def declared(prog):
    """The declarations of the program's LLVM IR, without their debug-info attachments."""
    return [re.sub(r" !dbg !\d+", "", line) for line in prog.llvm_ir.splitlines() if line.startswith("declare")]


def test_tma_descriptor_lowers_to_the_tensor_map_runtime():
    # nvgpu is converted before the kernel is outlined, as MLIR's own pipeline does: in the other
    # order the captured descriptor reaches the gpu.func signature and cannot be lowered.
    prog = mg.HostProgram(TMA, "sm_90a", format="ptx")
    assert "declare ptr @mgpuTensorMapEncodeTiledMemref(i64, ptr, i64, i64, i64, i64, i64, ptr)" in declared(prog)
    assert "prefetch.tensormap" in prog.ptx


def test_tma_descriptor_on_the_fake_driver(fake_libcuda):
    out = run('''
from test_host_program_hopper import TMA
prog = mg.HostProgram(TMA, "sm_90a", format="ptx")
free = mg.cuda.Device(0).mem_info()[0]
fake.fake_log_clear()
prog("main")
out["maps"] = ''' + '[line for line in fake.fake_log().decode().splitlines() if line.startswith("cuTensorMapEncodeTiled")]' + '''
out["leaked"] = free - mg.cuda.Device(0).mem_info()[0]
''', fake_libcuda)
    (line,) = out["maps"]
    # f16 (type 6), the driver's order: innermost dimension first, byte strides of the outer ones.
    assert "type=6 rank=2" in line and "dims=256,128 strides=512 box=64,64 " in line and "swizzle=3" in line
    assert out["leaked"] == 0                       # the map's device copy is freed with the call


def test_cluster_launch(fake_libcuda):
    prog = mg.HostProgram(CLUSTER, "sm_90a", format="ptx")
    assert "declare void @mgpuLaunchClusterKernel(ptr, i64, i64, i64, i64, i64, i64, i64, i64, i64, i32, ptr, " \
           "ptr, ptr)" in declared(prog)
    out = run('''
from test_host_program_hopper import CLUSTER
prog = mg.HostProgram(CLUSTER, "sm_90a", format="ptx")
y = np.zeros(128, np.float32)
fake.fake_log_clear()
prog("doubled", np.arange(128, dtype=np.float32), y)
out["y"] = y.tolist()
out["log"] = ''' + '[line for line in fake.fake_log().decode().splitlines() if line.startswith("cuLaunchKernel")]' + '''
''', fake_libcuda)
    assert out["y"] == [2.0 * i for i in range(128)]
    assert out["log"][0] == "cuLaunchKernelEx cluster=2,1,1" and out["log"][1].startswith("cuLaunchKernel function=twice")
