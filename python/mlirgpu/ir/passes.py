"""Pass pipelines over modules (MLIR's textual pipeline syntax)."""
import sys

from .._mlirgpu import PassManager

__all__ = ["PassManager", "run"]


def run(module, pipeline, *, print_ir_before_all=False, print_ir_after_all=False, timing=False,
        verify_each=True, file=None):
    """Run `pipeline` on `module` in place.

    The IR dumps and timing report, when asked for, are written to `file`
    (default: sys.stdout) and returned; otherwise '' is returned. A failing
    pass raises mlirgpu.MLIRError carrying MLIR's diagnostics.
    """
    report = PassManager(pipeline, print_ir_before_all=print_ir_before_all,
                         print_ir_after_all=print_ir_after_all, timing=timing,
                         verify_each=verify_each).run(module)
    if report:
        print(report, end="", file=sys.stdout if file is None else file)
    return report
