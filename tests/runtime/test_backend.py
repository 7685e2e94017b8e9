"""Backend selection (mg.backend, mg.set_backend, MLIRGPU_BACKEND) and the
CPU backend's DeviceArray: host memory with the GPU's interface, less
__cuda_array_interface__. Runs without a GPU."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support.kernels_sgemm import scale_rows, sgemm_naive
from support.leaks import MB, growth

import mlirgpu as mg

SCRIPT = r"""
import json, sys
import mlirgpu as mg
out = {}
def attempt(key, fn):
    try:
        out[key] = fn()
    except BaseException as e:
        out[key] = [type(e).__name__, str(e)]
attempt("first", mg.backend)
attempt("set_cpu", lambda: (mg.set_backend("cpu"), mg.backend())[1])
attempt("set_other", lambda: mg.set_backend("gpu"))
attempt("set_cuda", lambda: (mg.set_backend("cuda"), mg.backend())[1])
print(json.dumps(out))
"""


def selection(**env):
    environment = {k: v for k, v in os.environ.items() if k != "MLIRGPU_BACKEND"}
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_default_is_cuda_where_there_is_a_gpu_else_cpu():
    out = selection()
    assert out["first"] == ("cuda" if mg.cuda.is_available() else "cpu")
    assert out["set_cpu"] == "cpu"
    assert out["set_other"] == ["ValueError", "set_backend: the backend is 'cuda' or 'cpu', not 'gpu'"]


def test_no_driver_means_cpu_and_cuda_is_refused():
    out = selection(MLIRGPU_LIBCUDA="/nonexistent/libcuda.so.1")
    assert out["first"] == "cpu"
    kind, message = out["set_cuda"]
    assert kind == "CudaError" and message.startswith("no CUDA driver: ")


def test_environment_forces_the_cpu():
    out = selection(MLIRGPU_BACKEND="cpu")
    assert out["first"] == "cpu"


def test_environment_names_a_backend():
    assert selection(MLIRGPU_BACKEND="opencl")["first"] == [
        "ValueError", "MLIRGPU_BACKEND: the backend is 'cuda' or 'cpu', not 'opencl'"]
    kind, message = selection(MLIRGPU_BACKEND="cuda", MLIRGPU_LIBCUDA="/nonexistent/libcuda.so.1")["first"]
    assert kind == "CudaError" and "no CUDA driver" in message


@pytest.fixture
def cpu():
    previous = mg.backend()
    mg.set_backend("cpu")
    yield
    mg.set_backend(previous)


@pytest.mark.usefixtures("cpu")
def test_host_device_array_interface():
    A = np.arange(12, dtype=np.float32).reshape(3, 4)
    dA = mg.to_device(A)
    assert isinstance(dA, mg.DeviceArray) and dA.is_host
    assert dA.shape == (3, 4) and dA.dtype == mg.f32 and dA.strides == (16, 4) and dA.nbytes == 48
    assert dA.device == -1 and dA.ptr % 64 == 0
    assert repr(dA) == "DeviceArray(shape=(3, 4), dtype=mlirgpu.f32, device=-1, is_host=True)"
    got = dA.get()
    np.testing.assert_array_equal(got, A)
    got[0, 0] = 99   # a copy
    assert dA.get()[0, 0] == 0
    assert not hasattr(dA, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="host memory"):
        dA.__cuda_array_interface__
    assert dA.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(dA)   # zero copy
    assert view.ctypes.data == dA.ptr
    view[2, 3] = -1
    assert dA.get()[2, 3] == -1
    out = np.empty((3, 4), np.float32)
    assert dA.copy_to_host(out) is out and out[2, 3] == -1


@pytest.mark.usefixtures("cpu")
def test_host_copy_from():
    src = mg.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    dst = mg.zeros((3, 4))
    assert dst.copy_from(src) is None
    np.testing.assert_array_equal(dst.get(), src.get())
    with pytest.raises(ValueError, match="different shape"):
        dst.copy_from(mg.zeros((4, 3)))
    with pytest.raises(TypeError, match="dtype f64"):
        dst.copy_from(mg.zeros((3, 4), mg.f64))
    with pytest.raises(TypeError, match="DeviceArray"):
        dst.copy_from(np.zeros((3, 4), np.float32))
    mg.empty((0, 4)).copy_from(mg.empty((0, 4)))   # nothing to copy


@pytest.mark.usefixtures("cpu")
def test_host_allocations():
    z = mg.zeros((5, 7), mg.f64)
    assert z.is_host and z.get().dtype == np.float64
    np.testing.assert_array_equal(z.get(), np.zeros((5, 7)))
    e = mg.empty((0, 3), mg.i32)
    assert e.is_host and e.get().shape == (0, 3) and e.nbytes == 0
    assert mg.empty((2, 2)).dtype == mg.f32


@pytest.mark.usefixtures("cpu")
def test_host_asarray_views_numpy_and_host_dlpack():
    X = np.ones((4, 8), np.float32)
    dX = mg.asarray(X)
    assert dX.is_host and dX.ptr == X.ctypes.data and dX.shape == (4, 8)
    assert mg.asarray(dX) is dX
    strided = mg.asarray(X[:, ::2])
    assert strided.strides == (32, 8) and not strided.is_c_contiguous
    np.testing.assert_array_equal(strided.get(), X[:, ::2])
    with pytest.raises(TypeError, match="no __dlpack__"):
        mg.asarray([1.0, 2.0])


@pytest.mark.usefixtures("cpu")
def test_cpu_launch_writes_views_and_ignores_streams():
    X = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    dX = mg.asarray(X)   # a view: the launch writes X itself
    scale_rows(dX, np.float32(2.0), 10, grid=(8,), block=(8, 4), stream=None)
    want = np.arange(64 * 4, dtype=np.float64).reshape(64, 4)
    want[:10] *= 2
    want[10:] *= -1
    np.testing.assert_array_equal(X, want)


class HostTensor:
    """A host DLPack producer that is not NumPy (as a CPU torch tensor is)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@pytest.mark.usefixtures("cpu")
def test_cpu_launch_takes_host_dlpack_objects():
    X = np.arange(32 * 4, dtype=np.float32).reshape(32, 4)
    scale_rows(HostTensor(X), 3.0, 32, grid=(4,), block=(8, 4))
    np.testing.assert_array_equal(X, 3.0 * np.arange(32 * 4).reshape(32, 4))


@pytest.mark.usefixtures("cpu")
def test_cpu_launch_refuses_what_is_not_host_memory():
    dC = mg.empty((256, 256), mg.f32)
    cai = type("CAI", (), {"__cuda_array_interface__": {"shape": (256, 128), "typestr": "<f4",
                                                        "data": (4096, False), "version": 3}})()
    with pytest.raises(mg.LaunchError, match="parameter 'A'"):
        sgemm_naive(cai, mg.empty((128, 256), mg.f32), dC, grid=(16, 16), block=(16, 16))
    with pytest.raises(mg.LaunchError, match="K=64"):
        sgemm_naive[256, 128, 256, mg.f32](mg.empty((256, 64)), mg.empty((64, 256)), dC,
                                          grid=(16, 16), block=(16, 16))


@pytest.mark.usefixtures("cpu")
def test_thousand_launches_do_not_grow_the_process():
    A, B = mg.to_device(np.ones((32, 16), np.float32)), mg.to_device(np.ones((16, 32), np.float32))
    C = mg.empty((32, 32), mg.f32)

    def cpu_launch(i):
        sgemm_naive(A, B, C, grid=(2, 2), block=(16, 16))

    assert growth(cpu_launch, 1000, warmup=50) < 4 * MB
    np.testing.assert_array_equal(C.get(), 17.0)
