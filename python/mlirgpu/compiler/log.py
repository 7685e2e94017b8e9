"""mlirgpu's log: lines through the "mlirgpu" logger, for the topics
MLIRGPU_LOG (comma-separated, or "all") names: `compile` (each compile and
why), `cache` (disk hits, corrupt or refused entries, a directory that cannot be
written or is not trusted), `autotune` (what the tuner tried and chose)."""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

__all__ = ["log", "logger"]

logger = logging.getLogger("mlirgpu")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (notebooks replace it)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _log_enabled(*topics):
    words = {w.strip() for w in os.environ.get("MLIRGPU_LOG", "").split(",")}
    return bool(words & ({"all"} | set(topics)))


def log(topics: Iterable[str], message: str) -> None:
    """Log at INFO when MLIRGPU_LOG names one of topics (read at each call)."""
    if not _log_enabled(*topics):
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)    # the user asked for these lines by setting MLIRGPU_LOG
    if not logger.hasHandlers():
        logger.addHandler(_StderrHandler())
    logger.info(message)
