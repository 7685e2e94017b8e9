"""Grouped GEMM in 8-bit floats with row-wise scales, as a mixture-of-experts
layer runs it in FP8: mlirgpu.ops.scaled_grouped_matmul, as
torch._scaled_grouped_mm takes it for a 2-d a and a 3-d b.

A (total_M, K) f8e4m3 holds the groups' rows end to end, row-major; B
(G, K, N) f8e4m3 one matrix per group, each column-major (B's
transpose(-2, -1) C-contiguous: G weights w (N, K) passed as
w.transpose(-2, -1)), the K-major operand wgmma reads 8-bit floats as; offs
(G,) int32 the groups' cumulative row ends, as grouped_matmul takes them.
scale_a (total_M,) float32 scales the rows of A, scale_b (G, N) float32 the
columns of each group's B:

    C[r, n] = scale_a[r] * scale_b[g, n] * sum_k A[r, k] * B[g, k, n]

for the rows r of group g. It runs hopper_gemm's grouped kernel in 8 bits
(wgmma m64nNk32, B read through a 3-d tensor map of its G x N x K view), the
scales applied to the float32 accumulators in the register epilogue, which
stores the group's rows only; the checks, the offsets' handling and the
launch are grouped_matmul's (grouped_gemm._launch). Only sm_90a's wgmma
reads 8-bit floats here: on other GPUs it is a LaunchError saying so. The
CPU backend runs the same kernel, emulating its TMA copies and 8-bit
wgmmas (with float32 sums, where the GPU's keep fewer bits).
"""
from .._mlirgpu import Dispatcher, bf16
from . import gemm, grouped_gemm, scaled_gemm

__all__ = ["scaled_grouped_matmul", "register_torch"]


def scaled_grouped_matmul(a, b, scale_a, scale_b, offs, out_dtype=bf16, *, out=None):
    """For each group g: C[rows of g] = scale_a[rows of g, None] *
    scale_b[g] * (A[rows of g] @ B[g]), in one launch.

    a (total_M, K) f8e4m3, row-major, holds the groups' rows end to end; b
    (G, K, N) f8e4m3 their matrices, each column-major (b.transpose(-2, -1)
    C-contiguous: weights w (G, N, K) passed as w.transpose(-2, -1)); offs
    (G,) int32 the groups' cumulative row ends (group g owns rows offs[g - 1]
    .. offs[g], from row 0 for g = 0); scale_a (total_M,) and scale_b (G, N)
    float32 arrays: a scale per row of a, and per group and column of b. As
    torch._scaled_grouped_mm takes them. K and N are multiples of 16 (TMA
    reads rows of 16-byte multiples). Returns C (total_M, N) of `out_dtype`
    (bf16, f16 or f32, or torch's): `out` (a C-contiguous array of that
    shape and dtype) or a new array in a's library. Rows past offs[-1] are
    not written.

    The products are summed by wgmma's FP8 accumulator, which keeps fewer
    bits than float32 and is not promoted to float32 every few steps: the
    result is that of torch._scaled_grouped_mm(..., use_fast_accum=True),
    less accurate than its default.

    Offsets on the host (a NumPy array) are checked, as grouped_matmul's;
    offsets on the device are read by the kernel only, never by the host.
    As grouped_matmul's, later calls with arrays of the signature of a
    first one (offsets on the device) launch from C.
    Runs on sm_90a GPUs and on the CPU backend; on other GPUs it is a
    LaunchError, as are bad shapes, layouts, dtypes and scales (a
    ValueError); what is no array is a TypeError.

        c = mlirgpu.ops.scaled_grouped_matmul(x8, w8.transpose(-2, -1), scale_x, scale_w, offs)

    With torch tensors it is also torch.ops.mlirgpu.scaled_grouped_matmul,
    which torch.compile keeps in its graph (out_dtype then a torch dtype).
    """
    if gemm._compiling is not None and gemm._compiling():
        result = register_torch()(a, b, scale_a, scale_b, offs, out_dtype)
        return result if out is None else out.copy_(result)
    try:
        given = scaled_gemm.kept_output(a, out, (a.shape[0], b.shape[2]), out_dtype)
    except (AttributeError, IndexError, TypeError):    # no torch tensors: _launch says what they must be
        given = None
    if given is None:
        return _launch(a, b, scale_a, scale_b, offs, out_dtype, out)
    return _KEPT(a, b, scale_a, scale_b, offs, given)


def _launch(a, b, scale_a, scale_b, offs, out_dtype, out):
    """scaled_grouped_matmul's work, outside torch.compile's tracing: grouped_matmul's, in 8 bits."""
    if _registered is None and type(a).__module__.split(".")[0] == "torch":
        register_torch()
    return grouped_gemm._launch(a, b, offs, out, scaled=(scale_a, scale_b, out_dtype), dispatcher=_KEPT)


# Calls of scaled_grouped_matmul(a, b, scale_a, scale_b, offs, out) (its out_dtype out's) whose arrays'
# signature (types, dtypes, shapes, devices) a launch has seen: their LaunchPlans, run from C; any other
# call is _launch's.
_KEPT = Dispatcher(lambda args, kwargs: _launch(*args[:5], args[5].dtype, args[5]), "scaled_grouped_matmul")


_registered = None


def register_torch():
    """Registers torch.ops.mlirgpu.scaled_grouped_matmul, a torch custom op
    running scaled_grouped_matmul (the output's dtype as a torch dtype), with
    a fake implementation (the output's shape and dtype) for torch.compile;
    once. Returns the op."""
    global _registered
    import torch

    if _registered is None:
        @torch.library.custom_op("mlirgpu::scaled_grouped_matmul", mutates_args=())
        def scaled_grouped_matmul_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                                     offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
            # Rows past the last group are zeros here: an op's output holds no garbage.
            a, b = a.detach(), b.detach()    # below autograd, yet marked requires_grad, which DLPack refuses
            out = a.new_zeros((a.shape[0], b.shape[2]), dtype=out_dtype)
            return _launch(a, b, scale_a, scale_b, offs, out_dtype, out)

        @scaled_grouped_matmul_op.register_fake
        def _(a, b, scale_a, scale_b, offs, out_dtype):
            grouped_gemm.check_fake_shapes(torch, "scaled_grouped_matmul", a, b, offs)
            torch._check(a.dtype == b.dtype == torch.float8_e4m3fn,
                         lambda: f"mlirgpu::scaled_grouped_matmul takes float8_e4m3fn, not {a.dtype} and {b.dtype}")
            torch._check(tuple(scale_a.shape) == (a.shape[0],) and tuple(scale_b.shape) == (b.shape[0], b.shape[2]),
                         lambda: f"mlirgpu::scaled_grouped_matmul takes scale_a (total_M,) and scale_b (G, N), "
                                 f"not {scale_a.shape} and {scale_b.shape}")
            return a.new_empty((a.shape[0], b.shape[2]), dtype=out_dtype)

        _registered = scaled_grouped_matmul_op
    gemm.register_torch()    # torch.compiler.is_compiling, which scaled_grouped_matmul asks
    return torch.ops.mlirgpu.scaled_grouped_matmul
