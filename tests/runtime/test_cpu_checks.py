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


def test_ctrl_c_stops_a_host_program_that_loops():
    assert_isolated(INTERRUPT + """
import mlirgpu as mg
program = mg.HostProgram('''
func.func @spin(%n: i64) -> i64 {
  %c1 = arith.constant 1 : i64
  %c0 = arith.constant 0 : i64
  %r = scf.while (%i = %n) : (i64) -> i64 {
    %more = arith.cmpi sge, %i, %c0 : i64
    scf.condition(%more) %i : i64
  } do {
  ^bb0(%i: i64):
    %next = arith.addi %i, %c1 : i64
    scf.yield %next : i64
  }
  return %r : i64
}''')
print(interrupted(lambda: program("spin", 0)))
print("then", program("spin", -3))
""", "KeyboardInterrupt\nthen -3")


# ---------------------------------------------------------------------------
# The GPU's limits, in this process (nothing here can crash)

import numpy as np  # noqa: E402

import mlirgpu as mg  # noqa: E402
from mlirgpu import thread_idx  # noqa: E402

M = mg.generics("M")


@mg.kernel
def iota(x: mg.memref[M, mg.i32]):
    x[thread_idx.x] = mg.cast(thread_idx.x, mg.i32)


@pytest.mark.parametrize("grid, block, shared_mem, why", [
    ((1, 65536), 32, 0, "grid[1] = 65536 is over 65535"),
    (1, (1, 1, 65), 0, "block[2] = 65 is over 64"),
    (1, (64, 32), 0, "the block has 2048 threads, over 1024"),
    (1, 32, 227 * 1024 + 1, "0 bytes of static and 232449 of dynamic shared memory are over the 232448"),
])
def test_a_launch_past_the_gpus_limits_fails_as_on_the_gpu(monkeypatch, grid, block, shared_mem, why):
    monkeypatch.delenv("MLIRGPU_CPU_CHIP", raising=False)
    with pytest.raises(mg.CudaError, match="cuLaunchKernel of 'iota' failed: CUDA_ERROR_INVALID_VALUE") as error:
        mg.cpu.run(iota[32], [np.zeros(32, np.int32)], grid=grid, block=block, shared_mem=shared_mem)
    assert why in str(error.value) and error.value.name == "CUDA_ERROR_INVALID_VALUE"


def test_shared_memory_limit_is_the_named_chips(monkeypatch):
    x = np.zeros(32, np.int32)
    mg.cpu.run(iota[32], [x], grid=1, block=32, shared_mem=100 * 1024)
    monkeypatch.setenv("MLIRGPU_CPU_CHIP", "sm_89")
    with pytest.raises(mg.CudaError, match="over the 101376 a block may have .the limits of sm_89"):
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
