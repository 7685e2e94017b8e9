"""Dtypes, device-array views and argument checking: everything that runs
without a GPU. Behaviour without a driver is checked in a child process whose
driver library is made unloadable (MLIRGPU_LIBCUDA), so these tests hold on
GPU machines too."""
import datetime
import gc
import json
import os
import pickle
import subprocess
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

import mlirgpu._mlirgpu as C
from mlirgpu import cuda

# ---------------------------------------------------------------------------
# dtypes

NUMPY_EQUIVALENT = [
    ("bool_", np.bool_, 1, "b"),
    ("i8", np.int8, 1, "i"),
    ("i16", np.int16, 2, "i"),
    ("i32", np.int32, 4, "i"),
    ("i64", np.int64, 8, "i"),
    ("u8", np.uint8, 1, "u"),
    ("u16", np.uint16, 2, "u"),
    ("u32", np.uint32, 4, "u"),
    ("u64", np.uint64, 8, "u"),
    ("f16", np.float16, 2, "f"),
    ("f32", np.float32, 4, "f"),
    ("f64", np.float64, 8, "f"),
]


@pytest.mark.parametrize("name,np_type,itemsize,kind", NUMPY_EQUIVALENT)
def test_dtype_singleton_matches_numpy(name, np_type, itemsize, kind):
    dt = getattr(C, name)
    assert isinstance(dt, C.DType)
    assert dt.name == name
    assert dt.itemsize == itemsize and dt.bits == 8 * itemsize
    assert dt.kind == kind
    assert repr(dt) == f"mlirgpu.{name}"
    assert dt.numpy == np.dtype(np_type)
    assert dt == np.dtype(np_type) and np.dtype(np_type) == dt
    assert dt == np_type
    assert hash(dt) == hash(np.dtype(np_type))
    assert {np.dtype(np_type): "found"}[dt] == "found"


@pytest.mark.parametrize("name,np_type,itemsize,kind", NUMPY_EQUIVALENT)
def test_dtype_converts_from_numpy_both_ways(name, np_type, itemsize, kind):
    dt = getattr(C, name)
    assert C.dtype(dt) is dt
    assert C.dtype(np.dtype(np_type)) is dt
    assert C.dtype(np_type) is dt
    assert C.dtype(np.dtype(np_type).name) is dt      # "float32", "int8", "bool"
    assert C.dtype(dt.name) is dt                      # "f32", "i8", "bool_"
    assert C.dtype(dt.numpy) is dt


def test_index_is_intp_sized_but_distinct_from_i64():
    assert C.index.itemsize == 8 and C.index.kind == "i"
    assert C.index.numpy == np.dtype(np.intp)
    assert C.dtype("index") is C.index
    assert C.index != C.i64
    assert C.dtype(np.intp) is C.i64       # NumPy has no index type: its ints map to i64


def test_dtype_strings():
    assert C.dtype("float32") is C.f32
    assert C.dtype("f32") is C.f32
    assert C.dtype("int32") is C.i32
    assert C.dtype("i32") is C.i32
    assert C.dtype("bool") is C.bool_
    assert C.dtype("bfloat16") is C.bf16
    assert C.dtype("bf16") is C.bf16
    assert C.dtype("float16") is C.f16
    assert C.dtype("uint64") is C.u64
    # Bare short names are mlirgpu's (bit widths); NumPy's byte-width codes
    # need a byte-order prefix.
    assert C.dtype("i8") is C.i8
    assert C.dtype("<i8") is C.i64
    assert C.dtype("f4") is C.f32
    assert C.dtype(float) is C.f64
    assert C.f32 == "float32" and C.f32 != "float64"


@pytest.mark.parametrize("bad", ["float33", "", "f128", "complex64", "object", "int7"])
def test_dtype_bad_name_is_value_error(bad):
    with pytest.raises(ValueError):
        C.dtype(bad)


@pytest.mark.parametrize("bad", [3.5, None, [1], (4,), np.complex64, np.dtype("c8"), np.dtype(">f4"), object])
def test_dtype_bad_type_is_type_error(bad):
    with pytest.raises(TypeError):
        C.dtype(bad)


def test_dtype_compares_false_against_other_things():
    assert C.f32 != 3 and not (C.f32 == None)   # noqa: E711
    assert C.f32 != C.f64 and C.f32 != "nonsense" and C.f32 != np.dtype("c8")


def test_bf16_numpy_needs_ml_dtypes():
    assert C.bf16.itemsize == 2 and C.bf16.name == "bf16"
    try:
        import ml_dtypes
    except ImportError:
        with pytest.raises(TypeError, match="ml_dtypes"):
            C.bf16.numpy
    else:
        assert C.bf16.numpy == np.dtype(ml_dtypes.bfloat16)
        assert C.dtype(ml_dtypes.bfloat16) is C.bf16
        assert C.dtype(np.dtype(ml_dtypes.bfloat16)) is C.bf16


@pytest.mark.parametrize("name, ml_name, dlpack_code", [("f8e4m3", "float8_e4m3fn", 10), ("f8e5m2", "float8_e5m2", 12)])
def test_8_bit_floats_are_ml_dtypes_types(name, ml_name, dlpack_code):
    dt = getattr(C, name)
    assert dt.itemsize == 1 and dt.bits == 8 and dt.name == name and repr(dt) == f"mlirgpu.{name}"
    assert C.dtype(name) is dt and C.dtype(ml_name) is dt
    assert pickle.loads(pickle.dumps(dt)) is dt
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ml_type = getattr(ml_dtypes, ml_name)
    assert dt.numpy == np.dtype(ml_type)
    assert C.dtype(ml_type) is dt and C.dtype(np.dtype(ml_type)) is dt
    assert dt == ml_type and dt != C.u8 and dt != np.uint8
    # The other 8-bit floats of ml_dtypes (fnuz: no negative zero, other bias) are not these.
    with pytest.raises(TypeError):
        C.dtype(ml_dtypes.float8_e4m3fnuz)
    with pytest.raises(TypeError):
        C.dtype(ml_dtypes.float8_e5m2fnuz)


def test_dtypes_are_immutable_pickle_as_singletons():
    with pytest.raises(AttributeError):
        C.f32.itemsize = 8
    with pytest.raises(AttributeError):
        C.f32.name = "f64"
    with pytest.raises(TypeError):
        C.DType()
    assert pickle.loads(pickle.dumps(C.f32)) is C.f32


# ---------------------------------------------------------------------------
# the driver

def test_is_available_is_a_bool_and_never_raises():
    assert isinstance(cuda.is_available(), bool)
    assert cuda.current_device() == 0
    assert C.default_stream.handle == 0
    assert C.default_stream.__cuda_stream__() == (0, 0)


NO_DRIVER_SCRIPT = r"""
import json, sys
import numpy as np
import mlirgpu._mlirgpu as C
from mlirgpu import cuda
out = {"available": C.is_available()}
def attempt(key, fn):
    try:
        fn()
        out[key] = None
    except BaseException as e:
        out[key] = [type(e).__name__, getattr(e, "code", None), getattr(e, "name", None), str(e)]
fake = type("Fake", (), {"__cuda_array_interface__": {"shape": (4,), "typestr": "<f4",
                         "data": (4096, False), "version": 3}})()
attempt("empty", lambda: C.empty((2, 3)))
attempt("zeros", lambda: C.zeros(4, C.i32))
attempt("to_device", lambda: C.to_device(np.ones(3)))
attempt("Stream", lambda: C.Stream())
attempt("Event", lambda: C.Event())
attempt("Device", lambda: C.Device(0))
attempt("load_module", lambda: C.load_module(".version 7.0\n.target sm_50\n.address_size 64\n"))
attempt("Module.load", lambda: cuda.Module.load(b"\x7fELF...."))
attempt("device_count", lambda: C.device_count())
attempt("driver_version", lambda: C.driver_version())
attempt("set_device", lambda: C.set_device(0))
attempt("synchronize", lambda: C.synchronize())
attempt("default_stream.synchronize", lambda: C.default_stream.synchronize())
attempt("view.get", lambda: C.asarray(fake).get())
attempt("cai_with_stream", lambda: C.asarray(type("S", (), {"__cuda_array_interface__": {
    "shape": (4,), "typestr": "<f4", "data": (4096, False), "version": 3, "stream": 7}})()))
attempt("dlpack_other_stream", lambda: C.asarray(fake).__dlpack__(stream=7))
out["view_device"] = C.asarray(fake).device
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def no_driver():
    env = dict(os.environ, MLIRGPU_LIBCUDA="/nonexistent/libcuda.so.1")
    done = subprocess.run([sys.executable, "-W", "error", "-c", NO_DRIVER_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_driver_is_not_available(no_driver):
    assert no_driver["available"] is False


@pytest.mark.parametrize("entry", ["empty", "zeros", "to_device", "Stream", "Event", "Device",
                                   "load_module", "Module.load", "device_count", "driver_version",
                                   "set_device", "synchronize", "default_stream.synchronize",
                                   "view.get", "cai_with_stream", "dlpack_other_stream"])
def test_no_driver_gpu_entry_points_raise_cuda_error(no_driver, entry):
    kind, code, name, message = no_driver[entry]
    assert kind == "CudaError"
    assert code == -1 and name == "MLIRGPU_NO_DRIVER"
    assert message.startswith("no CUDA driver: ")
    assert "/nonexistent/libcuda.so.1" in message     # the dlerror text


def test_no_driver_views_need_no_driver(no_driver):
    assert no_driver["view_device"] == 0


def test_cuda_error_hierarchy():
    assert issubclass(C.CudaError, C.Error)
    assert issubclass(C.LaunchError, C.Error) and issubclass(C.LaunchError, ValueError)


# ---------------------------------------------------------------------------
# arguments checked before the driver is needed

@pytest.mark.parametrize("make", [C.empty, C.zeros])
def test_allocation_argument_errors(make):
    with pytest.raises(ValueError, match="negative"):
        make((2, -1))
    with pytest.raises(ValueError, match="negative"):
        make(-3)
    with pytest.raises(TypeError):
        make("abc")
    with pytest.raises(TypeError):
        make((2, 2.0))
    with pytest.raises(TypeError):
        make(None)
    with pytest.raises(TypeError):
        make((True, 2))
    with pytest.raises(ValueError, match="at most 8"):
        make((1,) * 9)
    with pytest.raises(ValueError, match="too large"):
        make((1 << 40, 1 << 40))
    with pytest.raises(ValueError):
        make((1 << 70,))
    with pytest.raises(ValueError, match="unknown dtype"):
        make((2,), "float33")
    with pytest.raises(TypeError):
        make((2,), 3.5)
    with pytest.raises(TypeError):
        make((2,), C.f32, stream="s")
    with pytest.raises(TypeError):
        make((2,), C.f32, stream=object())
    with pytest.raises(ValueError):
        make((2,), C.f32, stream=-5)


def test_to_device_argument_errors():
    with pytest.raises(TypeError):
        C.to_device(np.array([object(), object()]))
    with pytest.raises(TypeError):
        C.to_device(np.zeros(3, np.complex64))
    with pytest.raises(TypeError):
        C.to_device(object())
    with pytest.raises(ValueError):
        C.to_device(np.zeros((1,) * 9))
    with pytest.raises(TypeError):
        C.to_device(np.zeros(3), stream="s")


def test_load_module_argument_errors():
    with pytest.raises(TypeError):
        C.load_module(123)
    with pytest.raises(TypeError):
        cuda.Module.load(bytearray(b"x"))
    with pytest.raises(ValueError):
        C.load_module("")
    with pytest.raises(TypeError):
        cuda.Module()
    with pytest.raises(TypeError):
        C.Function()


# ---------------------------------------------------------------------------
# views through __cuda_array_interface__ (fake producers: pointers are never read)

class FakeCAI:
    def __init__(self, **cai):
        base = {"shape": (2, 3), "typestr": "<f4", "data": (0x10000, False), "version": 3}
        base.update(cai)
        self.__cuda_array_interface__ = {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def test_cai_view_is_zero_copy_and_keeps_its_owner():
    owner = FakeCAI()
    alive = weakref.ref(owner)
    view = C.asarray(owner)
    assert isinstance(view, C.DeviceArray)
    assert view.ptr == 0x10000
    assert view.shape == (2, 3) and view.strides == (12, 4) and view.ndim == 2
    assert view.dtype is C.f32 and view.size == 6 and view.nbytes == 24
    assert view.is_c_contiguous and len(view) == 2
    assert repr(view).startswith("DeviceArray(shape=(2, 3), dtype=mlirgpu.f32")
    assert C.asarray(view) is view
    del owner
    gc.collect()
    assert alive() is not None
    del view
    gc.collect()
    assert alive() is None


def test_cai_export_round_trip():
    view = C.asarray(FakeCAI(strides=(4, 8), typestr="<i2"))
    assert view.dtype is C.i16 and view.strides == (4, 8) and not view.is_c_contiguous
    cai = view.__cuda_array_interface__
    assert cai == {"shape": (2, 3), "typestr": "<i2", "data": (0x10000, False), "version": 3,
                   "strides": (4, 8), "stream": 1}
    contiguous = C.asarray(FakeCAI()).__cuda_array_interface__
    assert contiguous["strides"] is None and contiguous["stream"] == 1
    again = C.asarray(view)
    assert again is view


def test_cai_view_of_every_typestr():
    for typestr, dt in [("|b1", C.bool_), ("|i1", C.i8), ("<i2", C.i16), ("<i4", C.i32),
                        ("<i8", C.i64), ("|u1", C.u8), ("<u2", C.u16), ("<u4", C.u32),
                        ("<u8", C.u64), ("<f2", C.f16), ("<f4", C.f32), ("<f8", C.f64)]:
        view = C.asarray(FakeCAI(typestr=typestr))
        assert view.dtype is dt
        assert view.__cuda_array_interface__["typestr"] == typestr


def test_cai_zero_dim_empty_and_negative_strides():
    scalar = C.asarray(FakeCAI(shape=()))
    assert scalar.shape == () and scalar.size == 1 and scalar.strides == ()
    with pytest.raises(TypeError):
        len(scalar)
    empty = C.asarray(FakeCAI(shape=(0, 5), data=(0, False)))
    assert empty.size == 0 and empty.nbytes == 0 and empty.is_c_contiguous
    reversed_ = C.asarray(FakeCAI(shape=(4,), strides=(-4,)))
    assert reversed_.strides == (-4,) and not reversed_.is_c_contiguous
    broadcast = C.asarray(FakeCAI(shape=(3, 4), strides=(0, 4)))
    assert broadcast.strides == (0, 4)


@pytest.mark.parametrize("cai,error", [
    (dict(shape=_DROP), ValueError),
    (dict(typestr=_DROP), ValueError),
    (dict(data=_DROP), ValueError),
    (dict(version=_DROP), ValueError),
    (dict(shape=[2, 3]), TypeError),
    (dict(shape=(2, -3)), ValueError),
    (dict(shape=(2, 3.0)), TypeError),
    (dict(shape=(1,) * 9), ValueError),
    (dict(typestr="<f3"), TypeError),
    (dict(typestr="<c8"), TypeError),
    (dict(typestr=">f4"), TypeError),
    (dict(typestr="f4"), ValueError),
    (dict(typestr="<fx"), ValueError),
    (dict(typestr=4), TypeError),
    (dict(data=0x10000), TypeError),
    (dict(data=(None, False)), TypeError),
    (dict(data=(-1, False)), ValueError),  # malformed, as the docs say of every CAI field
    (dict(shape=(2**63,)), ValueError),  # beyond ssize_t: malformed, not an OverflowError
    (dict(version="3"), TypeError),
    (dict(strides=(4,)), ValueError),
    (dict(strides=[12, 4]), TypeError),
    (dict(mask=object()), ValueError),
    (dict(stream=0), ValueError),
    (dict(stream="s"), TypeError),
])
def test_cai_bad_dicts(cai, error):
    with pytest.raises(error):
        C.asarray(FakeCAI(**cai))


def test_cai_not_a_dict():
    class Odd:
        __cuda_array_interface__ = [("shape", (2,))]
    with pytest.raises(TypeError):
        C.asarray(Odd())


def test_cai_property_errors_propagate():
    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("producer failed")
    with pytest.raises(RuntimeError, match="producer failed"):
        C.asarray(Broken())


def test_asarray_refuses_host_arrays_and_strangers():
    with pytest.raises(TypeError, match="host array: use mlirgpu.to_device"):
        C.asarray(np.zeros(3))
    with pytest.raises(TypeError, match="host array"):
        C.asarray(np.ma.zeros(3))        # an ndarray subclass
    with pytest.raises(TypeError):
        C.asarray(object())
    with pytest.raises(TypeError):
        C.asarray(3)
    with pytest.raises(TypeError):
        C.asarray([1.0, 2.0])

    class HostInterface:
        __array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}
    with pytest.raises(TypeError, match="host array"):
        C.asarray(HostInterface())


# ---------------------------------------------------------------------------
# DLPack, both directions (no driver needed while no stream must be waited on)

def test_dlpack_export_capsule_names_and_device():
    view = C.asarray(FakeCAI())
    assert view.__dlpack_device__() == (2, view.device)
    legacy = view.__dlpack__()
    assert "dltensor" in repr(legacy) and "versioned" not in repr(legacy)
    versioned = view.__dlpack__(max_version=(1, 0))
    assert '"dltensor_versioned"' in repr(versioned)
    legacy_again = view.__dlpack__(max_version=(0, 8))
    assert "versioned" not in repr(legacy_again)
    assert view.__dlpack__(stream=-1, dl_device=(2, view.device), copy=False) is not None
    assert view.__dlpack__(stream=1) is not None


def test_dlpack_export_argument_errors():
    view = C.asarray(FakeCAI())
    with pytest.raises(ValueError):
        view.__dlpack__(stream=0)
    with pytest.raises(BufferError):
        view.__dlpack__(dl_device=(1, 0))
    with pytest.raises(TypeError):
        view.__dlpack__(dl_device="cuda")
    with pytest.raises(BufferError):
        view.__dlpack__(copy=True)
    with pytest.raises(TypeError):
        view.__dlpack__(max_version="1.0")
    with pytest.raises(TypeError):
        view.__dlpack__(None)          # keyword-only
    with pytest.raises(BufferError):
        C.asarray(FakeCAI(shape=(3,), strides=(6,))).__dlpack__()


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_dlpack_round_trip_through_capsule(max_version):
    owner = FakeCAI(shape=(3, 4), strides=(-16, 4), typestr="<u2")
    view = C.asarray(owner)
    capsule = view.__dlpack__(max_version=max_version)
    again = C.asarray(capsule)
    assert again is not view
    assert again.ptr == view.ptr and again.shape == view.shape and again.strides == view.strides
    assert again.dtype is C.u16
    assert "used_dltensor" in repr(capsule)
    with pytest.raises(ValueError, match="already consumed"):
        C.asarray(capsule)
    alive = weakref.ref(owner)
    del owner, view, capsule
    gc.collect()
    assert alive() is not None     # the second view holds the first through the managed tensor
    del again
    gc.collect()
    assert alive() is None


def test_unconsumed_capsule_releases_the_array():
    owner = FakeCAI()
    alive = weakref.ref(owner)
    view = C.asarray(owner)
    capsules = [view.__dlpack__(), view.__dlpack__(max_version=(1, 0))]
    del owner, view
    gc.collect()
    assert alive() is not None
    del capsules
    gc.collect()
    assert alive() is None


class FakeDLPack:
    """Forwards the DLPack protocol, like a framework tensor would."""

    def __init__(self, capsule, device=(2, 0), legacy_signature=False):
        self.capsule, self.device, self.calls = capsule, device, []
        if legacy_signature:
            self.__dlpack__ = self._legacy

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        return self.capsule

    def _legacy(self, stream=None):
        self.calls.append({"stream": stream})
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def test_dlpack_import_asks_for_versioned_and_legacy_default_stream():
    view = C.asarray(FakeCAI())
    producer = FakeDLPack(view.__dlpack__(max_version=(1, 0)))
    imported = C.asarray(producer)
    assert imported.ptr == view.ptr
    assert producer.calls == [{"stream": 1, "max_version": (1, 1)}]


def test_dlpack_import_without_synchronizing_asks_for_no_stream():
    """For a caller that uses the view on the producer's own current stream
    (mlirgpu.ops on torch's): stream -1, no ordering, which a CUDA graph
    capture would refuse."""
    view = C.asarray(FakeCAI())
    producer = FakeDLPack(view.__dlpack__(max_version=(1, 0)))
    assert C.asarray(producer, synchronize=False).ptr == view.ptr
    assert producer.calls == [{"stream": -1, "max_version": (1, 1)}]


def test_dlpack_import_falls_back_without_max_version():
    view = C.asarray(FakeCAI())
    producer = FakeDLPack(view.__dlpack__(), legacy_signature=True)
    assert C.asarray(producer).ptr == view.ptr
    assert producer.calls == [{"stream": 1}]


def test_dlpack_import_errors():
    with pytest.raises(ValueError, match="not a DLPack capsule"):
        C.asarray(datetime.datetime_CAPI)
    with pytest.raises(ValueError, match="not a DLPack capsule"):
        C.asarray(FakeDLPack(datetime.datetime_CAPI))
    view = C.asarray(FakeCAI())
    with pytest.raises(TypeError, match="host array"):
        C.asarray(FakeDLPack(view.__dlpack__(), device=(1, 0)))
    with pytest.raises(TypeError, match="not CUDA"):
        C.asarray(FakeDLPack(view.__dlpack__(), device=(10, 0)))
    with pytest.raises(TypeError, match="not a capsule"):
        C.asarray(FakeDLPack("capsule"))
    with pytest.raises(TypeError):
        C.asarray(FakeDLPack(view.__dlpack__(), device="cuda"))


# ---------------------------------------------------------------------------
# nothing leaks

def test_views_and_capsules_do_not_leak():
    owner = FakeCAI(shape=(5, 7), strides=(28, 4))
    base = sys.getrefcount(owner)

    def cycle():
        view = C.asarray(owner)
        C.asarray(view.__dlpack__(max_version=(1, 0)))
        C.asarray(view.__dlpack__())
        view.__dlpack__()                  # never consumed
        view.__cuda_array_interface__
        repr(view), view.shape, view.strides

    for _ in range(100):
        cycle()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(10000):
        cycle()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert sys.getrefcount(owner) == base
    assert grown < 64 * 1024


def test_argument_errors_do_not_leak():
    for _ in range(2000):
        for call in (lambda: C.empty((2, -1)), lambda: C.dtype("nope"),
                     lambda: C.asarray(FakeCAI(typestr="<c8")), lambda: C.asarray(np.zeros(2))):
            with pytest.raises((TypeError, ValueError)):
                call()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(5000):
        for call in (lambda: C.empty((2, -1)), lambda: C.dtype("nope"),
                     lambda: C.asarray(FakeCAI(typestr="<c8")), lambda: C.asarray(np.zeros(2))):
            try:
                call()
            except (TypeError, ValueError):
                pass
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 64 * 1024
