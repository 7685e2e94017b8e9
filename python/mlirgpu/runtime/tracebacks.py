"""Tracebacks that start at the user's code, as JAX's do.

An error raised while a kernel is traced or launched passes through many of
mlirgpu's frames; what the user needs is the line that called mlirgpu and the
lines of their kernel it ran. A function decorated with `user_frames` removes
mlirgpu's frames (files under the package) from the traceback of what it
raises, its own frame included, and those of the standard library it calls.
MLIRGPU_TRACEBACK=full keeps them all.
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
import types
from collections.abc import Callable
from typing import TypeVar

__all__ = ["user_frames", "user_stacklevel", "without_library_frames"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The standard library's files (contextlib's, which mlirgpu's frames call), not the packages installed in it.
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[name]) + os.sep for name in ("stdlib", "platstdlib")})
_INSTALLED = tuple({os.path.abspath(sysconfig.get_paths()[name]) + os.sep for name in ("purelib", "platlib")})
F = TypeVar("F", bound=Callable)


def without_library_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """`tb` without the entries of frames in mlirgpu's files and the standard library's."""
    kept = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith(_PACKAGE) or
                filename.startswith(_STDLIB) and not filename.startswith(_INSTALLED)):
            kept.append(tb)
        tb = tb.tb_next
    result = None
    for entry in reversed(kept):
        result = types.TracebackType(result, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return result


def user_stacklevel() -> int:
    """The `stacklevel` that makes a warning its caller warns point at the
    user's line: the first frame outside mlirgpu's files."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def user_frames(function: F) -> F:
    """`function`, whose exceptions leave it with mlirgpu's frames removed
    from their tracebacks (unless MLIRGPU_TRACEBACK=full)."""
    @functools.wraps(function)
    def boundary(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as error:
            if os.environ.get("MLIRGPU_TRACEBACK", "").lower() != "full":
                chained, seen = error, set()
                while chained is not None and id(chained) not in seen:   # the causes Python prints too
                    seen.add(id(chained))
                    chained.__traceback__ = without_library_frames(chained.__traceback__)
                    chained = chained.__cause__ or chained.__context__
            # A bare raise adds no entry for this frame: the traceback stays as set.
            raise
    return boundary
