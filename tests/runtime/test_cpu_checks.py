"""The CPU backend's checks of a kernel's mistakes (docs/cpu_backend.md): what
would kill the process, hang it, or silently give wrong results on a GPU is a
KernelError naming the thread and the line. Each kernel runs in a fresh
interpreter where a regression would kill or hang it."""
import pytest

from support.checks import assert_isolated

PRELUDE = """
import numpy as np
import mlirgpu as mg
from mlirgpu import block_idx, thread_idx
mg.set_backend("cpu")
N = mg.generics("N")

def at(marker):  # "<this file>:<line>" of the line that ends with "# marker"
    with open(__file__) as f:
        return next(f"{__file__}:{n}" for n, line in enumerate(f, 1) if line.rstrip().endswith("# " + marker))

def expect_kernel_error(launch, *parts):
    try:
        launch()
    except mg.KernelError as error:
        text = str(error)
        missing = [p for p in parts if p not in text]
        print("KernelError" if not missing else f"missing {missing} in {text}")
    else:
        print("no error")
"""


NUMPY = {"i32": "int32", "u32": "uint32", "i64": "int64"}


@pytest.mark.parametrize("dtype, numerator, divisor, operator, what", [
    ("i32", 7, 0, "//", "division by zero"),
    ("u32", 7, 0, "%", "division by zero"),
    ("i64", -2 ** 63, -1, "//", "division overflow"),
    ("i32", -2 ** 31, -1, "%", "division overflow"),
])
def test_integer_division_fault_is_a_kernel_error(dtype, numerator, divisor, operator, what):
    assert_isolated(PRELUDE + f"""
@mg.kernel
def divide(x: mg.memref[N, mg.{dtype}], d: mg.memref[N, mg.{dtype}], y: mg.memref[N, mg.{dtype}]):
    i = thread_idx.x
    y[i] = x[i] {operator} d[i]                      # division

x = np.full(32, {numerator}, np.{NUMPY[dtype]})
d = np.ones(32, x.dtype)
d[5] = {divisor}
expect_kernel_error(lambda: divide(x, d, np.zeros_like(x), grid=1, block=32),
                    "{what}", "thread (5, 0, 0) of block (0, 0, 0)", at("division"))
d[5] = 1
y = np.zeros_like(x)
divide(x, d, y, grid=1, block=32)                    # the interpreter goes on
print("then", y[5] == x[5] {operator} 1)
""", "KernelError\nthen True")


INTERRUPT = """
import os, signal, threading

# Python's own Ctrl-C handler, as in an interpreter started from a terminal: a parent
# (a background job of a non-interactive shell) may have left SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)

def interrupted(call):  # Ctrl-C half a second into call(): KeyboardInterrupt, or what it returned
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        return call()
    except KeyboardInterrupt:
        return "KeyboardInterrupt"
"""


@pytest.mark.parametrize("loop", [
    "while n >= 0:\n        n = n + 1",
    "while n >= 0:\n        n = n + 1\n        mg.syncthreads()",
    "for k in range(1 << 62):\n        n = n + mg.cast(k, mg.i64)",
])
def test_ctrl_c_stops_a_kernel_that_never_finishes(loop):
    assert_isolated(PRELUDE + INTERRUPT + f"""
@mg.kernel
def spin(x: mg.memref[N, mg.i64]):
    i = thread_idx.x
    n = x[i]
    {loop}
    x[i] = n

@mg.kernel
def iota(x: mg.memref[N, mg.i64]):
    x[thread_idx.x] = mg.cast(thread_idx.x, mg.i64)

print(interrupted(lambda: spin(np.zeros(64, np.int64), grid=2, block=32)))
x = np.zeros(32, np.int64)
iota(x, grid=1, block=32)                            # the interpreter goes on
print("then", x[31])
""", "KeyboardInterrupt\nthen 31")


@pytest.mark.parametrize("loop", ["""
  %r = scf.while (%i = %n) : (i64) -> i64 {
    %more = arith.cmpi sge, %i, %c0 : i64
    scf.condition(%more) %i : i64
  } do {
  ^bb0(%i: i64):
    %next = arith.addi %i, %c1 : i64
    scf.yield %next : i64
  }
  return %r : i64""", """
  cf.br ^loop(%n : i64)
^loop(%i: i64):
  %more = arith.cmpi sge, %i, %c0 : i64
  %next = arith.addi %i, %c1 : i64
  cf.cond_br %more, ^loop(%next : i64), ^done(%i : i64)
^done(%r: i64):
  return %r : i64"""], ids=["scf.while", "cf.br"])
def test_ctrl_c_stops_a_host_program_that_loops(loop):
    assert_isolated(INTERRUPT + f"""
import mlirgpu as mg
program = mg.HostProgram('''
func.func @spin(%n: i64) -> i64 {{
  %c1 = arith.constant 1 : i64
  %c0 = arith.constant 0 : i64{loop}
}}''')
print(interrupted(lambda: program("spin", 0)))
print("then", program("spin", -3))
""", "KeyboardInterrupt\nthen -3")


# ---------------------------------------------------------------------------
# The GPU's limits, in this process (nothing here can crash)

import numpy as np  # noqa: E402

import mlirgpu as mg  # noqa: E402
from mlirgpu import block_idx, thread_idx  # noqa: E402

M = mg.generics("M")


@mg.kernel
def iota(x: mg.memref[M, mg.i32]):
    x[thread_idx.x] = mg.cast(thread_idx.x, mg.i32)


@pytest.mark.parametrize("grid, block, shared_mem, why", [
    ((1, 65536), 32, 0, "grid[1] = 65536: at most 65535"),
    (1, (1, 1, 65), 0, "block[2] = 65: at most 64"),
    (1, (64, 32), 0, "the block has 2048 threads: at most 1024"),
    (1, 32, 227 * 1024 + 1, "0 bytes of static and 232449 of dynamic shared memory: a block has at most 232448"),
])
def test_a_launch_past_the_gpus_limits_is_refused(monkeypatch, grid, block, shared_mem, why):
    monkeypatch.delenv("MLIRGPU_CPU_CHIP", raising=False)
    with pytest.raises(mg.LaunchError) as error:
        mg.cpu.run(iota[32], [np.zeros(32, np.int32)], grid=grid, block=block, shared_mem=shared_mem)
    assert str(error.value).startswith("launch of kernel 'iota' with grid=")
    assert f"{why} on sm_90a (where cuLaunchKernel fails with CUDA_ERROR_INVALID_VALUE)" in str(error.value)


def test_shared_memory_limit_is_the_named_chips(monkeypatch):
    x = np.zeros(32, np.int32)
    mg.cpu.run(iota[32], [x], grid=1, block=32, shared_mem=100 * 1024)
    monkeypatch.setenv("MLIRGPU_CPU_CHIP", "sm_89")
    with pytest.raises(mg.LaunchError, match="a block has at most 101376 on sm_89"):
        mg.cpu.run(iota[32], [x], grid=1, block=32, shared_mem=100 * 1024)
    monkeypatch.setenv("MLIRGPU_CPU_CHIP", "sm_42")
    with pytest.raises(ValueError, match="MLIRGPU_CPU_CHIP: unknown chip 'sm_42'"):
        mg.cpu.run(iota[32], [x], grid=1, block=32)


def test_wgmma_needs_whole_warpgroups():
    from test_cpu_hopper import wgmma_kernel
    from mlirgpu.layout import wgmma as wgmma_layout
    tile = wgmma_layout.tile_layout((64, 64), 2, "128B")
    with pytest.raises(mg.LaunchError, match=r"wgmma, which takes whole warpgroups of 128 threads, but the "
                                             r"block \(96, 1, 1\) has 96 threads"):
        mg.cpu.run(wgmma_kernel(tile, tile, "K")[()], [np.zeros(2 * 64 * 64, np.float16),
                                                       np.zeros((64, 64), np.float32)],
                   grid=1, block=96, shared_mem=2 * 64 * 64 * 2 + 1024)


# ---------------------------------------------------------------------------
# Races (on by default) and reads of uninitialized shared memory (asked for)

def line_of(marker):
    """The line of this file whose comment ends with `marker`."""
    with open(__file__) as f:
        return next(n for n, text in enumerate(f, 1) if "# " in text and text.rstrip().endswith(marker))


@mg.kernel
def neighbour_without_barrier(x: mg.memref[M, mg.f32]):
    s = mg.shared.array((32,), mg.f32)
    t = thread_idx.x
    s[t] = x[t]                                          # each thread writes its own
    x[t] = s[(t + 1) % 32]                               # and reads its neighbour's, unsynchronized


@mg.kernel
def neighbour_with_barrier(x: mg.memref[M, mg.f32]):
    s = mg.shared.array((32,), mg.f32)
    t = thread_idx.x
    s[t] = x[t]
    mg.syncthreads()
    x[t] = s[(t + 1) % 32]


@mg.kernel
def everyone_writes_one(x: mg.memref[M, mg.f32]):
    s = mg.shared.array((1,), mg.f32)
    s[0] = x[thread_idx.x]                               # every thread, the same element
    mg.syncthreads()
    x[thread_idx.x] = s[0]


@mg.kernel
def other_warp_after_a_shuffle(x: mg.memref[M, mg.f32]):
    s = mg.shared.array((32,), mg.f32)
    t = thread_idx.x
    if t < 32:
        s[t] = x[t]                                      # warp 0 writes
    y = mg.warp.shfl_xor(x[t], 1)                        # each warp's shuffle orders its own lanes only
    if t >= 32:
        x[t] = s[t - 32] + y                             # warp 1 reads warp 0's writes with no barrier


@mg.kernel
def reads_past_what_was_written(x: mg.memref[M, mg.f32]):
    s = mg.shared.array((64,), mg.f32)
    t = thread_idx.x
    s[t] = x[t]
    mg.syncthreads()
    x[t] = s[t + 32]                                     # the upper half, never written


def test_a_read_of_a_neighbours_write_without_a_barrier_is_a_race(monkeypatch):
    monkeypatch.setenv("MLIRGPU_CHECK", "bounds,races,uninitialized")  # a race, though the read came first
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(neighbour_without_barrier[32], [x], grid=1, block=32)
    text = str(info.value)
    assert text.startswith(f"data race on shared memory at {__file__}:{line_of('each thread writes its own')}: "
                           f"thread (1, 0, 0) of block (0, 0, 0) writes byte 4 of its block's shared memory")
    assert f"which thread (0, 0, 0) of block (0, 0, 0) read at {__file__}:{line_of('unsynchronized')}" in text
    assert "shared address 0x" in text


def test_two_writes_of_one_address_between_barriers_are_a_race():
    with pytest.raises(mg.KernelError, match=r"data race on shared memory at .*:%d: thread \(1, 0, 0\) of block "
                       r"\(0, 0, 0\) writes byte 0 .* which thread \(0, 0, 0\) of block \(0, 0, 0\) wrote"
                       % line_of("every thread, the same element")):
        mg.cpu.run(everyone_writes_one[32], [np.zeros(32, np.float32)], grid=1, block=32)


def test_a_barrier_between_write_and_read_is_no_race():
    x = np.arange(32, dtype=np.float32)
    mg.cpu.run(neighbour_with_barrier[32], [x], grid=1, block=32)
    np.testing.assert_array_equal(x, np.roll(np.arange(32, dtype=np.float32), -1))


def test_a_warp_collective_orders_only_its_own_warps_accesses():
    # Tensor-core kernels run a collective (mma.sync, ldmatrix) between most accesses: one warp's must
    # not hide another warp's read of shared memory that no barrier separates from its write.
    with pytest.raises(mg.KernelError, match=r"data race on shared memory at .*:%d: thread \(32, 0, 0\) of block "
                       r"\(0, 0, 0\) reads byte 0 .* which thread \(0, 0, 0\) of block \(0, 0, 0\) wrote at .*:%d"
                       % (line_of("with no barrier"), line_of("warp 0 writes"))):
        mg.cpu.run(other_warp_after_a_shuffle[64], [np.arange(64, dtype=np.float32)], grid=1, block=64)


def test_a_read_of_shared_memory_no_thread_wrote_is_an_error(monkeypatch):
    monkeypatch.setenv("MLIRGPU_CHECK", "bounds,races,uninitialized")
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(reads_past_what_was_written[32], [np.zeros(32, np.float32)], grid=1, block=32)
    assert str(info.value).startswith(
        f"read of uninitialized shared memory at {__file__}:{line_of('never written')}: thread (0, 0, 0) of block "
        f"(0, 0, 0) reads byte 128 of its block's shared memory")


@pytest.mark.parametrize("checks, error", [
    ("", "data race"),
    ("bounds", None),
    ("bounds,races", "data race"),
    ("uninitialized", "read of uninitialized shared memory"),
    ("none", None),
])
def test_each_check_has_its_switch(monkeypatch, checks, error):
    monkeypatch.setenv("MLIRGPU_CHECK", checks)
    x = np.zeros(32, np.float32)
    if error is None:
        mg.cpu.run(neighbour_without_barrier[32], [x], grid=1, block=32)
    else:
        with pytest.raises(mg.KernelError, match=error):
            mg.cpu.run(neighbour_without_barrier[32], [x], grid=1, block=32)


@mg.kernel
def rotate_in_place(x: mg.memref[M, mg.f32]):
    t = thread_idx.x
    right = x[(t + 1) % 32]                              # each thread reads its neighbour's element
    x[t] = right                                         # and writes its own, unsynchronized


@mg.kernel
def rotate_in_place_with_barrier(x: mg.memref[M, mg.f32]):
    t = thread_idx.x
    right = x[(t + 1) % 32]
    mg.syncthreads()
    x[t] = right


@mg.kernel
def everyone_adds_to_one(x: mg.memref[M, mg.f32]):
    mg.atomic.add(x, 0, 1.0)


@mg.kernel
def everyone_reads_one(x: mg.memref[M, mg.f32], y: mg.memref[M, mg.f32]):
    y[thread_idx.x] = x[0]


@mg.kernel
def each_block_writes_one(x: mg.memref[M, mg.f32]):
    if thread_idx.x == 0:
        x[0] = mg.cast(block_idx.x, mg.f32)


@mg.kernel
def each_block_writes_one_at_once(x: mg.memref[M, mg.f32]):
    if thread_idx.x == 0:
        x[0] = mg.cast(block_idx.x, mg.f32)              # the blocks run interleaved: a cooperative launch
    mg.grid.sync()


@mg.kernel
def global_other_warp_after_a_shuffle(x: mg.memref[M, mg.f32]):
    t = thread_idx.x
    if t < 32:
        x[t] = 1.0                                       # warp 0 writes global memory
    y = mg.warp.shfl_xor(mg.cast(t, mg.f32), 1)          # each warp's shuffle orders its own lanes only
    if t >= 32:
        x[t] = x[t - 32] + y                             # warp 1 reads it with no barrier


@mg.kernel
def own_warp_after_a_shuffle(x: mg.memref[M, mg.f32], y: mg.memref[M, mg.f32]):
    t = thread_idx.x
    x[t] = mg.cast(t, mg.f32)
    z = mg.warp.shfl_xor(x[t], 1)
    y[t] = x[t ^ 1] + z                                  # the other lane's write, ordered by the shuffle


def test_a_write_of_an_element_a_neighbour_read_without_a_barrier_is_a_race():
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(mg.KernelError) as info:
        mg.cpu.run(rotate_in_place[32], [x], grid=1, block=32)
    text = str(info.value)
    write, read = line_of("writes its own, unsynchronized"), line_of("reads its neighbour's element")
    assert text.startswith(f"data race on global memory at {__file__}:{write}: thread (1, 0, 0) of block (0, 0, 0) "
                           f"writes element 1 of 'x' (address {hex(x.ctypes.data + 4)}), which thread (0, 0, 0) of "
                           f"block (0, 0, 0) read at {__file__}:{read}, with no barrier between them"), text


def test_a_barrier_between_global_read_and_write_is_no_race():
    x = np.arange(32, dtype=np.float32)
    mg.cpu.run(rotate_in_place_with_barrier[32], [x], grid=1, block=32)
    np.testing.assert_array_equal(x, np.roll(np.arange(32, dtype=np.float32), -1))


def test_atomics_and_reads_of_one_element_are_no_race():
    x = np.zeros(32, np.float32)
    mg.cpu.run(everyone_adds_to_one[32], [x], grid=1, block=32)
    assert x[0] == 32
    y = np.zeros(32, np.float32)
    mg.cpu.run(everyone_reads_one[32], [x, y], grid=1, block=32)
    np.testing.assert_array_equal(y, np.full(32, 32, np.float32))


@pytest.mark.parametrize("kernel", [each_block_writes_one, each_block_writes_one_at_once])
def test_blocks_writing_one_element_are_no_race_of_a_block(kernel):
    # Two blocks are unordered on a GPU too, but the check is of the threads of one block.
    x = np.zeros(32, np.float32)
    mg.cpu.run(kernel[32], [x], grid=4, block=32)
    assert x[0] in (0, 1, 2, 3)


def test_a_warp_collective_orders_only_its_own_warps_global_accesses():
    with pytest.raises(mg.KernelError, match=r"data race on global memory at .*:%d: thread \(32, 0, 0\) of block "
                       r"\(0, 0, 0\) reads element 0 of 'x' .* which thread \(0, 0, 0\) of block \(0, 0, 0\) wrote "
                       r"at .*:%d" % (line_of("reads it with no barrier"), line_of("warp 0 writes global memory"))):
        mg.cpu.run(global_other_warp_after_a_shuffle[64], [np.zeros(64, np.float32)], grid=1, block=64)
    x, y = np.zeros(64, np.float32), np.zeros(64, np.float32)
    mg.cpu.run(own_warp_after_a_shuffle[64], [x, y], grid=1, block=64)
    np.testing.assert_array_equal(y, 2 * (np.arange(64) ^ 1).astype(np.float32))


@pytest.mark.parametrize("checks, race", [("", True), ("races", True), ("bounds", False), ("none", False)])
def test_the_global_race_check_is_the_races_switch(monkeypatch, checks, race):
    monkeypatch.setenv("MLIRGPU_CHECK", checks)
    x = np.arange(32, dtype=np.float32)
    if race:
        with pytest.raises(mg.KernelError, match="data race on global memory"):
            mg.cpu.run(rotate_in_place[32], [x], grid=1, block=32)
    else:
        mg.cpu.run(rotate_in_place[32], [x], grid=1, block=32)


def test_the_global_race_check_reads_a_read_only_array():
    # The check takes the addresses a kernel reads: that is no store, and a read-only input is still taken.
    x = np.arange(32, dtype=np.float32)
    x.flags.writeable = False
    y = np.zeros(32, np.float32)
    mg.cpu.run(everyone_reads_one[32], [x, y], grid=1, block=32)
    np.testing.assert_array_equal(y, np.zeros(32, np.float32))


def test_an_unknown_check_is_a_value_error(monkeypatch):
    monkeypatch.setenv("MLIRGPU_CHECK", "bounds,race")
    with pytest.raises(ValueError, match="unknown check 'race' .known: bounds, races, uninitialized, none"):
        mg.cpu.run(iota[32], [np.zeros(32, np.int32)], grid=1, block=32)


# ---------------------------------------------------------------------------
# Deadlocks name every line threads are blocked on

@mg.kernel
def half_a_warpgroup_at_a_named_barrier(x: mg.memref[M, mg.f32]):
    if thread_idx.x < 64:
        mg.warpgroup.barrier(1)                          # 128 expected, 64 come
    x[thread_idx.x] = 1.0


@mg.kernel
def one_waits_for_a_phase_the_rest_at_a_barrier(x: mg.memref[M, mg.f32]):
    bars = mg.mbarrier.array(1)
    if thread_idx.x == 0:
        bars.init(0, 1)
    mg.syncthreads()
    if thread_idx.x == 0:
        bars.wait(0, 0)                                  # nobody arrives
    mg.syncthreads()                                     # the others wait here
    x[thread_idx.x] = 1.0


def test_a_named_barrier_that_cannot_complete_is_a_deadlock():
    line = line_of("128 expected, 64 come")
    with pytest.raises(mg.KernelError, match=rf"deadlock at .*:{line}: thread \(0, 0, 0\) of block \(0, 0, 0\) "
                       rf"waits on line {line} for a named barrier .*; blocked: 64 threads on line {line} "
                       rf"\(the first thread \(0, 0, 0\) of block \(0, 0, 0\)\)$"):
        mg.cpu.run(half_a_warpgroup_at_a_named_barrier[128], [np.zeros(128, np.float32)], grid=1, block=128)


def test_a_deadlock_names_each_line_threads_wait_on():
    wait, barrier = line_of("nobody arrives"), line_of("the others wait here")
    with pytest.raises(mg.KernelError, match=rf"deadlock at .*:{wait}: .* for an mbarrier phase .*; blocked: "
                       rf"1 thread on line {wait} \(the first thread \(0, 0, 0\) of block \(0, 0, 0\)\), "
                       rf"31 threads on line {barrier} \(the first thread \(1, 0, 0\) of block \(0, 0, 0\)\)$"):
        mg.cpu.run(one_waits_for_a_phase_the_rest_at_a_barrier[32], [np.zeros(32, np.float32)], grid=1, block=32)
