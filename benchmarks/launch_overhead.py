"""Host time per launch of a trivial kernel with three array arguments.

    python benchmarks/launch_overhead.py [--launches N] [--repeats R] [--batch B] [--library NAME ...]

Each path launches the same work (C[i] = A[i] + B[i] on 1024 float32, 4
blocks of 256 threads). Two figures, each the median of R runs:

- host: the time spent in the launch calls, B launches at a time with a
  synchronise (untimed) between batches, so the driver's queue never fills
  and the GPU never sets the pace: the cost of a launch to the caller.
- +sync: N launches in a row, then one synchronise, over N: what a loop of
  launches sustains, the GPU's own time per tiny kernel included.

mlirgpu paths: the kernel written with @mlirgpu.kernel and called as users
call it (after its first call every launch is a hit of its C dispatcher:
argument signature, table lookup, launch), a specialization of it called as
`kernel[L, BLOCK](...)` (a tile size the arguments do not give: its own C
dispatcher), and the same kernel's Function from mlirgpu.cuda called
directly; each with DeviceArrays, and with each
array library's own arrays where it is importable: torch tensors, CuPy
arrays, JAX arrays (the two inputs: JAX arrays are immutable, the output is
a DeviceArray). The last column is each row's cost over the same path
with DeviceArrays: what passing that library's arrays costs per launch, the
median of the two rows' differences within each run (host figures). One
more @mlirgpu.kernel row passes two tensor maps (mg.tensor_map of the
inputs) and two scalars besides the three DeviceArrays, as a TMA kernel is
called; its last column is its cost over the arrays-only row. Another reads
a module global (a float), which its dispatcher checks in C before each
launch; its last column is what that check costs over the same row.

Peers, each where importable: CuPy RawKernel, a torch in-place add, Triton,
and cuLaunchKernel called from C (benchmarks/launch_floor.c, built with gcc
when the toolkit's headers are there), the floor under every Python path.

--library torch|cupy|jax (repeatable) measures only those libraries' rows,
with their own peers (torch: the in-place add and Triton; CuPy: RawKernel),
beside the DeviceArray rows and the C floor: a run short enough to repeat
several times, as on a busy host the figures move from one run to the next.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
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


def one_run(launch, synchronize, launches, batch):
    """(host, +sync) microseconds per launch, one run."""
    spent, done = 0.0, 0
    while done < launches:
        start = time.perf_counter()
        for _ in range(batch):
            launch()
        spent += time.perf_counter() - start
        synchronize()
        done += batch
    start = time.perf_counter()
    for _ in range(launches):
        launch()
    synchronize()
    return spent / done * 1e6, (time.perf_counter() - start) / launches * 1e6


def base_path(name):
    """The DeviceArray row a library's row is measured against, or None."""
    if " args)" not in name or "DeviceArray args" in name:
        return None
    return name.split(" (")[0] + " (DeviceArray args)"


def measure_all(paths, launches, repeats, batch):
    """({name: (host, +sync) medians}, {name: host cost over its DeviceArray
    row}); the paths take turns, run after run, so that drift in clocks or
    load falls on all of them alike, and a row's cost over its DeviceArray
    row is the median of the differences within each round."""
    for launch, synchronize in paths.values():
        for _ in range(100):
            launch()
        synchronize()
    runs = {name: [] for name in paths}
    for _ in range(repeats):
        for name, (launch, synchronize) in paths.items():
            runs[name].append(one_run(launch, synchronize, launches, batch))
    medians = {name: tuple(statistics.median(r[i] for r in rs) for i in (0, 1)) for name, rs in runs.items()}
    over = {name: statistics.median(mine[0] - theirs[0] for mine, theirs in zip(runs[name], runs[base_path(name)]))
            for name in runs if base_path(name) in runs}
    return medians, over


def c_floor(cubin, launches, repeats, batch, library=None, kernel=None):
    """{stream: (host, +sync)} of cuLaunchKernel from C, and with an exported `library` and its
    `kernel` of the same work also {"exported-" + stream: ...} of its function; {} where it cannot be built."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_floor.c")
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if shutil.which("gcc") is None or not os.path.exists(os.path.join(cuda_home, "include", "cuda.h")):
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        binary, image = os.path.join(tmp, "launch_floor"), os.path.join(tmp, "add.cubin")
        with open(image, "wb") as f:
            f.write(cubin)
        subprocess.run(["gcc", "-O2", "-std=c11", "-D_POSIX_C_SOURCE=199309L", f"-I{cuda_home}/include",
                        source, f"-L{cuda_home}/lib64/stubs", "-lcuda", "-ldl", "-o", binary], check=True)
        exported = [str(library), kernel] if library else []
        out = subprocess.run([binary, image, "add", str(launches), str(repeats), str(batch), *exported],
                             check=True, capture_output=True, text=True).stdout
    return {name: (float(host), float(synced)) for name, host, synced in map(str.split, out.splitlines())}


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

    return launch, device.synchronize, kernel, cubin, (a, b, c)


L = mg.generics("L")


@mg.kernel
def add(a: mg.memref[L, mg.f32], b: mg.memref[L, mg.f32], c: mg.memref[L, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    c[i] = a[i] + b[i]


def kernel_runner(arrays, check):
    """@mg.kernel's own call: the first one compiles and registers, the rest hit."""
    a, b, c = arrays

    def launch():
        add(a, b, c, grid=(N_ELEMENTS // 256,), block=(256,))

    launch()
    check(c)
    assert len(add) == 1, "the kernel's dispatcher has more than one entry"
    return launch


BLOCK = mg.generics("BLOCK")


@mg.kernel(generics=(L, BLOCK))
def add_tiled(a: mg.memref[L, mg.f32], b: mg.memref[L, mg.f32], c: mg.memref[L, mg.f32]):
    i = mg.block_idx.x * BLOCK + mg.thread_idx.x
    c[i] = a[i] + b[i]


def specialization_runner(arrays, check):
    """add_tiled[L, 256](...), the way to launch a kernel whose tile size the arguments do not give."""
    a, b, c = arrays
    spec = add_tiled[N_ELEMENTS, 256]

    def launch():
        spec(a, b, c, grid=(N_ELEMENTS // 256,), block=(256,))

    launch()
    check(c)
    assert len(spec) == 1, "the specialization's dispatcher has more than one entry"
    return launch


@mg.kernel
def add_mapped(a_map: mg.TensorMap, b_map: mg.TensorMap, a: mg.memref[L, mg.f32], b: mg.memref[L, mg.f32],
               c: mg.memref[L, mg.f32], alpha: mg.f32, times: mg.i32):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    c[i] = alpha * a[i] + mg.cast(times, mg.f32) * b[i]


def mapped_runner(arrays, check):
    """A kernel taking two tensor maps, three arrays and two scalars, as a TMA
    kernel is called: the same C fast path as arrays alone."""
    a, b, c = arrays
    a_map, b_map = mg.tensor_map(a, box=(256,), swizzle="none"), mg.tensor_map(b, box=(256,), swizzle="none")

    def launch():
        add_mapped(a_map, b_map, a, b, c, 1.0, 1, grid=(N_ELEMENTS // 256,), block=(256,))

    launch()
    check(c)
    assert len(add_mapped) == 1, "the kernel's dispatcher has more than one entry"
    return launch


ALPHA = 1.0


@mg.kernel
def add_alpha(a: mg.memref[L, mg.f32], b: mg.memref[L, mg.f32], c: mg.memref[L, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    c[i] = a[i] + ALPHA * b[i]


def global_runner(arrays, check):
    """A kernel that reads the global ALPHA: the C fast path, the global checked there."""
    a, b, c = arrays

    def launch():
        add_alpha(a, b, c, grid=(N_ELEMENTS // 256,), block=(256,))

    launch()
    check(c)
    assert len(add_alpha) == 1, "the kernel's dispatcher has no entry: its launches take the Python path"
    return launch


def jax_arrays(host):
    """Two JAX arrays on the GPU, and a DeviceArray for the output: JAX
    arrays are immutable, and a kernel may not store to them."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # leave memory to the others
    import jax
    import jax.numpy as jnp
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        raise ImportError("JAX sees no GPU")
    a = jax.device_put(jnp.asarray(host), gpus[0])
    return a, jnp.array(a, copy=True), mg.empty((N_ELEMENTS,), mg.f32)


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
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--library", action="append", choices=("torch", "cupy", "jax"),
                        help="measure only this library's arrays (repeatable; default: every importable one)")
    args = parser.parse_args()
    wanted = set(args.library or ("torch", "cupy", "jax"))
    if not mg.cuda.is_available():
        raise SystemExit("launch_overhead.py needs a CUDA GPU")
    measure = (args.launches, args.repeats, args.batch)
    paths = {}
    launch, sync, kernel, cubin, _keep = mlirgpu_runner()
    host = np.arange(N_ELEMENTS, dtype=np.float32)
    paths["mlirgpu @mg.kernel (DeviceArray args)"] = (
        kernel_runner((mg.to_device(host), mg.to_device(host), mg.empty((N_ELEMENTS,), mg.f32)),
                      lambda c: np.testing.assert_array_equal(c.get(), 2 * host)), sync)
    paths["mlirgpu kernel[L, BLOCK] (DeviceArray args)"] = (
        specialization_runner((mg.to_device(host), mg.to_device(host), mg.empty((N_ELEMENTS,), mg.f32)),
                              lambda c: np.testing.assert_array_equal(c.get(), 2 * host)), sync)
    paths["mlirgpu @mg.kernel (TensorMap + array + scalar args)"] = (
        mapped_runner((mg.to_device(host), mg.to_device(host), mg.empty((N_ELEMENTS,), mg.f32)),
                      lambda c: np.testing.assert_array_equal(c.get(), 2 * host)), sync)
    paths["mlirgpu @mg.kernel (global + array args)"] = (
        global_runner((mg.to_device(host), mg.to_device(host), mg.empty((N_ELEMENTS,), mg.f32)),
                      lambda c: np.testing.assert_array_equal(c.get(), 2 * host)), sync)
    paths["mlirgpu Function (DeviceArray args)"] = (launch, sync)
    libraries = {}
    if "torch" in wanted:
        try:
            import torch
            t = torch.arange(N_ELEMENTS, dtype=torch.float32, device="cuda")
            libraries["torch tensor"] = ((t, t.clone(), torch.empty_like(t)),
                                         lambda c: np.testing.assert_array_equal(c.cpu().numpy(), 2 * host))
        except ImportError as missing:
            print(f"torch: not importable ({missing})")
    if "cupy" in wanted:
        try:
            import cupy
            x = cupy.asarray(host)
            libraries["CuPy array"] = ((x, x.copy(), cupy.empty_like(x)),
                                       lambda c: np.testing.assert_array_equal(cupy.asnumpy(c), 2 * host))
        except ImportError as missing:
            print(f"CuPy: not importable ({missing})")
    if "jax" in wanted:
        try:
            libraries["JAX arrays, DeviceArray out"] = (
                jax_arrays(host), lambda c: np.testing.assert_array_equal(c.get(), 2 * host))
        except ImportError as missing:
            print(f"JAX: not importable ({missing})")
    # JAX arrays are read-only to kernels: a Function that says it stores to its third array only
    stores_c = mg.cuda.load_module(cubin).get_function("add", params=["ptr", "ptr", "ptr"], stores=[2])
    for library, (arrays, check) in libraries.items():
        add.clear()   # one signature at a time: the row measures this library's hits
        try:
            paths[f"mlirgpu @mg.kernel ({library} args)"] = (kernel_runner(arrays, check), sync)
            add_tiled[N_ELEMENTS, 256].clear()
            paths[f"mlirgpu kernel[L, BLOCK] ({library} args)"] = (specialization_runner(arrays, check), sync)
        except mg.LaunchError as refused:   # arrays the library exports read-only
            print(f"mlirgpu @mg.kernel ({library} args): {refused}")

        def function_launch(arrays=arrays, function=stores_c if library.startswith("JAX") else kernel):
            function(*arrays, grid=(N_ELEMENTS // 256,), block=(256,))
        paths[f"mlirgpu Function ({library} args)"] = (function_launch, sync)
    peers = (("CuPy RawKernel", cupy_runner, "cupy"), ("torch in-place add", torch_runner, "torch"),
             ("Triton", triton_runner, "torch"))
    for name, runner, library in peers:
        if library not in wanted:
            continue
        try:
            paths[name] = runner()
        except ImportError as missing:
            print(f"{name}: not importable ({missing})")
    medians, over_base = measure_all(paths, *measure)
    rows = list(medians.items())
    for stream, figures in c_floor(cubin, *measure).items():
        rows.append((f"C cuLaunchKernel, {stream} stream", figures))
    figures = dict(rows)
    cupy = figures.get("CuPy RawKernel")
    print(f"\nus per launch, {mg.cuda.Device(0).name}, medians of {args.repeats} runs; host: batches of "
          f"{args.batch}, +sync: {args.launches} launches then one synchronise")
    print(f"| {'launch path':<44} | {'host':>6} | {'vs CuPy':>7} | {'+sync':>6} | {'vs CuPy':>7} | "
          f"{'over DeviceArray':>16} |")
    print(f"|{'-' * 46}|{'-' * 8}|{'-' * 9}|{'-' * 8}|{'-' * 9}|{'-' * 18}|")
    for name, (host, synced) in rows:
        vs = (f"{host / cupy[0]:.2f}x", f"{synced / cupy[1]:.2f}x") if cupy else ("n/a", "n/a")
        # the same path with DeviceArrays, measured in the same run
        over = f"{over_base[name]:+.2f} us" if name in over_base else ""
        print(f"| {name:<44} | {host:6.2f} | {vs[0]:>7} | {synced:6.2f} | {vs[1]:>7} | {over:>16} |")


if __name__ == "__main__":
    main()
