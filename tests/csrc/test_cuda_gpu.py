"""The CUDA runtime on a real GPU: device properties, copies, zero-copy
exchange with PyTorch and CuPy, hand-written PTX kernels, streams, events,
error recovery and leaks. Every test is marked `gpu` (skipped without one)."""
import gc

import numpy as np
import pytest

import mlirgpu._mlirgpu as C
from mlirgpu import cuda

pytestmark = pytest.mark.gpu

PTX = r"""
.version 7.0
.target sm_50
.address_size 64

// x[i] += v for i < n
.visible .entry add_scalar(.param .u64 p_x, .param .f32 p_v, .param .u32 p_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [p_x];
    ld.param.f32 %f1, [p_v];
    ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f2, [%rd4];
    add.f32 %f2, %f2, %f1;
    st.global.f32 [%rd4], %f2;
DONE:
    ret;
}

// out[i] += in[i] + v for i < n
.visible .entry add_vec(.param .u64 p_out, .param .u64 p_in, .param .f32 p_v, .param .u32 p_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [p_out];
    ld.param.u64 %rd2, [p_in];
    ld.param.f32 %f1, [p_v];
    ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd3, %r5, 4;
    cvta.to.global.u64 %rd4, %rd1;
    add.s64 %rd5, %rd4, %rd3;
    cvta.to.global.u64 %rd6, %rd2;
    add.s64 %rd7, %rd6, %rd3;
    ld.global.f32 %f2, [%rd5];
    ld.global.f32 %f3, [%rd7];
    add.f32 %f2, %f2, %f3;
    add.f32 %f2, %f2, %f1;
    st.global.f32 [%rd5], %f2;
DONE:
    ret;
}

// spins for `cycles` clock ticks, then x[0] = v
.visible .entry spin_then_set(.param .u64 p_x, .param .u64 p_cycles, .param .f32 p_v)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<7>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [p_x];
    ld.param.u64 %rd2, [p_cycles];
    ld.param.f32 %f1, [p_v];
    mov.u64 %rd3, %clock64;
SPIN:
    mov.u64 %rd4, %clock64;
    sub.s64 %rd5, %rd4, %rd3;
    setp.lt.s64 %p1, %rd5, %rd2;
    @%p1 bra SPIN;
    cvta.to.global.u64 %rd6, %rd1;
    st.global.f32 [%rd6], %f1;
    ret;
}

// dst[0] = src[0]
.visible .entry copy_first(.param .u64 p_dst, .param .u64 p_src)
{
    .reg .b64 %rd<5>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_src];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.f32 %f1, [%rd4];
    st.global.f32 [%rd3], %f1;
    ret;
}
"""

@pytest.fixture(scope="module")
def module():
    return C.load_module(PTX)


# ---------------------------------------------------------------------------
# devices

def test_device_properties():
    assert cuda.is_available() is True
    assert cuda.device_count() >= 1
    assert cuda.driver_version() >= 11000
    d = cuda.Device(0)
    assert d.ordinal == 0 and d == cuda.Device(0)
    assert isinstance(d.name, str) and d.name
    major, minor = d.compute_capability
    assert d.chip == f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    assert d.multiprocessor_count > 0 and d.max_threads_per_block == 1024
    assert 0 < d.shared_memory_per_block <= d.shared_memory_per_block_optin
    assert d.shared_memory_per_block_optin <= d.shared_memory_per_multiprocessor
    free, total = d.mem_info()
    assert 0 < free <= total and total == d.total_memory
    d.synchronize()
    if "H100" in d.name:
        assert d.compute_capability == (9, 0) and d.chip == "sm_90a"
        if "PCIe" not in d.name:
            assert d.multiprocessor_count == 132
    with pytest.raises(ValueError):
        cuda.Device(cuda.device_count())
    with pytest.raises(ValueError):
        cuda.set_device(-1)
    cuda.set_device(0)
    assert cuda.current_device() == 0


# ---------------------------------------------------------------------------
# copies

def test_round_trip_bf16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    host = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    dev = C.to_device(host)
    assert dev.dtype is C.bf16
    np.testing.assert_array_equal(dev.get().astype(np.float32), host.astype(np.float32))
    with pytest.raises(TypeError):
        dev.__cuda_array_interface__


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_round_trip_8_bit_floats(name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    host = (np.arange(-12, 12, dtype=np.float32) / 8).reshape(4, 6).astype(getattr(ml_dtypes, name))
    dev = C.to_device(host)
    assert dev.dtype is C.dtype(name) and dev.nbytes == 24
    back = dev.get()
    assert back.dtype == host.dtype
    np.testing.assert_array_equal(back.view(np.uint8), host.view(np.uint8))
    with pytest.raises(TypeError):
        dev.__cuda_array_interface__
    # DLPack carries them (its float8 codes): a zero-copy view of the same bytes.
    view = C.asarray(DLPackOnly(dev))
    assert view.dtype is dev.dtype and view.ptr == dev.ptr
    np.testing.assert_array_equal(view.get().view(np.uint8), host.view(np.uint8))


def test_copy_from_device_to_device():
    src = C.to_device(np.arange(15, dtype=np.int32).reshape(3, 5))
    dst = C.zeros((3, 5), C.i32)
    stream = C.Stream()
    dst.copy_from(src, stream=stream)
    np.testing.assert_array_equal(dst.get(), np.arange(15).reshape(3, 5))   # get() orders after `stream`
    with pytest.raises(ValueError, match="host memory"):
        dst.copy_from(C.zeros((3, 5), C.i32, host=True))


# ---------------------------------------------------------------------------
# zero-copy exchange with PyTorch and CuPy

class DLPackOnly:
    """Hides __cuda_array_interface__ so that asarray takes the DLPack path."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@pytest.mark.parametrize("path", ["cai", "dlpack"])
def test_asarray_torch_is_zero_copy(path):
    torch = pytest.importorskip("torch")
    t = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    for source in (t, t[:, ::2], t.T, t[1:, 2:], torch.arange(3, device="cuda").expand(4, 3)):
        view = C.asarray(source if path == "cai" else DLPackOnly(source))
        assert view.ptr == source.data_ptr()
        assert view.shape == tuple(source.shape)
        assert view.strides == tuple(s * source.element_size() for s in source.stride())
        np.testing.assert_array_equal(view.get(), source.cpu().numpy())
    # writes through the view show up in the tensor
    view = C.asarray(t)
    C.load_module(PTX).get_function("add_scalar")(view, np.float32(1.0), np.uint32(24), grid=1, block=32)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), np.arange(24, dtype=np.float32).reshape(4, 6) + 1)


@pytest.mark.parametrize("path", ["cai", "dlpack"])
def test_asarray_cupy_is_zero_copy(path):
    cp = pytest.importorskip("cupy")
    a = cp.arange(20, dtype=cp.float64).reshape(4, 5)
    sources = [a, a[:, ::2], a.T]
    if path == "cai":
        sources += [a[::-1], a[:, ::-2]]     # negative strides
    for source in sources:
        view = C.asarray(source if path == "cai" else DLPackOnly(source))
        assert view.ptr == source.data.ptr
        assert view.strides == source.strides
        np.testing.assert_array_equal(view.get(), cp.asnumpy(source))


def test_torch_consumes_device_array():
    torch = pytest.importorskip("torch")
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    arr = C.to_device(host)
    by_dlpack = torch.from_dlpack(arr)
    by_cai = torch.as_tensor(arr, device="cuda")
    assert by_dlpack.data_ptr() == arr.ptr == by_cai.data_ptr()
    np.testing.assert_array_equal(by_dlpack.cpu().numpy(), host)
    np.testing.assert_array_equal(by_cai.cpu().numpy(), host)
    del arr
    gc.collect()      # the DLPack tensor keeps the memory alive
    np.testing.assert_array_equal(by_dlpack.cpu().numpy(), host)


def test_cupy_consumes_device_array():
    cp = pytest.importorskip("cupy")
    host = np.arange(10, dtype=np.int32)
    arr = C.to_device(host)
    by_cai = cp.asarray(arr)
    by_dlpack = cp.from_dlpack(arr)
    assert by_cai.data.ptr == arr.ptr == by_dlpack.data.ptr
    np.testing.assert_array_equal(cp.asnumpy(by_cai), host)
    np.testing.assert_array_equal(cp.asnumpy(by_dlpack), host)


def test_torch_stream_objects_are_accepted():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    arr = C.zeros(16, C.f32, stream=s)
    np.testing.assert_array_equal(arr.get(stream=s), np.zeros(16, np.float32))
    ours = C.Stream()
    with torch.cuda.stream(torch.cuda.ExternalStream(ours.handle)):
        assert torch.cuda.current_stream().cuda_stream == ours.handle


# ---------------------------------------------------------------------------
# kernels

def test_module_and_function_attributes(module):
    f = module.get_function("add_scalar")
    assert f.name == "add_scalar" and f.params is None and f.module is module
    assert f.num_regs > 0 and f.max_threads_per_block > 0
    assert f.shared_size_bytes == 0 and f.local_size_bytes == 0
    f.set_max_dynamic_shared_memory(0)
    with pytest.raises(C.CudaError, match="no_such_kernel"):
        module.get_function("no_such_kernel")


def test_launch_with_device_array_torch_tensor_and_numpy_scalar(module):
    torch = pytest.importorskip("torch")
    n = 1000
    out = C.to_device(np.arange(n, dtype=np.float32))
    inp = torch.full((n,), 2.0, device="cuda")
    module.get_function("add_vec")(out, inp, np.float32(0.5), np.uint32(n), grid=(n + 255) // 256, block=256)
    np.testing.assert_allclose(out.get(), np.arange(n, dtype=np.float32) + 2.5)


def test_launch_with_signature_packs_python_scalars(module):
    f = module.get_function("add_scalar", params=["ptr", C.f32, "u32"])
    assert f.params == ("ptr", C.f32, C.u32)
    x = C.zeros(300, C.f32)
    f(x, 1.5, 300, grid=(2, 1, 1), block=(256,))
    f.launch(x, 2, 299, grid=[2], block=256, shared_mem=0, stream=None)
    expected = np.full(300, 3.5, np.float32)
    expected[299] = 1.5
    np.testing.assert_array_equal(x.get(), expected)


def test_launch_argument_errors(module):
    f = module.get_function("add_scalar")
    typed = module.get_function("add_scalar", params=["ptr", C.f32, C.u32])
    x = C.zeros(4, C.f32)
    with pytest.raises(C.LaunchError, match="signature"):
        f(x, 1.0, 4, grid=1, block=4)                     # Python scalars need a signature
    with pytest.raises(C.LaunchError, match="host array"):
        f(np.zeros(4, np.float32), np.float32(1), np.uint32(4), grid=1, block=4)
    with pytest.raises(C.LaunchError, match="3 parameters, 2 arguments"):
        typed(x, 1.0, grid=1, block=4)
    with pytest.raises(C.LaunchError, match="argument 1"):
        typed(x, "one", 4, grid=1, block=4)
    with pytest.raises(C.LaunchError, match="argument 2"):
        typed(x, 1.0, -4, grid=1, block=4)
    with pytest.raises(C.LaunchError, match="argument 1"):
        typed(x, x, 4, grid=1, block=4)
    with pytest.raises(C.LaunchError, match="argument 0"):
        typed(1.0, 1.0, 4, grid=1, block=4)
    for bad in (0, -1, (1, 1, 1, 1), (), 2 ** 32, 1.0, "1", (1, None)):
        with pytest.raises(C.LaunchError):
            f(x, np.float32(1), np.uint32(4), grid=bad, block=4)
    with pytest.raises(C.LaunchError, match="grid= and block="):
        f(x, np.float32(1), np.uint32(4), block=4)
    with pytest.raises(C.LaunchError):
        f(x, np.float32(1), np.uint32(4), grid=1, block=4, shared_mem=-1)
    with pytest.raises(TypeError):
        f(x, np.float32(1), np.uint32(4), grid=1, block=4, blocks=4)
    with pytest.raises(C.LaunchError, match="at most 64"):
        f(*([x] * 65), grid=1, block=1)
    np.testing.assert_array_equal(x.get(), np.zeros(4, np.float32))   # nothing ran


def test_too_large_block_is_a_driver_error_and_recoverable(module):
    f = module.get_function("add_scalar")
    x = C.zeros(8, C.f32)
    with pytest.raises(C.CudaError) as info:
        f(x, np.float32(1), np.uint32(8), grid=1, block=(2048,))
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE" and info.value.code == 1
    assert "cuLaunchKernel" in str(info.value)
    f(x, np.float32(1), np.uint32(8), grid=1, block=(8,))
    np.testing.assert_array_equal(x.get(), np.ones(8, np.float32))
    np.testing.assert_array_equal(C.to_device(np.arange(5)).get(), np.arange(5))


def test_bad_ptx_error_carries_the_jit_log():
    bad = PTX.replace("add.f32 %f2, %f2, %f1;", "add.f32 %f2, %f2, %f9;", 1)
    with pytest.raises(C.CudaError) as info:
        C.load_module(bad)
    message = str(info.value)
    assert info.value.name == "CUDA_ERROR_INVALID_PTX"
    assert "cuModuleLoadDataEx" in message
    log = message.split("\n", 1)[1]
    assert "%f9" in log or "error" in log.lower()


def test_events_time_a_kernel(module):
    spin = module.get_function("spin_then_set")
    x = C.zeros(1, C.f32)
    start, end = C.Event(), C.Event()
    with pytest.raises(C.CudaError):
        start.elapsed_time(end)
    start.record()
    spin(x, np.int64(1_000_000), np.float32(3.0), grid=1, block=1)
    end.record()
    end.synchronize()
    assert end.query() is True
    assert start.elapsed_time(end) > 0
    assert x.get()[0] == 3.0


def test_stream_and_event_ordering(module):
    spin = module.get_function("spin_then_set")
    copy = module.get_function("copy_first")
    s1, s2 = C.Stream(non_blocking=True), C.Stream(non_blocking=True)
    flag, out = C.zeros(1, C.f32), C.zeros(1, C.f32)
    flag.get()     # the zeros are in place before the streams start
    spin(flag, np.int64(50_000_000), np.float32(1.0), grid=1, block=1, stream=s1)
    done = C.Event(timing=False)
    done.record(s1)
    s2.wait(done)
    copy(out, flag, grid=1, block=1, stream=s2)
    assert s1.query() is False        # still spinning
    s2.synchronize()
    assert s1.query() is True and done.query() is True
    assert out.get()[0] == 1.0
    assert isinstance(s1.handle, int) and s1.handle != 0
    assert s1.__cuda_stream__() == (0, s1.handle)


def test_get_orders_after_the_last_stream(module):
    spin = module.get_function("spin_then_set")
    s = C.Stream(non_blocking=True)
    x = C.zeros(1, C.f32)
    x.get()
    spin(x, np.int64(20_000_000), np.float32(5.0), grid=1, block=1, stream=s)
    assert x.__cuda_array_interface__["stream"] == s.handle
    assert x.get()[0] == 5.0          # copied on s, after the kernel


@pytest.mark.device_memory
def test_alloc_free_cycles_do_not_leak():
    device = cuda.Device(0)
    C.empty(1 << 20, C.u8)
    device.synchronize()
    free_before = device.mem_info()[0]
    for _ in range(10_000):
        C.empty(1 << 20, C.u8)
    device.synchronize()
    assert abs(device.mem_info()[0] - free_before) <= 2 << 20


def test_launch_with_wrong_scalar_signature(module):
    typed = module.get_function("add_scalar", params=["ptr", C.f32, C.u32])
    x = C.zeros(4, C.f32)
    with pytest.raises(C.LaunchError):
        typed(x, np.float32(1.0), 4.5, grid=1, block=4)      # a float for a u32
    with pytest.raises(C.LaunchError):
        typed(x, 1.0, 2 ** 32, grid=1, block=4)              # out of range for u32
    with pytest.raises(C.LaunchError):
        typed(x, 1.0, 4, 5, grid=1, block=4)                 # one too many
    with pytest.raises(ValueError):
        module.get_function("add_scalar", params=["ptr", "float33", "u32"])
