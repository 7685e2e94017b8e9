"""C = A @ B in half precision at every shape: mlirgpu.ops.matmul picks one of
mlirgpu's tensor-core GEMMs from the shape and the GPU, once per (shape,
dtype, device), and launches it.

- "wgmma": the persistent, warp-specialized Hopper GEMM (hopper_gemm.py:
  TMA, wgmma) on sm_90a, where the rows of A, B and C are whole multiples
  of 16 bytes (K and N multiples of 8): past 16 rows from M * N * K =
  1024^3, fewer than 64 rows counting as 64 (below it the host's time
  dominates, and the mma.sync launch costs less), and up to 16 rows where
  B holds at least 8192 x 4096 elements: 128 x 256 tiles where they fill
  every multiprocessor at least once, else 128 x 128 tiles, two
  warpgroups taking turns (ping-pong), which give twice the tiles and
  overlap one tile's epilogue with the next one's products; up to 128
  rows, and to 256 where they make one wave and K is short (under 12288),
  128 x 64 tiles instead, 8 stages deep, which double the blocks streaming
  B; where the tiles leave half the multiprocessors idle and K is long
  (from 12288), split-K: 2 to 4 slices of K as work units, their float32
  partial products summed by a second kernel. Up to 64 rows, each step
  loads A's rows only (rounded up to a multiple of 8: a_rows), not a
  128-row box that reaches past them.
- "mma.sync": the Ampere-style GEMM (ampere_gemm.py: cp.async, ldmatrix,
  mma.sync) fed by an mg.TileScheduler, everywhere else:
  - on sm_90a, from 17 to 1024 rows (smaller products, or rows TMA cannot address):
    64 x 128 tiles, a block each (on an H200 these beat the split-K and
    stream-K schedules below from 128 to 512 rows);
  - small M (at most 256 rows): a tile of 16, 64 or 128 rows and split-K,
    so that every multiprocessor streams its share of B (what bounds a
    skinny product is reading B once): with 16-row tiles a slice per
    multiprocessor, else enough for two blocks on each;
  - otherwise 128 x 128 tiles: data-parallel when the tiles make whole
    waves of the persistent blocks, the hybrid (whole waves, then stream-K
    for the rest) when they make more than one, stream-K when fewer.

`choose` is that rule, a function of the shape, the chip and its number of
multiprocessors; the CPU backend runs what an sm_80 with 4 multiprocessors
would.
"""
from collections import namedtuple


from .._mlirgpu import Dispatcher, LaunchError, bf16, current_device, f16, f32, i32
from ..runtime import backend
from . import ampere_gemm, hopper_gemm, kept
from .arrays import Workspaces, as_array, dtype_of, geometry, is_contiguous, new_like, output, torch_stream, zero

__all__ = ["matmul", "choose", "register_torch", "Choice", "SMALL_M"]

SMALL_M = 256                     # rows up to which a product is "skinny": split-K over B
SHORT_DATA_PARALLEL_M = 1024      # on sm_90a, rows up to which mma.sync runs 64 x 128 tiles, data-parallel
HOST_BOUND_PRODUCT = 1024 ** 3   # M * N * K under which a product's time is the host's: mma.sync costs less
# N * K from which products of at most 16 rows run the Hopper GEMM on sm_90a (below it, the mma.sync
# split-K): in timings on an H200 (1 and 16 rows, each kernel forced through ops.matmul beside
# torch.matmul) it ran faster at N * K of 8192^2 and 4096 x 14336, and slower at 4096^2; this is
# the size between them.
SKINNY_WGMMA_NK = 8192 * 4096
CPU_MULTIPROCESSORS = 4           # what the CPU backend plans for: splits and streams on a small grid
MIN_STEPS_PER_SLICE = 4           # a split-K slice fills the cp.async pipeline (3 steps ahead) at least once

WGMMA = hopper_gemm.CONFIGS[0]    # 128 x 256 tiles, 4 stages, TMA-store epilogue
PINGPONG = hopper_gemm.CONFIGS[1]  # 128 x 128 tiles, 6 stages, ping-pong, TMA-store epilogue
# 128 x 64 tiles, 8 stages, the register epilogue: for 1 to 256 rows, where even 128 x 128 tiles
# leave multiprocessors idle, twice the tiles, each streaming its columns of B through a deeper ring
# (on an H200, benchmarks/matmul_sweep.py: 128 x 8192^2 and 256 x 4096^2 at 0.93 and 0.87 of
# cuBLAS, where ping-pong gave 0.83 and 0.70; with A's rows only a step, up to 64 rows, they also ran
# faster than ping-pong's tiles in timings that forced each through ops.matmul, split-K included).
# From 129 rows only where the tiles make one wave and K is not split.
NARROW = hopper_gemm.Config(64, 64, 8)
NARROW_ROWS = (1, 256)
MAX_WGMMA_SPLIT = 4               # slices of K of the Hopper GEMM's split-K
# The K from which the Hopper GEMM splits K: on an H200 it paid at K = 14336 (64-256 rows, N = 4096:
# 0.82-0.90 of cuBLAS in benchmarks/matmul_sweep.py) and not at K = 8192, where the partial sums'
# second pass costs about what the idle multiprocessors would.
WGMMA_SPLIT_MIN_K = 12288
# mma.sync tiles (ampere_gemm.Config: BM, BN, BK, WM, WN, stages) by the rows of A they suit.
SKINNY = ampere_gemm.Config(16, 128, 64, 16, 32, 4)    # 4 warps side by side, 72 KB
SHORT = ampere_gemm.Config(64, 128, 64, 32, 64, 4)     # 2 x 2 warps, 96 KB
SQUARE = ampere_gemm.Config(128, 128, 64, 64, 64, 3)   # 2 x 2 warps of 64 x 64, 96 KB: fits every sm_80-89

#: The kernel for one shape: `kernel` "wgmma" or "mma.sync", its config, and
#: for mma.sync the TileScheduler mode, split and persistent units.
Choice = namedtuple("Choice", "kernel config mode split units")


def _ceil_div(a, b):
    return -(-a // b)


def _wgmma_choice(m, k, n, multiprocessors):
    """The Hopper GEMM's configuration for an (m x k) @ (k x n) product (`choose`)."""
    if _ceil_div(m, WGMMA.bm) * _ceil_div(n, WGMMA.bn) >= multiprocessors:
        return Choice("wgmma", WGMMA, None, None, multiprocessors)
    narrow = _ceil_div(m, NARROW.bm) * _ceil_div(n, NARROW.bn)
    split_k = m <= NARROW.bm and k >= WGMMA_SPLIT_MIN_K    # the 128 x 64 tiles' split-K
    if NARROW_ROWS[0] <= m <= NARROW_ROWS[1] and narrow <= multiprocessors and (k < WGMMA_SPLIT_MIN_K or split_k):
        split = min(multiprocessors // narrow, MAX_WGMMA_SPLIT) if k >= WGMMA_SPLIT_MIN_K else 1
        if split > 1:
            return Choice("wgmma", NARROW.replace(split=split), "split_k", split, multiprocessors)
        return Choice("wgmma", NARROW, None, None, multiprocessors)
    tiles = _ceil_div(m, PINGPONG.bm) * _ceil_div(n, PINGPONG.bn)
    split = min(multiprocessors // tiles, MAX_WGMMA_SPLIT)
    if split > 1 and k >= WGMMA_SPLIT_MIN_K:
        return Choice("wgmma", PINGPONG.replace(epilogue="registers", split=split), "split_k", split,
                      multiprocessors)
    return Choice("wgmma", PINGPONG, None, None, multiprocessors)


def _wgmma_takes(m, k, n):
    """Whether the Hopper GEMM runs an (m x k) @ (k x n) product on sm_90a
    (where TMA can address its rows): up to 16 rows, for a B of at least
    SKINNY_WGMMA_NK elements; else unless its time is the host's. Up to 64
    rows, a product reads B once whatever its rows: it counts as 64."""
    if m <= SKINNY.bm:
        return n * k >= SKINNY_WGMMA_NK
    return max(m, 64) * n * k >= HOST_BOUND_PRODUCT


def choose(m, k, n, chip, multiprocessors):
    """The kernel ops.matmul runs for an (m x k) @ (k x n) product on a GPU
    `chip` ("sm_90a", "sm_80", ...) of `multiprocessors` SMs (see the
    module's text for the rule)."""
    if chip == "sm_90a" and k % 8 == 0 and n % 8 == 0 and _wgmma_takes(m, k, n):
        choice = _wgmma_choice(m, k, n, multiprocessors)
        if m <= 64:
            # Each step loads A's rows only (to a multiple of 8), not a box reaching past them.
            choice = choice._replace(config=choice.config.replace(a_rows=max(8, _ceil_div(m, 8) * 8)))
        return choice
    if chip == "sm_90a" and SKINNY.bm < m <= SHORT_DATA_PARALLEL_M:
        # On an H200, from 128 to 512 rows, 64 x 128 tiles, a block each, beat split-K and stream-K
        # over larger tiles, whose fix-ups cost more than they save there.
        return Choice("mma.sync", SHORT, "data_parallel", None, _ceil_div(m, SHORT.bm) * _ceil_div(n, SHORT.bn))
    # Two blocks of 96 KB of shared memory share an SM of sm_80 and sm_90; one does on sm_86-89.
    per_sm = 2 if chip in ("sm_80", "sm_90a") else 1
    if m <= SMALL_M:
        config = SKINNY if m <= 16 else SHORT if m <= 64 else SQUARE
        tiles = _ceil_div(m, config.bm) * _ceil_div(n, config.bn)
        steps = _ceil_div(k, config.bk)
        if config is SKINNY:
            # A slice per multiprocessor: on an H200 (1 and 16 rows, N = 4096 and 8192, K = 4096 to
            # 14336) that ran faster than two or more blocks a multiprocessor, whose shorter slices
            # each fill the pipeline anew (benchmarks/matmul_sweep.py: 0.71-0.81 of cuBLAS before on
            # the rows of K = 8192 and 14336, 0.79-0.89 after).
            split = multiprocessors // tiles
        else:
            split = _ceil_div(per_sm * multiprocessors, tiles)
        split = max(1, min(split, steps // MIN_STEPS_PER_SLICE))
        if split > 1:
            # A block per slice: the hardware schedules them as blocks retire.
            return Choice("mma.sync", config, "split_k", split, tiles * split)
        return Choice("mma.sync", config, "data_parallel", None, tiles)
    units = per_sm * multiprocessors
    tiles = _ceil_div(m, SQUARE.bm) * _ceil_div(n, SQUARE.bn)
    if tiles % units == 0:
        return Choice("mma.sync", SQUARE, "data_parallel", None, tiles)
    return Choice("mma.sync", SQUARE, "hybrid" if tiles > units else "stream_k", None, units)


def _device():
    """(chip, multiprocessors) of the current device; the CPU backend's stand-in."""
    if backend.current().name == "cpu":
        return "sm_80", CPU_MULTIPROCESSORS
    from .. import cuda

    device = cuda.Device(cuda.current_device())
    return device.chip, device.multiprocessor_count


def _wgmma(choice, m, k, n):
    """The launch of the Hopper GEMM for `choice` (hopper_gemm.launch keeps
    its tensor maps for the arrays' addresses), and its LaunchPlan's maker."""
    def run(a, b, c, stream, geometries):
        if geometries is not None and geometries[2] is None:    # a new output
            geometries[2] = geometry(c)
        hopper_gemm.launch(a, b, c, choice.config, stream, geometries=geometries)

    def plan(a, b, c, stream, source, geometries):
        return hopper_gemm.launch_plan(a, b, c, choice.config, geometries, source)
    return run, plan


def _mma_sync(choice, m, k, n):
    """The launch of the mma.sync GEMM for `choice`, with a workspace per
    stream: launches on one stream run in order, launches on two may
    overlap, and split tiles' partial sums and counters must not meet. And
    its LaunchPlan's maker: the plan holds the stream's workspace, so it
    serves that stream only, and no graph capture (which needs its own)."""
    config, mode, split = choice.config, choice.mode, choice.split
    plan = ampere_gemm.plan(m, k, n, config, mode, split, choice.units)
    kernel = ampere_gemm.kernel_for(config, mode, split)
    grid, block, shared = plan.grid, config.threads, config.shared_bytes()
    shapes = ((*plan.partials, f32), (plan.counters, i32))

    def run(a, b, c, stream, geometries):
        # One launch, its split tiles' counters back at zero when it ends: no lock to hold.
        (partials, counters), _ = _WORKSPACES.get(shapes, stream, a)
        kernel(a, b, c, partials, counters, counters, grid=grid, block=block, shared_mem=shared, stream=stream)

    def launch_plan(a, b, c, stream, source, geometries):
        (partials, counters), _ = _WORKSPACES.get(shapes, stream, a)
        params = [("arg", 0), ("arg", 1), ("arg", 2), ("value", partials), ("value", counters), ("value", counters)]
        return kernel.launch_plan([a, b, c, partials, counters, counters], params, grid=grid, block=block,
                                  shared_mem=shared, stream=source, stream_only=stream, capture=False, result=2)
    return run, launch_plan


# The mma.sync GEMM's partial sums and tile counters, per shape and stream (arrays.Workspaces): for as
# many streams as its LaunchPlans, which hold them, are kept for.
_WORKSPACES = Workspaces(kept.STREAMS_KEPT)


class _Call:
    """What a matmul of one (shape, dtype, device) runs: the choice, the
    output's shape and dtype, the launch, and the last `out` found right
    (its geometry but the address)."""

    __slots__ = ("choice", "shape", "dtype", "run", "plan", "plans", "checked_out")

    def __init__(self, a, b):
        A, B = as_array(a, "matmul's a"), as_array(b, "matmul's b")
        if len(A.shape) != 2 or len(B.shape) != 2:
            raise LaunchError(f"matmul multiplies 2-d arrays, not shapes {tuple(A.shape)} and {tuple(B.shape)}")
        (m, k), (k2, n) = A.shape, B.shape
        if k != k2:
            raise LaunchError(f"matmul's a {tuple(A.shape)} and b {tuple(B.shape)} do not multiply: "
                              f"a has {k} columns, b {k2} rows")
        dtype = dtype_of(A)
        if dtype not in (f16, bf16) or dtype_of(B) != dtype:
            raise LaunchError(f"matmul takes a and b of one dtype, f16 or bf16; got {A.dtype} and {B.dtype}")
        self.shape, self.dtype = (m, n), dtype
        self.checked_out = None
        self.plans = {}    # by stream: the LaunchPlans kept.keep registered
        # An empty product runs no kernel.
        self.choice = choose(m, k, n, *_device()) if m * n * k else None
        self.run = self.plan = None
        if k == 0 and m * n:
            self.run = _zeros
        elif m * n * k:
            self.run, self.plan = (_wgmma if self.choice.kernel == "wgmma" else _mma_sync)(self.choice, m, k, n)


def _zeros(a, b, c, stream, geometries):
    """A product over an empty K: zeros."""
    zero(c, "matmul")


_CALLS = {}


def _where():
    """The current backend and its device (the thread's, on the GPU; None on the CPU): part of the
    key of what an op keeps, which holds workspaces and loaded kernels of one device."""
    current = backend.current()
    return current, current_device() if current.name == "cuda" else None


def _key(a, b):
    return type(a), type(b), tuple(a.shape), tuple(b.shape), a.dtype, b.dtype, *_where()


# torch.compiler.is_compiling once torch is registered with (register_torch): a matmul
# traced by torch.compile is then the custom op's call, which the graph keeps whole.
_compiling = None


def register_torch():
    """Registers torch.ops.mlirgpu.matmul, a torch custom op (torch.library)
    running ops.matmul, with a fake implementation (the output's shape and
    dtype) so that torch.compile traces it without a graph break; from then
    on ops.matmul itself, traced by torch.compile, is that op. Done once
    torch is imported (mlirgpu.ops watches for it) and on the first matmul
    of torch tensors; once. Returns the op."""
    global _compiling
    import torch

    if _compiling is None:
        @torch.library.custom_op("mlirgpu::matmul", mutates_args=())
        def matmul_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            # Below autograd, yet still marked requires_grad, which DLPack refuses to export.
            return _launch(a.detach(), b.detach(), None)

        @matmul_op.register_fake
        def _(a, b):
            torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                         lambda: f"mlirgpu::matmul multiplies (M, K) by (K, N), not {a.shape} by {b.shape}")
            torch._check(a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16),
                         lambda: f"mlirgpu::matmul takes one dtype, f16 or bf16, not {a.dtype} and {b.dtype}")
            return a.new_empty((a.shape[0], b.shape[1]))

        _compiling = torch.compiler.is_compiling
    return torch.ops.mlirgpu.matmul


def matmul(a, b, *, out=None):
    """a @ b for a (M, K) and b (K, N), both f16 or both bf16, row-major
    (C-contiguous) as torch.matmul takes them; returns C (M, N) of their
    dtype, the products summed in float32.

    The arrays are torch tensors, CuPy or JAX arrays or DeviceArrays on the
    current backend (NumPy arrays on the CPU backend); the output is `out`
    (a C-contiguous (M, N) array of that dtype) or a new array in a's
    library (torch for a tensor, NumPy for a NumPy array, else a
    DeviceArray). The kernel is chosen on the first call with a shape,
    dtype and device and kept (`choose`). Bad shapes and dtypes are a
    LaunchError (a ValueError), what is no array a TypeError.

        c = mlirgpu.ops.matmul(a, b)

    With torch tensors it is also torch.ops.mlirgpu.matmul (`register_torch`),
    which torch.compile keeps in its graph.
    """
    if _compiling is not None and _compiling():
        result = register_torch()(a, b)
        return result if out is None else out.copy_(result)
    if out is None:
        try:    # a torch tensor's: torch makes the output in a's dtype, on its device
            out = a.new_empty((a.shape[0], b.shape[1]))
        except (AttributeError, IndexError, TypeError):
            return _launch(a, b, None)
    return _KEPT(a, b, out)


def _unaddressed(read):
    """An array's geometry (`read` by arrays.geometry) without its address: type, shape, strides, dtype."""
    return read[:1] + read[2:]


def _launch(a, b, out):
    """matmul's work, outside torch.compile's tracing. Each array's geometry
    (arrays.geometry) is read once: without the addresses, it finds the kept
    _Call, and a kept _Call was made for arrays of that shape, strides and
    dtype, so they need no more checks; with them, the Hopper GEMM's kept
    tensor maps."""
    try:
        geometries = [geometry(a), geometry(b), None if out is None else geometry(out)]
    except (AttributeError, TypeError):    # no array: _Call says what the arrays must be
        geometries = None
    key = None if geometries is None else (_unaddressed(geometries[0]), _unaddressed(geometries[1]), _where())
    call = _CALLS.get(key)
    if call is None:
        call = _Call(a, b)
        if not (is_contiguous(a) and is_contiguous(b)):
            raise LaunchError("matmul's a and b must be C-contiguous (copy them first)")
        if _compiling is None and type(a).__module__.split(".")[0] == "torch":
            register_torch()
        if key is not None:
            _CALLS[key] = call
    if out is None:
        out = new_like(a, call.shape, call.dtype)
    else:
        checked = None if geometries is None else _unaddressed(geometries[2])
        if checked is None or checked != call.checked_out:
            output(a, out, call.shape, call.dtype, "matmul")
            call.checked_out = checked
    if call.run is not None:
        # On torch's current stream for CUDA tensors (torch.cuda.stream(...) blocks, graph captures).
        stream = torch_stream(a)
        call.run(a, b, out, stream, geometries)
        if call.plan is not None and geometries is not None:
            kept.keep(_KEPT, call.plans, (a, b, out), stream,
                      lambda source: call.plan(a, b, out, stream, source, geometries))
    return out


# Calls of matmul(a, b, out) whose arrays' signature (types, dtypes, shapes, devices) a launch has seen:
# their LaunchPlans, run from C; any other call is _launch's.
_KEPT = Dispatcher(lambda args, kwargs: _launch(*args), "matmul")
