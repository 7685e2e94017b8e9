"""Dynamic generics and exported libraries, each against its peer in the same run.

    python benchmarks/export.py [--repeats R] [--launches N] [--batch B]

Four tables:

- compiles: an element-wise kernel launched at 100 sizes (1000 to 1099),
  compiles counted through mlirgpu's compile log (MLIRGPU_LOG=compile, a
  new cache directory), with its size a dynamic generic (one compile per
  variant: a multiple of 16 or not) and a fixed one (one compile per size).
- speed: the dynamic kernel against the fully specialized one, on the
  naive SGEMM of the worklog (examples/sgemm/k01_naive.py, 4096^3) and the
  element-wise kernel (2^24 floats); medians of CUDA-event times. Target:
  the dynamic one within 5%.
- load: a library of 20 exported kernels, from dlopen to its first launch
  done, each measured in a new process whose CUDA context exists already
  (untimed); peers: loading one cubin with cuModuleLoadData and launching
  it, and loading all 20 (what loading modules lazily saves). Target: at
  most 5 ms.
- launch: host time per launch of the exported function of C[i] = A[i] +
  B[i] (1024 floats) against a bare cuLaunchKernel loop, both in one
  process taking turns (benchmarks/launch_floor.c). Target: within 0.3 us.

The compile counts run on either backend; the rest needs a CUDA GPU, and
without one the script prints the counts and says so.
"""
import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["MLIRGPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="mlirgpu-export-bench-")   # every compile counted
os.environ["MLIRGPU_LOG"] = "compile"

import numpy as np  # noqa: E402

import mlirgpu as mg  # noqa: E402
from mlirgpu import ir  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples" / "sgemm"))
import common  # noqa: E402  (the SGEMM series' timing and operands)
import k01_naive  # noqa: E402
import launch_overhead  # noqa: E402  (the C floor and its kernel)

L = mg.generics("L", dynamic=True)
S = mg.generics("S")
LIBRARY_KERNELS = 20


@mg.kernel
def add(a: mg.memref[L, mg.f32], b: mg.memref[L, mg.f32], c: mg.memref[L, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < L:
        c[i] = a[i] + b[i]


@mg.kernel
def add_fixed(a: mg.memref[S, mg.f32], b: mg.memref[S, mg.f32], c: mg.memref[S, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < S:
        c[i] = a[i] + b[i]


ADD_LAUNCH = {"grid": ("(L + 255) / 256",), "block": (256,)}


class _Compiles(logging.Handler):
    """Counts the compile log's lines."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += record.getMessage().startswith("mlirgpu: compiling")


def compiles_over_sizes(kernel, sizes):
    counter = _Compiles()
    logging.getLogger("mlirgpu").addHandler(counter)
    try:
        for n in sizes:
            a = mg.to_device(np.ones(n, np.float32))
            c = mg.empty((n,), mg.f32)
            kernel(a, a, c, grid=((n + 255) // 256,), block=(256,))
            assert np.array_equal(c.get(), np.full(n, 2, np.float32)), f"{kernel.__name__} at {n}: wrong result"
    finally:
        logging.getLogger("mlirgpu").removeHandler(counter)
    return counter.count


def speed(repeats):
    """[(name, dynamic ms, specialized ms)]."""
    rows = []
    n = 4096
    dynamic, fixed = k01_naive.naive(dynamic=True), k01_naive.kernel
    A, B, C = (mg.to_device(x) for x in common.operands(n, n, n))
    grid, block = (common.ceil_div(n, k01_naive.BLOCK),) * 2, (k01_naive.BLOCK,) * 2
    times = {}
    for _ in range(3):   # the two take turns, so drift falls on both alike
        for name, kernel in (("dynamic", dynamic), ("fixed", fixed)):
            ms = common.time_ms(lambda k=kernel: k(A, B, C, 1.0, 0.0, grid=grid, block=block), repeat=repeats)
            times.setdefault(name, []).append(ms)
    rows.append((f"naive SGEMM {n}^3", statistics.median(times["dynamic"]), statistics.median(times["fixed"])))
    n = 1 << 24
    a, c = mg.to_device(np.ones(n, np.float32)), mg.empty((n,), mg.f32)
    times = {}
    for _ in range(3):
        for name, kernel in (("dynamic", add), ("fixed", add_fixed)):
            ms = common.time_ms(lambda k=kernel: k(a, a, c, grid=(n // 256,), block=(256,)), repeat=repeats)
            times.setdefault(name, []).append(ms)
    rows.append(("element-wise add 2^24", statistics.median(times["dynamic"]), statistics.median(times["fixed"])))
    return rows


def _scale_kernel(number):
    """A kernel of its own (x[i] *= number), named scale_<number>."""
    def scale(x: mg.memref[L, mg.f32]):
        i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
        if i < L:
            x[i] = x[i] * number
    scale.__name__ = scale.__qualname__ = f"scale_{number}"
    return mg.kernel(scale)


LOAD_PROGRAM = """
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
context, device, buffer = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0 and cuda.cuCtxSetCurrent(context) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(buffer), 4096) == 0
what, path = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if what == "library":
    lib = ctypes.CDLL(path)
    assert getattr(lib, "many_scale_0")(None, ctypes.c_void_p(buffer.value), ctypes.c_int64(1024)) == 0
else:    # cubins, one per line of the file: load them all, launch the first
    modules = []
    for image in open(path).read().split():
        module, data = ctypes.c_void_p(), open(image, "rb").read()
        assert cuda.cuModuleLoadData(ctypes.byref(module), data) == 0
        modules.append(module)
    function, length = ctypes.c_void_p(), ctypes.c_int64(1024)
    assert cuda.cuModuleGetFunction(ctypes.byref(function), modules[0], b"scale_0") == 0
    params = (ctypes.c_void_p * 2)(ctypes.addressof(buffer), ctypes.addressof(length))
    assert cuda.cuLaunchKernel(function, 4, 1, 1, 256, 1, 1, 0, None, params, None) == 0
assert cuda.cuCtxSynchronize() == 0
print((time.perf_counter() - start) * 1e3)
"""


def load_times(repeats, work):
    """{path: median ms from loading to the first launch done}, each run a new process."""
    kernels = [_scale_kernel(i) for i in range(LIBRARY_KERNELS)]
    chip = mg.cuda.Device(0).chip
    library = mg.export(kernels, work / "many", name="many", chips=[chip], cpu=False,
                        launch={k.__name__: ADD_LAUNCH for k in kernels})
    cubins = []
    for k in kernels:
        path = work / f"{k.__name__}.cubin"
        path.write_bytes(k.specialize({"L": 1024}, aligned=True).cubin(chip=chip))
        cubins.append(str(path))
    (work / "one.list").write_text(cubins[0])
    (work / "all.list").write_text("\n".join(cubins))
    program = work / "load.py"
    program.write_text(LOAD_PROGRAM)
    runs = {"library": [], "one": [], "all": []}
    for _ in range(repeats):
        for what, path in (("library", library), ("one", work / "one.list"), ("all", work / "all.list")):
            done = subprocess.run([sys.executable, str(program), what, str(path)], capture_output=True, text=True,
                                  check=True)
            runs[what].append(float(done.stdout))
    return {what: statistics.median(times) for what, times in runs.items()}


def launch_times(work, launches, repeats, batch):
    """launch_floor.c's figures: {stream: (host, +sync)} of the bare loop and {exported-stream: ...}."""
    chip = mg.cuda.Device(0).chip
    library = mg.export([add], work / "one", name="one", chips=[chip], cpu=False, launch={"add": ADD_LAUNCH})
    cubin = mg.compile_cubin(ir.Module.parse(launch_overhead.KERNEL), chip=chip)
    return launch_overhead.c_floor(cubin, launches, repeats, batch, library=library, kernel="add")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--launches", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    sizes = range(1000, 1100)
    dynamic, fixed = compiles_over_sizes(add, sizes), compiles_over_sizes(add_fixed, sizes)
    print(f"\ncompiles for {len(sizes)} sizes of an element-wise kernel ({mg.backend()} backend)")
    print(f"| {'size generic':<14} | {'compiles':>8} |\n|{'-' * 16}|{'-' * 10}|")
    print(f"| {'dynamic':<14} | {dynamic:>8} |\n| {'fixed':<14} | {fixed:>8} |")
    if not mg.cuda.is_available():
        print("\nno CUDA GPU: the speed, load and launch tables need one")
        return
    device = mg.cuda.Device(0).name
    print(f"\nms per launch, {device}, medians of CUDA-event times")
    print(f"| {'kernel':<24} | {'dynamic':>8} | {'fixed':>8} | {'ratio':>6} |\n|{'-' * 26}|{'-' * 10}|{'-' * 10}|"
          f"{'-' * 8}|")
    for name, dynamic_ms, fixed_ms in speed(args.repeats):
        print(f"| {name:<24} | {dynamic_ms:8.3f} | {fixed_ms:8.3f} | {dynamic_ms / fixed_ms:6.3f} |")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        loads = load_times(args.repeats, work)
        print(f"\nms from loading to the first launch done, {device}, medians of {args.repeats} new processes")
        print(f"| {'what is loaded':<44} | {'ms':>7} |\n|{'-' * 46}|{'-' * 9}|")
        for what, label in (("library", f"exported library of {LIBRARY_KERNELS} kernels"),
                            ("one", "cuModuleLoadData of one cubin"),
                            ("all", f"cuModuleLoadData of all {LIBRARY_KERNELS} cubins")):
            print(f"| {label:<44} | {loads[what]:7.3f} |")
        floor = launch_times(work, args.launches, args.repeats, args.batch)
    print(f"\nus per launch, {device}, medians of {args.repeats} runs; host: batches of {args.batch}, +sync: "
          f"{args.launches} launches then one synchronise")
    print(f"| {'stream':<10} | {'C host':>7} | {'exported':>8} | {'over C':>7} | {'C +sync':>7} | {'exported':>8} |")
    print(f"|{'-' * 12}|{'-' * 9}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 10}|")
    for stream in ("legacy", "per-thread", "own"):
        (host, synced), (ex_host, ex_synced) = floor[stream], floor[f"exported-{stream}"]
        print(f"| {stream:<10} | {host:7.3f} | {ex_host:8.3f} | {ex_host - host:+7.3f} | {synced:7.3f} | "
              f"{ex_synced:8.3f} |")


if __name__ == "__main__":
    main()
