"""A host program in the gpu dialect: two matmul kernels launched
`async` on independent tokens (so on two streams, free to overlap), joined by
`gpu.wait`, then an add kernel on their results, written into host_shared
memory. mg.HostProgram lowers it (kernels through NVVM to a cubin, host code
to LLVM calling mlirgpu's mgpu* runtime) and runs it through MLIR's
ExecutionEngine.

    python examples/host_program.py [M K N]      # default 256 1024 256 (multiples of 16)

It prints what the lowering declares, then, on a GPU, the result against
NumPy (2 * A @ B in float64) and the launch timeline, which shows whether
the two matmuls overlapped. Without a GPU it says so after the lowering.
"""
import sys

import numpy as np

import mlirgpu as mg

BLOCK = 16


def two_matmuls_program(M=256, K=1024, N=256):
    """The host program for A (MxK) @ B (KxN), as MLIR text."""
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kernels {{
    // C[r, c] = sum_k A[r, k] * B[k, c], one thread per element
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
    // Z = X + Y
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
    %block = arith.constant {BLOCK} : index
    %gx = arith.constant {N // BLOCK} : index
    %gy = arith.constant {M // BLOCK} : index
    // Inputs to the device, outputs allocated, on one stream.
    %t0 = gpu.wait async
    %dA, %t1 = gpu.alloc async [%t0] () : memref<{M}x{K}xf32>
    %dB, %t2 = gpu.alloc async [%t1] () : memref<{K}x{N}xf32>
    %C1, %t3 = gpu.alloc async [%t2] () : memref<{M}x{N}xf32>
    %C2, %t4 = gpu.alloc async [%t3] () : memref<{M}x{N}xf32>
    %t5 = gpu.memcpy async [%t4] %dA, %A : memref<{M}x{K}xf32>, memref<{M}x{K}xf32>
    %t6 = gpu.memcpy async [%t5] %dB, %B : memref<{K}x{N}xf32>, memref<{K}x{N}xf32>
    gpu.wait [%t6]
    // Two matmuls on independent tokens: two streams.
    %s1 = gpu.wait async
    %s2 = gpu.wait async
    %m1 = gpu.launch_func async [%s1] @kernels::@matmul blocks in (%gx, %gy, %c1) threads in (%block, %block, %c1)
        args(%dA : memref<{M}x{K}xf32>, %dB : memref<{K}x{N}xf32>, %C1 : memref<{M}x{N}xf32>)
    %m2 = gpu.launch_func async [%s2] @kernels::@matmul blocks in (%gx, %gy, %c1) threads in (%block, %block, %c1)
        args(%dA : memref<{M}x{K}xf32>, %dB : memref<{K}x{N}xf32>, %C2 : memref<{M}x{N}xf32>)
    gpu.wait [%m1, %m2]
    // Their sum, into memory the host reads too.
    %Out = gpu.alloc host_shared () : memref<{M}x{N}xf32>
    gpu.launch_func @kernels::@add blocks in (%gx, %gy, %c1) threads in (%block, %block, %c1)
        args(%C1 : memref<{M}x{N}xf32>, %C2 : memref<{M}x{N}xf32>, %Out : memref<{M}x{N}xf32>)
    %t7 = gpu.wait async
    %t8 = gpu.dealloc async [%t7] %dA : memref<{M}x{K}xf32>
    %t9 = gpu.dealloc async [%t8] %dB : memref<{K}x{N}xf32>
    %t10 = gpu.dealloc async [%t9] %C1 : memref<{M}x{N}xf32>
    %t11 = gpu.dealloc async [%t10] %C2 : memref<{M}x{N}xf32>
    gpu.wait [%t11]
    return %Out : memref<{M}x{N}xf32>
  }}
}}
"""


def overlap(timeline):
    """Milliseconds during which the two matmuls both ran (0 when they did not overlap)."""
    (_, _, s1, e1), (_, _, s2, e2) = [t for t in timeline if t[0] == "matmul"]
    return max(0.0, min(e1, e2) - max(s1, s2))


def main(M=256, K=1024, N=256):
    if M % BLOCK or N % BLOCK:
        raise SystemExit(f"M and N must be multiples of {BLOCK}")
    prog = mg.HostProgram(two_matmuls_program(M, K, N))
    declared = sorted(line.split("@")[1].split("(")[0] for line in prog.llvm_ir.splitlines()
                      if line.startswith("declare") and "@mgpu" in line)
    print(f"host program {M}x{K} @ {K}x{N} for {prog.chip}: the host code calls {', '.join(declared)}")
    print(f"kernels: {len(prog.ptx)} characters of PTX, loaded as {'a cubin' if prog.format == 'cubin' else 'PTX'}")
    if not mg.cuda.is_available():
        print("no GPU (mlirgpu.cuda.is_available() is False): the program needs one to run")
        return
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = prog.run("test_parallel", A, B, timeline=True)
    reference = 2 * (A.astype(np.float64) @ B.astype(np.float64))
    error = np.abs(C - reference).max() / np.abs(reference).max()
    print(f"test_parallel: relative error against NumPy (float64) {error:.3e}")
    print(f"{'kernel':<8} {'stream':>16} {'start ms':>9} {'end ms':>9}")
    for name, stream, start, end in prog.timeline:
        print(f"{name:<8} {stream:>16x} {start:>9.3f} {end:>9.3f}")
    both = overlap(prog.timeline)
    print(f"the two matmuls overlapped for {both:.3f} ms" if both > 0 else "the two matmuls did not overlap")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
