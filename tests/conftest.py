"""Tests marked `gpu` (declared in pyproject.toml) need a CUDA driver and a
device; where there is none they are skipped, with the reason. A test that
takes the `backend` fixture runs once per backend: "cpu" everywhere, "cuda"
(gpu-marked) where there is a GPU, with the same assertions."""
import os
import subprocess

import pytest

from mlirgpu import compiler, ir


def pytest_collection_modifyitems(config, items):
    import mlirgpu.cuda

    if mlirgpu.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: mlirgpu.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    """The backend the test launches on, made current for the test."""
    import mlirgpu as mg

    previous = mg.backend()
    mg.set_backend(request.param)
    try:
        yield request.param
    finally:
        mg.set_backend(previous)


@pytest.fixture
def ctx():
    """A fresh Context, current for the whole test."""
    context = ir.Context()
    with context:
        yield context


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory):
    """Path of tests/fake_cuda/libcuda.c built as a shared library."""
    source = os.path.join(os.path.dirname(__file__), "fake_cuda", "libcuda.c")
    library = str(tmp_path_factory.mktemp("fake_cuda") / "libcuda.so.1")
    subprocess.run(["gcc", "-O1", "-std=gnu11", "-shared", "-fPIC", f"-I{compiler.CUDA_HOME}/include",
                    source, "-o", library], check=True)
    return library
