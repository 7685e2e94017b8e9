"""The property-based fuzzers (tests/fuzz_ir.py, tests/fuzz_arrays.py), each
run by pytest in a process of its own, so that a crash they find fails its
test here instead of ending the suite. The array fuzzer runs with the fake
CUDA driver (tests/fake_cuda), whose device memory is host memory."""
import os
import subprocess
import sys

import pytest

from checks import PYTHON_DIR

pytest.importorskip("hypothesis")

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_fuzzer(module, env=None):
    environment = dict(os.environ, **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, TESTS, environment.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           os.path.join(TESTS, module)], capture_output=True, text=True, timeout=600,
                          env=environment, cwd=TESTS)
    assert proc.returncode == 0, (f"{module} failed with status {proc.returncode} (negative: killed by that "
                                  f"signal)\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def test_ir_fuzzer():
    assert " passed" in run_fuzzer("fuzz_ir.py")


def test_array_interop_fuzzer(fake_libcuda):
    out = run_fuzzer("fuzz_arrays.py", {"MLIRGPU_LIBCUDA": fake_libcuda})
    assert "3 passed" in out, out
