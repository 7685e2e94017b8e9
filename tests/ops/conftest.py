"""What the ops' tests share: the CPU backend planning as a GPU of a chosen kind."""
import sys

import pytest

from support.backends import current_backend


def clear_plans():
    """Forgets the launches matmul and grouped_matmul planned (for the chip they saw)."""
    sys.modules["mlirgpu.ops.gemm"]._CALLS.clear()
    sys.modules["mlirgpu.ops.grouped_gemm"]._CALLS.clear()


@pytest.fixture
def device(monkeypatch):
    """The CPU backend, planning as a GPU of the chip and multiprocessors a test
    sets, with no product too small for the Hopper GEMM (the CPU runs small ones)."""
    def pretend(chip, multiprocessors=132):
        monkeypatch.setattr(sys.modules["mlirgpu.ops.gemm"], "_device", lambda: (chip, multiprocessors))
        monkeypatch.setattr(sys.modules["mlirgpu.ops.gemm"], "HOST_BOUND_PRODUCT", 0)
        clear_plans()
    with current_backend("cpu"):
        yield pretend
    clear_plans()
