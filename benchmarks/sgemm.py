"""SGEMM on the GPU: the series' kernels (examples/sgemm/) against cuBLAS and
Triton's tutorial matmul, measured in the same run.

    python benchmarks/sgemm.py [--sizes MxKxN ...] [--kernels 5,10] [--repeat R] [--out DIR] [--no-write]

- The first of --sizes (default 4096x4096x4096) runs every kernel of the
  series (--kernels: those numbers only); each later size (default
  5120x256x5120, A 5120x256 @ B 256x5120) runs the fastest of
  them at the first size, and the launch functions of
  examples/tiled_matmul.py where that module is importable.
- Peers at every size, where importable: cuBLAS through torch.matmul with
  TF32 off (cupy.matmul where torch is absent), and Triton's tutorial matmul
  written below (float32 operands, tl.dot in IEEE precision, the tutorial's
  autotune configs for CUDA).
- Operands: float32, row-major, from a normal distribution (common.operands).
  Every row computes C = A @ B: the series with alpha = 1, beta = 0 (kernel
  10, as BLAS does, then does not read C; kernels 1-9, as the worklog's, do).
- Checks, before any timing: cuBLAS against NumPy in float64 (relative error
  below 1e-4, else the run stops: every other check compares with it), then
  every other result against cuBLAS's (NumPy's where neither torch nor cupy
  is importable), below 1e-4. A result over it, or an exception in its first
  launch, is reported as FAILED, with the reason, and not timed. An error
  that leaves the CUDA context unusable (an illegal address) fails every
  later row too.
- Time: the median of --repeat samples (default 20), after --warmup
  launches (common.time_ms). A sample is a batch of back-to-back launches,
  enough for about 20 ms, between two CUDA events on the default stream,
  divided by the batch, so the host's launch overhead is not counted as
  device time (the same for every row);
  TFLOP/s = 2 M N K / time. % of cuBLAS and % of Triton are ratios of
  times measured in this run.

It prints the table and, unless --no-write, writes it with the GPU, driver,
date and command line to OUT/sgemm_h100.md, and a bar chart of TFLOP/s to
OUT/sgemm_h100.png (matplotlib; OUT is --out, default docs/).
"""
import argparse
import dataclasses
import datetime
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import checkout  # noqa: E402,F401 (mlirgpu: the installed package, else this checkout's)
sys.path.insert(1, os.path.join(ROOT, "examples", "sgemm"))
sys.path.insert(2, os.path.join(ROOT, "examples"))

import mlirgpu as mg  # noqa: E402
import common  # noqa: E402

ALPHA, BETA = 1.0, 0.0   # the peers' problem, C = A @ B
TOLERANCE = 1e-4
DEFAULT_SIZES = ("4096x4096x4096", "5120x256x5120")
FILE_NAME = "sgemm_h100"
CUBLAS, TRITON = "cuBLAS", "Triton"

try:
    import triton
    import triton.language as tl
    TRITON_MISSING = None
except Exception as error:  # not installed, or a triton that cannot load here
    triton = None
    TRITON_MISSING = f"{type(error).__name__}: {error}"


# -- Triton's tutorial matmul (python/tutorials/03-matrix-multiplication.py), for float32 ----------------------

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), GROUP_M = 8: the tutorial's configs for CUDA. The
# largest need more shared memory in float32 than a block has; Triton's autotuner skips those.
TRITON_CONFIGS = ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
                  (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2))

if triton is not None:
    @triton.autotune(configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8},
                                            num_stages=stages, num_warps=warps)
                              for m, n, k, stages, warps in TRITON_CONFIGS],
                     key=["M", "N", "K"])
    @triton.jit
    def triton_matmul_kernel(a, b, c, M, N, K, a_row, a_col, b_row, b_col, c_row, c_col,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr):
        # Programs go down GROUP_M tile rows before the next tile column, so that a group's
        # tiles of A and B are reused from L2.
        program = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * tiles_n
        group_first_m = (program // per_group) * GROUP_M
        group_height = min(tiles_m - group_first_m, GROUP_M)
        tile_m = group_first_m + (program % per_group) % group_height
        tile_n = (program % per_group) // group_height

        # Rows and columns past the edge wrap around: their results are masked out at the store.
        rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        ks = tl.arange(0, BLOCK_K)
        a_tile = a + rows[:, None] * a_row + ks[None, :] * a_col
        b_tile = b + ks[:, None] * b_row + cols[None, :] * b_col
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, tl.cdiv(K, BLOCK_K)):
            left = K - step * BLOCK_K
            a_block = tl.load(a_tile, mask=ks[None, :] < left, other=0.0)
            b_block = tl.load(b_tile, mask=ks[:, None] < left, other=0.0)
            acc = tl.dot(a_block, b_block, acc, input_precision="ieee")
            a_tile += BLOCK_K * a_col
            b_tile += BLOCK_K * b_row

        out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c + out_rows[:, None] * c_row + out_cols[None, :] * c_col, acc,
                 mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


def triton_matmul(A, B, C):
    """C = A @ B for float32 torch tensors, through the kernel above."""
    M, K = A.shape
    N = B.shape[1]
    triton_matmul_kernel[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)](
        A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1))


# -- the arrays: torch tensors, else CuPy arrays, else DeviceArrays ---------------------------------------------

class Library:
    """Where the operands live and who multiplies them as the reference. Every
    mlirgpu kernel runs on mg.asarray views of them (zero-copy)."""

    def __init__(self):
        self.name, self.version, self.module = "mlirgpu", mg.__version__, None
        for name in ("torch", "cupy"):
            try:
                module = __import__(name)
            except ImportError:
                continue
            if name == "torch" and not module.cuda.is_available():
                continue
            self.name, self.version, self.module = name, module.__version__, module
            break
        if self.name == "torch":
            self.module.backends.cuda.matmul.allow_tf32 = False  # cuBLAS in IEEE float32, as the kernels

    @property
    def cublas(self):
        return {"torch": "torch.matmul", "cupy": "cupy.matmul"}.get(self.name)

    def to_device(self, array):
        if self.name == "torch":
            return self.module.from_numpy(array).cuda()
        if self.name == "cupy":
            return self.module.asarray(array)
        return mg.to_device(array)

    def matmul(self, A, B, C):
        self.module.matmul(A, B, out=C)


@dataclasses.dataclass
class Row:
    size: tuple
    name: str
    kind: str            # "kernel", "tiled_matmul", CUBLAS or TRITON
    ms: float = None     # None: FAILED (reason) or not run
    reason: str = ""
    error: float = None  # relative error of its checked result

    @property
    def tflops(self):
        M, K, N = self.size
        return 2 * M * N * K / (self.ms * 1e-3) / 1e12 if self.ms else None


class Problem:
    """One size's operands on the device, the reference results, and the rows measured on it."""

    def __init__(self, library, size, args):
        self.library, self.size, self.args = library, size, args
        M, K, N = size
        A, B, C = common.operands(M, K, N)
        self.A, self.B, self.C0 = (library.to_device(x) for x in (A, B, C))
        self.C, self.P = library.to_device(C.copy()), library.to_device(np.zeros((M, N), np.float32))
        self.dA, self.dB, self.dC, self.dC0, self.dP = (mg.asarray(x) for x in
                                                         (self.A, self.B, self.C, self.C0, self.P))
        self.rows = []
        if library.cublas:
            library.matmul(self.A, self.B, self.P)
            product = self.dP.get().astype(np.float64)
            exact = A.astype(np.float64) @ B.astype(np.float64)
            error = common.relative_error(product, exact)
            if not error < TOLERANCE:
                raise SystemExit(f"{library.cublas} at {label(size)}: relative error {error:.1e} against NumPy "
                                 f"in float64 (TF32 on?): it cannot be the reference")
        else:
            product = A.astype(np.float64) @ B.astype(np.float64)
        self.product = product                                  # A @ B
        self.sgemm = ALPHA * product + BETA * C.astype(np.float64)  # the series' result

    def measure(self, name, kind, run, out, expected):
        """Checks run()'s result in `out` (a DeviceArray) against `expected`, then times it."""
        row = Row(self.size, name, kind)
        self.rows.append(row)
        try:
            self.dC.copy_from(self.dC0)
            run()
            row.error = common.relative_error(out.get(), expected)
        except Exception as error:  # a compile or launch error of this row: the table says which
            row.reason = f"{type(error).__name__}: {first_line(error)}"
            print(f"{name} at {label(self.size)}: FAILED, {row.reason}", flush=True)
            return row
        if not row.error < TOLERANCE:
            row.reason = f"relative error {row.error:.1e}"
            print(f"{name} at {label(self.size)}: FAILED, {row.reason}", flush=True)
            return row
        row.ms = common.time_ms(run, repeat=self.args.repeat, warmup=self.args.warmup)
        print(f"{name} at {label(self.size)}: {row.ms:.3f} ms, {row.tflops:.2f} TFLOP/s "
              f"(relative error {row.error:.1e})", flush=True)
        return row

    def kernel(self, module):
        return self.measure(module.TITLE, "kernel",
                            lambda: module.launch(self.dA, self.dB, self.dC, ALPHA, BETA), self.dC, self.sgemm)

    def tiled(self, name, launch):
        return self.measure(name, "tiled_matmul", lambda: launch(self.dA, self.dB, self.dC), self.dC, self.product)

    def peers(self):
        if self.library.cublas:
            self.measure(f"{CUBLAS} ({self.library.cublas}, TF32 off)", CUBLAS,
                         lambda: self.library.matmul(self.A, self.B, self.C), self.dC, self.product)
        if triton is not None and self.library.name == "torch":
            self.measure(f"{TRITON} tutorial matmul (ieee)", TRITON,
                         lambda: triton_matmul(self.A, self.B, self.C), self.dC, self.product)

    def peer_ms(self, kind):
        return next((row.ms for row in self.rows if row.kind == kind), None)


def first_line(error):
    text = str(error).strip().splitlines()
    return (text[0] if text else "")[:160]


def label(size):
    M, K, N = size
    return f"{M}x{K} @ {K}x{N}"


def parse_size(text):
    try:
        sizes = [int(x) for x in text.lower().split("x")]
    except ValueError:
        sizes = []
    if len(sizes) == 1:
        sizes *= 3
    if len(sizes) != 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"a size is MxKxN (or N for a cube), not {text!r}")
    return tuple(sizes)


def parse_kernels(text):
    try:
        numbers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        numbers = []
    if not numbers or not all(1 <= n <= len(common.KERNELS) for n in numbers):
        raise argparse.ArgumentTypeError(f"--kernels takes numbers 1 to {len(common.KERNELS)} separated by commas, "
                                         f"not {text!r}")
    return [common.KERNELS[n - 1] for n in sorted(set(numbers))]


def tiled_matmul_launches():
    """{name: launch(A, B, C)} of examples/tiled_matmul.py: its module-level
    functions named launch*, each taking DeviceArrays A, B, C and computing
    C = A @ B; {} where it is absent or defines none."""
    try:
        import tiled_matmul
    except ImportError as error:
        print(f"examples/tiled_matmul.py: not importable ({error})")
        return {}
    launches = {f"tiled_matmul.{name}": value for name, value in sorted(vars(tiled_matmul).items())
                if name.startswith("launch") and callable(value)}
    if not launches:
        print("examples/tiled_matmul.py: defines no launch* function (launch(A, B, C) computing C = A @ B)")
    return launches


# -- the table, the page, the chart ---------------------------------------------------------------------------

def percent(ms, peer_ms):
    return f"{100 * peer_ms / ms:.1f}%" if ms and peer_ms else "n/a"


def table(rows):
    """The markdown table of one size's rows."""
    cublas = next((r.ms for r in rows if r.kind == CUBLAS), None)
    triton_ms = next((r.ms for r in rows if r.kind == TRITON), None)
    lines = ["| kernel | ms | TFLOP/s | % of cuBLAS | % of Triton |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        if row.ms is None:
            lines.append(f"| {row.name} | FAILED ({row.reason.replace('|', '/')}) | | | |")
        else:
            lines.append(f"| {row.name} | {row.ms:.3f} | {row.tflops:.2f} | {percent(row.ms, cublas)} | "
                         f"{percent(row.ms, triton_ms)} |")
    return "\n".join(lines)


def tables(problems):
    return "\n\n".join(f"## {label(p.size)} (M={p.size[0]}, K={p.size[1]}, N={p.size[2]})\n\n{table(p.rows)}"
                       for p in problems)


def driver_text():
    version = mg.cuda.driver_version()
    text = f"CUDA {version // 1000}.{version % 1000 // 10}"
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30)
            if done.returncode == 0 and done.stdout.strip():
                text = f"{done.stdout.strip().splitlines()[0]} ({text})"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return text


def git_commit():
    try:
        done = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def markdown(problems, facts, image):
    lines = [f"# SGEMM on {facts['GPU']}", "",
             "float32, row-major. Every row computes C = A @ B (the series with alpha = 1, beta = 0); tiled_matmul, "
             "cuBLAS (TF32 off) and Triton's tutorial matmul (tl.dot in IEEE precision) C = A @ B. "
             f"Each time is the median of {facts['repeats']} samples, each a batch of back-to-back launches (about 20 ms) "
             f"between CUDA events divided by the batch; every result was "
             f"checked before it was timed against {facts['reference']} (relative error below {TOLERANCE:.0e}). "
             "Written by `benchmarks/sgemm.py`.", "", tables(problems), ""]
    if image:
        lines += [f"![TFLOP/s per kernel]({image})", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in facts.items() if key not in ("repeats", "reference")]
    return "\n".join(lines) + "\n"


def chart(problems, path, title):
    """A horizontal bar chart of TFLOP/s per row, one panel per size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"kernel": "#4c72b0", "tiled_matmul": "#8172b2", CUBLAS: "#55a868", TRITON: "#dd8452"}
    heights = [max(len(p.rows), 1) for p in problems]
    figure, axes = plt.subplots(len(problems), 1, figsize=(9, 1.2 + 0.38 * sum(heights) + 0.6 * len(problems)),
                                gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, problem in zip(axes[:, 0], problems):
        rows = problem.rows
        values = [row.tflops or 0.0 for row in rows]
        ys = range(len(rows))
        ax.barh(ys, values, color=[colors[row.kind] for row in rows])
        ax.set_yticks(list(ys), [row.name for row in rows])
        ax.invert_yaxis()
        top = max(values, default=0) or 1.0
        ax.set_xlim(0, top * 1.18)
        for y, row, value in zip(ys, rows, values):
            ax.text(value + top * 0.01, y, f"{value:.2f}" if row.ms else "FAILED", va="center", fontsize=8)
        ax.set_title(label(problem.size), fontsize=10)
        ax.set_xlabel("TFLOP/s")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write(problems, facts, out):
    os.makedirs(out, exist_ok=True)
    image = f"{FILE_NAME}.png"
    try:
        chart(problems, os.path.join(out, image), f"SGEMM, float32, {facts['GPU']}")
    except ImportError as error:
        print(f"no chart: matplotlib is not importable ({error})")
        image = None
    with open(os.path.join(out, f"{FILE_NAME}.md"), "w") as f:
        f.write(markdown(problems, facts, image))
    print(f"wrote {os.path.join(out, FILE_NAME)}.md" + (f" and {image}" if image else ""))


# -- the run --------------------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[3:]))
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(s) for s in DEFAULT_SIZES],
                        metavar="MxKxN", help="the first runs every kernel; later ones the fastest, tiled_matmul "
                                              f"and the peers (default {' '.join(DEFAULT_SIZES)})")
    parser.add_argument("--kernels", type=parse_kernels, default=list(common.KERNELS), metavar="5,10",
                        help="the series' kernels to run, by number (default all)")
    parser.add_argument("--repeat", type=int, default=20, help="timed launches per row (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed launches before them (default 3)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"), help="where the page and chart go (docs/)")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    if not mg.cuda.is_available():
        raise SystemExit("benchmarks/sgemm.py times kernels on an NVIDIA GPU: mlirgpu.cuda.is_available() is False "
                         "here (no driver or no device). The kernels' results on the CPU backend are checked by "
                         "tests/system/test_sgemm_series.py.")
    if mg.backend() != "cuda":
        raise SystemExit(f"benchmarks/sgemm.py times the GPU, but the current backend is {mg.backend()!r} "
                         f"(MLIRGPU_BACKEND={os.environ.get('MLIRGPU_BACKEND')!r})")

    library = Library()
    if not library.cublas:
        print("cuBLAS: neither torch (with CUDA) nor cupy is importable; results are checked against NumPy")
    if triton is None:
        print(f"Triton: not importable ({TRITON_MISSING})")
    elif library.name != "torch":
        print("Triton: needs torch tensors, and torch is not importable")

    first = Problem(library, args.sizes[0], args)
    problems = [first]
    first.peers()
    timed = []  # (ms, module) of the kernels that passed
    for name in args.kernels:
        try:
            module = common.load(name)
        except Exception as error:  # a module that does not import is a row that failed
            first.rows.append(Row(first.size, name, "kernel", reason=f"{type(error).__name__}: {first_line(error)}"))
            print(f"{name}: FAILED to import, {first.rows[-1].reason}")
            continue
        row = first.kernel(module)
        if row.ms:
            timed.append((row.ms, module))
    best = min(timed, key=lambda pair: pair[0])[1] if timed else None
    launches = tiled_matmul_launches() if len(args.sizes) > 1 else {}
    for size in args.sizes[1:]:
        problem = Problem(library, size, args)
        problems.append(problem)
        problem.peers()
        if best is not None:
            problem.kernel(best)
        for name, launch in launches.items():
            problem.tiled(name, launch)

    device = mg.cuda.Device(0)
    software = [f"mlirgpu {mg.__version__}" + (f" (git {git_commit()})" if git_commit() else "")]
    if library.cublas:
        software.append(f"{library.name} {library.version}" +
                        (f" (CUDA {library.module.version.cuda})" if library.name == "torch" else ""))
    if triton is not None and library.name == "torch":
        software.append(f"triton {triton.__version__}")
    facts = {"GPU": device.name, "driver": driver_text(), "date": datetime.datetime.now(datetime.timezone.utc)
             .strftime("%Y-%m-%d %H:%M UTC"), "command": "`" + shlex.join(["python", *sys.argv]) + "`",
             "software": ", ".join(software), "repeats": args.repeat,
             "reference": "cuBLAS's result" if library.cublas else "NumPy's result in float64"}
    print(f"\nSGEMM float32 on {device.name}, median of {args.repeat} samples (CUDA events around batches of launches)\n")
    print(tables(problems))
    if not args.no_write:
        write(problems, facts, args.out)
    return problems


if __name__ == "__main__":
    main()
