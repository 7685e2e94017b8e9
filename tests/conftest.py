import pytest

from mlirgpu import ir


@pytest.fixture
def ctx():
    """A fresh Context, current for the whole test."""
    context = ir.Context()
    with context:
        yield context
