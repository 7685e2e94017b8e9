"""Running a launch test on each backend: a test that takes conftest.py's
`backend` fixture runs on "cpu" everywhere and "cuda" where there is a GPU.
`@cuda_only` narrows one such test to the GPU, for arguments that live in
CUDA memory (torch and cupy tensors). `current_backend(name)` makes a backend
current for a block, for a test that runs on both in turn."""
import contextlib

import pytest

import mlirgpu as mg

cuda_only = pytest.mark.parametrize("backend", [pytest.param("cuda", marks=pytest.mark.gpu)], indirect=True)


@contextlib.contextmanager
def current_backend(name):
    previous = mg.backend()
    mg.set_backend(name)
    try:
        yield name
    finally:
        mg.set_backend(previous)
