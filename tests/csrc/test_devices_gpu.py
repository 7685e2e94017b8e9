"""Two real GPUs: device scopes, arrays copied between devices, kernels
launched on the device of their arrays (mlirgpu's, torch's), and the
distributed examples. Every test is marked `multigpu`: skipped with fewer
than two GPUs."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from support.checks import PYTHON_DIR

import mlirgpu as mg

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "distributed")

N = mg.generics("N")


@mg.kernel
def axpy(a: mg.f32, X: mg.memref[N, mg.f32], Y: mg.memref[N, mg.f32]):
    i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
    if i < N:
        Y[i] = a * X[i] + Y[i]


def test_device_scopes_in_threads_do_not_meet():
    seen, barrier = {}, threading.Barrier(2)

    def work(ordinal):
        with mg.cuda.device(ordinal):
            barrier.wait()
            seen[ordinal] = (mg.cuda.current_device(), mg.zeros(4, mg.f32).device)
    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {0: (0, 0), 1: (1, 1)}
    assert mg.cuda.current_device() == 0


def test_arrays_move_between_devices():
    host = np.arange(1 << 20, dtype=np.float32)
    a = mg.to_device(host)
    with mg.cuda.device(1):
        s1 = mg.Stream()
    b = a.to(1, stream=s1)
    c = b.to(mg.cuda.Device(0))
    assert (a.device, b.device, c.device) == (0, 1, 0)
    np.testing.assert_array_equal(b.get(), host)
    np.testing.assert_array_equal(c.get(), host)
    d = mg.zeros(host.shape, mg.f32)
    d.copy_from(b)
    np.testing.assert_array_equal(d.get(), host)


def test_a_kernel_runs_on_the_device_of_its_arrays():
    n = 1 << 16
    x = np.random.rand(n).astype(np.float32)
    with mg.cuda.device(1):
        X1, Y1 = mg.to_device(x), mg.zeros(n, mg.f32)
    X0, Y0 = mg.to_device(x), mg.zeros(n, mg.f32)
    for _ in range(2):                       # a miss, then the dispatcher's hit
        axpy(2.0, X1, Y1, grid=(n + 255) // 256, block=256)
        axpy(3.0, X0, Y0, grid=(n + 255) // 256, block=256)
    assert mg.cuda.current_device() == 0
    np.testing.assert_allclose(Y1.get(), 4 * x, rtol=1e-6)
    np.testing.assert_allclose(Y0.get(), 6 * x, rtol=1e-6)
    with pytest.raises(mg.LaunchError, match="'X' on device 0; 'Y' on device 1"):
        axpy(1.0, X0, Y1, grid=1, block=256)


def test_torch_tensors_of_the_second_device():
    torch = pytest.importorskip("torch")
    n = 4096
    x = torch.rand(n, device="cuda:1")
    y = torch.zeros(n, device="cuda:1")
    for _ in range(2):
        axpy(0.5, x, y, grid=n // 256, block=256)
    torch.cuda.synchronize(1)
    assert torch.allclose(y, x)
    with pytest.raises(mg.LaunchError, match="different devices"):
        axpy(1.0, torch.zeros(n, device="cuda:0"), y, grid=n // 256, block=256)


def run_example(*command, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (PYTHON_DIR, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=EXAMPLES)


def test_two_gpus_one_process_example():
    proc = run_example(sys.executable, "two_gpus_one_process.py")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "both results match NumPy" in proc.stdout


def test_torchrun_allreduce_example():
    pytest.importorskip("torch.distributed")
    proc = run_example(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       "allreduce.py")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("matches the single-process reference") == 2, proc.stdout
