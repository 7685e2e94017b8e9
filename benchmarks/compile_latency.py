"""Compile latency of the naive SGEMM, each figure measured in a new process.

    python benchmarks/compile_latency.py [--repeats R]

- cold: an empty cache directory; from specializing the kernel to a loaded,
  launchable function: trace + MLIR pipeline + ptxas + module load. The CUDA
  context is made before (once per process, whatever the library: Triton's
  row below starts with torch's context made too) and reported apart.
- disk cache: a new process whose cache directory holds that cubin: from
  specializing to a launchable function, MLIR and ptxas skipped.
- Triton: the first call of a trivial kernel in a new process with an empty
  TRITON_CACHE_DIR (where triton is importable), beside mlirgpu's.
Each row is the median of R processes; `import` time and the loading of the
C extension (which `import mlirgpu` leaves to the first name used) are
reported apart.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MLIRGPU_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import mlirgpu as mg
t1 = time.perf_counter()
cuda = mg.cuda  # the first use of a name loads the C extension, with MLIR and LLVM inside
t_extension = time.perf_counter()
if cuda.is_available():
    cuda.synchronize()  # the CUDA context: once per process, for every library alike
t_context = time.perf_counter()
sys.path.insert(0, sys.argv[1])
from support.kernels_sgemm import sgemm_naive
t2 = time.perf_counter()
spec = sgemm_naive[256, 128, 256, mg.f32]
if cuda.is_available():
    spec.function()
else:
    spec.cubin("sm_90a")
t3 = time.perf_counter()
print(json.dumps({"import": (t1 - t0) * 1e3, "extension": (t_extension - t1) * 1e3,
                  "context": (t_context - t_extension) * 1e3, "compile": (t3 - t2) * 1e3,
                  "info": mg.cache_info()._asdict()}))
"""

TRITON_PROBE = r"""
import json, time
import torch, triton, triton.language as tl
torch.cuda.synchronize()

@triton.jit
def add(a, b, c, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(c + i, tl.load(a + i) + tl.load(b + i))

a = torch.ones(1024, device="cuda"); b = torch.ones_like(a); c = torch.empty_like(a)
torch.cuda.synchronize()
t0 = time.perf_counter()
add[(4,)](a, b, c, BLOCK=256)
torch.cuda.synchronize()
print(json.dumps({"compile": (time.perf_counter() - t0) * 1e3}))
"""


def probe(code, env, *args):
    # From a file: Triton reads its kernels' source back.
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(code)
    try:
        done = subprocess.run([sys.executable, script.name, *args], env=env, capture_output=True, text=True,
                              timeout=600)
    finally:
        os.unlink(script.name)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tests = os.path.join(ROOT, "tests")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = {}
    cold, warm, imports, extensions, contexts = [], [], [], [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            run_env = dict(env, MLIRGPU_CACHE_DIR=cache)
            first = probe(MLIRGPU_PROBE, run_env, tests)
            second = probe(MLIRGPU_PROBE, run_env, tests)
            assert first["info"]["compiles"] == 1 and second["info"]["compiles"] == 0, (first, second)
            cold.append(first["compile"])
            warm.append(second["compile"])
            imports.append(first["import"])
            extensions.append(first["extension"])
            contexts.append(first["context"])
    rows["mlirgpu cold (trace + MLIR + ptxas + load)"] = statistics.median(cold)
    rows["mlirgpu, new process, disk cache hit"] = statistics.median(warm)
    rows["import mlirgpu"] = statistics.median(imports)
    rows["the extension (at the first name used)"] = statistics.median(extensions)
    rows["CUDA context (cuInit, primary context)"] = statistics.median(contexts)
    try:
        import triton  # noqa: F401
        times = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:
                times.append(probe(TRITON_PROBE, dict(env, TRITON_CACHE_DIR=cache))["compile"])
        rows["Triton first call, empty cache"] = statistics.median(times)
    except ImportError:
        print("Triton: not importable")
    device = "no GPU (compile only)"
    try:
        import mlirgpu as mg
        if mg.cuda.is_available():
            device = mg.cuda.Device(0).name
    except ImportError:
        pass
    print(f"\ncompile latency of the naive SGEMM (256x128x256 f32), {device}, medians of {args.repeats} processes")
    print(f"| {'what':<44} | {'ms':>8} |")
    print(f"|{'-' * 46}|{'-' * 10}|")
    for name, ms in rows.items():
        print(f"| {name:<44} | {ms:8.1f} |")


if __name__ == "__main__":
    main()
