"""Pass pipelines over modules (MLIR's textual pipeline syntax)."""
from __future__ import annotations

import sys
from typing import TextIO

# Module and Operation are imported at run time, not only for type checkers, so that the docs
# resolve them to mlirgpu.ir's classes (mlirgpu.cuda has a Module too).
from .._mlirgpu import Module, Operation, PassManager

__all__ = ["PassManager", "run"]


def run(module: Module | Operation, pipeline: str, *, print_ir_before_all: bool = False,
        print_ir_after_all: bool = False, timing: bool = False, verify_each: bool = True,
        file: TextIO | None = None) -> str:
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
