"""Ready-made kernels, written in mlirgpu's language, called like library functions.

    import mlirgpu.ops
    o = mlirgpu.ops.attention(q, k, v, causal=True)
    c = mlirgpu.ops.matmul(a, b)
    c = mlirgpu.ops.grouped_matmul(tokens, expert_weights, offs)
    c = mlirgpu.ops.scaled_matmul(x8, w8.t(), scale_x, scale_w)

A layer above the runtime: each op validates its arguments, picks the
kernel specialization and launches it. Importing `mlirgpu` does not import
this package; `import mlirgpu.ops` does, and builds no kernel until a call.
With torch imported, the ops are also torch custom ops (torch.ops.mlirgpu.*).
"""
import sys

from . import attention_torch, grouped_gemm, scaled_gemm
from .attention import attention, forward
from .attention_backward import attention_backward
from .gemm import matmul, register_torch
from .grouped_gemm import grouped_matmul
from .scaled_gemm import scaled_matmul

attention_torch.provide(forward, attention_backward)

__all__ = ["attention", "attention_backward", "grouped_matmul", "matmul", "scaled_matmul"]

if "torch" in sys.modules:  # torch.ops.mlirgpu.*, for torch.compile (not worth importing torch for)
    register_torch()
    grouped_gemm.register_torch()
    scaled_gemm.register_torch()
