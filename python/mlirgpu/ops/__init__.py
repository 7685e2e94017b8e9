"""Ready-made kernels, written in mlirgpu's language, called like library functions.

    import mlirgpu.ops
    o = mlirgpu.ops.attention(q, k, v, causal=True)

A layer above the runtime: each op validates its arguments, picks the
kernel specialization and launches it. Importing `mlirgpu` does not import
this package; `import mlirgpu.ops` does, and builds no kernel until a call.
With torch imported, the ops are also torch custom ops (torch.ops.mlirgpu.*).
"""
from .attention import attention
from .attention_backward import attention_backward
from .attention_torch import register_if_imported

register_if_imported()

__all__ = ["attention", "attention_backward"]
