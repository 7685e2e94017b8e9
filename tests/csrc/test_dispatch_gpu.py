"""The launch fast path on a real GPU with real PyTorch and CuPy: the torch
reader passes the right pointers (offsets included) to Function launches,
Dispatcher hits compute the right results, signatures read from tensors
match DeviceArrays', and hits do not leak. Every test is marked `gpu`."""
import gc
import sys
import tracemalloc

import numpy as np
import pytest

import mlirgpu._mlirgpu as C
from mlirgpu import cuda

from support.checks import assert_isolated

pytestmark = pytest.mark.gpu

PTX = r"""
.version 7.0
.target sm_50
.address_size 64

// c[i] = a[i] + b[i] for i < n
.visible .entry add3(.param .u64 p_a, .param .u64 p_b, .param .u64 p_c, .param .u32 p_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<11>;
    ld.param.u64 %rd1, [p_a];
    ld.param.u64 %rd2, [p_b];
    ld.param.u64 %rd3, [p_c];
    ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    cvta.to.global.u64 %rd5, %rd1;
    add.s64 %rd6, %rd5, %rd4;
    cvta.to.global.u64 %rd7, %rd2;
    add.s64 %rd8, %rd7, %rd4;
    cvta.to.global.u64 %rd9, %rd3;
    add.s64 %rd10, %rd9, %rd4;
    ld.global.f32 %f1, [%rd6];
    ld.global.f32 %f2, [%rd8];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}
"""

N = 1000


@pytest.fixture(scope="module")
def add3():
    return cuda.load_module(PTX).get_function("add3", params=["ptr", "ptr", "ptr", C.u32])


@pytest.fixture(scope="module")
def add3_raw():
    return cuda.load_module(PTX).get_function("add3")


def launch_config(n=N):
    return {"grid": ((n + 255) // 256,), "block": (256,)}


def counting_dispatcher(function):
    misses = []

    def miss(args, kwargs):
        misses.append(args)
        d.register(args, function)
        return function(*args, **kwargs)

    d = C.Dispatcher(miss, function.name)
    return d, misses


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


# ---------------------------------------------------------------------------
# Function launches with torch tensors

def test_function_launch_with_torch_tensors(torch, add3_raw):
    a = torch.arange(N + 5, dtype=torch.float32, device="cuda")
    b = torch.full((N + 5,), 0.5, device="cuda")
    c = torch.zeros(N + 5, device="cuda")
    add3_raw(a, b, c, np.uint32(N), **launch_config())
    torch.cuda.synchronize()
    assert torch.equal(c[:N], a[:N] + 0.5) and not c[N:].any()
    # views start where data_ptr() says: offsets are passed, not the storage base
    c.zero_()
    add3_raw(a[5:], b[3:], c[2:], np.uint32(N), **launch_config())
    torch.cuda.synchronize()
    assert torch.equal(c[2:N + 2], a[5:N + 5] + 0.5) and not c[:2].any()


def test_function_launch_mixes_torch_and_device_arrays(torch, add3):
    a = torch.arange(N, dtype=torch.float32, device="cuda")
    b = C.to_device(np.full(N, 2.0, np.float32))
    c = torch.empty(N, device="cuda")
    add3(a, b, c, N, **launch_config())
    torch.cuda.synchronize()
    assert torch.equal(c, a + 2)


def test_function_launch_accepts_tensors_that_require_grad(torch, add3):
    # torch's __cuda_array_interface__ refuses these; the pointer is all a launch needs
    a = torch.ones(N, device="cuda", requires_grad=True)
    p = torch.nn.Parameter(torch.ones(N, device="cuda"))
    c = torch.empty(N, device="cuda")
    add3(a, p, c, N, **launch_config())
    torch.cuda.synchronize()
    assert torch.equal(c, torch.full((N,), 2.0, device="cuda"))


def test_function_launch_with_cpu_tensor_is_a_launch_error(torch, add3):
    c = torch.empty(N, device="cuda")
    with pytest.raises(C.LaunchError, match="argument 1 is a host array"):
        add3(c, torch.ones(N), c, N, **launch_config())


# ---------------------------------------------------------------------------
# Dispatcher hits with torch tensors

def test_dispatcher_hits_with_torch_tensors(torch, add3):
    d, misses = counting_dispatcher(add3)
    for step in range(5):
        a = torch.full((N,), float(step), device="cuda")
        b = torch.arange(N, dtype=torch.float32, device="cuda")
        c = torch.empty(N, device="cuda")
        d(a, b, c, N, **launch_config())
        torch.cuda.synchronize()
        assert torch.equal(c, a + b), step
    assert len(misses) == 1 and len(d) == 1


def test_dispatcher_hits_with_torch_views_parameters_and_subclasses(torch, add3):
    """Tensors read through DLPack (plain ones, Parameters, views that start
    inside their storage) and through attributes (a subclass with its own
    __torch_function__) launch on the right memory."""
    class Logged(torch.Tensor):
        calls = 0

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            Logged.calls += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    d, misses = counting_dispatcher(add3)
    base = torch.arange(N + 8, dtype=torch.float32, device="cuda")
    a = base[8:]
    b = torch.nn.Parameter(torch.full((N,), 2.0, device="cuda"))
    c = torch.zeros(N + 3, device="cuda", requires_grad=True)[3:]
    d(a, b, c, N, **launch_config())
    torch.cuda.synchronize()
    assert torch.equal(c.detach(), a + 2)
    # Off 16 bytes as c is, so that both calls take the same (unaligned) variant.
    logged = torch.zeros(N + 3, device="cuda")[3:].as_subclass(Logged)
    d(a, b, logged, N, **launch_config())
    torch.cuda.synchronize()
    assert torch.equal(logged.as_subclass(torch.Tensor), a + 2) and Logged.calls > 0
    assert len(misses) == 1


def test_dispatcher_torch_and_device_arrays_share_a_signature(torch, add3):
    d, misses = counting_dispatcher(add3)
    a = C.to_device(np.arange(N, dtype=np.float32))
    c = torch.empty(N, device="cuda")
    d(a, a, C.empty(N), N, **launch_config())   # registers the signature of (array, array, array, int)
    assert d.signature((c,)) == d.signature((a,))
    d(a, a, c, N, **launch_config())
    torch.cuda.synchronize()
    assert len(misses) == 1
    assert torch.equal(c.cpu(), torch.arange(N, dtype=torch.float32) * 2)


def test_torch_signatures(torch):
    d = C.Dispatcher(lambda args, kwargs: None, "k")
    device = torch.cuda.current_device()
    t = torch.empty((4, 6), device="cuda")
    assert d.signature((t,)) == (("array", C.f32, (4, 6), None, device),)
    assert d.signature((t.T,)) == (("array", C.f32, (6, 4), (4, 24), device),)
    assert d.signature((t[:, ::2],)) == (("array", C.f32, (4, 3), (24, 8), device),)
    assert d.signature((torch.empty(3, device="cuda").expand(4, 3),)) == \
        (("array", C.f32, (4, 3), (0, 4), device),)
    assert d.signature((t[:1],)) == (("array", C.f32, (1, 6), None, device),)
    assert d.signature((torch.empty((2, 0, 3), device="cuda"),))[0][3] is None
    assert d.signature((torch.empty(5),)) == (("host", C.f32, (5,), None),)
    assert d.signature((torch.empty(5, dtype=torch.complex64, device="cuda"),)) == (("other", torch.Tensor),)


@pytest.mark.parametrize("name, dtype", [
    ("float32", C.f32), ("float64", C.f64), ("float16", C.f16), ("bfloat16", C.bf16), ("int8", C.i8),
    ("int16", C.i16), ("int32", C.i32), ("int64", C.i64), ("uint8", C.u8), ("bool", C.bool_),
    ("float8_e4m3fn", C.f8e4m3), ("float8_e5m2", C.f8e5m2)])
def test_torch_dtypes(torch, name, dtype):
    d = C.Dispatcher(lambda args, kwargs: None, "k")
    t = torch.zeros(3, dtype=getattr(torch, name), device="cuda")
    assert d.signature((t,))[0][:3] == ("array", dtype, (3,))


@pytest.mark.multigpu
def test_torch_on_a_second_device(torch):
    d = C.Dispatcher(lambda args, kwargs: None, "k")
    assert d.signature((torch.empty(3, device="cuda:1"),))[0][4] == 1


def test_torch_hits_do_not_leak(torch, add3):
    d, misses = counting_dispatcher(add3)
    a, b, c = (torch.ones(N, device="cuda") for _ in range(3))
    config = launch_config()

    def loop(n):
        for _ in range(n):
            d(a, b, c, N, **config)
        torch.cuda.synchronize()

    loop(1000)
    gc.collect()
    refs = [sys.getrefcount(x) for x in (a, b, c, add3)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    loop(10000)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 10000, grown
    assert refs == [sys.getrefcount(x) for x in (a, b, c, add3)]
    assert len(misses) == 1


# ---------------------------------------------------------------------------
# CuPy: read by attribute, ordered after CuPy's current stream as its
# __cuda_array_interface__ (v3) asks

def test_cupy_arrays_launch_and_hit(add3):
    cupy = pytest.importorskip("cupy")
    d, misses = counting_dispatcher(add3)
    for step in range(3):
        a = cupy.full(N, float(step), dtype=cupy.float32)
        b = cupy.arange(N, dtype=cupy.float32)
        c = cupy.empty(N, dtype=cupy.float32)
        d(a, b, c, N, **launch_config())
        cuda.synchronize()
        assert bool((c == a + b).all()), step
    assert len(misses) == 1
    assert d.signature((cupy.empty((2, 3), dtype=cupy.float16),))[0][:4] == ("array", C.f16, (2, 3), None)


def test_device_array_hits_on_the_gpu(add3):
    d, misses = counting_dispatcher(add3)
    host = np.arange(N, dtype=np.float32)
    a, b, c = C.to_device(host), C.to_device(host * 3), C.empty(N)
    for _ in range(3):
        d(a, b, c, N, **launch_config())
    np.testing.assert_array_equal(c.get(), host * 4)
    assert len(misses) == 1


class Protocol:
    """An array seen only through the __cuda_array_interface__ of `array`."""

    def __init__(self, array):
        self.__cuda_array_interface__ = array.__cuda_array_interface__


def test_cupy_signatures_match_its_protocol():
    cupy = pytest.importorskip("cupy")
    d = C.Dispatcher(lambda args, kwargs: None, "k")
    x = cupy.empty((4, 6), dtype=cupy.float32)
    for array in (x, x.T, x[:, ::2], x[1:3], cupy.empty((2, 0, 3), dtype=cupy.float16),
                  cupy.empty(5, dtype=cupy.int64), cupy.empty((3, 1), dtype=cupy.uint8)):
        assert d.signature((array,)) == d.signature((Protocol(array),)), (array.shape, array.strides)


def test_torch_signatures_match_its_protocol(torch):
    d = C.Dispatcher(lambda args, kwargs: None, "k")
    t = torch.empty((4, 6), device="cuda")
    for tensor in (t, t.T, t[:, ::2], t[1:3], torch.empty((2, 0, 3), device="cuda", dtype=torch.float16),
                   torch.empty(3, device="cuda").expand(4, 3), torch.empty(5, device="cuda", dtype=torch.int64)):
        assert d.signature((tensor,)) == d.signature((Protocol(tensor),)), (tensor.shape, tensor.stride())


def test_cupy_launch_waits_for_cupys_current_stream(add3):
    cupy = pytest.importorskip("cupy")
    n = 1 << 24
    config = launch_config(n)
    d, misses = counting_dispatcher(add3)
    stream = cupy.cuda.Stream(non_blocking=True)
    for step in range(3):
        with stream:
            # long work on CuPy's stream: the launch (on the legacy stream) must come after it
            a = cupy.arange(n, dtype=cupy.float32)
            for _ in range(20):
                a = a * 1.0 + 0.0
            b = cupy.full(n, float(step), dtype=cupy.float32)
            c = cupy.zeros(n, dtype=cupy.float32)
            d(a, b, c, n, **config)
        cuda.synchronize()
        stream.synchronize()
        assert bool((c == cupy.arange(n, dtype=cupy.float32) + step).all()), step
    assert len(misses) == 1


def test_jax_arrays_launch_and_hit():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(device.platform == "gpu" for device in jax.devices()):
        pytest.skip("JAX has no GPU here")
    # JAX arrays are read-only to kernels: this add3 says it stores to its third array only
    add3 = cuda.load_module(PTX).get_function("add3", params=["ptr", "ptr", "ptr", C.u32], stores=[2])
    d, misses = counting_dispatcher(add3)
    c = C.empty(N)
    for step in range(3):
        a = jnp.arange(N, dtype=jnp.float32)
        b = jnp.full(N, float(step), dtype=jnp.float32)
        d(a, b, c, N, **launch_config())
        np.testing.assert_array_equal(c.get(), np.arange(N, dtype=np.float32) + step)
    assert len(misses) == 1
    assert d.signature((a,)) == d.signature((Protocol(a),))
    with pytest.raises(C.LaunchError, match="read-only"):
        d(a, a, b, N, **launch_config())


def test_kernels_take_read_only_arrays_for_parameters_they_only_read():
    import mlirgpu as mg
    from mlirgpu import block_dim, block_idx, thread_idx
    n = mg.generics("n")

    @mg.kernel
    def axpy(a: mg.f32, x: mg.memref[n, mg.f32], y: mg.memref[n, mg.f32]):
        i = block_idx.x * block_dim.x + thread_idx.x
        if i < n:
            y[i] = a * x[i] + y[i]

    x = C.to_device(np.arange(N, dtype=np.float32))
    read_only = type("ReadOnly", (), {"__cuda_array_interface__": {
        "shape": (N,), "typestr": "<f4", "data": (int(x.ptr), True), "version": 3, "stream": None}})()
    y = C.zeros(N)
    for _ in range(2):   # the miss, then the dispatcher's hit
        axpy(2.0, read_only, y, grid=(N + 255) // 256, block=256)
    np.testing.assert_array_equal(y.get(), 4 * np.arange(N, dtype=np.float32))
    with pytest.raises(C.LaunchError, match="read-only"):
        axpy(2.0, y, read_only, grid=(N + 255) // 256, block=256)


def test_a_kernel_hit_reads_each_argument_once():
    """@mg.kernel's hit reads a __cuda_array_interface__ once per launch,
    keywords that run user code (np.int64 extents) included."""
    import mlirgpu as mg
    from mlirgpu import block_dim, block_idx, thread_idx
    n = mg.generics("n")

    @mg.kernel
    def axpy(a: mg.f32, x: mg.memref[n, mg.f32], y: mg.memref[n, mg.f32]):
        i = block_idx.x * block_dim.x + thread_idx.x
        if i < n:
            y[i] = a * x[i] + y[i]

    x, y = C.to_device(np.arange(N, dtype=np.float32)), C.zeros(N)

    class Counting:
        reads = 0

        @property
        def __cuda_array_interface__(self):
            Counting.reads += 1
            return x.__cuda_array_interface__

    counting = Counting()
    axpy(1.0, counting, y, grid=(N + 255) // 256, block=256)   # the miss
    reads = []
    for grid in ((N + 255) // 256, np.int64((N + 255) // 256)):
        before = Counting.reads
        axpy(1.0, counting, y, grid=grid, block=256)
        reads.append(Counting.reads - before)
    assert reads == [1, 1]
    np.testing.assert_array_equal(y.get(), 3 * np.arange(N, dtype=np.float32))


def test_jax_arrays_launch_mlirgpu_kernels():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(device.platform == "gpu" for device in jax.devices()):
        pytest.skip("JAX has no GPU here")
    import mlirgpu as mg
    from mlirgpu import block_dim, block_idx, thread_idx
    n = mg.generics("n")

    @mg.kernel
    def add(a: mg.memref[n, mg.f32], b: mg.memref[n, mg.f32], c: mg.memref[n, mg.f32]):
        i = block_idx.x * block_dim.x + thread_idx.x
        if i < n:
            c[i] = a[i] + b[i]

    c = mg.empty(N, mg.f32)
    for step in range(3):
        a, b = jnp.arange(N, dtype=jnp.float32), jnp.full(N, float(step), dtype=jnp.float32)
        add(a, b, c, grid=(N + 255) // 256, block=256)
        np.testing.assert_array_equal(c.get(), np.arange(N, dtype=np.float32) + step)
    with pytest.raises(mg.LaunchError, match="read-only"):
        add(a, c, b, grid=(N + 255) // 256, block=256)


# The start of a script for a process of its own: JAX on the GPU (or a line
# saying there is none) and `copy`, a kernel copying a 1-D array of `dtype`.
JAX_COPY = '''
import os
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
import jax, jax.numpy as jnp
import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx
if not any(device.platform == "gpu" for device in jax.devices()):
    print("JAX has no GPU here")
    raise SystemExit
n = mg.generics("n")

@mg.kernel
def copy(a: mg.memref[n, mg.{dtype}], c: mg.memref[n, mg.{dtype}]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < n:
        c[i] = a[i]
'''


def test_a_donated_jax_array_is_refused_without_a_crash():
    pytest.importorskip("jax")
    # In a process of its own: JAX's own is_ready() crashes the interpreter on a deleted array.
    proc = assert_isolated(JAX_COPY.format(dtype="f32") + '''
import numpy as np
a, c = jnp.arange(256, dtype=jnp.float32), mg.empty(256, mg.f32)
copy(a, c, grid=1, block=256)                     # seen once: its reads are kept
step = jax.jit(lambda x: x + 1, donate_argnums=0)
b = step(a)                                       # a's buffer is donated: a is deleted
for launch in (lambda: copy(a, c, grid=1, block=256), lambda: mg.asarray(a)):
    try:
        launch()
    except (mg.LaunchError, ValueError) as error:
        assert "deleted" in str(error), error
    else:
        raise AssertionError("a deleted array was launched")
copy(b, c, grid=1, block=256)
assert (c.get() == np.arange(256) + 1).all()
print("refused")
''', "")
    if "JAX has no GPU here" in proc.stdout:
        pytest.skip("JAX has no GPU here")
    assert "refused" in proc.stdout


def test_bfloat16_arrays_of_torch_and_jax_launch_and_are_viewed():
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    # In a process of its own, so that the bfloat16 array is the first JAX array mlirgpu reads.
    proc = assert_isolated(JAX_COPY.format(dtype="bf16") + '''
import torch
a = jnp.arange(256, dtype=jnp.bfloat16)
c = torch.zeros(256, dtype=torch.bfloat16, device="cuda")
copy(a, c, grid=1, block=256)
assert torch.equal(c.cpu(), torch.arange(256).to(torch.bfloat16)), c
for x in (a, c):
    view = mg.asarray(x)
    assert view.dtype == mg.bf16 and view.shape == (256,), view
print("bf16 arrays ok")
''', "")
    if "JAX has no GPU here" in proc.stdout:
        pytest.skip("JAX has no GPU here")
    assert "bf16 arrays ok" in proc.stdout
