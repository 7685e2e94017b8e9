"""C = (scale_a * scale_b) * (A @ B) in 8-bit floats: mlirgpu.ops.scaled_matmul,
as torch._scaled_mm takes it, through hopper_gemm's FP8 kernel (TMA and
wgmma m64nNk32, the scales applied to the f32 accumulators in the epilogue).

A (M, K) is f8e4m3 and row-major; B (K, N) is f8e4m3 and column-major (B.T
is C-contiguous: an (N, K) weight w passed as w.t(), as torch._scaled_mm
wants it), which is the N x K operand wgmma reads 8-bit inputs as. The
scales are per tensor: numbers, or arrays of one element. Only sm_90a's
wgmma reads 8-bit floats here: on other GPUs the op is a LaunchError saying
so. The CPU backend runs the same kernel, emulating its TMA copies and
8-bit wgmmas (with float32 sums, where the GPU's keep fewer bits).
"""
import sys

from .._mlirgpu import Dispatcher, DType, LaunchError, bf16, dtype, f8e4m3, f16, f32
from ..runtime import backend
from . import gemm, hopper_gemm, kept
from .arrays import as_array, dtype_of, geometry, is_contiguous, output, per_tensor_scale, torch_stream

__all__ = ["scaled_matmul", "register_torch"]

OUT_DTYPES = (bf16, f16, f32)


def _out_dtype(kind, op="scaled_matmul"):
    """out_dtype as an mlirgpu dtype: given as one, a NumPy dtype, a name or a torch dtype
    (a LaunchError naming `op` for any other)."""
    if type(kind).__module__ == "torch":
        kind = str(kind).removeprefix("torch.")    # torch.bfloat16 -> "bfloat16"
    try:
        kind = kind if isinstance(kind, DType) else dtype(kind)
    except (TypeError, ValueError):
        kind = None
    if kind not in OUT_DTYPES:
        raise LaunchError(f"{op}'s out_dtype is bf16, f16 or f32, not {kind}")
    return kind


# out_dtype as given: the torch dtype of a new output of torch tensors (read from torch once).
_TORCH_OUT = {}
_TORCH_NAMES = {bf16: "bfloat16", f16: "float16", f32: "float32"}
# out_dtype as given: the mlirgpu dtype it names (out_kind).
_KINDS = {}


def out_kind(out_dtype):
    """The mlirgpu dtype of OUT_DTYPES that out_dtype names (as _out_dtype
    reads it), else out_dtype itself, for the op's checks to refuse: what
    keys a call's output. Read once per out_dtype: every call asks."""
    kind = _KINDS.get(out_dtype)
    if kind is None:
        try:
            kind = _out_dtype(out_dtype)
        except LaunchError:
            return out_dtype
        _KINDS[out_dtype] = kind
    return kind


def kept_output(a, out, shape, out_dtype):
    """The output a call passes its op's Dispatcher: `out` where out_dtype
    names its dtype, else (out None) a new torch tensor of `shape` like a,
    of the dtype out_dtype names. None where there is none: the op's Python
    path then makes the output, or says what is wrong. An AttributeError or
    TypeError where a is no torch tensor, out no array, or out_dtype no
    dtype at all."""
    if out is None:
        kind = _TORCH_OUT.get(out_dtype)
        if kind is None:
            name = _TORCH_NAMES.get(out_kind(out_dtype))
            if name is None or type(a).__module__.split(".")[0] != "torch":
                return None
            kind = _TORCH_OUT[out_dtype] = getattr(sys.modules["torch"], name)
        return a.new_empty(shape, dtype=kind)
    return out if out_kind(out_dtype) is out_kind(out.dtype) else None


def scaled_matmul(a, b, scale_a, scale_b, out_dtype=bf16, *, out=None):
    """(scale_a * scale_b) * (a @ b) for f8e4m3 a (M, K), row-major, and b
    (K, N), column-major (b.T C-contiguous), as torch._scaled_mm takes them;
    the products summed in float32, scaled, and returned as `out_dtype`
    (bf16, f16 or f32, or torch's): `out` (a C-contiguous (M, N) array of
    it) or a new array in a's library. scale_a and scale_b are numbers or
    arrays of one element (a device array's is read back to the host). K
    and N are multiples of 16 (TMA reads rows of 16-byte multiples).
    After a first call with arrays of a signature (types, dtypes, shapes,
    devices) and scales that are Python numbers, later calls like it launch
    from C, each passing its own scales; scales given as arrays are read on
    the host, call after call.

    The products are summed by wgmma's FP8 accumulator, which keeps fewer
    bits than float32 and is not promoted to float32 every few steps: the
    result is that of torch._scaled_mm(..., use_fast_accum=True), less
    accurate than its default.

    Runs on sm_90a GPUs (wgmma reads 8-bit floats) and on the CPU backend;
    on other GPUs it is a LaunchError, as are bad shapes, layouts and dtypes
    (a ValueError); what is no array is a TypeError.

        c = mlirgpu.ops.scaled_matmul(x8, w8.t(), scale_x, scale_w)

    With torch tensors it is also torch.ops.mlirgpu.scaled_matmul, which
    torch.compile keeps in its graph; traced there, the scales are 1-element
    float32 tensors and out_dtype a torch dtype, as the op takes them.
    """
    if gemm._compiling is not None and gemm._compiling():
        result = register_torch()(a, b, scale_a, scale_b, out_dtype)
        return result if out is None else out.copy_(result)
    try:
        given = kept_output(a, out, (a.shape[0], b.shape[1]), out_dtype)
    except (AttributeError, IndexError, TypeError):    # no torch tensors: _launch says what they must be
        given = None
    if given is None:
        return _launch(a, b, scale_a, scale_b, out_dtype, out)
    return _KEPT(a, b, scale_a, scale_b, given)


def _launch(a, b, scale_a, scale_b, out_dtype, out):
    """scaled_matmul's work, outside torch.compile's tracing. Where the
    scales are Python numbers, it has later calls like this one launch from
    C (_KEPT); scales given as arrays are read on the host, call after call."""
    if _registered is None and type(a).__module__.split(".")[0] == "torch":
        register_torch()
    out_dtype = _out_dtype(out_dtype)
    A, B = as_array(a, "scaled_matmul's a"), as_array(b, "scaled_matmul's b")
    if len(A.shape) != 2 or len(B.shape) != 2:
        raise LaunchError(f"scaled_matmul multiplies 2-d arrays, not shapes {tuple(A.shape)} and {tuple(B.shape)}")
    B = B.T    # N x K, as the kernel reads it
    (m, k), (n, k2) = A.shape, B.shape
    if k != k2:
        raise LaunchError(f"scaled_matmul's a {tuple(A.shape)} and b {tuple(b.shape)} do not multiply: "
                          f"a has {k} columns, b {k2} rows")
    if dtype_of(A) != f8e4m3 or dtype_of(B) != f8e4m3:
        raise LaunchError(f"scaled_matmul takes a and b of f8e4m3, not {A.dtype} and {B.dtype}")
    if k % 16 or n % 16:
        raise LaunchError(f"scaled_matmul needs K and N multiples of 16 (TMA reads rows of 16-byte multiples), "
                          f"not K = {k}, N = {n}")
    if not (is_contiguous(A) and is_contiguous(B)):
        raise LaunchError("scaled_matmul's a is row-major and b column-major (b.T C-contiguous), "
                          "as torch._scaled_mm takes them")
    scales = (per_tensor_scale(scale_a, "scaled_matmul's scale_a"),    # what is wrong with the call, before where
              per_tensor_scale(scale_b, "scaled_matmul's scale_b"))
    if backend.current().name != "cpu" and gemm._device()[0] != "sm_90a":
        raise LaunchError(f"scaled_matmul needs an sm_90a GPU (wgmma reads the 8-bit floats), not "
                          f"{gemm._device()[0]}")
    out = output(a, out, (m, n), out_dtype, "scaled_matmul")
    C, stream = as_array(out, "scaled_matmul's out"), torch_stream(a)
    geometries = (geometry(A), geometry(B), geometry(C))
    hopper_gemm.launch(A, B, C, stream=stream, scale_a=scales[0], scale_b=scales[1], geometries=geometries)
    if type(scale_a) in (float, int) and type(scale_b) in (float, int):
        # A Python number's signature is its type: a kept launch passes each call's value.
        key = (*(gemm._unaddressed(g) for g in geometries), *gemm._where())
        kept.keep(_KEPT, _PLANS.setdefault(key, {}), (a, b, scale_a, scale_b, out), stream,
                  lambda source: hopper_gemm.launch_plan(A, B, C, None, geometries, source, (0, 1, 4), (2, 3)))
    return out


# By the arrays' geometries without their addresses, backend and device: the LaunchPlans by stream that
# kept.keep registered.
_PLANS = {}

# Calls of scaled_matmul(a, b, scale_a, scale_b, out) (its out_dtype out's) with scales that are Python
# numbers, whose signature (types, dtypes, shapes, devices) a launch has seen: their LaunchPlans, run from
# C; any other call is _launch's.
_KEPT = Dispatcher(lambda args, kwargs: _launch(*args[:4], args[4].dtype, args[4]), "scaled_matmul")


_registered = None


def register_torch():
    """Registers torch.ops.mlirgpu.scaled_matmul, a torch custom op running
    scaled_matmul (scales as 1-element float32 tensors, the output's dtype
    as a torch dtype), with a fake implementation for torch.compile; once.
    Returns the op."""
    global _registered
    import torch

    if _registered is None:
        @torch.library.custom_op("mlirgpu::scaled_matmul", mutates_args=())
        def scaled_matmul_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                             out_dtype: torch.dtype) -> torch.Tensor:
            a, b = a.detach(), b.detach()    # below autograd, yet marked requires_grad, which DLPack refuses
            return _launch(a, b, scale_a, scale_b, out_dtype, None)

        @scaled_matmul_op.register_fake
        def _(a, b, scale_a, scale_b, out_dtype):
            torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                         lambda: f"mlirgpu::scaled_matmul multiplies (M, K) by (K, N), not {a.shape} by {b.shape}")
            torch._check(a.dtype == b.dtype == torch.float8_e4m3fn,
                         lambda: f"mlirgpu::scaled_matmul takes float8_e4m3fn, not {a.dtype} and {b.dtype}")
            return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)

        _registered = scaled_matmul_op
    gemm.register_torch()    # torch.compiler.is_compiling, which scaled_matmul asks
    return torch.ops.mlirgpu.scaled_matmul
