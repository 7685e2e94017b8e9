"""Half-precision and FP8 GEMM on the tensor cores: mlirgpu's kernels against
cuBLAS and Triton's tutorial matmul, measured in the same run.

    python benchmarks/gemm_tensorcore.py [--dtypes bf16 f16 fp8] [--sizes MxKxN ...] [--kernels NAME ...]
                                         [--repeat R] [--out DIR] [--no-write] [--check]

- Rows: every entry of KERNELS (a name and a function launching C = A @ B on
  mlirgpu DeviceArrays; a kernel of another example adds its own entry): one
  per tile configuration of examples/tensorcore/ampere_gemm.py (mma.sync),
  and on an sm_90a GPU one per configuration of examples/tensorcore/
  hopper_gemm.py (wgmma: tile, stages, epilogue, schedule, multicast; its
  tensor maps are made at its first launch and kept); --kernels keeps those
  whose name contains one of its words (e.g. `--kernels mma.sync`),
  then the peers, where importable: cuBLAS through torch.matmul, and
  Triton's tutorial matmul (written below: its GROUP_M-swizzled program
  order, its autotune configs for CUDA, tl.dot accumulating in float32).
- Problems: for each of --dtypes (default bf16 and f16; A, B and C of that
  type, products summed in float32) each of --sizes (default 4096^3,
  8192^3, and the LLM-like 4096x4096x14336, 8192x8192x1024 and
  16384x4096x4096). A and B are row-major, uniform in [-1, 1).
- fp8 (only when asked for): A (M x K) and B (given as N x K, the layout
  FP8 GEMMs take) are uniform in [-1, 1) quantized to float8_e4m3fn with a
  scale per tensor (max |x| / 448, 448 being e4m3's largest value), C is
  bf16 = scale_a * scale_b * (A @ B). The rows: every configuration of the
  Hopper GEMM with 8-bit inputs, and cuBLAS through
  torch._scaled_mm(A, B.t(), scale_a, scale_b, out_dtype=torch.bfloat16),
  as it is called by default (use_fast_accum=False: cuBLAS moves its sums
  into f32 registers every few wgmmas) and with use_fast_accum=True (the
  sums stay in the tensor cores' accumulators, as mlirgpu's kernel keeps
  them). % of cuBLAS is against the default call; there is no Triton row.
- Checks, before any timing: torch.matmul (torch._scaled_mm) against NumPy
  in float64 of the (dequantized) inputs (a relative error,
  max |C - exact| / max |exact|, below 1e-2), then every row against
  torch's result (NumPy's without torch), below 1e-2. A
  row over it, or one whose first launch raises, is reported as FAILED with
  the reason and not timed.
- Time: the median of --repeat samples (default 20) after 3 warm-up
  launches; a sample is a batch of back-to-back launches (about 20 ms)
  between two CUDA events, divided by the batch. TFLOP/s = 2 M N K / time;
  % of cuBLAS and % of Triton are ratios of times measured in this run.
- --check: small sizes (130x72x136 and 256x256x256, or --sizes), results
  checked against NumPy in float64, 2 timed samples: a quick test of the
  script itself, on the CPU backend too (MLIRGPU_BACKEND=cpu), where the
  peers are skipped.

It prints the table, then for each problem the fastest row of each kernel
(mma.sync, wgmma) and its % of cuBLAS, and, unless --no-write or --check, writes it with the
GPU, driver, date and command line to OUT/gemm_tensorcore_h100.md and a bar
chart of TFLOP/s to OUT/gemm_tensorcore_h100.png (matplotlib; OUT is --out,
default docs/).
"""
import argparse
import dataclasses
import datetime
import os
import shlex
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import checkout  # noqa: E402,F401 (mlirgpu: the installed package, else this checkout's)
sys.path.insert(1, os.path.join(ROOT, "examples", "tensorcore"))
sys.path.insert(2, os.path.join(ROOT, "examples", "sgemm"))

import mlirgpu as mg  # noqa: E402
import ampere_gemm  # noqa: E402
import hopper_gemm  # noqa: E402
import common  # noqa: E402  (examples/sgemm: time_ms)

TOLERANCE = 1e-2
DEFAULT_SIZES = ("4096x4096x4096", "8192x8192x8192", "4096x4096x14336", "8192x8192x1024", "16384x4096x4096")
CHECK_SIZES = ("130x72x136", "256x256x256")
FILE_NAME = "gemm_tensorcore_h100"
CUBLAS, TRITON = "cuBLAS", "Triton"
FP8 = "fp8"          # --dtypes name of e4m3 inputs with per-tensor scales and bf16 output
E4M3_MAX = 448.0     # float8_e4m3fn's largest finite value

# The mlirgpu kernels: (name, launch(A, B, C) on DeviceArrays, A M x K, B K x N, C M x N, one dtype for A and B).
KERNELS = [(f"mma.sync {c.name} (examples/tensorcore/ampere_gemm.py)",
            lambda A, B, C, c=c: ampere_gemm.launch(A, B, C, c)) for c in ampere_gemm.CONFIGS]
if hopper_gemm.available():  # sm_90a: one row per configuration of the warp-specialized wgmma GEMM
    KERNELS += [(f"{c.name} (examples/tensorcore/hopper_gemm.py)",
                 lambda A, B, C, c=c: hopper_gemm.launch(A, B, C, c)) for c in hopper_gemm.CONFIGS]

try:
    import torch
    # The peers run on the GPU; with the CPU backend the kernels read NumPy arrays instead.
    if not torch.cuda.is_available() or mg.backend() == "cpu":
        torch = None
except ImportError:
    torch = None

try:
    import triton
    import triton.language as tl
    TRITON_MISSING = None
except Exception as error:  # not installed, or a triton that cannot load here
    triton = None
    TRITON_MISSING = f"{type(error).__name__}: {error}"


# -- Triton's tutorial matmul (python/tutorials/03-matrix-multiplication.py), for f16 and bf16 ----------------

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), GROUP_M = 8: the tutorial's autotune configs for CUDA.
TRITON_CONFIGS = ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
                  (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
                  (128, 256, 128, 3, 8), (256, 128, 128, 3, 8), (256, 64, 128, 4, 4), (64, 256, 128, 4, 4),
                  (128, 128, 128, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 32, 64, 4, 4))

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
            acc = tl.dot(a_block, b_block, acc)
            a_tile += BLOCK_K * a_col
            b_tile += BLOCK_K * b_row

        out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c + out_rows[:, None] * c_row + out_cols[None, :] * c_col, acc.to(c.dtype.element_ty),
                 mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


def triton_matmul(A, B, C):
    """C = A @ B for f16/bf16 torch tensors, through the kernel above."""
    M, K = A.shape
    N = B.shape[1]
    triton_matmul_kernel[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)](
        A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1))


# With 8-bit inputs: (name, launch(A, B, C, scale_a, scale_b)), A M x K, B N x K; every configuration
# of the Hopper GEMM, on an sm_90a GPU.
FP8_KERNELS = []
for listed in hopper_gemm.CONFIGS if hopper_gemm.available() else ():
    c = listed.replace(b_major="K").for_dtype(mg.f8e4m3)
    FP8_KERNELS.append((f"{c.name} (examples/tensorcore/hopper_gemm.py)",
                        lambda A, B, C, sa, sb, c=c: hopper_gemm.launch(A, B, C, c, scale_a=sa, scale_b=sb)))


# -- operands -------------------------------------------------------------------------------------------------

def view(tensor):
    """A DeviceArray viewing a torch tensor (through DLPack: torch gives bf16 no __cuda_array_interface__)."""
    return mg.asarray(torch.utils.dlpack.to_dlpack(tensor))


@dataclasses.dataclass
class Row:
    size: tuple
    dtype: str
    name: str
    kind: str            # "kernel", CUBLAS, TRITON or "peer" (a peer that is no column's reference)
    ms: float = None     # None: FAILED (reason) or not run
    reason: str = ""
    error: float = None  # relative error of its checked result

    @property
    def tflops(self):
        M, K, N = self.size
        return 2 * M * N * K / (self.ms * 1e-3) / 1e12 if self.ms else None


def relative_error(got, expected):
    return float(np.abs(got.astype(np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30))


class Problem:
    """One dtype and size: its operands, the reference, and the rows measured on it."""

    def __init__(self, dtype, size, args):
        self.dtype, self.size, self.args = dtype, size, args
        self.rows = []
        if dtype == mg.f8e4m3:
            self.fp8_operands()
            return
        M, K, N = size
        A, B = ampere_gemm.operands(M, K, N, dtype)
        if torch is not None:
            torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype.name]
            self.A, self.B = (torch.from_numpy(x.astype(np.float32)).to("cuda", torch_dtype) for x in (A, B))
            self.C = torch.empty((M, N), dtype=torch_dtype, device="cuda")
            self.dA, self.dB, self.dC = view(self.A), view(self.B), view(self.C)
            torch.matmul(self.A, self.B, out=self.C)
            self.check_peer(lambda: ampere_gemm.reference(A, B), "torch.matmul")
        else:
            self.expected = ampere_gemm.reference(A, B)
            if mg.backend() == "cpu":  # NumPy arrays themselves: host DeviceArrays of bf16 have no NumPy view
                self.dA, self.dB, self.dC = A, B, np.zeros((M, N), dtype.numpy)
            else:
                self.dA, self.dB, self.dC = mg.to_device(A), mg.to_device(B), mg.zeros((M, N), dtype)

    def fp8_operands(self):
        """A (M x K) and B (N x K) quantized to e4m3 with a scale each; C in bf16."""
        M, K, N = self.size
        rng = np.random.default_rng(0)
        exact = [rng.random(shape, dtype=np.float32) * 2 - 1 for shape in ((M, K), (N, K))]
        self.scales = [float(np.float32(np.abs(x).max() / E4M3_MAX)) for x in exact]
        A, B = ((x / scale).astype(mg.f8e4m3.numpy) for x, scale in zip(exact, self.scales))
        del exact

        def dequantized():
            return (A.astype(np.float64) * self.scales[0]) @ (B.astype(np.float64) * self.scales[1]).T

        if torch is not None:
            self.A, self.B = (torch.from_numpy(x.view(np.uint8)).to("cuda").view(torch.float8_e4m3fn) for x in (A, B))
            self.C = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
            self.torch_scales = [torch.tensor(scale, dtype=torch.float32, device="cuda") for scale in self.scales]
            # torch reads 8-bit tensors through their attributes (its DLPack may not carry them).
            self.dA, self.dB, self.dC = mg.asarray(self.A), mg.asarray(self.B), view(self.C)
            self.scaled_mm(fast=False)
            self.check_peer(dequantized, "torch._scaled_mm")
        else:
            self.expected = dequantized()
            self.dA, self.dB, self.dC = mg.to_device(A), mg.to_device(B), mg.zeros((M, N), mg.bf16)

    def scaled_mm(self, fast):
        # The second operand column-major, as cuBLAS's FP8 GEMM wants it: B (N x K) transposed.
        torch._scaled_mm(self.A, self.B.t(), *self.torch_scales, out_dtype=torch.bfloat16,
                         use_fast_accum=fast, out=self.C)

    def check_peer(self, exact, name):
        """torch's result becomes the reference, once it matches NumPy in float64 (where that is quick)."""
        self.expected = self.fetch()
        if self.args.check or max(self.size) <= 4096:  # NumPy's float64 product of the largest takes minutes
            error = relative_error(self.expected, exact())
            if not error < TOLERANCE:
                raise SystemExit(f"{name} at {label(self.size)} {self.dtype.name}: relative error {error:.1e} "
                                 f"against NumPy in float64: it cannot be the reference")

    def fetch(self):
        if torch is not None:
            return self.C.float().cpu().numpy()
        return np.asarray(self.dC if isinstance(self.dC, np.ndarray) else self.dC.get()).astype(np.float64)

    def measure(self, name, kind, run):
        row = Row(self.size, self.dtype.name, name, kind)
        self.rows.append(row)
        try:
            if torch is not None:
                self.C.zero_()
            run()
            if torch is not None:
                torch.cuda.synchronize()
            row.error = relative_error(self.fetch(), self.expected)
        except Exception as error:  # a compile or launch error of this row: the table says which
            row.reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            print(f"{name} at {label(self.size)} {self.dtype.name}: FAILED, {row.reason}", flush=True)
            return row
        if not row.error < TOLERANCE:
            row.reason = f"relative error {row.error:.1e}"
            print(f"{name} at {label(self.size)} {self.dtype.name}: FAILED, {row.reason}", flush=True)
            return row
        row.ms = common.time_ms(run, repeat=self.args.repeat, warmup=self.args.warmup)
        print(f"{name} at {label(self.size)} {self.dtype.name}: {row.ms:.3f} ms, {row.tflops:.1f} TFLOP/s "
              f"(relative error {row.error:.1e})", flush=True)
        return row

    def kernels(self, names):
        if self.dtype == mg.f8e4m3:
            for name, launch in FP8_KERNELS:
                if not names or any(n.lower() in name.lower() for n in names):
                    self.measure(name, "kernel", lambda launch=launch: launch(self.dA, self.dB, self.dC, *self.scales))
            return
        for name, launch in KERNELS:
            if names and not any(n.lower() in name.lower() for n in names):
                continue
            self.measure(name, "kernel", lambda launch=launch: launch(self.dA, self.dB, self.dC))

    def peers(self):
        if torch is None:
            return
        if self.dtype == mg.f8e4m3:
            self.measure(f"{CUBLAS} (torch._scaled_mm)", CUBLAS, lambda: self.scaled_mm(fast=False))
            self.measure(f"{CUBLAS} (torch._scaled_mm, use_fast_accum=True)", "peer", lambda: self.scaled_mm(fast=True))
            return
        self.measure(f"{CUBLAS} (torch.matmul)", CUBLAS, lambda: torch.matmul(self.A, self.B, out=self.C))
        if triton is not None:
            self.measure(f"{TRITON} tutorial matmul (autotuned)", TRITON, lambda: triton_matmul(self.A, self.B, self.C))

    def peer_ms(self, kind):
        return next((row.ms for row in self.rows if row.kind == kind), None)


# -- the table and the page -----------------------------------------------------------------------------------

def label(size):
    M, K, N = size
    return f"{M}^3" if M == K == N else f"{M}x{K}x{N}"


def parse_size(text):
    try:
        parts = [int(p) for p in text.lower().split("x")]
        if len(parts) == 1:
            parts *= 3
        if len(parts) != 3 or min(parts) <= 0:
            raise ValueError
        return tuple(parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is MxKxN (or N for a cube), not {text!r}") from None


def percent(ms, peer_ms):
    return f"{100 * peer_ms / ms:.1f}%" if ms and peer_ms else "-"


def table(problems):
    lines = ["| dtype | M x K x N | kernel | time (ms) | TFLOP/s | % of cuBLAS | % of Triton |",
             "|---|---|---|---:|---:|---:|---:|"]
    for p in problems:
        cublas, triton_ms = p.peer_ms(CUBLAS), p.peer_ms(TRITON)
        for row in p.rows:
            if row.ms is None:
                lines.append(f"| {row.dtype} | {label(row.size)} | {row.name} | FAILED: {row.reason} | | | |")
            else:
                lines.append(f"| {row.dtype} | {label(row.size)} | {row.name} | {row.ms:.3f} | {row.tflops:.1f} | "
                             f"{percent(row.ms, cublas)} | {percent(row.ms, triton_ms)} |")
    return "\n".join(lines)


def best(problems):
    """For each problem, the fastest row of each kernel (the first word of its name: mma.sync, wgmma)."""
    lines = []
    for p in problems:
        cublas, fastest = p.peer_ms(CUBLAS), {}
        for row in p.rows:
            kernel = row.name.split()[0]
            if row.kind == "kernel" and row.ms and (kernel not in fastest or row.ms < fastest[kernel].ms):
                fastest[kernel] = row
        for kernel, row in fastest.items():
            lines.append(f"best {kernel} at {p.dtype.name} {label(p.size)}: {row.name}, {row.tflops:.1f} TFLOP/s, "
                         f"{percent(row.ms, cublas)} of cuBLAS")
    return lines


def facts():
    lines = [f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- command: `{shlex.join(['python'] + sys.argv)}`",
             f"- mlirgpu {mg.__version__}, backend {mg.backend()}"]
    if mg.backend() == "cuda":
        device = mg.cuda.Device(0)
        version = mg.cuda.driver_version()
        lines.append(f"- GPU: {device.name}, CUDA driver {version // 1000}.{version % 1000 // 10}")
    if torch is not None:
        lines.append(f"- torch {torch.__version__} (cuBLAS)")
    lines.append(f"- triton {triton.__version__}" if triton is not None else f"- Triton: not run ({TRITON_MISSING})")
    return lines


def chart(problems, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    labels = [f"{p.dtype.name} {label(p.size)}" for p in problems]
    names = []
    for p in problems:
        for row in p.rows:
            if row.name not in names:
                names.append(row.name)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(labels)), 4.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [next((r.tflops or 0 for r in p.rows if r.name == name), 0) for p in problems]
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(labels))], labels, rotation=20)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("GEMM on the tensor cores (f32 accumulation)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(problems, out):
    os.makedirs(out, exist_ok=True)
    image = chart(problems, os.path.join(out, FILE_NAME + ".png"))
    text = ["# GEMM on the tensor cores", "",
            "Produced by `benchmarks/gemm_tensorcore.py` (its docstring says how each number is measured).", "",
            *facts(), "", table(problems), ""]
    if image:
        text += [f"![TFLOP/s]({os.path.basename(image)})", ""]
    with open(os.path.join(out, FILE_NAME + ".md"), "w") as f:
        f.write("\n".join(text))
    print(f"wrote {os.path.join(out, FILE_NAME + '.md')}" + (f" and {image}" if image else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "f16"], choices=["bf16", "f16", FP8],
                        help="fp8: e4m3 inputs with a scale per tensor, bf16 output (see above)")
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=None, metavar="MxKxN",
                        help=f"default {' '.join(DEFAULT_SIZES)} ({' '.join(CHECK_SIZES)} with --check)")
    parser.add_argument("--kernels", nargs="+", default=None, metavar="NAME",
                        help="run only the KERNELS entries whose name contains one of these")
    parser.add_argument("--repeat", type=int, default=20, help="timed samples per row (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed launches before them (default 3)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"), help="where the page and chart go (docs/)")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--check", action="store_true", help="small sizes, 2 samples, nothing written")
    args = parser.parse_args(argv)
    if args.check:
        args.repeat, args.warmup = 2, 1
    sizes = args.sizes or [parse_size(s) for s in (CHECK_SIZES if args.check else DEFAULT_SIZES)]
    if mg.backend() != "cuda" and not args.check:
        raise SystemExit("the benchmark times the GPU: there is none here (--check runs it on the CPU backend)")
    problems = []
    for dtype in args.dtypes:
        for size in sizes:
            problem = Problem(mg.f8e4m3 if dtype == FP8 else mg.dtype(dtype), size, args)
            problem.kernels(args.kernels)
            problem.peers()
            problems.append(problem)
    print()
    print(table(problems))
    print()
    print("\n".join(best(problems)))
    if not (args.no_write or args.check):
        write(problems, args.out)
    failed = [row for p in problems for row in p.rows if row.ms is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
