"""The README's main example runs: the IR-built SGEMM compiled to PTX (and
run on a GPU where there is one), then the @mg.kernel SGEMM run on the
current backend (the CPU where there is no GPU) and checked against NumPy."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mlirgpu as mg
from support.checks import PYTHON_DIR

ROOT = Path(__file__).resolve().parents[2]


def run_example(*args, backend=None):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    env.pop("MLIRGPU_BACKEND", None)
    if backend is not None:
        env["MLIRGPU_BACKEND"] = backend
    return subprocess.run([sys.executable, str(ROOT / "examples" / "sgemm_naive.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def reported_errors(stdout):
    return [float(e) for e in re.findall(r"relative error against NumPy \(float64\) (\S+)", stdout)]


@pytest.mark.parametrize("backend", [None, "cpu"], ids=["default", "cpu"])
def test_main_example_runs(backend):
    done = run_example(backend=backend)
    assert done.returncode == 0, done.stderr
    assert "naive SGEMM 256x128 @ 128x256: PTX for" in done.stdout
    assert "entry sgemm_naive" in done.stdout
    ran_on = backend or ("cuda" if mg.cuda.is_available() else "cpu")
    assert f"@mg.kernel sgemm_naive ran on the {ran_on} backend" in done.stdout
    errors = reported_errors(done.stdout)
    assert len(errors) == (2 if ran_on == "cuda" else 1)   # the IR-built kernel runs on the GPU only
    assert all(0 <= e < 1e-5 for e in errors)
    assert done.stderr == ""


def test_main_example_sizes():
    done = run_example("64", "32", "48", backend="cpu")
    assert done.returncode == 0, done.stderr
    assert "naive SGEMM 64x32 @ 32x48" in done.stdout
    assert all(0 <= e < 1e-5 for e in reported_errors(done.stdout)) and reported_errors(done.stdout)
