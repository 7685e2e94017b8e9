"""Ready-made kernels, written in mlirgpu's language, called like library functions.

    import mlirgpu.ops
    o = mlirgpu.ops.attention(q, k, v, causal=True)
    c = mlirgpu.ops.matmul(a, b)

A layer above the runtime: each op validates its arguments, picks the
kernel specialization and launches it. Importing `mlirgpu` does not import
this package; `import mlirgpu.ops` does, and builds no kernel until a call.
"""
import sys

from .attention import attention
from .gemm import matmul, register_torch

__all__ = ["attention", "matmul"]

if "torch" in sys.modules:  # torch.ops.mlirgpu.matmul, for torch.compile (not worth importing torch for)
    register_torch()
