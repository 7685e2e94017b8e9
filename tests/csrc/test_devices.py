"""Several devices without a GPU: the fake driver of tests/support/fake_cuda with two
devices (FAKE_CUDA_DEVICES=2), each with its own primary context. What the
launch, the copies and the scopes hand the driver is read from its call log.
The same on two real GPUs: test_devices_gpu.py (marked multigpu)."""
import textwrap

import pytest
from support.checks import run_on_fake

import mlirgpu as mg

# The script's prelude, after run_on_fake's.
PRELUDE = '''
import threading

def log(*names):
    """The driver calls since the last log(), those named if any."""
    lines = _fake.fake_log().decode().splitlines()
    _fake.fake_log_clear()
    return [line for line in lines if not names or line.split()[0] in names]

N = mg.generics("N")

@mg.kernel
def add_scalar(X: mg.memref[N, mg.f32], v: mg.f32, n: mg.u32):
    X[mg.thread_idx.x] = X[mg.thread_idx.x] + v

@mg.kernel
def add3(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32], C: mg.memref[N, mg.f32], n: mg.u32):
    C[mg.thread_idx.x] = A[mg.thread_idx.x] + B[mg.thread_idx.x]

'''


@pytest.fixture
def fake(fake_libcuda, tmp_path):
    """fake(body, peer="1"): runs `body` after PRELUDE in a fresh interpreter
    on a two-device fake driver (run_on_fake); returns its `out` dict."""
    def run(body, peer="1"):
        return run_on_fake(fake_libcuda, tmp_path, PRELUDE + textwrap.dedent(body),
                           {"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_PEER": peer})
    return run


def test_device_scope_is_per_thread_and_restores_the_previous_device(fake):
    out = fake('''
    out["count"] = mg.cuda.device_count()
    with mg.cuda.device(1) as d:
        out["inside"] = [mg.cuda.current_device(), repr(d)]
        seen = []
        t = threading.Thread(target=lambda: seen.append(mg.cuda.current_device()))
        t.start(); t.join()
        out["other_thread"] = seen[0]
        with mg.cuda.device(mg.cuda.Device(0)):
            out["nested"] = mg.cuda.current_device()
        out["after_nested"] = mg.cuda.current_device()
    out["after"] = mg.cuda.current_device()
    try:
        with mg.cuda.device(1):
            raise KeyError("boom")
    except KeyError:
        out["after_error"] = mg.cuda.current_device()
    for bad in (2, -1, "1", True):
        try:
            with mg.cuda.device(bad):
                pass
        except (ValueError, TypeError) as e:
            out[repr(bad)] = type(e).__name__ + ": " + str(e)
    ''')
    assert out["count"] == 2
    assert out["inside"] == [1, "mlirgpu.cuda.Device(1)"] and out["other_thread"] == 0
    assert out["nested"] == 0 and out["after_nested"] == 1
    assert out["after"] == 0 and out["after_error"] == 0
    assert out["2"] == "ValueError: device 2 does not exist: there are 2"
    assert out["-1"].startswith("ValueError") and out["'1'"].startswith("TypeError")
    assert out["True"].startswith("TypeError")


def test_arrays_streams_and_events_belong_to_the_device_they_were_made_on(fake):
    out = fake('''
    a = mg.zeros(4, mg.f32)
    with mg.cuda.device(1):
        b = mg.to_device(np.arange(4, dtype=np.float32))
        s, e = mg.Stream(), mg.Event()
    out["devices"] = [a.device, b.device, s.device, e.device]
    out["dlpack"] = list(b.__dlpack_device__())
    out["repr"] = repr(b)
    ''')
    assert out["devices"] == [0, 1, 1, 1]
    assert out["dlpack"] == [2, 1]                       # kDLCUDA, device 1
    assert out["repr"].endswith("device=1)")


@pytest.mark.parametrize("peer", ["1", "0"])
def test_to_copies_between_devices_peer_to_peer_where_allowed(fake, peer):
    out = fake('''
    a = mg.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    log()
    b = a.to(1)
    out["log"] = log("cuCtxEnablePeerAccess", "cuMemcpyPeerAsync")
    out["b"] = [b.device, list(b.shape), b.get().tolist()]
    out["same"] = a.to(0) is a and b.to(mg.cuda.Device(1)) is b
    c = b.to(0)
    out["back"] = [c.device, c.get().tolist()]
    out["second_log"] = [l.split()[0] for l in log("cuCtxEnablePeerAccess", "cuMemcpyPeerAsync")]
    d = mg.zeros((2, 3), mg.f32)
    d.copy_from(b)
    out["copy_from"] = d.get().tolist()
    with mg.cuda.device(1):
        s1 = mg.Stream()
    for name, call in (("wrong_stream", lambda: a.to(1, stream=mg.Stream())),
                       ("bad_device", lambda: a.to(5)),
                       ("copy_from_wrong_stream", lambda: d.copy_from(b, stream=s1))):
        try:
            call()
        except (ValueError, TypeError) as e:
            out[name] = type(e).__name__ + ": " + str(e)
    ''', peer=peer)
    expected = [[0, 1, 2], [3, 4, 5]]
    assert out["b"] == [1, [2, 3], expected] and out["same"]
    assert out["back"] == [0, expected] and out["copy_from"] == expected
    copy = [line for line in out["log"] if line.startswith("cuMemcpyPeerAsync")]
    assert len(copy) == 1 and "dst_device=1" in copy[0] and "src_device=0" in copy[0] and "bytes=24" in copy[0]
    enabled = [line for line in out["log"] if line.startswith("cuCtxEnablePeerAccess")]
    # enabled once per pair of devices, and only where the devices can reach each other
    assert enabled == (["cuCtxEnablePeerAccess device=1 peer=0"] if peer == "1" else [])
    assert out["second_log"] == (["cuCtxEnablePeerAccess", "cuMemcpyPeerAsync"] if peer == "1"
                                 else ["cuMemcpyPeerAsync"])
    assert out["wrong_stream"] == "ValueError: to: the stream belongs to device 0, the copy runs on device 1"
    assert out["bad_device"] == "ValueError: device 5 does not exist: there are 2"
    assert out["copy_from_wrong_stream"].startswith("ValueError: copy_from: the stream belongs to device 1")


def test_a_kernel_launch_runs_on_the_device_of_its_arrays(fake):
    out = fake('''
    with mg.cuda.device(1):
        x1 = mg.zeros(4, mg.f32)
    x0 = mg.zeros(4, mg.f32)
    log()
    add_scalar(x1, 2.0, 4, grid=1, block=4)              # from device 0: loaded and run on device 1
    add_scalar(x1, 2.0, 4, grid=1, block=4)              # the dispatcher's hit
    out["launches"] = log("cuLaunchKernel", "cuModuleLoad")
    out["x1"] = x1.get().tolist()
    out["thread_device"] = mg.cuda.current_device()
    add_scalar(x0, 1.0, 4, grid=1, block=4)
    out["device0"] = log("cuLaunchKernel", "cuModuleLoad")
    try:
        add3(x0, x1, x0, 4, grid=1, block=4)
    except mg.LaunchError as e:
        out["mixed"] = str(e)
    ''')
    load, *launches = out["launches"]
    assert load.startswith("cuModuleLoad")
    assert launches == ["cuLaunchKernel function=add_scalar stream=0 device=1"] * 2
    assert out["x1"] == [4.0] * 4 and out["thread_device"] == 0
    assert out["device0"][0].startswith("cuModuleLoad")   # device 0's context loads its own module
    assert out["device0"][1:] == ["cuLaunchKernel function=add_scalar stream=0"]
    assert "live on different devices" in out["mixed"]
    assert "'A', 'C' on device 0; 'B' on device 1" in out["mixed"]


def test_a_function_refuses_arrays_and_streams_of_another_device(fake):
    out = fake('''
    with mg.cuda.device(1):
        module = C.load_module(".visible .entry add_scalar(\\n")
        s1 = mg.Stream()
        x1 = mg.zeros(4, mg.f32)
    f = module.get_function("add_scalar", params=["ptr", C.f32, C.u32])
    x0 = mg.zeros(4, mg.f32)
    f(x1, 1.0, 4, grid=1, block=4, stream=s1)
    out["x1"] = x1.get().tolist()
    for name, call in (("array", lambda: f(x0, 1.0, 4, grid=1, block=4)),
                       ("stream", lambda: f(x1, 1.0, 4, grid=1, block=4, stream=mg.Stream()))):
        try:
            call()
        except mg.LaunchError as e:
            out[name] = str(e)
    ''')
    assert out["x1"] == [1.0] * 4
    assert "argument 0 is an array on device 0, the kernel is loaded on device 1" in out["array"]
    assert "the stream belongs to device 0, the kernel is loaded on device 1" in out["stream"]


def test_device_scope_without_a_driver_raises_and_leaves_the_device_alone():
    if mg.cuda.is_available():
        pytest.skip("a driver is present")
    before = mg.cuda.current_device()
    with pytest.raises(mg.CudaError):
        with mg.cuda.device(0):
            pass
    assert mg.cuda.current_device() == before

