"""Tests marked `gpu` (declared in pyproject.toml) need a CUDA driver and a
device; where there is none they are skipped, with the reason. Tests marked
`multigpu` need two devices or more, and are skipped with fewer. A test that
takes the `backend` fixture runs once per backend: "cpu" everywhere, "cuda"
(gpu-marked) where there is a GPU, with the same assertions; `size` picks its
problem size per backend where the GPU's would be too slow on the CPU.

The whole session compiles into a cache directory of its own (MLIRGPU_CACHE_DIR,
removed at the end), so the tests neither read nor fill the user's cache."""
import os
import shutil
import subprocess
import tempfile

import pytest
from backends import current_backend

from mlirgpu import compiler, ir

_cache_dir = None


def pytest_configure(config):
    global _cache_dir
    _cache_dir = tempfile.mkdtemp(prefix="mlirgpu-test-cache-")
    os.environ["MLIRGPU_CACHE_DIR"] = _cache_dir


def pytest_unconfigure(config):
    if _cache_dir is not None:
        shutil.rmtree(_cache_dir, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    import mlirgpu.cuda

    count = mlirgpu.cuda.device_count() if mlirgpu.cuda.is_available() else 0
    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU: mlirgpu.cuda.is_available() is False")
    one_gpu = pytest.mark.skip(reason=f"needs two GPUs: mlirgpu.cuda.device_count() is {count}")
    for item in items:
        if "gpu" in item.keywords and count == 0:
            item.add_marker(no_gpu)
        elif "multigpu" in item.keywords and count < 2:
            item.add_marker(one_gpu)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    """The backend the test launches on, made current for the test."""
    with current_backend(request.param) as name:
        yield name


@pytest.fixture
def size(backend):
    """size(gpu=..., cpu=...): the problem size for the backend under test. The
    CPU backend runs a block's threads one after another on one core, so where
    the GPU's size would take seconds there (CI has 2 cores) it gets a smaller one."""
    return lambda gpu, cpu: gpu if backend == "cuda" else cpu


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
