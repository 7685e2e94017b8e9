"""Ready-made kernels, written in mlirgpu's language, called like library functions.

    import mlirgpu.ops
    o = mlirgpu.ops.attention(q, k, v, causal=True)
    c = mlirgpu.ops.matmul(a, b)
    c = mlirgpu.ops.grouped_matmul(tokens, expert_weights, offs)
    c = mlirgpu.ops.scaled_matmul(x8, w8.t(), scale_x, scale_w)
    c = mlirgpu.ops.scaled_grouped_matmul(x8, w8.transpose(-2, -1), scale_x, scale_w, offs)

A layer above the runtime: each op validates its arguments, picks the
kernel specialization and launches it. Importing `mlirgpu` does not import
this package; `import mlirgpu.ops` does, and builds no kernel until a call.
With torch, the ops are also torch custom ops (torch.ops.mlirgpu.*),
registered as soon as torch is imported, before or after this package.
"""
import importlib.abc
import importlib.util
import sys
import threading
import warnings

from . import attention_torch, grouped_gemm, scaled_gemm, scaled_grouped_gemm
from .attention import attention, forward
from .attention_backward import attention_backward
from .gemm import matmul, register_torch
from .grouped_gemm import grouped_matmul
from .scaled_gemm import scaled_matmul
from .scaled_grouped_gemm import scaled_grouped_matmul

attention_torch.provide(forward, attention_backward)

__all__ = ["attention", "attention_backward", "grouped_matmul", "matmul", "scaled_grouped_matmul", "scaled_matmul"]



def _register_torch_ops():
    """torch.ops.mlirgpu.*: torch.compile traces a call into the op, but
    cannot trace the op's registration, so it happens before any tracing."""
    attention_torch.register()
    register_torch()
    grouped_gemm.register_torch()
    scaled_gemm.register_torch()
    scaled_grouped_gemm.register_torch()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then` once the module `name` has been imported, the first time
    it is: the ops register when torch arrives, without importing it. A
    lookup that imports nothing (importlib.util.find_spec) leaves it waiting."""

    def __init__(self, name, then):
        self.name, self.then = name, then
        self._looking = threading.local()

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or getattr(self._looking, "now", False):
            return None
        self._looking.now = True         # the lookup below asks the finders again, this one included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._looking.now = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                self.then()
            except Exception as error:   # torch itself imported fine: its import must not fail for us
                warnings.warn(f"mlirgpu.ops could not register its torch ops: {error!r}", RuntimeWarning,
                              stacklevel=2)
        spec.loader.exec_module = exec_then
        return spec


if "torch" in sys.modules:
    _register_torch_ops()
else:  # not worth importing torch for: registered when it is imported
    sys.meta_path.insert(0, _AfterImport("torch", _register_torch_ops))
