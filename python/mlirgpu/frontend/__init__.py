"""From Python source to MLIR: the source rewrite that turns control flow
into scf operations (rewrite.py), the one way every function is traced
(trace.py), kernels (kernel.py), @mg.func device functions (function.py) and
the IR of element-wise kernels (elementwise.py)."""
from .function import func

__all__ = ["func"]
