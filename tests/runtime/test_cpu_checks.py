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
