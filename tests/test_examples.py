"""The README's main example runs: compiled only without a GPU, checked
against NumPy on one."""
import os
import subprocess
import sys
from pathlib import Path

import mlirgpu as mg

ROOT = Path(__file__).resolve().parents[1]


def run_example(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, str(ROOT / "examples" / "sgemm_naive.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_main_example_runs():
    done = run_example()
    assert done.returncode == 0, done.stderr
    assert "naive SGEMM 256x128 @ 128x256: PTX for" in done.stdout
    assert "entry sgemm_naive" in done.stdout
    if mg.cuda.is_available():
        assert "relative error against NumPy" in done.stdout
    else:
        assert "compiled only" in done.stdout
    assert done.stderr == ""
