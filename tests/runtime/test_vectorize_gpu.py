"""@mg.vectorize on the GPU: what only the CUDA backend has (foreign device
arrays, streams, misaligned views, host arrays refused). Results on both
backends are in test_vectorize.py."""
import numpy as np
import pytest
from support.backends import current_backend

import mlirgpu as mg

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def on_the_gpu():
    with current_backend("cuda"):
        yield


@mg.vectorize
def axpy(a, x, y):
    return a * x + y


def rng():
    return np.random.default_rng()


def test_misaligned_views_take_the_element_wise_kernel():
    x = rng().standard_normal(10_001, dtype=np.float32)
    dx = mg.to_device(x)
    view = mg.asarray(_Interface(dx, offset=1, count=10_000))   # 4 bytes past a 16-byte boundary
    got = axpy(1.0, view, view)
    np.testing.assert_allclose(got.get(), 2.0 * x[1:], rtol=1e-6)
    widths = {s.width for s in axpy._specializations.values() if s.rank is None and s.inputs[1][0] == mg.f32}
    assert 1 in widths


class _Interface:
    """A __cuda_array_interface__ view of part of a 1-d float32 DeviceArray."""

    def __init__(self, array, offset, count):
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": "<f4", "version": 3, "strides": None,
                                         "data": (array.ptr + 4 * offset, False), "stream": None}
        self.keep = array


def test_stream_keyword():
    stream = mg.Stream(non_blocking=True)
    x = rng().standard_normal(1 << 20, dtype=np.float32)
    dx = mg.to_device(x)
    out = mg.empty(x.shape, mg.f32)
    axpy(3.0, dx, dx, out=out, stream=stream)
    stream.synchronize()
    np.testing.assert_allclose(out.get(), 4.0 * x, rtol=1e-6)


def test_torch_tensors_zero_copy():
    torch = pytest.importorskip("torch")
    x = torch.randn(1000, 3, device="cuda")
    y = torch.randn(3, device="cuda")
    out = torch.empty(1000, 3, device="cuda")
    assert axpy(2.0, x, y, out=out) is out
    torch.testing.assert_close(out, 2.0 * x + y)
    got = axpy(2.0, x, y)
    assert isinstance(got, mg.DeviceArray)
    torch.testing.assert_close(torch.from_dlpack(got), 2.0 * x + y)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    x = cupy.random.standard_normal((64, 64), dtype=cupy.float32)
    got = axpy(0.5, x, x.T)
    np.testing.assert_allclose(got.get(), 0.5 * x.get() + x.get().T, rtol=1e-6, atol=1e-6)


def test_gpu_matches_cpu():
    x = rng().standard_normal((37, 41)).astype(np.float64)
    y = rng().standard_normal(41).astype(np.float64)
    gpu = axpy(1.75, x, y)
    with current_backend("cpu"):
        cpu = axpy(1.75, x, y)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-12, atol=1e-12)


def test_a_host_device_array_is_refused_on_the_gpu():
    with current_backend("cpu"):
        host = mg.to_device(np.zeros(3, np.float32))
    with pytest.raises(mg.LaunchError, match="DeviceArray in host memory"):
        axpy(1.0, host, host)
