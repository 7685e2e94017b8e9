"""Tests marked `gpu` (declared in pyproject.toml) need a CUDA driver and a
device; where there is none they are skipped, with the reason."""
import pytest

from mlirgpu import ir


def pytest_collection_modifyitems(config, items):
    import mlirgpu.cuda

    if mlirgpu.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: mlirgpu.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def ctx():
    """A fresh Context, current for the whole test."""
    context = ir.Context()
    with context:
        yield context
