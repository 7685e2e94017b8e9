"""Grouped GEMM, as a mixture-of-experts layer runs it: mlirgpu.ops.grouped_matmul
multiplies each group of rows of A by its own matrix of B, in one launch.

A (total_M, K) holds the groups' rows end to end, B (G, K, N) one matrix per
group, offs (G,) int32 the groups' cumulative row ends: group g owns rows
offs[g - 1] .. offs[g] of A and of C (from row 0 for g = 0), as
torch._grouped_mm takes them. The kernel reads the offsets from device
memory: no host synchronization and no work per group on the host. Its
persistent blocks take whole tiles in turn, a tile's linear index mapped to
(group, rows, columns) by walking the groups' tile counts in the kernel
(lang.GroupedTiles): a tile covers rows of one group only, the last of a
group partial.

Two kernels, chosen by the GPU (the CPU backend plans as gemm._device says):

- "wgmma" on sm_90a: hopper_gemm's persistent warp-specialized kernel in its
  grouped form (128 x 256 tiles, TMA through one 2-d map of A and one 3-d
  map of B, the register epilogue storing the group's rows only). TMA reads
  rows of 16-byte multiples: K and N must be multiples of 8.
- "mma.sync" elsewhere: ampere_gemm's kernel in its "grouped" mode (128 x 128
  tiles, B viewed as G * K rows of N): rows past a tile's group read as
  zeros and are not written, so any K and N work.

Either takes empty groups and groups smaller than a tile.

mlirgpu.ops.scaled_grouped_matmul (scaled_grouped_gemm) is the same launch
in 8 bits, as torch._scaled_grouped_mm takes it: A and B f8e4m3, B's
matrices column-major, a float32 scale per row of A and per group and
column of B; it runs the Hopper kernel's 8-bit grouped form only (sm_90a,
or the CPU backend), through _launch with `scaled`.
"""
from collections import namedtuple

import numpy as np

from .._mlirgpu import Dispatcher, LaunchError, bf16, f8e4m3, f16, f32, i32
from ..runtime import backend
from . import ampere_gemm, gemm, hopper_gemm, kept, scaled_gemm
from .arrays import as_array, dtype_of, is_contiguous, output, torch_stream, zero

__all__ = ["grouped_matmul", "register_torch"]

CONFIG = gemm.SQUARE     # mma.sync: 128 x 128 tiles, 3 stages of BK = 64, fits every sm_80-90

#: What a grouped matmul of one (shapes, dtype, device) runs: the kernel
#: ("wgmma" or "mma.sync"), the output's shape and dtype, for mma.sync the
#: persistent grid and the workspace the kernel is passed, and by stream
#: the LaunchPlans kept.keep registered.
_Call = namedtuple("_Call", "kernel shape dtype grid partials counters plans")


def _ceil_div(a, b):
    return -(-a // b)


def _check(A, B, O, name="grouped_matmul", dtypes=(f16, bf16)):
    """The shapes and dtypes the op `name` takes (a and b of one of `dtypes`), or a LaunchError."""
    if len(A.shape) != 2 or len(B.shape) != 3 or len(O.shape) != 1:
        raise LaunchError(f"{name} takes a (total_M, K), b (G, K, N) and offs (G,), not shapes "
                          f"{tuple(A.shape)}, {tuple(B.shape)} and {tuple(O.shape)}")
    (total_m, k), (groups, k2, n) = A.shape, B.shape
    if k != k2:
        raise LaunchError(f"{name}'s a {tuple(A.shape)} and b {tuple(B.shape)} do not multiply: "
                          f"a has {k} columns, b's matrices {k2} rows")
    if O.shape[0] != groups:
        raise LaunchError(f"{name}'s offs has one row end per group of b: {groups}, not {O.shape[0]}")
    dtype = dtype_of(A)
    if dtype not in dtypes or dtype_of(B) != dtype:
        raise LaunchError(f"{name} takes a and b of one dtype, {' or '.join(d.name for d in dtypes)}; "
                          f"got {A.dtype} and {B.dtype}")
    if dtype_of(O) != i32:
        raise LaunchError(f"{name}'s offs are int32, not {O.dtype}")
    return (total_m, n), dtype


def check_offsets(offsets, total_m, name="grouped_matmul"):
    """Host offsets (a NumPy array) that rise from 0 to at most total_m, or a
    LaunchError naming the first that does not (and the op, `name`)."""
    previous = 0
    for g, end in enumerate(offsets.tolist()):
        if end < previous:
            raise LaunchError(f"{name}'s offs must not decrease: offs[{g}] = {end} < {previous}")
        previous = end
    if previous > total_m:
        raise LaunchError(f"{name}'s offs end at row {previous}, past a's {total_m} rows")


def _plan(shape, dtype, groups, k):
    """The kernel of the launch, and for mma.sync its grid and workspace:
    persistent blocks, as many as the tiles of the largest split of rows
    into groups, at most the GPU's."""
    (total_m, n) = shape
    chip, multiprocessors = gemm._device()
    if chip == "sm_90a":
        if k % 8 or n % 8:
            raise LaunchError(f"grouped_matmul on sm_90a needs K and N multiples of 8 (TMA reads rows of "
                              f"16-byte multiples), not K = {k}, N = {n}")
        return _Call("wgmma", shape, dtype, None, None, None, {})
    per_sm = 2 if chip == "sm_80" else 1
    # Each group's tiles: at most one more row of tiles than its rows fill.
    tiles = (_ceil_div(total_m, CONFIG.bm) + groups) * _ceil_div(n, CONFIG.bn)
    schedule = ampere_gemm.plan(1, max(k, 1), n, CONFIG)
    return _Call("mma.sync", shape, dtype, min(tiles, per_sm * multiprocessors), *ampere_gemm.workspace(schedule),
                 None)


def _scaled_plan(shape, out_dtype, k):
    """scaled_grouped_matmul's launch: the Hopper kernel's 8-bit grouped form, or a LaunchError."""
    n = shape[1]
    if k % 16 or n % 16:
        raise LaunchError(f"scaled_grouped_matmul needs K and N multiples of 16 (TMA reads rows of 16-byte "
                          f"multiples), not K = {k}, N = {n}")
    if backend.current().name != "cpu" and gemm._device()[0] != "sm_90a":
        raise LaunchError(f"scaled_grouped_matmul needs an sm_90a GPU (wgmma reads the 8-bit floats), not "
                          f"{gemm._device()[0]}")
    return _Call("wgmma", shape, scaled_gemm._out_dtype(out_dtype, "scaled_grouped_matmul"), None, None, None, {})


def _scales(scale_a, scale_b, rows, groups, n):
    """scaled_grouped_matmul's scales as arrays the kernel takes: C-contiguous
    float32 of shapes (rows,) and (groups, n), or a LaunchError naming the one
    that is not."""
    arrays = []
    for scale, name, shape in ((scale_a, "scale_a", (rows,)), (scale_b, "scale_b", (groups, n))):
        array = as_array(scale, f"scaled_grouped_matmul's {name}")
        if tuple(array.shape) != shape or dtype_of(array) != f32 or not is_contiguous(scale):
            raise LaunchError(f"scaled_grouped_matmul's {name} is a C-contiguous float32 array of shape {shape} "
                              f"(a scale per {'row of a' if name == 'scale_a' else 'group and column of b'}), "
                              f"not {array.dtype} of shape {tuple(array.shape)}")
        arrays.append(array)
    return arrays


_CALLS = {}


def _launch(a, b, offsets, out, scaled=None, dispatcher=None):
    """grouped_matmul's work, outside torch.compile's tracing; with `scaled`,
    (scale_a, scale_b, out_dtype), scaled_grouped_matmul's, whose calls
    (a, b, scale_a, scale_b, offs, out) `dispatcher` takes. Later calls like
    this one launch the Hopper kernel from C (_KEPT, or `dispatcher`)."""
    name = "scaled_grouped_matmul" if scaled else "grouped_matmul"
    A, B, O = (as_array(a, f"{name}'s a"), as_array(b, f"{name}'s b"), as_array(offsets, f"{name}'s offs"))
    # out_dtype by the dtype it names: a call naming it and a miss of the op's Dispatcher, which passes
    # out's dtype, share a _Call.
    key = gemm._key(a, b) + (tuple(O.shape), scaled and scaled_gemm.out_kind(scaled[2]))
    call = _CALLS.get(key)
    if call is None:
        shape, dtype = _check(A, B, O, name, (f8e4m3,) if scaled else (f16, bf16))
        call = (_scaled_plan(shape, scaled[2], B.shape[1]) if scaled
                else _plan(shape, dtype, B.shape[0], B.shape[1]))
        _CALLS[key] = call
        if _registered is None and not scaled and type(a).__module__.split(".")[0] == "torch":
            register_torch()
    groups, k, n = B.shape
    if scaled:
        # The kernel reads b's matrices K-major, as b's (G, N, K) view: C-contiguous where b is
        # as torch._scaled_grouped_mm takes it. (A DeviceArray has no such view: its only one
        # with other axes, .T, reverses them all.)
        matrices = b.swapaxes(-2, -1) if hasattr(b, "swapaxes") else None
        if not (is_contiguous(a) and matrices is not None and is_contiguous(matrices) and is_contiguous(offsets)):
            raise LaunchError("scaled_grouped_matmul's a and offs must be C-contiguous and b's matrices column-major "
                              "(b.transpose(-2, -1) C-contiguous), as torch._scaled_grouped_mm takes them")
        scales = _scales(scaled[0], scaled[1], call.shape[0], groups, n)
    elif not (is_contiguous(a) and is_contiguous(b) and is_contiguous(offsets)):
        raise LaunchError("grouped_matmul's a, b and offs must be C-contiguous (copy them first)")
    if isinstance(offsets, np.ndarray):
        check_offsets(offsets, call.shape[0], name)
        if backend.current().name != "cpu":
            O = backend.to_device(offsets)
    out = output(a, out, call.shape, call.dtype, name)
    if call.shape[0] * n * k * groups == 0:
        # Nothing to multiply: the groups' rows (all of them, at most) are sums over an empty K.
        if k == 0:
            zero(out, name)
        return out
    C, stream = as_array(out, f"{name}'s out"), torch_stream(a)
    if call.kernel == "wgmma":
        # The tensor maps hold the arrays' addresses: made per call, here; from C, where an array moved.
        if scaled:
            B = as_array(matrices, f"{name}'s b")
        planned = hopper_gemm.grouped_plan(A, B, O, C, scales=scales if scaled else None)
        spec, arguments, keywords = planned
        spec(*arguments, stream=stream, **keywords)
        # Host offsets are checked and copied to the device on every call: never launched from C.
        if not isinstance(offsets, np.ndarray):
            if scaled:
                kept.keep(dispatcher, call.plans, (a, b, scaled[0], scaled[1], offsets, out), stream,
                          lambda source: hopper_gemm.grouped_launch_plan(planned, source, (0, 1, 4, 5), (2, 3)))
            else:
                kept.keep(_KEPT, call.plans, (a, b, offsets, out), stream,
                          lambda source: hopper_gemm.grouped_launch_plan(planned, source))
        return out
    # B's matrices one below the other: group g's rows of B start at row g * K. A LaunchPlan passes a
    # call's arrays as they are, not this view of b: these launches stay on this path.
    ampere_gemm.kernel_for(CONFIG, "grouped")(A, B.reshape(groups * k, n), C, call.partials, call.counters, O,
                                              grid=call.grid, block=CONFIG.threads, shared_mem=CONFIG.shared_bytes(),
                                              stream=stream)
    return out


def grouped_matmul(a, b, offs, *, out=None):
    """For each group g: C[rows of g] = A[rows of g] @ B[g], in one launch.

    a (total_M, K) holds the groups' rows end to end and b (G, K, N) their
    matrices, both f16 or both bf16 and C-contiguous; offs (G,) int32 holds
    the groups' cumulative row ends (group g owns rows offs[g - 1] ..
    offs[g], from row 0 for g = 0), as torch._grouped_mm takes them.
    Returns C (total_M, N) of a's dtype, the products summed in float32: out
    (a C-contiguous array of that shape and dtype) or a new array in a's
    library. Rows past offs[-1] are not written.

    Offsets on the host (a NumPy array) are checked: offsets that decrease
    or end past a's rows are a LaunchError. Offsets on the device are read
    by the kernel only, never by the host; that they rise is then the
    caller's contract, as for torch._grouped_mm. Bad shapes and dtypes are a
    LaunchError (a ValueError), what is no array a TypeError.

    On sm_90a, after a first call with arrays of a signature (types,
    dtypes, shapes, devices) and offsets on the device, later calls like it
    launch the kernel from C, its tensor maps encoded anew only where an
    array moved.

        c = mlirgpu.ops.grouped_matmul(tokens, expert_weights, offs)

    With torch tensors it is also torch.ops.mlirgpu.grouped_matmul, which
    torch.compile keeps in its graph.
    """
    if gemm._compiling is not None and gemm._compiling():
        result = register_torch()(a, b, offs)
        return result if out is None else out.copy_(result)
    if out is None:
        try:    # a torch tensor's: torch makes the output in a's dtype, on its device
            out = a.new_empty((a.shape[0], b.shape[2]))
        except (AttributeError, IndexError, TypeError):
            return _launch(a, b, offs, None)
    return _KEPT(a, b, offs, out)


# Calls of grouped_matmul(a, b, offs, out) whose arrays' signature (types, dtypes, shapes, devices) a
# launch of the Hopper kernel has seen: their LaunchPlans, run from C; any other call is _launch's.
_KEPT = Dispatcher(lambda args, kwargs: _launch(*args), "grouped_matmul")


_registered = None


def check_fake_shapes(torch, name, a, b, offs):
    """The shapes a grouped op's torch fake implementation takes (a (total_M,
    K), b (G, K, N), offs (G,) int32), or torch's error naming the op."""
    torch._check(a.dim() == 2 and b.dim() == 3 and a.shape[1] == b.shape[1],
                 lambda: f"mlirgpu::{name} multiplies (total_M, K) by (G, K, N), not {a.shape} by {b.shape}")
    torch._check(offs.dim() == 1 and offs.shape[0] == b.shape[0] and offs.dtype == torch.int32,
                 lambda: f"mlirgpu::{name} takes int32 offs of shape (G,), not {offs.dtype} of shape {offs.shape}")


def register_torch():
    """Registers torch.ops.mlirgpu.grouped_matmul, a torch custom op running
    grouped_matmul, with a fake implementation (the output's shape and
    dtype) for torch.compile; once. Returns the op."""
    global _registered
    import torch

    if _registered is None:
        @torch.library.custom_op("mlirgpu::grouped_matmul", mutates_args=())
        def grouped_matmul_op(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
            # Rows past the last group are zeros here: an op's output holds no garbage.
            a, b = a.detach(), b.detach()    # below autograd, yet marked requires_grad, which DLPack refuses
            return _launch(a, b, offs, a.new_zeros((a.shape[0], b.shape[2])))

        @grouped_matmul_op.register_fake
        def _(a, b, offs):
            check_fake_shapes(torch, "grouped_matmul", a, b, offs)
            torch._check(a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16),
                         lambda: f"mlirgpu::grouped_matmul takes one dtype, f16 or bf16, not {a.dtype} and {b.dtype}")
            return a.new_empty((a.shape[0], b.shape[2]))

        _registered = grouped_matmul_op
    gemm.register_torch()    # torch.compiler.is_compiling, which grouped_matmul asks
    return torch.ops.mlirgpu.grouped_matmul
