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
