"""Property-based fuzzing of array interop (Hypothesis): NumPy arrays of
random dtype, shape, strides and read-only flag through DLPack (host views
and np.from_dlpack round trips), and random __cuda_array_interface__ dicts
(well-formed ones over a real buffer, and broken ones) through asarray.
Each either round-trips exactly (values, shape, read-only flag) or raises a
documented exception class; nothing may crash the interpreter.

The CUDA-side properties need a driver: tests/system/test_fuzz.py runs this module
in a process of its own with the fake driver (tests/support/fake_cuda), where device
memory is host memory."""
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mlirgpu._mlirgpu as C  # noqa: E402
from mlirgpu import cuda  # noqa: E402

DOCUMENTED = (TypeError, ValueError, BufferError, C.LaunchError)

FUZZ = settings(max_examples=int(os.environ.get("MLIRGPU_FUZZ_EXAMPLES", "150")), deadline=None,
                database=None, suppress_health_check=[HealthCheck.too_slow])

DTYPES = ["bool", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8"]

needs_driver = pytest.mark.skipif(not cuda.is_available(), reason="needs a CUDA driver (tests/system/test_fuzz.py "
                                  "runs this with the fake one)")


@st.composite
def numpy_arrays(draw):
    """A view of random dtype, shape and strides (steps, negative steps,
    transposes) into a random buffer, maybe read-only."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    base = (np.arange(max(1, int(np.prod(shape))) * 9) % 7).astype(dtype)[: int(np.prod(shape)) * 4 or 1]
    array = base[:1].reshape(()).copy()
    if ndim:
        array = np.resize(base, tuple(s * 2 for s in shape))
        array = array[tuple(slice(None, None, draw(st.sampled_from([1, 2, -1]))) for _ in range(ndim))]
        array = array[tuple(slice(0, s) for s in shape)]
    if ndim > 1 and draw(st.booleans()):
        array = array.transpose(draw(st.permutations(range(ndim))))
    if draw(st.booleans()):
        array.flags.writeable = False
    return array


@FUZZ
@given(numpy_arrays())
def test_host_dlpack_views_round_trip(array):
    try:
        view = C.asarray(array, host=True)
    except DOCUMENTED:
        return
    assert view.shape == array.shape
    back = np.from_dlpack(view)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    if not array.flags.writeable:
        assert not back.flags.writeable, "a read-only array came back writeable"
    np.testing.assert_array_equal(view.get(), array)


BUFFER = np.arange(4096, dtype=np.uint8)


@st.composite
def cai_dicts(draw):
    """(dict, expected array or None): a well-formed interface over BUFFER
    (expected: the NumPy view of the same bytes), or one broken in one field."""
    dtype = np.dtype(draw(st.sampled_from(["i1", "i2", "i4", "i8", "u1", "f2", "f4", "f8"])))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim)))
    contiguous = draw(st.booleans())
    if contiguous:
        strides = None
        real = np.empty(shape, dtype).strides
    else:
        real = tuple(draw(st.integers(-8, 8)) * dtype.itemsize for _ in range(ndim))
        strides = real
    offset = draw(st.integers(0, 2048)) // dtype.itemsize * dtype.itemsize
    extent = [0, dtype.itemsize]
    if all(shape):
        for n, s in zip(shape, real):
            extent[0 if s < 0 else 1] += (n - 1) * s
    readonly = draw(st.booleans())
    cai = {"shape": shape, "typestr": dtype.str, "data": (BUFFER.ctypes.data + offset, readonly), "version": 3,
           "strides": strides}
    expected = None
    if offset + extent[0] >= 0 and offset + extent[1] <= BUFFER.nbytes:
        expected = np.lib.stride_tricks.as_strided(BUFFER[offset:].view(dtype), shape=shape, strides=real)
    breakage = draw(st.sampled_from([None, None, "shape", "typestr", "data", "version", "strides", "mask",
                                     "missing"]))
    if breakage is not None:
        expected = None
        broken = draw(st.one_of(st.none(), st.integers(-2**70, 2**70), st.text(max_size=6),
                                st.lists(st.integers(-2**65, 2**65), max_size=4).map(tuple),
                                st.tuples(st.integers(-2**65, 2**65), st.integers(-1, 2))))
        if breakage == "missing":
            del cai[draw(st.sampled_from(["shape", "typestr", "data", "version"]))]
        else:
            cai[breakage] = broken
    return cai, expected, readonly


class Foreign:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@needs_driver
@FUZZ
@given(cai_dicts())
def test_cuda_array_interface_dicts(case):
    cai, expected, readonly = case
    try:
        view = C.asarray(Foreign(cai))
    except DOCUMENTED:
        return
    if expected is None:
        return  # a broken field that means something valid, or memory outside BUFFER: never read
    assert view.shape == tuple(cai["shape"])
    np.testing.assert_array_equal(view.get(), expected)
    exported = view.__cuda_array_interface__
    assert exported["data"][1] == readonly, "the read-only bit was lost"
    if readonly:
        with pytest.raises(DOCUMENTED):
            view.copy_from_host(np.zeros(view.shape, view.dtype.numpy))


@needs_driver
@FUZZ
@given(numpy_arrays())
def test_device_copies_round_trip(array):
    assume(array.dtype != np.dtype("c8"))
    try:
        device = C.to_device(array)
    except DOCUMENTED:
        return
    np.testing.assert_array_equal(device.get(), array)
    np.testing.assert_array_equal(C.asarray(Foreign(device.__cuda_array_interface__)).get(), array)
