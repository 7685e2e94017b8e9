"""Host time per launch of a trivial kernel with three array arguments.

    python benchmarks/launch_overhead.py [--launches N] [--repeats R]

Each peer launches the same work (C[i] = A[i] + B[i] on 1024 float32, one
block of 256 threads) N times in a row, then synchronises; the time per launch
is the total over N, and the table shows the median of R such runs. Peers,
each where importable: CuPy RawKernel, a torch in-place add, a Triton kernel.
"""
import argparse
import statistics
import time

import numpy as np

import mlirgpu as mg
from mlirgpu import ir

N_ELEMENTS = 1024

KERNEL = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @add(%a: memref<1024xf32>, %b: memref<1024xf32>, %c: memref<1024xf32>) kernel {
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %tid = gpu.thread_id x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %x = memref.load %a[%i] : memref<1024xf32>
      %y = memref.load %b[%i] : memref<1024xf32>
      %z = arith.addf %x, %y : f32
      memref.store %z, %c[%i] : memref<1024xf32>
      gpu.return
    }
  }
}
"""

CUDA_SOURCE = r"""
extern "C" __global__ void add(const float *a, const float *b, float *c) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    c[i] = a[i] + b[i];
}
"""


def per_launch_us(launch, synchronize, launches, repeats):
    """Median over `repeats` of (time of `launches` launches + one sync) / launches."""
    for _ in range(100):
        launch()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(launches):
            launch()
        synchronize()
        times.append((time.perf_counter() - start) / launches * 1e6)
    return statistics.median(times)


def mlirgpu_runner():
    device = mg.cuda.Device(0)
    cubin = mg.compile_cubin(ir.Module.parse(KERNEL), chip=device.chip)
    kernel = mg.cuda.load_module(cubin).get_function("add")
    host = np.arange(N_ELEMENTS, dtype=np.float32)
    a, b, c = mg.to_device(host), mg.to_device(host), mg.empty((N_ELEMENTS,), mg.f32)

    def launch():
        kernel(a, b, c, grid=(N_ELEMENTS // 256,), block=(256,))

    launch()
    assert np.array_equal(c.get(), 2 * host), "mlirgpu kernel computed a wrong result"
    return launch, device.synchronize, kernel, (a, b, c)


def torch_tensors_runner(kernel, torch):
    a = torch.arange(N_ELEMENTS, dtype=torch.float32, device="cuda")
    b, c = a.clone(), torch.empty_like(a)

    def launch():
        kernel(a, b, c, grid=(N_ELEMENTS // 256,), block=(256,))

    launch()
    assert torch.equal(c, 2 * a)
    return launch


def cupy_runner():
    import cupy
    kernel = cupy.RawKernel(CUDA_SOURCE, "add")
    a = cupy.arange(N_ELEMENTS, dtype=cupy.float32)
    b, c = a.copy(), cupy.empty_like(a)

    def launch():
        kernel((N_ELEMENTS // 256,), (256,), (a, b, c))

    launch()
    assert bool((c == 2 * a).all())
    return launch, cupy.cuda.Device().synchronize


def torch_runner():
    import torch
    a = torch.arange(N_ELEMENTS, dtype=torch.float32, device="cuda")
    b = torch.ones_like(a)

    def launch():
        a.add_(b)

    return launch, torch.cuda.synchronize


def triton_runner():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(a, b, c, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(c + i, tl.load(a + i) + tl.load(b + i))

    a = torch.arange(N_ELEMENTS, dtype=torch.float32, device="cuda")
    b, c = a.clone(), torch.empty_like(a)
    grid = (N_ELEMENTS // 256,)

    def launch():
        add[grid](a, b, c, BLOCK=256)

    launch()
    assert torch.equal(c, 2 * a)
    return launch, torch.cuda.synchronize


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if not mg.cuda.is_available():
        raise SystemExit("launch_overhead.py needs a CUDA GPU")
    rows = []
    launch, sync, kernel, _keep = mlirgpu_runner()
    rows.append(("mlirgpu (DeviceArray args)", per_launch_us(launch, sync, args.launches, args.repeats)))
    try:
        import torch
        rows.append(("mlirgpu (torch tensor args)",
                     per_launch_us(torch_tensors_runner(kernel, torch), sync, args.launches, args.repeats)))
    except ImportError:
        torch = None
    for name, runner in (("CuPy RawKernel", cupy_runner), ("torch in-place add", torch_runner),
                         ("Triton", triton_runner)):
        try:
            launch, sync = runner()
        except ImportError as missing:
            print(f"{name}: not importable ({missing})")
            continue
        rows.append((name, per_launch_us(launch, sync, args.launches, args.repeats)))
    cupy_us = dict(rows).get("CuPy RawKernel")
    print(f"\nhost time per launch, {mg.cuda.Device(0).name}, median of {args.repeats} x "
          f"{args.launches} launches")
    print(f"| {'launch path':<28} | {'us/launch':>9} | {'vs CuPy RawKernel':>17} |")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 19}|")
    for name, us in rows:
        ratio = f"{us / cupy_us:.2f}x" if cupy_us else "n/a"
        print(f"| {name:<28} | {us:9.2f} | {ratio:>17} |")


if __name__ == "__main__":
    main()
