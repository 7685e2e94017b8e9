"""mlirgpu.ops.attention as the torch custom op `mlirgpu::attention`, with
`mlirgpu::attention_backward` as its autograd formula: registered once
both `mlirgpu.ops` and torch are imported, or at the first call on a torch
tensor (nothing here imports torch). mlirgpu.ops hands it the
forward and backward functions, so that it imports neither.

The ops take plain arguments (a window as two ints, -1 for no bound; 0 for
"no maximum length" and "choose the split"), have fake implementations
that give the outputs' shapes (torch.compile traces them without a graph
break) and launch on torch's current stream (CUDA graphs capture them)."""
import sys
from typing import Optional

OPS = None     # (torch.Tensor, the forward op, the backward op) once registered
KERNELS = None     # (forward, backward): the functions the ops call, given by mlirgpu.ops (provide)


def provide(forward, backward):
    """Gives the ops the functions they call (mlirgpu.ops does, at its import:
    this module imports neither); mlirgpu.ops registers them once torch is imported."""
    global KERNELS
    KERNELS = (forward, backward)


def register():
    """Registers the two ops (once); torch must be importable."""
    global OPS
    if OPS is not None:
        return
    import torch
    from torch import Tensor
    forward, attention_backward = KERNELS

    def options(causal, scale, left, right, max_seqlen_q, max_seqlen_k):
        return dict(causal=causal, scale=scale, window=None if left < 0 and right < 0 else (left, right),
                    max_seqlen_q=max_seqlen_q or None, max_seqlen_k=max_seqlen_k or None)

    @torch.library.custom_op("mlirgpu::attention", mutates_args=())
    def attention_op(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float], left: int, right: int,
                     cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                     num_splits: int) -> tuple[Tensor, Tensor]:
        # An op's implementation runs below autograd, but its tensors still say requires_grad,
        # which DLPack refuses to export: the kernels read them as plain tensors.
        q, k, v = q.detach(), k.detach(), v.detach()
        return forward(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, num_splits=num_splits or None,
                       return_lse=True, **options(causal, scale, left, right, max_seqlen_q, max_seqlen_k))

    @attention_op.register_fake
    def _(q, k, v, causal, scale, left, right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, num_splits):
        lse = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])
        return torch.empty_like(q), q.new_empty(lse, dtype=torch.float32)

    @torch.library.custom_op("mlirgpu::attention_backward", mutates_args=())
    def backward_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
                    scale: Optional[float], left: int, right: int, cu_seqlens_q: Optional[Tensor],
                    cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                    deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
        dout, q, k, v, out = (x.detach() for x in (dout, q, k, v, out))
        return attention_backward(dout, q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                  deterministic=deterministic,
                                  **options(causal, scale, left, right, max_seqlen_q, max_seqlen_k))

    @backward_op.register_fake
    def _(dout, q, k, v, out, lse, causal, scale, left, right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
          deterministic):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale, left, right, cu_q, cu_k, max_q, max_k, _ = inputs
        ctx.save_for_backward(q, k, v, *output, cu_q, cu_k)
        ctx.mark_non_differentiable(output[1])    # the log-sum-exp carries no gradient
        ctx.options = (causal, scale, left, right)
        ctx.lengths = (max_q, max_k)

    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        grads = backward_op(dout.contiguous(), q, k, v, out, lse, *ctx.options, cu_q, cu_k, *ctx.lengths,
                            torch.are_deterministic_algorithms_enabled())
        return (*grads,) + (None,) * 9

    attention_op.register_autograd(backward, setup_context=setup_context)
    OPS = (Tensor, attention_op, backward_op)


def is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def takes(x):
    """Whether x is a torch tensor, registering the ops at the first one."""
    if OPS is not None:
        return isinstance(x, OPS[0])
    if not is_torch(x):
        return False
    register()
    return True


def needs_op(q, k, v):
    """Whether a call on torch tensors goes through the custom op: autograd
    is to differentiate it (grad mode on, an input requiring grad),
    torch.compile is tracing it, or an input is a tensor subclass (a fake or
    distributed tensor, say) whose dispatch only the op goes through. Other
    calls (inference, decoding) launch the kernels directly: the op's
    dispatch costs more host time than they do."""
    tensor = OPS[0]
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling() or not type(q) is type(k) is type(v) is tensor:
        return True
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def attention(q, k, v, causal, scale, window, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, num_splits):
    """(output, lse) through torch.ops.mlirgpu.attention."""
    left, right = (None, None) if window is None else window
    left, right = -1 if left is None else left, -1 if right is None else right
    return OPS[1](q, k, v, bool(causal), None if scale is None else float(scale), left, right, cu_seqlens_q,
                     cu_seqlens_k, max_seqlen_q or 0, max_seqlen_k or 0, num_splits or 0)
