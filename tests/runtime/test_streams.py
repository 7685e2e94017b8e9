"""Streams, events, pinned memory, asynchronous copies, the CAI stream rule
and CUDA graphs without a GPU: what mlirgpu hands the driver, checked
against the fake driver of tests/support/fake_cuda (its call log, and its emulation
of stream capture), and the behaviour without a driver and on the CPU
backend. Each fake-driver test runs in a fresh interpreter (the driver is
loaded once per process). On a GPU: test_streams_gpu.py."""
import json
import os
import sys
import textwrap

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu._mlirgpu as C
from support.backends import current_backend
from support.checks import run_on_fake

# The script's prelude, after run_on_fake's: the fake driver's log, and kernels it emulates by name.
PRELUDE = '''
import gc, sys, tracemalloc, weakref

_fake.fake_pinned_live.restype = ctypes.c_long
HANDLE_KEYS = ("stream", "event", "exec", "graph", "ptr", "dst", "src")

def log():
    """The driver calls since the last log(): one line each, 'name key=value ...'."""
    lines = _fake.fake_log().decode().splitlines()
    _fake.fake_log_clear()
    return lines

def trace(**named):
    """log() with the handles named: those given here by their keyword, 0, 1 and 2
    as themselves, any other as #1, #2... in order of appearance."""
    names = {str(int(v)): k for k, v in named.items()}
    lines = []
    for line in log():
        words = line.split()
        for i, word in enumerate(words[1:], 1):
            key, _, value = word.partition("=")
            if key in HANDLE_KEYS and value not in ("0", "1", "2"):
                if value not in names:
                    names[value] = "#%d" % (sum(n.startswith("#") for n in names.values()) + 1)
                words[i] = key + "=" + names[value]
        lines.append(" ".join(words))
    return lines

def named(lines, *prefixes):
    return [l for l in lines if l.split()[0] in prefixes]

N = mg.generics("N")

@mg.kernel
def add_scalar(X: mg.memref[N, mg.f32], v: mg.f32, n: mg.u32):
    X[mg.thread_idx.x] = X[mg.thread_idx.x] + v

@mg.kernel
def add3(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32], C: mg.memref[N, mg.f32], n: mg.u32):
    C[mg.thread_idx.x] = A[mg.thread_idx.x] + B[mg.thread_idx.x]

module = C.load_module(".visible .entry add_scalar(\\n.visible .entry record_params(\\n")
raw_add = module.get_function("add_scalar", params=["ptr", C.f32, C.u32])
record = module.get_function("record_params")

class Foreign:
    """A producer's array seen only through __cuda_array_interface__ (v3)."""
    def __init__(self, array, stream):
        self.__cuda_array_interface__ = dict(array.__cuda_array_interface__, stream=stream)

'''


@pytest.fixture
def fake(fake_libcuda, tmp_path):
    """fake(body): runs `body` after PRELUDE in a fresh interpreter on the fake
    driver (run_on_fake); returns its `out` dict."""
    return lambda body: run_on_fake(fake_libcuda, tmp_path, PRELUDE + textwrap.dedent(body))


# ---------------------------------------------------------------------------
# pinned host memory

def test_pinned_empty_is_page_locked_numpy_memory(fake):
    out = fake('''
    log()
    a = mg.pinned_empty((4, 3), mg.f32)
    out["alloc"] = trace(a=a.ctypes.data)
    out["array"] = [type(a).__name__, list(a.shape), str(a.dtype), a.flags.c_contiguous, a.flags.writeable]
    out["base"] = [type(a.base).__name__, a.base.ptr == a.ctypes.data, a.base.nbytes, a.base.device]
    a[:] = 7
    z = mg.pinned_zeros(5, mg.i64)
    out["zeros"] = z.tolist()
    out["dtypes"] = [str(mg.pinned_empty(2, t).dtype) for t in (mg.f16, mg.u8, "float64", np.int32)]
    ''')
    assert out["alloc"] == ["cuMemHostAlloc ptr=a bytes=48 flags=1"]   # CU_MEMHOSTALLOC_PORTABLE
    assert out["array"] == ["ndarray", [4, 3], "float32", True, True]
    assert out["base"] == ["PinnedMemory", True, 48, 0]
    assert out["zeros"] == [0] * 5
    assert out["dtypes"] == ["float16", "uint8", "float64", "int32"]


def test_pinned_memory_is_freed_with_the_last_view(fake):
    out = fake('''
    a = mg.pinned_empty(16)
    ptr = a.ctypes.data
    view = a[4:8].reshape(2, 2)
    live = _fake.fake_pinned_live()
    log()
    del a
    gc.collect()
    out["after_array"] = trace(a=ptr)
    del view
    out["after_view"] = trace(a=ptr)
    out["live"] = [live, _fake.fake_pinned_live()]
    ''')
    assert out["after_array"] == []   # the view keeps the memory
    assert out["after_view"] == ["cuMemFreeHost ptr=a"]
    assert out["live"] == [1, 0]


def test_pinned_zero_size_and_bad_arguments_do_not_touch_the_driver(fake):
    out = fake('''
    log()
    empty = mg.pinned_empty((0, 3))
    out["empty"] = [list(empty.shape), empty.base is None]
    errors = []
    for args in [((-1,),), ((2.5,),), ((2,), np.complex64), ((2,), "nonsense"), (tuple(range(1, 10)),)]:
        try:
            mg.pinned_empty(*args)
        except (TypeError, ValueError) as e:
            errors.append(type(e).__name__)
    out["errors"] = errors
    out["log"] = log()
    ''')
    assert out["empty"] == [[0, 3], True]
    assert out["errors"] == ["ValueError", "TypeError", "TypeError", "ValueError", "ValueError"]
    assert out["log"] == []


def test_pinned_allocations_do_not_leak(fake):
    out = fake('''
    for _ in range(50):
        mg.pinned_empty(1000)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(2000):
        a = mg.pinned_zeros((10, 100))
        b = a[3:]
        del a, b
    gc.collect()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    out["grown"] = grown
    out["live"] = _fake.fake_pinned_live()
    ''')
    assert out["live"] == 0
    assert out["grown"] < 64 * 1024


def test_pinned_memory_on_the_cpu_backend_is_ordinary_memory():
    with current_backend("cpu"):
        a = mg.pinned_empty((3, 2), mg.f64)
        z = mg.pinned_zeros(4, mg.i32)
    assert a.shape == (3, 2) and a.dtype == np.float64 and a.base is None
    assert z.tolist() == [0, 0, 0, 0]


# ---------------------------------------------------------------------------
# asynchronous copies

def test_copy_from_host_is_asynchronous_on_its_stream(fake):
    out = fake('''
    s = mg.Stream(non_blocking=True)
    h = mg.pinned_empty(6)
    h[:] = np.arange(6)
    d = mg.empty(6)
    log()
    d.copy_from_host(h, stream=s)
    out["copy"] = trace(d=d.ptr, h=h.ctypes.data, s=s.handle)
    out["cai_stream"] = d.__cuda_array_interface__["stream"] == s.handle
    out["value"] = d.get().tolist()
    ''')
    assert out["copy"] == ["cuMemcpyHtoDAsync dst=d src=h bytes=24 stream=s"]   # no synchronize
    assert out["cai_stream"]   # later work orders itself after the copy
    assert out["value"] == [0, 1, 2, 3, 4, 5]


def test_copies_without_a_stream_use_the_arrays_last_stream(fake):
    out = fake('''
    s = mg.Stream()
    d = mg.zeros(4)
    raw_add(d, 1.0, 4, grid=1, block=4, stream=s)
    h = np.arange(4, dtype=np.float32)
    log()
    d.copy_from_host(h)
    host = np.empty(4, np.float32)
    d.copy_to_host(host, blocking=False)
    out["trace"] = trace(s=s.handle, d=d.ptr, h=h.ctypes.data, host=host.ctypes.data)
    out["host"] = host.tolist()
    ''')
    assert out["trace"] == ["cuMemcpyHtoDAsync dst=d src=h bytes=16 stream=s",
                            "cuMemcpyDtoHAsync dst=host src=d bytes=16 stream=s"]
    assert out["host"] == [0, 1, 2, 3]


def test_copy_to_host_and_get_wait_unless_told_not_to(fake):
    out = fake('''
    s = mg.Stream(non_blocking=True)
    d = mg.to_device(np.arange(8, dtype=np.float32))
    pinned = mg.pinned_empty(8)
    log()
    d.copy_to_host(pinned, stream=s, blocking=False)
    out["async"] = trace(s=s.handle, d=d.ptr, p=pinned.ctypes.data)
    out["pinned"] = pinned.tolist()
    out["cai_stream"] = d.__cuda_array_interface__["stream"] == s.handle
    plain = np.empty(8, np.float32)
    d.copy_to_host(plain, stream=s)
    out["blocking"] = [l.split()[0] for l in log()]
    got = d.get(blocking=False)
    out["get_async"] = [[l.split()[0] for l in log()], got.tolist()]
    got = d.get(stream=s)
    out["get"] = [l.split()[0] for l in log()]
    ''')
    assert out["async"] == ["cuMemcpyDtoHAsync dst=p src=d bytes=32 stream=s"]
    assert out["pinned"] == list(range(8)) and out["cai_stream"]
    assert out["blocking"] == ["cuMemcpyDtoHAsync", "cuStreamSynchronize"]
    assert out["get_async"] == [["cuMemcpyDtoHAsync"], list(range(8))]
    assert out["get"] == ["cuMemcpyDtoHAsync", "cuStreamSynchronize"]


def test_copy_mismatches_raise_before_the_driver(fake):
    out = fake('''
    d = mg.zeros((4, 3))
    strided = C.asarray(type("Strided", (), {"__cuda_array_interface__": dict(
        d.__cuda_array_interface__, shape=(4, 2), strides=(12, 4))})())
    read_only = np.zeros((4, 3), np.float32)
    read_only.flags.writeable = False
    cases = {
        "from_dtype": lambda: d.copy_from_host(np.zeros((4, 3), np.float64)),
        "from_shape": lambda: d.copy_from_host(np.zeros((3, 4), np.float32)),
        "from_list": lambda: d.copy_from_host([[0.0] * 3] * 4),
        "from_strided_src": lambda: d.copy_from_host(np.zeros((4, 6), np.float32)[:, ::2]),
        "from_strided_dst": lambda: strided.copy_from_host(np.zeros((4, 2), np.float32)),
        "from_big_endian": lambda: d.copy_from_host(np.zeros((4, 3), ">f4")),
        "from_stream": lambda: d.copy_from_host(np.zeros((4, 3), np.float32), stream="s"),
        "to_dtype": lambda: d.copy_to_host(np.zeros((4, 3), np.int32), blocking=False),
        "to_shape": lambda: d.copy_to_host(np.zeros(12, np.float32), blocking=False),
        "to_read_only": lambda: d.copy_to_host(read_only, blocking=False),
        "to_strided": lambda: d.copy_to_host(np.zeros((4, 6), np.float32)[:, ::2], blocking=False),
        "get_strided": lambda: strided.get(blocking=False),
    }
    log()
    for name, case in cases.items():
        try:
            case()
            out[name] = "no error"
        except Exception as e:
            out[name] = type(e).__name__
    out["log"] = log()
    ''')
    assert out.pop("log") == []
    assert out == {"from_dtype": "TypeError", "from_shape": "ValueError", "from_list": "TypeError",
                   "from_strided_src": "ValueError", "from_strided_dst": "ValueError",
                   "from_big_endian": "TypeError", "from_stream": "TypeError", "to_dtype": "TypeError",
                   "to_shape": "ValueError", "to_read_only": "ValueError", "to_strided": "ValueError",
                   "get_strided": "ValueError"}


def test_empty_copies_call_nothing(fake):
    out = fake('''
    d = mg.empty((0, 4))
    log()
    d.copy_from_host(np.zeros((0, 4), np.float32))
    d.copy_to_host(np.zeros((0, 4), np.float32), blocking=False)
    out["got"] = list(d.get(blocking=False).shape)
    out["log"] = log()
    ''')
    assert out == {"got": [0, 4], "log": []}


def test_host_arrays_copy_with_memcpy():
    """The CPU backend's DeviceArrays: copies are plain host copies, streams unused."""
    d = C.zeros((2, 3), C.f32, host=True)
    d.copy_from_host(np.arange(6, dtype=np.float32).reshape(2, 3))
    out = np.zeros((2, 3), np.float32)
    d.copy_to_host(out, blocking=False)
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(d.get(blocking=False), np.arange(6).reshape(2, 3))


# ---------------------------------------------------------------------------
# the default stream

def test_what_each_stream_argument_hands_the_driver(fake):
    out = fake('''
    x = mg.zeros(4)
    blocking, non_blocking = mg.Stream(), mg.Stream(non_blocking=True)
    out["created"] = trace(blocking=blocking.handle, non_blocking=non_blocking.handle)[-2:]
    for stream in (None, 0, 1, 2, mg.cuda.default_stream, blocking, non_blocking):
        raw_add(x, 1.0, 4, grid=1, block=4, stream=stream)
    out["launches"] = trace(blocking=blocking.handle, non_blocking=non_blocking.handle)
    y = mg.to_device(np.zeros(4, np.float32))
    out["to_device"] = [l.split()[-1] for l in log()]
    raw_add(y, 1.0, 4, grid=1, block=4, stream=non_blocking)
    log()
    y.get()
    out["get"] = trace(non_blocking=non_blocking.handle)
    ''')
    assert out["created"] == ["cuStreamCreate stream=blocking flags=0",       # synchronises with the legacy stream
                              "cuStreamCreate stream=non_blocking flags=1"]   # CU_STREAM_NON_BLOCKING
    assert [l.split()[-1] for l in out["launches"]] == [
        "stream=0", "stream=0", "stream=0", "stream=2", "stream=0", "stream=blocking", "stream=non_blocking"]
    assert out["to_device"] == ["stream=0"]
    assert out["get"] == ["cuMemcpyDtoHAsync dst=#1 src=#2 bytes=16 stream=non_blocking",
                          "cuStreamSynchronize stream=non_blocking"]


def test_cpu_backend_runs_launches_to_completion_and_ignores_streams(fake):
    out = fake('''
    s = mg.Stream(non_blocking=True)
    mg.set_backend("cpu")
    x = mg.zeros(4)
    log()
    add_scalar(x, 2.0, 4, grid=1, block=4, stream=s)
    out["x"] = x.get().tolist()
    out["log"] = log()
    ''')
    assert out == {"x": [2.0] * 4, "log": []}


def test_the_api_snippet_hands_the_driver_its_ordering(fake):
    """The two-stream example of the guide, with add3 (C = A + B) for k1, k2 and add."""
    out = fake('''
    k1 = k2 = add = add3
    n, g, b = 8, 1, 8
    dA, dB = mg.to_device(np.arange(n, dtype=np.float32)), mg.to_device(np.ones(n, np.float32))
    dC1, dC2, dOut = mg.empty(n), mg.empty(n), mg.empty(n)
    k1(dA, dB, dC1, n, grid=g, block=b)   # compiles once
    log()
    s1, s2 = mg.Stream(), mg.Stream()
    start, end = mg.Event(), mg.Event()
    start.record(s1)
    k1(dA, dB, dC1, n, grid=g, block=b, stream=s1)
    k2(dA, dB, dC2, n, grid=g, block=b, stream=s2)
    done = mg.Event(); done.record(s2); s1.wait(done)
    add(dC1, dC2, dOut, n, grid=g, block=b, stream=s1)
    end.record(s1)
    s1.synchronize()
    out["trace"] = trace(s1=s1.handle, s2=s2.handle, start=start.handle, end=end.handle, done=done.handle)
    out["out"] = dOut.get().tolist()
    out["ms"] = start.elapsed_time(end) > 0
    ''')
    assert [l for l in out["trace"] if not l.startswith("cuStreamCreate")] == [
        "cuEventRecord event=start stream=s1",
        "cuLaunchKernel function=add3 stream=s1",
        "cuLaunchKernel function=add3 stream=s2",
        "cuEventRecord event=done stream=s2",
        "cuStreamWaitEvent stream=s1 event=done flags=0",
        "cuLaunchKernel function=add3 stream=s1",
        "cuEventRecord event=end stream=s1",
        "cuStreamSynchronize stream=s1"]
    assert out["out"] == [2 * i + 2 for i in range(8)]
    assert out["ms"]


# ---------------------------------------------------------------------------
# __cuda_array_interface__ streams of foreign arrays

def test_a_launch_waits_for_the_producer_stream_of_a_cai_array(fake):
    out = fake('''
    producer, launch = mg.Stream(), mg.Stream(non_blocking=True)
    x = mg.zeros(4)
    buf = mg.zeros(4, mg.u64)
    foreign = Foreign(x, producer.handle)
    names = dict(producer=producer.handle, launch=launch.handle)
    log()
    raw_add(foreign, 1.0, 4, grid=1, block=4, stream=launch)
    out["function"] = trace(**names)
    d = C.Dispatcher(lambda args, kwargs: (d.register(args, record), record(*args, **kwargs)), "record_params")
    d(buf, np.uint32(2), foreign, foreign, grid=1, block=1, stream=launch)   # miss: the Function path
    log()
    d(buf, np.uint32(2), foreign, foreign, grid=1, block=1, stream=launch)   # hit: the dispatcher read the CAI
    out["hit"] = trace(**names)
    out["hit_pointers"] = buf.get()[:2].tolist() == [x.ptr, x.ptr]
    add_scalar(foreign, 1.0, 4, grid=1, block=4, stream=launch)
    log()
    add_scalar(foreign, 1.0, 4, grid=1, block=4, stream=launch)
    out["kernel"] = trace(**names)
    out["x"] = x.get().tolist()
    ''')
    wait = ["cuEventRecord event=#1 stream=producer", "cuStreamWaitEvent stream=launch event=#1 flags=0"]
    assert out["function"] == wait + ["cuLaunchKernel function=add_scalar stream=launch"]
    assert out["hit"] == wait + ["cuLaunchKernel function=record_params stream=launch"]   # one wait for two arrays
    assert out["hit_pointers"]
    assert out["kernel"] == wait + ["cuLaunchKernel function=add_scalar stream=launch"]
    assert out["x"] == [3.0] * 4


def test_cai_streams_that_need_no_wait(fake):
    out = fake('''
    s = mg.Stream(non_blocking=True)
    x = mg.zeros(4)
    log()
    raw_add(Foreign(x, None), 1.0, 4, grid=1, block=4, stream=s)         # no stream: nothing to wait for
    raw_add(Foreign(x, s.handle), 1.0, 4, grid=1, block=4, stream=s)     # the launch's own stream
    raw_add(Foreign(x, 1), 1.0, 4, grid=1, block=4)                       # legacy on legacy
    out["none"] = trace(s=s.handle)
    raw_add(Foreign(x, 1), 1.0, 4, grid=1, block=4, stream=s)             # legacy producer, another stream
    raw_add(Foreign(x, 2), 1.0, 4, grid=1, block=4, stream=s)             # per-thread producer
    out["legacy"] = trace(s=s.handle)
    ''')
    assert out["none"] == ["cuLaunchKernel function=add_scalar stream=s"] * 2 + [
        "cuLaunchKernel function=add_scalar stream=0"]
    assert out["legacy"] == ["cuEventRecord event=#1 stream=0", "cuStreamWaitEvent stream=s event=#1 flags=0",
                             "cuLaunchKernel function=add_scalar stream=s",
                             "cuEventRecord event=#2 stream=2", "cuStreamWaitEvent stream=s event=#2 flags=0",
                             "cuLaunchKernel function=add_scalar stream=s"]


def test_asarray_still_orders_the_legacy_stream(fake):
    out = fake('''
    producer = mg.Stream()
    x = mg.zeros(4)
    log()
    view = mg.asarray(Foreign(x, producer.handle))
    out["trace"] = trace(producer=producer.handle)
    out["view_stream"] = view.__cuda_array_interface__["stream"]
    ''')
    assert out["trace"] == ["cuEventRecord event=#1 stream=producer", "cuStreamWaitEvent stream=0 event=#1 flags=0"]
    assert out["view_stream"] == 1


def test_a_dlpack_array_on_another_stream_waits_for_the_legacy_stream(fake):
    out = fake('''
    class Producer:   # DLPack only: asked to order its work before the legacy stream (stream=1)
        def __init__(self, array): self.array, self.streams = array, []
        def __dlpack_device__(self): return self.array.__dlpack_device__()
        def __dlpack__(self, stream=None, max_version=None):
            self.streams.append(stream)
            return self.array.__dlpack__(stream=-1, max_version=max_version)
    s = mg.Stream(non_blocking=True)
    producer = Producer(mg.zeros(4))
    log()
    raw_add(producer, 1.0, 4, grid=1, block=4, stream=s)
    out["trace"] = trace(s=s.handle)
    out["streams"] = producer.streams
    ''')
    assert out["streams"] == [1]
    assert out["trace"] == ["cuEventRecord event=#1 stream=0", "cuStreamWaitEvent stream=s event=#1 flags=0",
                            "cuLaunchKernel function=add_scalar stream=s"]


# ---------------------------------------------------------------------------
# graphs

def test_graph_captures_launches_and_replays_them(fake):
    out = fake('''
    x = mg.zeros(8)
    add_scalar(x, 1.0, 8, grid=1, block=8)   # compiled and registered before the capture
    log()
    with mg.graph() as g:
        out["inside"] = [g.capturing, g.ready]
        add_scalar(x, 1.0, 8, grid=1, block=8, stream=g.stream)
        raw_add(x, 2.0, 8, grid=1, block=8, stream=g.stream)
    out["captured"] = trace(s=g.stream.handle)
    out["state"] = [g.capturing, g.ready, g.num_nodes, g.stream.non_blocking, x.get().tolist()[0]]
    for _ in range(10):
        g.replay()
    out["x"] = x.get().tolist()
    other = mg.Stream()
    g.replay(stream=other)
    out["replays"] = named(trace(s=g.stream.handle, other=other.handle), "cuGraphLaunch")
    out["x_stream"] = x.__cuda_array_interface__["stream"] == other.handle
    ''')
    assert out["inside"] == [True, False]
    assert out["captured"] == [
        "cuStreamCreate stream=s flags=1",
        "cuStreamBeginCapture stream=s mode=1",   # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        "cuLaunchKernel function=add_scalar stream=s",
        "cuLaunchKernel function=add_scalar stream=s",
        "cuStreamEndCapture stream=s",
        "cuGraphInstantiateWithFlags exec=#1 graph=#2 nodes=2 flags=0"]
    assert out["state"] == [False, True, 2, True, 1.0]   # captured launches did not run
    assert out["x"] == [31.0] * 8
    assert len(set(out["replays"][:10])) == 1 and out["replays"][0].endswith(" stream=s")
    assert out["replays"][10] == out["replays"][0].replace("stream=s", "stream=other")
    assert out["x_stream"]   # the arrays order later work after the replay's stream


def test_graph_on_a_given_stream(fake):
    out = fake('''
    s = mg.Stream(non_blocking=True)
    x = mg.zeros(4)
    with mg.graph(s) as g:
        raw_add(x, 1.0, 4, grid=1, block=4, stream=s)
    g.replay()
    g.replay()
    out["same"] = g.stream is s
    out["x"] = x.get().tolist()
    ''')
    assert out == {"same": True, "x": [2.0] * 4}


def test_graph_refuses_the_legacy_stream_before_the_driver(fake):
    out = fake('''
    log()
    for stream in (None, 0, 1, mg.cuda.default_stream):
        try:
            mg.graph(stream)
        except ValueError as e:
            out.setdefault("errors", []).append(str(e))
    try:
        mg.graph("s")
    except TypeError as e:
        out["type"] = str(e)
    out["log"] = log()
    ''')
    assert len(out["errors"]) == 4
    assert all("cannot capture the legacy default stream" in e for e in out["errors"])
    assert "stream must be" in out["type"]
    assert out["log"] == []


def test_an_exception_in_the_block_discards_the_graph_and_propagates(fake):
    out = fake('''
    x = mg.zeros(4)
    g = mg.graph()
    s = g.stream
    log()
    try:
        with g:
            raw_add(x, 1.0, 4, grid=1, block=4, stream=s)
            raise KeyError("mine")
    except KeyError as e:
        out["raised"] = str(e)
    out["trace"] = trace(s=s.handle)
    out["state"] = [g.ready, g.capturing]
    try:
        g.replay()
    except RuntimeError as e:
        out["replay"] = str(e)
    raw_add(x, 5.0, 4, grid=1, block=4, stream=s)   # the stream runs work again
    out["x"] = x.get().tolist()
    ''')
    assert out["raised"] == "'mine'"
    assert out["trace"] == ["cuStreamBeginCapture stream=s mode=1", "cuLaunchKernel function=add_scalar stream=s",
                            "cuStreamEndCapture stream=s", "cuGraphDestroy graph=#1"]
    assert out["state"] == [False, False]
    assert "discarded" in out["replay"]
    assert out["x"] == [5.0] * 4


def test_synchronising_calls_during_capture_raise_and_end_it(fake):
    out = fake('''
    x = mg.zeros(4)
    add_scalar(x, 1.0, 4, grid=1, block=4)
    host = np.zeros(4, np.float32)
    results = {}
    for name, call in [("get", lambda g: x.get()),
                       ("numpy_argument", lambda g: add_scalar(host, 1.0, 4, grid=1, block=4, stream=g.stream)),
                       ("synchronize", lambda g: g.stream.synchronize()),
                       ("legacy_work", lambda g: raw_add(mg.asarray(Foreign(x, None)), 1.0, 4, grid=1, block=4))]:
        g = mg.graph(mg.Stream())   # blocking: legacy-stream work would wait for it
        try:
            with g:
                add_scalar(x, 1.0, 4, grid=1, block=4, stream=g.stream)
                call(g)
            results[name] = "no error"
        except mg.CudaError as e:
            results[name] = [e.name, g.capturing, g.ready]
        add_scalar(x, 1.0, 4, grid=1, block=4, stream=g.stream)   # the stream is usable again
        g.stream.synchronize()
    out["results"] = results
    out["x"] = x.get().tolist()
    g = mg.graph()
    try:
        with g:
            try:
                g.stream.synchronize()
            except mg.CudaError:
                pass   # swallowed: the end of the block reports the broken capture
    except mg.CudaError as e:
        out["swallowed"] = [e.name, "discarded" in repr(g)]
    ''')
    assert out["results"] == {"get": ["CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", False, False],
                              "numpy_argument": ["CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", False, False],
                              "synchronize": ["CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", False, False],
                              "legacy_work": ["CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", False, False]}
    assert out["x"] == [5.0] * 4   # the first launch, then one per stream after its failed capture
    assert out["swallowed"] == ["CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", True]


def test_graph_state_errors(fake):
    out = fake('''
    g = mg.graph()
    try:
        g.replay()
    except RuntimeError as e:
        out["new"] = str(e)
    with g:
        try:
            g.replay()
        except RuntimeError as e:
            out["capturing"] = str(e)
    try:
        with g:
            pass
    except RuntimeError as e:
        out["twice"] = str(e)
    try:
        g.__exit__(None, None, None)
    except RuntimeError as e:
        out["exit"] = str(e)
    out["nodes"] = g.num_nodes
    ''')
    assert "not captured yet" in out["new"]
    assert "still capturing" in out["capturing"]
    assert "captures once" in out["twice"] and "captures once" in out["exit"]
    assert out["nodes"] == 0


def test_graph_ends_on_its_own_thread(fake):
    out = fake('''
    import threading
    g = mg.graph()
    g.__enter__()
    def other():
        try:
            g.__exit__(None, None, None)
        except RuntimeError as e:
            out["other"] = str(e)
    t = threading.Thread(target=other)
    t.start(); t.join()
    g.__exit__(None, None, None)
    out["ready"] = g.ready
    ''')
    assert "thread that began it" in out["other"]
    assert out["ready"]


def test_graph_keeps_captured_arrays_and_kernels_alive(fake):
    out = fake('''
    x, pinned = mg.zeros(4), mg.pinned_empty(4)
    pinned[:] = 3
    d = mg.empty(4)
    refs = [weakref.ref(x), weakref.ref(d)]
    with mg.graph() as g:
        d.copy_from_host(pinned, stream=g.stream)
        raw_add(x, 1.0, 4, grid=1, block=4, stream=g.stream)
    function = raw_add
    references = sys.getrefcount(function)
    del x, d, pinned, raw_add, module
    gc.collect()
    out["alive"] = [r() is not None for r in refs] + [sys.getrefcount(function) == references - 1]
    g.replay()
    out["x"] = refs[0]().get().tolist()
    out["d"] = refs[1]().get().tolist()
    log()
    del g
    gc.collect()
    out["freed"] = [l.split()[0] for l in log()]
    out["dead"] = [r() is None for r in refs] + [sys.getrefcount(function) == references - 2]
    ''')
    assert out["alive"] == [True, True, True]
    assert out["x"] == [1.0] * 4 and out["d"] == [3.0] * 4
    # the executable graph goes before the memory it points at
    assert out["freed"][:2] == ["cuGraphExecDestroy", "cuGraphDestroy"]
    assert sorted(out["freed"][2:]) == ["cuMemFree", "cuMemFree", "cuMemFreeHost", "cuStreamDestroy"]
    assert out["dead"] == [True, True, True]


def test_memory_freed_during_a_capture_is_freed_after_it(fake):
    out = fake('''
    x, temporary = mg.zeros(4), mg.zeros(4)
    ptr = temporary.ptr
    log()
    with mg.graph() as g:
        raw_add(x, 1.0, 4, grid=1, block=4, stream=g.stream)
        del temporary   # freeing now would break the capture
        gc.collect()
    out["trace"] = trace(t=ptr, s=g.stream.handle)
    out["ready"] = g.ready
    ''')
    assert out["trace"] == ["cuStreamCreate stream=s flags=1", "cuStreamBeginCapture stream=s mode=1",
                            "cuLaunchKernel function=add_scalar stream=s", "cuStreamEndCapture stream=s",
                            "cuMemFree ptr=t",
                            "cuGraphInstantiateWithFlags exec=#1 graph=#2 nodes=1 flags=0"]
    assert out["ready"]


def test_graph_captures_asynchronous_copies(fake):
    out = fake('''
    host, back = mg.pinned_empty(4), mg.pinned_zeros(4)
    d = mg.zeros(4)
    with mg.graph() as g:
        d.copy_from_host(host, stream=g.stream)
        raw_add(d, 1.0, 4, grid=1, block=4, stream=g.stream)
        d.copy_to_host(back, stream=g.stream, blocking=False)
    results = []
    for value in (10, 20):
        host[:] = value          # a replay reads the host buffer as it is then
        g.replay()
        g.stream.synchronize()
        results.append(back.tolist())
    out["results"] = results
    out["nodes"] = g.num_nodes
    ''')
    assert out["results"] == [[11.0] * 4, [21.0] * 4]
    assert out["nodes"] == 3


def test_a_foreign_producer_outside_the_capture_is_not_waited_for(fake):
    out = fake('''
    producer = mg.Stream()
    x = mg.zeros(4)
    foreign = Foreign(x, producer.handle)
    with mg.graph() as g:
        log()
        raw_add(foreign, 1.0, 4, grid=1, block=4, stream=g.stream)
        out["trace"] = trace(s=g.stream.handle)
    g.replay()
    out["x"] = x.get().tolist()
    ''')
    assert out["trace"] == ["cuLaunchKernel function=add_scalar stream=s"]
    assert out["x"] == [1.0] * 4


def test_a_replay_inside_another_capture_is_kept_alive_by_it(fake):
    out = fake('''
    x = mg.zeros(4)
    with mg.graph() as inner:
        raw_add(x, 1.0, 4, grid=1, block=4, stream=inner.stream)
    with mg.graph() as outer:
        inner.replay(stream=outer.stream)
        inner.replay(stream=outer.stream)
    references = sys.getrefcount(inner)
    out["retained"] = references == 3   # `inner`, getrefcount's argument, and outer
    log()
    del inner
    gc.collect()
    out["inner_alive"] = named(log(), "cuGraphExecDestroy") == []
    outer.replay()
    out["x"] = x.get().tolist()
    out["nodes"] = outer.num_nodes
    ''')
    assert out == {"retained": True, "inner_alive": True, "x": [2.0] * 4, "nodes": 2}


def test_a_graph_in_a_reference_cycle_is_collected(fake):
    out = fake('''
    class Holder:   # a CAI object the graph retains, and that refers back to the graph
        def __init__(self, array):
            self.__cuda_array_interface__ = array.__cuda_array_interface__
    holder = Holder(mg.zeros(4))
    holder.array = mg.asarray(holder)
    with mg.graph() as g:
        raw_add(holder, 1.0, 4, grid=1, block=4, stream=g.stream)
    holder.graph = g
    log()
    del g, holder
    out["before_gc"] = named(log(), "cuGraphExecDestroy")
    gc.collect()
    out["after_gc"] = [l.split()[0] for l in named(log(), "cuGraphExecDestroy", "cuGraphDestroy")]
    ''')
    assert out == {"before_gc": [], "after_gc": ["cuGraphExecDestroy", "cuGraphDestroy"]}


def test_graphs_do_not_leak(fake):
    out = fake('''
    x = mg.zeros(4)
    def cycle():
        with mg.graph() as g:
            raw_add(x, 1.0, 4, grid=1, block=4, stream=g.stream)
        g.replay()
    for _ in range(20):
        cycle()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(500):
        cycle()
    gc.collect()
    out["grown"] = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    log()
    out["x"] = x.get().tolist()
    ''')
    assert out["grown"] < 64 * 1024
    assert out["x"] == [520.0] * 4


def test_graph_on_the_cpu_backend_is_a_runtime_error():
    with current_backend("cpu"):
        with pytest.raises(RuntimeError, match="CUDA backend"):
            mg.graph()


# ---------------------------------------------------------------------------
# without a driver

NO_DRIVER_SCRIPT = """
import json
import numpy as np
import mlirgpu as mg
import mlirgpu._mlirgpu as C
out = {"backend": mg.backend()}
def attempt(name, call):
    try:
        call()
        out[name] = "no error"
    except Exception as e:
        out[name] = [type(e).__name__, getattr(e, "name", None)]
view = C.asarray(type("H", (), {"__cuda_array_interface__": {
    "shape": (4,), "typestr": "<f4", "data": (4096, False), "version": 3}})())
attempt("pinned_empty", lambda: C.pinned_empty(4))
attempt("pinned_zeros", lambda: C.pinned_zeros((2, 2)))
attempt("pinned_empty_zero_size", lambda: C.pinned_empty(0))
attempt("mg_pinned_empty", lambda: mg.pinned_empty(4))
attempt("Graph", lambda: C.Graph())
attempt("Graph_legacy", lambda: C.Graph(0))
attempt("mg_graph", lambda: mg.graph())
attempt("copy_from_host", lambda: view.copy_from_host(np.zeros(4, np.float32)))
attempt("copy_from_host_mismatch", lambda: view.copy_from_host(np.zeros(4, np.float64)))
attempt("copy_to_host_async", lambda: view.copy_to_host(np.zeros(4, np.float32), blocking=False))
attempt("get_async", lambda: view.get(blocking=False))
print(json.dumps(out))
"""


def test_no_driver_behaviour_of_the_new_functions():
    env = dict(os.environ, MLIRGPU_LIBCUDA="/nonexistent/libcuda.so.1")
    env.pop("MLIRGPU_BACKEND", None)
    import subprocess
    done = subprocess.run([sys.executable, "-W", "error", "-c", NO_DRIVER_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    no_driver = ["CudaError", "MLIRGPU_NO_DRIVER"]
    assert out == {"backend": "cpu",
                   "pinned_empty": no_driver, "pinned_zeros": no_driver,
                   "pinned_empty_zero_size": "no error",      # nothing to pin
                   "mg_pinned_empty": "no error",             # the CPU backend's: ordinary memory
                   "Graph": no_driver,                        # its own stream needs the driver
                   "Graph_legacy": ["ValueError", None],
                   "mg_graph": ["RuntimeError", None],
                   "copy_from_host": no_driver, "copy_from_host_mismatch": ["TypeError", None],
                   "copy_to_host_async": no_driver, "get_async": no_driver}


def test_exports():
    assert mg.graph is not None and mg.Graph is C.Graph is mg.cuda.Graph
    assert mg.pinned_empty.__module__ == "mlirgpu.runtime.streams"
    assert callable(mg.pinned_zeros)
