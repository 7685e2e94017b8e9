"""The first kernel end to end on the GPU: the naive SGEMM built through
mlirgpu.ir, compiled to cubin, loaded and launched through the C runtime; and
the @mg.kernel one launched from the disk cache in a new process."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support.checks import PYTHON_DIR, TESTS_DIR
from support.sgemm_ir import sgemm_naive

import mlirgpu as mg

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernel():
    module = sgemm_naive.build_naive_sgemm(256, 128, 256)
    cubin = mg.compile_cubin(module, chip=mg.cuda.Device(0).chip)
    return mg.cuda.load_module(cubin).get_function("sgemm_naive")


def relative_error(got, expected):
    return np.linalg.norm(got - expected) / np.linalg.norm(expected)


@pytest.mark.parametrize("seed", [0, 1])
def test_naive_sgemm_matches_numpy(kernel, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((256, 128), dtype=np.float32)
    B = rng.standard_normal((128, 256), dtype=np.float32)
    dA, dB = mg.to_device(A), mg.to_device(B)
    dC = mg.to_device(np.full((256, 256), np.nan, dtype=np.float32))  # poisoned: every element must be written
    kernel(dA, dB, dC, grid=(16, 16), block=(16, 16))
    C = dC.get()
    expected = A.astype(np.float64) @ B.astype(np.float64) + 1.0
    assert np.isfinite(C).all()
    assert relative_error(C, expected) < 1e-5


def test_naive_sgemm_from_ptx(kernel):
    module = sgemm_naive.build_naive_sgemm(256, 128, 256)
    function = mg.cuda.load_module(mg.compile_ptx(module, chip=mg.cuda.Device(0).chip)).get_function("sgemm_naive")
    rng = np.random.default_rng(2)
    A = rng.random((256, 128), dtype=np.float32)
    B = rng.random((128, 256), dtype=np.float32)
    dC = mg.empty((256, 256), mg.f32)
    function(mg.to_device(A), mg.to_device(B), dC, grid=(16, 16), block=(16, 16))
    assert relative_error(dC.get(), A.astype(np.float64) @ B + 1.0) < 1e-5


def test_events_time_the_kernel(kernel):
    dA, dB, dC = mg.zeros((256, 128), mg.f32), mg.zeros((128, 256), mg.f32), mg.empty((256, 256), mg.f32)
    start, end = mg.cuda.Event(), mg.cuda.Event()
    start.record()
    for _ in range(10):
        kernel(dA, dB, dC, grid=(16, 16), block=(16, 16))
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert (dC.get() == 1.0).all()


DISK_HIT_CHILD = """
    import sys
    import numpy as np
    import mlirgpu as mg
    from mlirgpu.runtime.compiled import CompiledModule
    from mlirgpu.runtime.kernel import Specialization
    from support.kernels_sgemm import sgemm_naive

    def refuse(*args, **kwargs):
        raise AssertionError("a disk hit traced or lowered the kernel")

    if sys.argv[1] == "hit":
        Specialization.trace = CompiledModule.compilation = refuse
    rng = np.random.default_rng(3)
    A = rng.standard_normal((256, 128), dtype=np.float32)
    B = rng.standard_normal((128, 256), dtype=np.float32)
    C = mg.zeros((256, 256), mg.f32)
    sgemm_naive(mg.to_device(A), mg.to_device(B), C, grid=(16, 16), block=(16, 16))
    expected = A.astype(np.float64) @ B.astype(np.float64) + 1.0
    info = mg.cache_info()
    print(info.disk_hits, info.compiles, bool(np.abs(C.get() - expected).max() < 1e-3))
"""


def test_a_new_process_launches_the_naive_sgemm_from_the_disk_cache_untraced(tmp_path):
    env = dict(os.environ, MLIRGPU_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([PYTHON_DIR, TESTS_DIR]))
    outputs = []
    for expect in ("compile", "hit"):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(DISK_HIT_CHILD), expect], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout.split())
    assert outputs == [["0", "1", "True"], ["1", "0", "True"]]
