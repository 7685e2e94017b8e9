"""From Python source to MLIR: the source rewrite that turns control flow
into calls of the scf builders (rewrite.py), those builders, run while the
rewritten code is traced (control_flow.py), the one way every function is traced
(trace.py), kernels (kernel.py), @mg.func device functions (function.py) and
the IR of element-wise kernels (elementwise.py)."""
from .function import func

__all__ = ["func"]
