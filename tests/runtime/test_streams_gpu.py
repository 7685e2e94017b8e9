"""Streams, events, pinned memory, asynchronous copies, foreign producers and
CUDA graphs on a GPU. What mlirgpu hands the driver is checked without one
in test_streams.py; here the GPU's results and ordering are."""
import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import block_dim, block_idx, thread_idx

pytestmark = pytest.mark.gpu

N = mg.generics("N")
BLOCK = 256
# Steps of slow_fill's dependent FMA chain: about 40 ms on an H100, long
# enough that a consumer launched right after it runs while it spins.
SPIN = 20_000_000


@mg.kernel
def slow_fill(X: mg.memref[N, mg.f32], value: mg.f32, iterations: mg.i32):
    """A slow producer: spins, then writes `value` to every element."""
    i = block_idx.x * block_dim.x + thread_idx.x
    acc = mg.constant(0.0, mg.f32)
    for _ in range(iterations):
        acc = acc * 0.5 + 1.0
    if i < N:
        X[i] = value + acc * 0.0   # keeps the loop: x * 0.0 is not folded for floats


@mg.kernel
def copy(dst: mg.memref[N, mg.f32], src: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        dst[i] = src[i]


@mg.kernel
def add_one(X: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    if i < N:
        X[i] = X[i] + 1.0


@mg.kernel
def k1(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32], C: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    C[i] = A[i] + B[i]


@mg.kernel
def k2(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32], C: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    C[i] = A[i] * B[i]


@mg.kernel
def add(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32], C: mg.memref[N, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    C[i] = A[i] + B[i]


def grid(n):
    return ((n + BLOCK - 1) // BLOCK,)


@pytest.fixture(autouse=True)
def cuda_backend():
    previous = mg.backend()
    mg.set_backend("cuda")
    yield
    mg.set_backend(previous)


class Foreign:
    """A producer's array seen only through __cuda_array_interface__ v3, naming its stream."""

    def __init__(self, array, stream):
        self.__cuda_array_interface__ = dict(array.__cuda_array_interface__, stream=stream.handle)


# ---------------------------------------------------------------------------
# pinned memory and asynchronous copies

def test_pinned_round_trip_with_asynchronous_copies():
    n = 1 << 20
    host, back = mg.pinned_empty(n), mg.pinned_zeros(n)
    host[:] = np.random.default_rng(0).random(n, dtype=np.float32)
    assert type(host.base).__name__ == "PinnedMemory"
    s = mg.Stream(non_blocking=True)
    d = mg.empty(n)
    d.copy_from_host(host, stream=s)
    add_one(d, grid=grid(n), block=BLOCK, stream=s)
    d.copy_to_host(back, stream=s, blocking=False)
    s.synchronize()
    np.testing.assert_array_equal(back, host + np.float32(1))
    np.testing.assert_array_equal(d.get(), back)


def test_asynchronous_copies_return_before_the_stream_gets_to_them():
    n = 1 << 16
    host, back = mg.pinned_empty(n), mg.pinned_empty(n)
    host[:] = 2.0
    s = mg.Stream(non_blocking=True)
    d, e = mg.zeros(n), mg.zeros(n)
    slow_fill(d, 0.0, 1, grid=grid(n), block=BLOCK)   # compiled, and the zeros in place
    mg.cuda.synchronize()
    slow_fill(d, 3.0, SPIN, grid=grid(n), block=BLOCK, stream=s)
    e.copy_from_host(host, stream=s)                 # queued behind the spinning kernel
    d.copy_to_host(back, stream=s, blocking=False)
    assert s.query() is False                        # both calls returned while it spins
    got = d.get(blocking=False)                      # ordered on d's last stream, s
    s.synchronize()
    assert (back == 3).all() and (got == 3).all() and (e.get() == 2).all()


def test_get_and_copy_to_host_wait_by_default():
    n = 1 << 16
    s = mg.Stream(non_blocking=True)
    d = mg.zeros(n)
    d.get()
    slow_fill(d, 5.0, SPIN // 4, grid=grid(n), block=BLOCK, stream=s)
    out = np.empty(n, np.float32)
    d.copy_to_host(out)          # on d's last stream, s, and waited for
    assert (out == 5).all()


# ---------------------------------------------------------------------------
# ordering between streams

def test_a_consumer_sees_the_producer_only_after_waiting():
    s1, s2 = mg.Stream(non_blocking=True), mg.Stream(non_blocking=True)   # the legacy stream orders neither
    x, y = mg.zeros(1), mg.zeros(1)
    slow_fill(x, 0.0, 1, grid=1, block=1)   # compiled and loaded before timing matters
    copy(y, x, grid=1, block=1)
    mg.cuda.synchronize()

    # Without the wait: the consumer reads right away, while the producer spins.
    consumer_done, producer_done = mg.Event(), mg.Event()
    slow_fill(x, 7.0, SPIN, grid=1, block=1, stream=s2)
    producer_done.record(s2)
    copy(y, x, grid=1, block=1, stream=s1)
    consumer_done.record(s1)
    s1.synchronize()
    s2.synchronize()
    raced = y.get()[0]
    assert x.get()[0] == 7.0
    # The producer's single thread stores x as its last act: a consumer done
    # a millisecond before the producer's end read x before that store.
    if consumer_done.elapsed_time(producer_done) > 1.0:
        assert raced == 0.0

    # With the wait: the consumer runs after the producer, whatever the timing.
    x2, y2 = mg.zeros(1 << 16), mg.zeros(1 << 16)
    x2.get()
    slow_fill(x2, 7.0, SPIN, grid=grid(1 << 16), block=BLOCK, stream=s2)
    done, producer_end, consumer_end = mg.Event(), mg.Event(), mg.Event()
    done.record(s2)
    producer_end.record(s2)
    s1.wait(done)
    copy(y2, x2, grid=grid(1 << 16), block=BLOCK, stream=s1)
    consumer_end.record(s1)
    s1.synchronize()
    assert (y2.get() == 7.0).all()
    assert producer_end.elapsed_time(consumer_end) >= 0.0   # the consumer ended after the producer


def test_the_api_snippet_runs_as_shown():
    n = 1 << 20
    g, b = grid(n), BLOCK
    rng = np.random.default_rng(1)
    A, B = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    dA, dB = mg.to_device(A), mg.to_device(B)
    dC1, dC2, dOut = mg.empty(n), mg.empty(n), mg.empty(n)
    start, end = mg.Event(), mg.Event()

    s1, s2 = mg.Stream(), mg.Stream()
    start.record(s1)
    k1(dA, dB, dC1, grid=g, block=b, stream=s1)
    k2(dA, dB, dC2, grid=g, block=b, stream=s2)
    done = mg.Event(); done.record(s2); s1.wait(done)
    add(dC1, dC2, dOut, grid=g, block=b, stream=s1)
    end.record(s1)
    s1.synchronize()
    assert start.elapsed_time(end) > 0             # milliseconds between two recorded events

    np.testing.assert_array_equal(dOut.get(), (A + B) + (A * B))


def test_elapsed_time_measures_a_slow_kernel():
    x = mg.zeros(1)
    slow_fill(x, 1.0, 1, grid=1, block=1)
    start, end = mg.Event(), mg.Event()
    start.record()
    slow_fill(x, 1.0, SPIN // 4, grid=1, block=1)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0


# ---------------------------------------------------------------------------
# foreign arrays whose producer names its stream

def test_a_launch_on_a_non_blocking_stream_waits_for_a_cai_producer():
    n = 1 << 16
    producer, consumer = mg.Stream(non_blocking=True), mg.Stream(non_blocking=True)
    x, y = mg.zeros(n), mg.zeros(n)
    copy(y, x, grid=grid(n), block=BLOCK)   # compiled, and the zeros in place
    mg.cuda.synchronize()
    for value in (9.0, 11.0):               # the dispatcher's fast path reads the CAI both times
        slow_fill(x, value, SPIN, grid=grid(n), block=BLOCK, stream=producer)
        copy(y, Foreign(x, producer), grid=grid(n), block=BLOCK, stream=consumer)   # no event of ours
        consumer.synchronize()
        assert (y.get() == value).all()


def test_a_cupy_array_from_another_stream_is_consumed_after_its_producer():
    cupy = pytest.importorskip("cupy")
    n = 1 << 16
    consumer = mg.Stream(non_blocking=True)
    y = mg.zeros(n)
    producer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        x = cupy.zeros(n, dtype=cupy.float32)
        copy(y, x, grid=grid(n), block=BLOCK, stream=producer)   # compiled before timing matters
        producer.synchronize()
        slow_fill(x, 4.0, SPIN, grid=grid(n), block=BLOCK, stream=producer)
        assert x.__cuda_array_interface__["stream"] == producer.ptr
        copy(y, x, grid=grid(n), block=BLOCK, stream=consumer)
    consumer.synchronize()
    assert (y.get() == 4.0).all()


# ---------------------------------------------------------------------------
# graphs

def test_graph_replays_give_the_result_of_every_launch():
    n = 1 << 16
    x, y = mg.zeros(n), mg.zeros(n)
    add_one(x, grid=grid(n), block=BLOCK)   # the first calls compile and load, outside the capture
    copy(y, x, grid=grid(n), block=BLOCK)
    mg.cuda.synchronize()
    with mg.graph() as g:
        add_one(x, grid=grid(n), block=BLOCK, stream=g.stream)
        add_one(x, grid=grid(n), block=BLOCK, stream=g.stream)
        copy(y, x, grid=grid(n), block=BLOCK, stream=g.stream)
    assert g.ready and g.num_nodes == 3
    assert (x.get() == 1.0).all()           # captured, not run
    for _ in range(10):
        g.replay()
    np.testing.assert_array_equal(x.get(), np.full(n, 21.0, np.float32))   # get() follows the replays' stream
    np.testing.assert_array_equal(y.get(), np.full(n, 21.0, np.float32))


def test_graph_with_copies_reads_its_host_buffer_at_each_replay():
    n = 1 << 12
    host, back = mg.pinned_empty(n), mg.pinned_zeros(n)
    d = mg.zeros(n)
    add_one(d, grid=grid(n), block=BLOCK)
    mg.cuda.synchronize()
    with mg.graph() as g:
        d.copy_from_host(host, stream=g.stream)
        add_one(d, grid=grid(n), block=BLOCK, stream=g.stream)
        d.copy_to_host(back, stream=g.stream, blocking=False)
    for value in (10.0, 20.0, 30.0):
        host[:] = np.arange(n, dtype=np.float32) * value
        g.replay()
        g.stream.synchronize()
        np.testing.assert_array_equal(back, np.arange(n, dtype=np.float32) * value + 1)


def test_graph_replays_on_another_stream():
    n = 1024
    x = mg.zeros(n)
    add_one(x, grid=grid(n), block=BLOCK)
    s = mg.Stream(non_blocking=True)
    with mg.graph(s) as g:
        add_one(x, grid=grid(n), block=BLOCK, stream=s)
    other = mg.Stream()
    g.replay(stream=other)
    g.replay(stream=other)
    other.synchronize()
    assert (x.get() == 3.0).all()


def test_a_synchronising_call_in_a_capture_raises_and_leaves_the_stream_usable():
    n = 1024
    x = mg.zeros(n)
    add_one(x, grid=grid(n), block=BLOCK)
    mg.cuda.synchronize()
    g = mg.graph()
    with pytest.raises(mg.CudaError):
        with g:
            add_one(x, grid=grid(n), block=BLOCK, stream=g.stream)
            x.get()                          # copies on the capturing stream and waits: refused
    assert not g.ready and not g.capturing
    with pytest.raises(RuntimeError):
        g.replay()
    add_one(x, grid=grid(n), block=BLOCK, stream=g.stream)   # the stream runs work again
    g.stream.synchronize()
    assert (x.get() == 2.0).all()


def test_an_exception_in_the_block_propagates_and_the_stream_stays_usable():
    n = 1024
    x = mg.zeros(n)
    add_one(x, grid=grid(n), block=BLOCK)
    mg.cuda.synchronize()                  # g.stream is non-blocking: nothing orders it after that launch
    g = mg.graph()
    with pytest.raises(ZeroDivisionError):
        with g:
            add_one(x, grid=grid(n), block=BLOCK, stream=g.stream)
            1 / 0
    assert not g.ready
    add_one(x, grid=grid(n), block=BLOCK, stream=g.stream)
    g.stream.synchronize()
    assert (x.get() == 2.0).all()


def test_the_legacy_stream_cannot_be_captured():
    for stream in (None, 0, mg.cuda.default_stream):
        with pytest.raises(ValueError, match="legacy default stream"):
            mg.graph(stream)


@pytest.mark.device_memory
def test_graphs_do_not_leak_device_memory():
    device = mg.cuda.Device(0)
    n = 1 << 20

    def cycle():
        x = mg.zeros(n)
        with mg.graph() as g:
            add_one(x, grid=grid(n), block=BLOCK, stream=g.stream)
        g.replay()
        g.stream.synchronize()

    cycle()
    device.synchronize()
    free_before = device.mem_info()[0]
    for _ in range(200):
        cycle()
    device.synchronize()
    assert abs(device.mem_info()[0] - free_before) <= 8 << 20
