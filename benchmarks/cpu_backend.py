"""The CPU backend against numba-cuda's simulator: the shared-memory tiled matmul
(tile 16, static shared memory), float32, C = A @ B, in one run.

    python benchmarks/cpu_backend.py [--size 256] [--repeats 3] [--peer-size N]

- mlirgpu: the kernel below on the CPU backend (mg.set_backend("cpu")),
  DeviceArrays in host memory; the first launch (trace, lowering, JIT) is
  reported apart, then the best of R launches, with the default checks
  (bounds, races), with bounds checks alone
  (MLIRGPU_CHECK=bounds) and without (MLIRGPU_CHECK=none): the ratios are
  what checks cost.
- peer: the same kernel written with numba.cuda, run by its simulator
  (NUMBA_ENABLE_CUDASIM=1) in a subprocess. Where numba-cuda is not
  importable here, the script makes a virtual environment under /tmp
  (--venv) and installs numba-cuda into it with pip, pinning this NumPy.
  The simulator runs each thread as a Python thread: at 256 it takes
  minutes. --peer-size runs it on a smaller cube and scales its time by the
  ratio of multiply-adds (n**3), which the table marks as an estimate.

Both results are checked against NumPy (float64). Goal: at most
2 s for mlirgpu on a 2-core machine, and at least 100x faster than the
simulator.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import checkout  # noqa: E402,F401 (mlirgpu: the installed package, else this checkout's)

import mlirgpu as mg  # noqa: E402

# The tile-16, static-shared-memory kernel the tests run on both backends.
sys.path.insert(0, os.path.join(ROOT, "tests"))
from support.kernels_features import TILE, matmul_static as matmul_tiled  # noqa: E402


PEER = r"""
import json, os, sys, time
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
import numpy as np
from numba import cuda, float32

TILE = 16

@cuda.jit
def matmul_tiled(A, B, C):
    As = cuda.shared.array((TILE, TILE), float32)
    Bs = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    acc = float32(0.0)
    for t in range(A.shape[1] // TILE):
        As[ty, tx] = A[row, t * TILE + tx]
        Bs[ty, tx] = B[t * TILE + ty, col]
        cuda.syncthreads()
        for k in range(TILE):
            acc += As[ty, k] * Bs[k, tx]
        cuda.syncthreads()
    C[row, col] = acc

n = int(sys.argv[1])
rng = np.random.default_rng(0)
A = rng.standard_normal((n, n), dtype=np.float32)
B = rng.standard_normal((n, n), dtype=np.float32)
C = np.full((n, n), np.nan, np.float32)
start = time.perf_counter()
matmul_tiled[(n // TILE, n // TILE), (TILE, TILE)](A, B, C)
seconds = time.perf_counter() - start
expected = A.astype(np.float64) @ B.astype(np.float64)
error = float(np.linalg.norm(C - expected) / np.linalg.norm(expected))
import numba, numba_cuda
print(json.dumps({"seconds": seconds, "error": error,
                  "version": f"numba {numba.__version__}, numba-cuda {numba_cuda.__version__}"}))
"""


def operands(n):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n), dtype=np.float32)
    B = rng.standard_normal((n, n), dtype=np.float32)
    return A, B, A.astype(np.float64) @ B.astype(np.float64)


def relative_error(got, expected):
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def run_mlirgpu(n, repeats, checks):
    """`checks`: MLIRGPU_CHECK for this run ("" for the default, "bounds" or
    "none"); engines are cached per set of checks, so each run compiles its own."""
    os.environ["MLIRGPU_CHECK"] = checks
    mg.set_backend("cpu")
    A, B, expected = operands(n)
    dA, dB = mg.to_device(A), mg.to_device(B)
    dC = mg.to_device(np.full((n, n), np.nan, np.float32))
    launch = dict(grid=(n // TILE, n // TILE), block=(TILE, TILE))
    start = time.perf_counter()
    matmul_tiled(dA, dB, dC, **launch)   # trace, lower, JIT, run
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul_tiled(dA, dB, dC, **launch)
        times.append(time.perf_counter() - start)
    return {"first": first, "seconds": min(times), "error": relative_error(dC.get(), expected)}


def peer_python(venv):
    """An interpreter where numba-cuda's simulator imports: this one, else `venv` (made if needed)."""
    probe = "import os; os.environ['NUMBA_ENABLE_CUDASIM'] = '1'; from numba import cuda; import numba_cuda"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return sys.executable
    python = os.path.join(venv, "bin", "python")
    if not (os.path.exists(python) and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0):
        print(f"numba-cuda is not importable here: installing it into {venv} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = [python, "-m", "pip", "install", "-q", "numba-cuda"]
        if subprocess.run(pip + [f"numpy=={np.__version__}"]).returncode != 0:
            subprocess.run(pip + ["numpy"], check=True)   # this NumPy is not one numba supports
    return python


def run_peer(n, venv):
    python = peer_python(venv)
    done = subprocess.run([python, "-c", PEER, str(n)], capture_output=True, text=True,
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"))
    if done.returncode != 0:
        raise RuntimeError(f"the numba-cuda simulator failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=256, help="M = K = N, a multiple of 16 (default 256)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-size", type=int, default=None,
                        help="run the simulator at this size and scale its time by (size / peer-size)**3")
    parser.add_argument("--no-peer", action="store_true", help="mlirgpu only")
    parser.add_argument("--venv", default="/tmp/mlirgpu-bench-numba-cudasim",
                        help="where to install numba-cuda when it is not importable here")
    args = parser.parse_args()
    n = args.size
    if n % TILE or (args.peer_size or TILE) % TILE:
        parser.error(f"sizes are multiples of {TILE}")
    print(f"tiled matmul (tile {TILE}, static shared memory), {n}x{n}x{n} float32, "
          f"{os.cpu_count()} CPUs, mlirgpu {mg.__version__}")
    rows, ours, bounds, unchecked = [], None, None, None
    try:
        ours = run_mlirgpu(n, args.repeats, "")
        rows.append(("mlirgpu, CPU backend (bounds and races, the default)", n, ours["seconds"], ours["error"], ""))
        print(f"mlirgpu first launch (trace + lowering + JIT + run): {ours['first']:.3f} s")
        bounds = run_mlirgpu(n, args.repeats, "bounds")
        rows.append(("mlirgpu, CPU backend (MLIRGPU_CHECK=bounds)", n, bounds["seconds"], bounds["error"], ""))
        unchecked = run_mlirgpu(n, args.repeats, "none")
        rows.append(("mlirgpu, CPU backend (MLIRGPU_CHECK=none)", n, unchecked["seconds"], unchecked["error"], ""))
    except mg.Error as error:
        print(f"mlirgpu's CPU backend cannot run the tiled matmul ({type(error).__name__}): {error}")
        print("(shared memory on the CPU backend: see docs/cpu_backend.md)")
    peer_seconds = None
    if not args.no_peer:
        peer_n = args.peer_size or n
        peer = run_peer(peer_n, args.venv)
        scale = (n / peer_n) ** 3
        peer_seconds = peer["seconds"] * scale
        note = "" if peer_n == n else f"estimate: measured at {peer_n}, x{scale:.0f}"
        rows.append((f"numba-cuda simulator ({peer['version']})", peer_n, peer_seconds, peer["error"], note))
    if rows:
        width = max(len(r[0]) for r in rows)
        print(f"\n{'':{width}}  {'n':>5}  {'seconds':>9}  {'rel. error':>10}")
        for name, size, seconds, error, note in rows:
            print(f"{name:{width}}  {size:>5}  {seconds:>9.4f}  {error:>10.1e}  {note}")
    if ours is not None and bounds is not None and unchecked is not None:
        print(f"\nthe default checks cost {ours['seconds'] / unchecked['seconds']:.2f}x the unchecked launch, "
              f"bounds checks alone {bounds['seconds'] / unchecked['seconds']:.2f}x")
    if ours is not None and peer_seconds is not None:
        print(f"\nsimulator / mlirgpu: {peer_seconds / ours['seconds']:.0f}x (goal: >= 100x); "
              f"mlirgpu {ours['seconds']:.3f} s (goal: <= 2 s)")
    return 0 if ours is not None and all(r[3] <= 1e-5 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
