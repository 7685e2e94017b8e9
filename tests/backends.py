"""Running a launch test on each backend: a test that takes conftest.py's
`backend` fixture runs on "cpu" everywhere and "cuda" where there is a GPU.
`@cuda_only` narrows one such test to the GPU, for what the CPU backend does
not run yet (or tensors that live in CUDA memory)."""
import pytest

cuda_only = pytest.mark.parametrize("backend", [pytest.param("cuda", marks=pytest.mark.gpu)], indirect=True)
