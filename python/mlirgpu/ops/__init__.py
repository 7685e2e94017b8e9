"""Ready-made kernels, written in mlirgpu's language, called like library functions.

    import mlirgpu.ops
    o = mlirgpu.ops.attention(q, k, v, causal=True)
    c = mlirgpu.ops.matmul(a, b)

A layer above the runtime: each op validates its arguments, picks the
kernel specialization and launches it. Importing `mlirgpu` does not import
this package; `import mlirgpu.ops` does, and builds no kernel until a call.
With torch imported, the ops are also torch custom ops (torch.ops.mlirgpu.*).
"""
import sys

from . import attention_torch
from .attention import attention, forward
from .attention_backward import attention_backward
from .gemm import matmul, register_torch

attention_torch.provide(forward, attention_backward)

__all__ = ["attention", "attention_backward", "matmul"]

if "torch" in sys.modules:  # torch.ops.mlirgpu.matmul, for torch.compile (not worth importing torch for)
    register_torch()
