"""The test files sit in a folder per layer of the package (ir, layout,
language, frontend, compiler, runtime, ops), csrc/ for the C core and system/
for the whole package; what they share is the package `support`.

Tests marked `gpu` (declared in pyproject.toml) need a CUDA driver and a
device; where there is none they are skipped, with the reason. Tests marked
`multigpu` need two devices or more, and are skipped with fewer. A test that
takes the `backend` fixture runs once per backend: "cpu" everywhere, "cuda"
(gpu-marked) where there is a GPU, with the same assertions; `size` picks its
problem size per backend where the GPU's would be too slow on the CPU.

Tests marked `device_memory` read the free memory of the whole GPU, which the
session's other processes (pytest -n) change as they allocate: each runs while
no other test of the session runs.

The whole session compiles into a cache directory of its own (MLIRGPU_CACHE_DIR,
removed at the end), so the tests neither read nor fill the user's cache; the
workers of pytest -n share it, so a kernel one of them compiled is a disk hit
for the others."""
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from support.backends import current_backend
from support.checks import TEST_PATH

from mlirgpu import compiler, ir

# A test file imports another's module by its name, wherever under tests/ it is.
sys.path[:0] = [path for path in TEST_PATH if path not in sys.path]

_cache_dir = None
# The file whose locks keep device_memory tests apart from the rest: made by the
# process that starts the workers (pytest -n), which removes it at the end, and
# opened by each worker. Byte 0 is a turnstile, byte 1 the lock a test holds,
# shared or, for a device_memory test, alone: a test takes the turnstile before
# the lock, so one waiting to run alone is not passed by tests that come later.
_lock_path = None
_lock = None


def pytest_configure(config):
    global _cache_dir, _lock_path, _lock
    worker = getattr(config, "workerinput", None)
    if worker is not None and "mlirgpu_lock" in worker:
        # The starting process's directory, which it removes at the end.
        os.environ["MLIRGPU_CACHE_DIR"] = worker["mlirgpu_cache_dir"]
        _lock = os.open(worker["mlirgpu_lock"], os.O_RDWR)
        return
    _cache_dir = tempfile.mkdtemp(prefix="mlirgpu-test-cache-")
    os.environ["MLIRGPU_CACHE_DIR"] = _cache_dir
    if worker is None:
        fd, _lock_path = tempfile.mkstemp(prefix="mlirgpu-test-", suffix=".lock")
        os.close(fd)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["mlirgpu_lock"] = _lock_path
    node.workerinput["mlirgpu_cache_dir"] = _cache_dir


def pytest_unconfigure(config):
    if _cache_dir is not None:
        shutil.rmtree(_cache_dir, ignore_errors=True)
    if _lock_path is not None:
        os.unlink(_lock_path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _lock is None:   # no other process of the session runs tests
        yield
        return
    alone = item.get_closest_marker("device_memory") is not None
    fcntl.lockf(_lock, fcntl.LOCK_EX, 1, 0)
    fcntl.lockf(_lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH, 1, 1)
    if not alone:
        fcntl.lockf(_lock, fcntl.LOCK_UN, 1, 0)
    try:
        yield
    finally:
        fcntl.lockf(_lock, fcntl.LOCK_UN, 1, 1)
        if alone:
            fcntl.lockf(_lock, fcntl.LOCK_UN, 1, 0)


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
    """Path of tests/support/fake_cuda/libcuda.c built as a shared library."""
    source = os.path.join(os.path.dirname(__file__), "support", "fake_cuda", "libcuda.c")
    library = str(tmp_path_factory.mktemp("fake_cuda") / "libcuda.so.1")
    subprocess.run(["gcc", "-O1", "-std=gnu11", "-shared", "-fPIC", f"-I{compiler.CUDA_HOME}/include",
                    source, "-o", library], check=True)
    return library
