"""mg.grid.sync(): the grid-wide barrier and cooperative launches.

The PTX of the barrier (fences, the release increment, the acquire spin)
for sm_80 and sm_90a, accepted by ptxas; kernels that need it (every block
writes, the grid syncs, every block reads another block's writes; loops of
several barriers) on each backend (conftest.py's `backend`: the CPU
backend, and the GPU where there is one), including many barriers per
launch and many launches in a row, which a counter that does not reset
would fail; the CPU backend's divergence and bounds errors, its limit, and
a leak check of its cooperative launches; what a cooperative launch hands
the driver (the fake one of tests/support/fake_cuda): the cooperative attribute, the
occupancy check that refuses a grid too large before launching, and the
event that orders launches sharing the counter (none inside a graph)."""
import inspect
import os
import re
import textwrap

import numpy as np
import pytest

import mlirgpu as mg
import mlirgpu.compiler
from support.backends import current_backend
from support.checks import assert_isolated, filecheck, ptxas_accepts, toolkit_without_ptxas
from mlirgpu import _mlirgpu, block_dim, block_idx, grid_dim, thread_idx
from mlirgpu.language.grid import COUNTER

PTXAS = os.path.join(mlirgpu.compiler.CUDA_HOME, "bin", "ptxas")


def line_of(text):
    """The line of this file holding `text` (a marker comment)."""
    lines, _ = inspect.getsourcelines(inspect.getmodule(line_of))
    return next(i + 1 for i, line in enumerate(lines) if text in line and "line_of(" not in line)


# ---------------------------------------------------------------------------
# Kernels

@mg.kernel
def rotate_blocks(X: mg.memref[None, mg.i32], Y: mg.memref[None, mg.i32]):
    """Y[i] = X written by the next block over (every block's write seen after the barrier)."""
    i = block_idx.x * block_dim.x + thread_idx.x
    n = grid_dim.x * block_dim.x
    X[i] = mg.cast(i, mg.i32) * 3
    mg.grid.sync()
    Y[i] = X[(i + block_dim.x) % n]


@mg.kernel
def ring_steps(A: mg.memref[None, mg.i32], B: mg.memref[None, mg.i32], steps: mg.i32):
    """Each step: B from A one block ahead, plus 1; then A from B likewise (two barriers a step)."""
    i = block_idx.x * block_dim.x + thread_idx.x
    n = grid_dim.x * block_dim.x
    ahead = (i + block_dim.x) % n
    for _ in range(steps):
        B[i] = A[ahead] + 1
        mg.grid.sync()
        A[i] = B[ahead] + 1
        mg.grid.sync()


def ring_expected(a0, block, steps):
    """ring_steps' A after `steps` steps from `a0`."""
    return np.roll(a0, -2 * block * steps) + 2 * steps


@mg.kernel
def grid_sum(X: mg.memref[None, mg.f32], partial: mg.memref[None, mg.f32], out: mg.memref[1, mg.f32]):
    """One launch: each block's sum to `partial`, the barrier, block 0 adds them up."""
    b = block_idx.x
    total = mg.block.reduce(X[b * block_dim.x + thread_idx.x], "add")
    if thread_idx.x == 0:
        partial[b] = total
    mg.grid.sync()
    if b == 0:
        s = mg.constant(0.0, mg.f32)
        for k in range(grid_dim.x):
            s += partial[k]
        if thread_idx.x == 0:
            out[0] = s


M = mg.generics("M")


@mg.func
def publish_and_wait(X, i, value):
    X[i] = value
    mg.grid.sync()


@mg.kernel
def blocks_in_3d(X: mg.memref[M, mg.i32], Y: mg.memref[M, mg.i32], S: mg.memref[M, mg.i32]):
    """A 3-d grid of 3-d blocks, the barrier in a device function; each block's shared memory is its own."""
    block = (block_idx.z * grid_dim.y + block_idx.y) * grid_dim.x + block_idx.x
    threads = block_dim.x * block_dim.y * block_dim.z
    t = (thread_idx.z * block_dim.y + thread_idx.y) * block_dim.x + thread_idx.x
    i = block * threads + t
    mine = mg.shared.array((1,), mg.i32)
    if t == 0:
        mine[0] = mg.cast(block, mg.i32)
    publish_and_wait(X, i, mg.cast(block, mg.i32))
    n = grid_dim.x * grid_dim.y * grid_dim.z * threads
    Y[i] = X[(i + threads) % n]
    S[i] = mine[0]


@mg.kernel
def no_barrier(X: mg.memref[4, mg.f32]):
    X[thread_idx.x] = 1.0


# ---------------------------------------------------------------------------
# The IR and PTX

def test_the_counter_and_the_barrier_in_the_ir():
    text = rotate_blocks[()].ir()
    filecheck(text,
              rf'memref.global @{COUNTER} : memref<1xi32, #gpu.address_space<global>> = dense<0>',
              rf'memref.get_global @{COUNTER}',
              r'gpu.barrier',
              r'nvvm.memory.barrier <gpu>',
              r'atom.release.gpu.global.add.u32',
              r'scf.while',
              r'llvm.load .* atomic syncscope\("device"\) acquire',
              r'nvvm.memory.barrier <gpu>',
              r'gpu.barrier')


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_the_barrier_in_ptx(chip, tmp_path):
    ptx = ring_steps[()].ptx(chip=chip)
    # The counter is a zero-initialized global the launch finds by name (the driver's C has the same).
    filecheck(ptx, rf"^\.visible \.global \.align 4 \.b8 {COUNTER}\[4\];")
    # Each barrier: the block's threads (bar.sync), then in its first thread a fence, the release
    # increment, the acquire spin and a fence, then the block's threads again. LLVM lays the first
    # thread's part out of line, so the bar.syncs are counted, the rest checked in order.
    body = ptx[ptx.index(".entry ring_steps"):]
    arrive_and_wait = (r"membar\.gl;", r"atom\.release\.gpu\.global\.add\.u32", r"ld\.acquire\.gpu\.global\.b32",
                       r"membar\.gl;")
    filecheck(body, *arrive_and_wait, *arrive_and_wait)
    assert len(re.findall(r"bar\.sync\s+0;", body)) == 4
    assert body.count("atom.release.gpu.global.add.u32") == 2
    if not os.path.exists(PTXAS):
        pytest.skip(f"no ptxas at {PTXAS}")
    ptxas_accepts(ptx, chip, tmp_path)


def test_a_kernel_without_the_barrier_has_no_counter():
    assert COUNTER not in no_barrier[()].ptx(chip="sm_80")


# ---------------------------------------------------------------------------
# Runs, on each backend


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("blocks, block", [(2, 32), (8, 64), (5, 96)])
def test_every_block_sees_every_other_blocks_writes(blocks, block):
    n = blocks * block
    X, Y = mg.zeros((n,), mg.i32), mg.zeros((n,), mg.i32)
    rotate_blocks(X, Y, grid=blocks, block=block)
    np.testing.assert_array_equal(Y.get(), np.roll(np.arange(n, dtype=np.int32) * 3, -block))


@pytest.mark.usefixtures("backend")
def test_many_barriers_in_a_loop(size):
    blocks, block = size(gpu=(64, 256), cpu=(6, 64))
    steps = size(gpu=2000, cpu=50)  # 4000 barriers on the GPU: a counter that fails to reset hangs or errs
    a0 = np.arange(blocks * block, dtype=np.int32)
    A, B = mg.to_device(a0), mg.zeros((blocks * block,), mg.i32)
    ring_steps(A, B, steps, grid=blocks, block=block)
    np.testing.assert_array_equal(A.get(), ring_expected(a0, block, steps))


@pytest.mark.usefixtures("backend")
def test_launches_back_to_back(size):
    blocks, block = size(gpu=(100, 128), cpu=(4, 32))
    launches = size(gpu=200, cpu=10)
    a0 = np.arange(blocks * block, dtype=np.int32)
    A, B = mg.to_device(a0), mg.zeros((blocks * block,), mg.i32)
    for _ in range(launches):
        ring_steps(A, B, 3, grid=blocks, block=block)
    np.testing.assert_array_equal(A.get(), ring_expected(a0, block, 3 * launches))


@pytest.mark.usefixtures("backend")
def test_one_launch_sum(size):
    blocks = size(gpu=256, cpu=8)
    X = np.random.default_rng(2).random(blocks * 128, dtype=np.float32)
    partial, out = mg.zeros((blocks,), mg.f32), mg.zeros((1,), mg.f32)
    grid_sum(mg.to_device(X), partial, out, grid=blocks, block=128)
    np.testing.assert_allclose(partial.get(), X.reshape(blocks, 128).astype(np.float64).sum(1), rtol=1e-5)
    assert abs(float(out.get()[0]) - X.astype(np.float64).sum()) <= 1e-4 * X.sum()


@pytest.mark.usefixtures("backend")
def test_3d_grid_with_the_barrier_in_a_device_function():
    grid, block = (3, 2, 2), (4, 2, 4)
    threads, blocks = 32, 12
    n = threads * blocks
    X, Y, S = (mg.zeros((n,), mg.i32) for _ in range(3))
    blocks_in_3d(X, Y, S, grid=grid, block=block)
    owner = np.repeat(np.arange(blocks, dtype=np.int32), threads)
    np.testing.assert_array_equal(X.get(), owner)
    np.testing.assert_array_equal(Y.get(), np.roll(owner, -threads))
    np.testing.assert_array_equal(S.get(), owner)  # not another block's shared memory


@pytest.mark.usefixtures("backend")
def test_the_largest_grid_runs():
    spec = rotate_blocks[()]
    blocks = spec.max_cooperative_grid_blocks(256)
    assert blocks >= 1
    n = blocks * 256
    X, Y = mg.zeros((n,), mg.i32), mg.zeros((n,), mg.i32)
    spec(X, Y, grid=blocks, block=256)
    np.testing.assert_array_equal(Y.get(), np.roll(np.arange(n, dtype=np.int32) * 3, -256))


@pytest.mark.usefixtures("backend")
def test_a_grid_too_large_is_a_launch_error():
    spec = rotate_blocks[()]
    blocks = spec.max_cooperative_grid_blocks((128, 1, 1))
    n = (blocks + 1) * 128
    X, Y = mg.zeros((n,), mg.i32), mg.zeros((n,), mg.i32)
    with pytest.raises(mg.LaunchError, match=rf"mg.grid.sync\(\).* at most {blocks} blocks of \(?128"):
        spec(X, Y, grid=blocks + 1, block=128)
    assert not Y.get().any()  # nothing ran


@pytest.mark.gpu
def test_concurrent_streams_do_not_share_the_counter_wrongly():
    # Launches of one kernel on two streams: each waits for the one before (they share its counter).
    streams = [mg.Stream(), mg.Stream()]
    blocks, block = 66, 256
    a0 = np.arange(blocks * block, dtype=np.int32)
    arrays = [(mg.to_device(a0), mg.zeros((blocks * block,), mg.i32)) for _ in streams]
    for _ in range(50):
        for stream, (A, B) in zip(streams, arrays):
            ring_steps(A, B, 5, grid=blocks, block=block, stream=stream)
    for stream, (A, _) in zip(streams, arrays):
        stream.synchronize()
        np.testing.assert_array_equal(A.get(), ring_expected(a0, block, 5 * 50))


@pytest.mark.gpu
def test_the_loaded_function_says_it_is_cooperative():
    assert rotate_blocks[()].function().cooperative
    assert not no_barrier[()].function().cooperative


# ---------------------------------------------------------------------------
# The CPU backend: divergence, and its limit

@mg.kernel
def one_block_skips(X: mg.memref[None, mg.f32]):
    if block_idx.x != 1:
        mg.grid.sync()  # block 1 never gets here
    if thread_idx.x == 0:  # one thread per block: two storing one element would race
        X[block_idx.x] = 1.0


@mg.kernel
def syncthreads_against_grid_sync(X: mg.memref[None, mg.f32]):
    if thread_idx.x == 0:
        mg.syncthreads()  # thread 0 only
    else:
        mg.grid.sync()  # the others
    X[thread_idx.x] = 1.0


@mg.kernel
def shuffle_against_grid_sync(X: mg.memref[None, mg.f32]):
    v = X[thread_idx.x]
    if thread_idx.x < 16:
        v = mg.warp.shfl_xor(v, 1)  # half the warp shuffles
    else:
        mg.grid.sync()  # the other half
    X[thread_idx.x] = v


def test_a_block_that_skips_the_barrier_is_named():
    line = line_of("# block 1 never gets here")
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(one_block_skips[()], [np.zeros(3, np.float32)], grid=3, block=2)
    assert str(info.value) == (f"barrier divergence at {__file__}:{line}: thread (0, 0, 0) of block (0, 0, 0) "
                               f"waits at mg.grid.sync() on line {line}, but thread (0, 0, 0) of block (1, 0, 0) "
                               f"returned without reaching it")


def test_syncthreads_against_grid_sync_is_divergence():
    line, other = line_of("# thread 0 only"), line_of("# the others")
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(syncthreads_against_grid_sync[()], [np.zeros(4, np.float32)], grid=2, block=4)
    assert str(info.value) == (f"barrier divergence at {__file__}:{line}: thread (0, 0, 0) of block (0, 0, 0) "
                               f"waits at mg.syncthreads() on line {line}, but thread (1, 0, 0) of its block "
                               f"waits at mg.grid.sync() on line {other}")


def test_a_shuffle_against_grid_sync_is_warp_divergence():
    line, other = line_of("# half the warp shuffles"), line_of("# the other half")
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(shuffle_against_grid_sync[()], [np.zeros(32, np.float32)], grid=2, block=32)
    assert str(info.value).endswith(f"thread (16, 0, 0) of its warp waits at mg.grid.sync() on line {other}")


def test_the_cpu_backend_runs_every_block_at_once_up_to_its_limit():
    limit = _mlirgpu.CPU_MAX_COOPERATIVE_THREADS
    with current_backend("cpu"):
        assert rotate_blocks[()].max_cooperative_grid_blocks(256) == limit // 256
        assert rotate_blocks[()].max_cooperative_grid_blocks((8, 4, 2)) == limit // 64
    n = (limit // 64 + 1) * 64
    with pytest.raises(mg.LaunchError) as info:
        mg.cpu.run(rotate_blocks[()], [np.zeros(n, np.int32), np.zeros(n, np.int32)], grid=limit // 64 + 1,
                   block=64)
    assert str(info.value) == (f"launch of kernel 'rotate_blocks': it calls mg.grid.sync(), so every block of its "
                               f"grid must run at once, and the CPU backend runs at most {limit // 64} blocks of 64 "
                               f"threads at once ({limit} threads in all); the grid ({limit // 64 + 1}, 1, 1) "
                               f"has more")


@mg.kernel
def reads_past_the_end(X: mg.memref[None, mg.f32]):
    i = block_idx.x * block_dim.x + thread_idx.x
    mg.grid.sync()
    X[i] = X[i + 1]  # the last thread of the last block reads past the end


def test_a_bounds_error_names_its_block(monkeypatch):
    monkeypatch.setenv("MLIRGPU_CHECK", "bounds")
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(reads_past_the_end[()], [np.zeros(12, np.float32)], grid=3, block=4)
    assert str(info.value) == (f"out-of-bounds load from 'X' at index (12,) [shape (12,)] by thread (3, 0, 0) of "
                               f"block (2, 0, 0) at {__file__}:{line_of('# the last thread of the last block')}")


def test_the_runtime_is_usable_after_a_divergence():
    with pytest.raises(mg.KernelError):
        mg.cpu.run(one_block_skips[()], [np.zeros(3, np.float32)], grid=3, block=2)
    X, Y = np.zeros(64, np.int32), np.zeros(64, np.int32)
    mg.cpu.run(rotate_blocks[()], [X, Y], grid=4, block=16)
    np.testing.assert_array_equal(Y, np.roll(np.arange(64, dtype=np.int32) * 3, -16))


# ---------------------------------------------------------------------------
# What a cooperative launch hands the driver (the fake one)

def test_cooperative_launches_reach_the_driver(fake_libcuda, tmp_path):
    # A script file: kernels need their source, which `python -c` code has not.
    script = tmp_path / "fake_cooperative.py"
    no_ptxas = toolkit_without_ptxas(str(tmp_path))   # kernels load as PTX, which the fake reads
    script.write_text(textwrap.dedent(f"""
        import ctypes, os
        os.environ["MLIRGPU_LIBCUDA"] = {fake_libcuda!r}
        os.environ["CUDA_HOME"] = {no_ptxas!r}
        import numpy as np
        import mlirgpu as mg
        fake = ctypes.CDLL({fake_libcuda!r})
        fake.fake_log.restype = ctypes.c_char_p

        @mg.kernel
        def rotate(X: mg.memref[None, mg.i32]):
            X[mg.thread_idx.x] = 1
            mg.grid.sync()

        @mg.kernel
        def plain(X: mg.memref[None, mg.i32]):
            X[mg.thread_idx.x] = 1

        X = mg.zeros((1 << 20,), mg.i32)
        fake.fake_log_clear()
        spec = rotate[()]
        # The fake is an H100 of 132 multiprocessors holding 2048 threads each.
        assert spec.max_cooperative_grid_blocks(256) == 132 * 8, spec.max_cooperative_grid_blocks(256)
        assert spec.max_cooperative_grid_blocks(128, shared_mem=100 * 1024) == 132 * 2
        assert spec.function().cooperative and not plain[()].function().cooperative
        # Only the module that defines the counter is asked for it: a failed lookup is an
        # error to compute-sanitizer and API tracers.
        lookups = [l for l in fake.fake_log().decode().splitlines() if l.startswith("cuModuleGetGlobal")]
        assert lookups == ["cuModuleGetGlobal {COUNTER}"], lookups   # the symbol the language defines

        stream = mg.Stream()
        fake.fake_log_clear()
        rotate(X, grid=132 * 8, block=256, stream=stream)
        rotate(X, grid=7, block=256, stream=stream)
        log = fake.fake_log().decode().splitlines()
        launches = [l for l in log if l.startswith("cuLaunchKernelEx cooperative=1")]
        assert launches == ["cuLaunchKernelEx cooperative=1 grid=1056,1,1 stream=%d" % stream.handle,
                            "cuLaunchKernelEx cooperative=1 grid=7,1,1 stream=%d" % stream.handle], log
        # Each launch waits for the one before (the event recorded after it): they share the counter.
        events = [l.split()[1] for l in log if l.startswith("cuEventRecord")]
        assert len(events) == 2 and events[0] == events[1], log
        first, second = (log.index(l) for l in launches)
        waits = [i for i, l in enumerate(log) if l.startswith("cuStreamWaitEvent") and events[0] in l]
        records = [i for i, l in enumerate(log) if l.startswith("cuEventRecord")]
        assert len(waits) == 2 and waits[0] < first < records[0] < waits[1] < second < records[1], log
        # The occupancy is asked once for both launches (the same block and shared memory).
        assert sum(l.startswith("cuOccupancy") for l in log) == 1, log
        # Another Function of the same module shares the counter, and so the event.
        function = spec.function()
        again = function.module.get_function("rotate", params=function.params)
        fake.fake_log_clear()
        again(X, grid=2, block=256)
        log = fake.fake_log().decode().splitlines()
        assert [l.split()[2] for l in log if l.startswith("cuStreamWaitEvent")] == [events[0]], log

        fake.fake_log_clear()
        try:
            rotate(X, grid=132 * 8 + 1, block=256)
        except mg.LaunchError as error:
            message = str(error)
        else:
            raise AssertionError("a grid larger than the device holds at once")
        assert message == ("launch of kernel 'rotate': it calls mg.grid.sync(), so every block of its grid must be "
                           "resident on the GPU at once, and this device holds at most 1056 blocks of (256, 1, 1) "
                           "threads with 0 bytes of dynamic shared memory; the grid (1057, 1, 1) has 1057 "
                           "(max_cooperative_grid_blocks gives the limit)"), message
        assert "cuLaunch" not in fake.fake_log().decode()   # refused before launching

        # Captured into a graph: the graph's edges order its nodes, no event of the kernel's.
        rotate(X, grid=8, block=256)
        fake.fake_log_clear()
        with mg.graph() as g:
            rotate(X, grid=8, block=256, stream=g.stream)
        log = fake.fake_log().decode()
        assert "cuLaunchKernelEx cooperative=1 grid=8,1,1 stream=%d" % g.stream.handle in log, log
        assert "cuEventRecord" not in log and "cuStreamWaitEvent" not in log, log

        fake.fake_log_clear()
        plain(X, grid=4, block=256)
        log = fake.fake_log().decode()
        assert "cuLaunchKernel function=plain" in log and "cooperative" not in log and "cuEvent" not in log, log
        print("ok")
    """))
    assert_isolated(f"import runpy; runpy.run_path({str(script)!r})", "ok")


def test_cooperative_cpu_launches_do_not_leak():
    from support.leaks import MB, growth
    X, Y = np.zeros(256, np.int32), np.zeros(256, np.int32)
    limit = _mlirgpu.CPU_MAX_COOPERATIVE_THREADS

    def cooperative_cycle(i):
        mg.cpu.run(rotate_blocks[()], [X, Y], grid=8, block=32)
        with pytest.raises(mg.KernelError):
            mg.cpu.run(one_block_skips[()], [np.zeros(3, np.float32)], grid=3, block=2)
        with pytest.raises(mg.LaunchError):
            mg.cpu.run(rotate_blocks[()], [X, Y], grid=limit, block=2)
    grown = growth(cooperative_cycle, 1_000, warmup=100)
    assert grown < 8 * MB, f"{grown / MB:.1f} MB"
    np.testing.assert_array_equal(Y, np.roll(np.arange(256, dtype=np.int32) * 3, -32))
