"""The property-based fuzzers (tests/support/fuzz_ir.py, tests/support/fuzz_arrays.py), each
run by pytest in a process of its own, so that a crash they find fails its
test here instead of ending the suite. The array fuzzer runs with the fake
CUDA driver (tests/support/fake_cuda), whose device memory is host memory."""
import os
import subprocess
import sys

import pytest

from support.checks import PYTHON_DIR, TESTS_DIR

pytest.importorskip("hypothesis")

FUZZERS = os.path.join(TESTS_DIR, "support")


def run_fuzzer(module, env=None):
    environment = dict(os.environ, **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, TESTS_DIR, environment.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           os.path.join(FUZZERS, module)], capture_output=True, text=True, timeout=600,
                          env=environment, cwd=FUZZERS)
    assert proc.returncode == 0, (f"{module} failed with status {proc.returncode} (negative: killed by that "
                                  f"signal)\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def test_ir_fuzzer():
    assert " passed" in run_fuzzer("fuzz_ir.py")


def test_array_interop_fuzzer(fake_libcuda):
    out = run_fuzzer("fuzz_arrays.py", {"MLIRGPU_LIBCUDA": fake_libcuda})
    assert "3 passed" in out, out
