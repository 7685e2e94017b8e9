"""DeviceArray as CuPy and Numba users reach for it: basic slicing gives
strided views, .T, reshape of contiguous arrays, copy(), fill(), itemsize,
len(), a repr naming shape, dtype and device, np.asarray refused with a
pointer to .get(), and copies of every dtype to the device and back. On both
backends, with the same assertions."""
import numpy as np
import pytest

import mlirgpu as mg

pytestmark = pytest.mark.usefixtures("backend")

A = np.arange(24, dtype=np.float32).reshape(4, 6)


ALL_DTYPES = [mg.bool_, mg.i8, mg.i16, mg.i32, mg.i64, mg.u8, mg.u16, mg.u32, mg.u64, mg.f16, mg.f32, mg.f64,
              mg.index]


def sample(dt, shape):
    rng = np.random.default_rng(0)
    n = int(np.prod(shape))
    if dt is mg.bool_:
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    values = rng.integers(0, 100, n) if dt.kind in "iu" else rng.standard_normal(n)
    return values.astype(dt.numpy).reshape(shape)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (7,), (4, 5), (2, 3, 4)])
def test_round_trip_every_dtype(dt, shape):
    host = sample(dt, shape)
    dev = mg.to_device(host)
    assert dev.shape == shape and dev.dtype == (mg.i64 if dt is mg.index else dt)
    back = dev.get()
    assert back.dtype == host.dtype and back.shape == shape
    np.testing.assert_array_equal(back, host)


def test_to_device_non_contiguous_and_swapped_host():
    host = np.arange(24, dtype=">i4").reshape(4, 6)[:, ::2]
    np.testing.assert_array_equal(mg.to_device(host).get(), host)
    np.testing.assert_array_equal(mg.to_device([[1.0, 2.0], [3.0, 4.0]]).get(), [[1.0, 2.0], [3.0, 4.0]])


def test_zeros_empty_and_copy_to_host():
    z = mg.zeros((3, 5), mg.i32)
    np.testing.assert_array_equal(z.get(), np.zeros((3, 5), np.int32))
    e = mg.empty(0)
    assert e.get().shape == (0,) and e.ptr == 0
    out = np.full((3, 5), 7, np.int32)
    assert z.copy_to_host(out) is out
    assert not out.any()
    with pytest.raises(ValueError):
        z.copy_to_host(np.zeros((5, 3), np.int32))
    with pytest.raises(TypeError):
        z.copy_to_host(np.zeros((3, 5), np.float32))


@pytest.mark.parametrize("key", [
    1, -1, (1, 2), slice(1, 3), (slice(None), slice(None, None, 2)), (slice(None, None, -1), 3),
    (Ellipsis, -1), (slice(3, 0, -2), slice(1, 5, 3)), (slice(2, 2), slice(None)), Ellipsis,
])
def test_basic_slicing_is_a_view_with_numpy_semantics(key):
    d = mg.to_device(A)
    view = d[key]
    want = A[key]
    assert view.shape == want.shape and view.strides == want.strides
    np.testing.assert_array_equal(view.get(), want)


def test_views_share_memory_and_keep_it_alive():
    d = mg.to_device(A)
    view = d[1:3, ::2]
    d[2].copy_from(mg.to_device(np.full(6, -1, np.float32)))
    del d
    np.testing.assert_array_equal(view.get(), [[6, 8, 10], [-1, -1, -1]])


def test_transpose_reshape_copy_fill_itemsize():
    d = mg.to_device(A)
    np.testing.assert_array_equal(d.T.get(), A.T)
    assert d.T.strides == A.T.strides
    np.testing.assert_array_equal(d.reshape(3, 8).get(), A.reshape(3, 8))
    np.testing.assert_array_equal(d.reshape((2, -1)).get(), A.reshape(2, -1))
    copy = d[:, 1::2].copy()
    assert copy.is_c_contiguous and copy.ptr != d.ptr
    np.testing.assert_array_equal(copy.get(), A[:, 1::2])
    same = d.copy()
    np.testing.assert_array_equal(same.get(), A)
    same.fill(2.5)
    np.testing.assert_array_equal(same.get(), np.full((4, 6), 2.5, np.float32))
    np.testing.assert_array_equal(d.get(), A)          # the copy is not a view
    assert (d.itemsize, d.size, d.nbytes, len(d)) == (4, 24, 96, 4)
    assert mg.zeros(3, mg.f64).itemsize == 8


@pytest.mark.parametrize("mask", [True, False, np.True_, np.False_])
def test_bool_scalar_index_is_a_mask_as_in_numpy(mask):
    d = mg.to_device(A)
    view = d[mask]
    assert view.shape == A[mask].shape == ((1 if mask else 0), 4, 6)
    np.testing.assert_array_equal(view.get(), A[mask])
    np.testing.assert_array_equal(d[(mask,)].get(), A[(mask,)])
    with pytest.raises(IndexError, match="a bool index is a mask"):
        d[mask, 0]


def test_reshape_whose_size_overflows_raises_value_error():
    d = mg.zeros(4, mg.f32)
    with pytest.raises(ValueError, match="exceeds the maximum allowed size"):
        d.reshape(2**40, 2**40)
    with pytest.raises(ValueError, match="exceeds the maximum allowed size"):
        d.reshape(-1, 2**40, 2**40)


def test_repr_names_shape_dtype_and_device():
    text = repr(mg.zeros((2, 3), mg.i32))
    assert text.startswith("DeviceArray(shape=(2, 3), dtype=mlirgpu.i32, device=")
    assert ("device=-1, is_host=True" in text) == (mg.backend() == "cpu")
    assert text.endswith(f"device={mg.zeros(1).device}" + (", is_host=True)" if mg.backend() == "cpu" else ")"))


@pytest.mark.parametrize("bad, error, match", [
    (lambda d: d[4], IndexError, "out of bounds for dimension 0 of size 4"),
    (lambda d: d[0, 0, 0], IndexError, "too many indices"),
    (lambda d: d[None], IndexError, "does not add dimensions"),
    (lambda d: d[..., ...], IndexError, "single ellipsis"),
    (lambda d: d[1.5], TypeError, r"ints, slices and '\.\.\.', not float"),
    (lambda d: d[::2].reshape(12), ValueError, "C-contiguous"),
    (lambda d: d.reshape(5, 5), ValueError, "cannot reshape"),
    (lambda d: d.reshape(-1, -1), ValueError, "non-negative"),
    (lambda d: d[:, ::2].fill(1.0), ValueError, "strided"),
    (lambda d: d.fill("text"), ValueError, "could not convert string to float"),
    (lambda d: np.asarray(d), TypeError, r"call \.get\(\)"),
    (lambda d: np.array(d), TypeError, r"call \.get\(\)"),
])
def test_misuse_raises(bad, error, match):
    with pytest.raises(error, match=match):
        bad(mg.to_device(A))


def test_strided_view_as_a_kernel_argument_names_the_parameter():
    N = mg.generics("N")

    @mg.kernel
    def double(x: mg.memref[N, mg.f32]):
        x[mg.thread_idx.x] = 2.0 * x[mg.thread_idx.x]

    d = mg.to_device(np.arange(8, dtype=np.float32))
    with pytest.raises(mg.LaunchError, match="parameter 'x' needs a C-contiguous array"):
        double(d[::2], grid=1, block=4)
    double(d[2:6], grid=1, block=4)                    # a contiguous view works, in place
    np.testing.assert_array_equal(d.get(), [0, 1, 4, 6, 8, 10, 6, 7])


def test_strided_views_in_vectorize():
    @mg.vectorize
    def add(a, b):
        return a + b

    d = mg.to_device(A)
    got = add(d[::2, 1::2], d.T[::2, ::2].T)
    np.testing.assert_array_equal(got.get(), A[::2, 1::2] + A.T[::2, ::2].T)
