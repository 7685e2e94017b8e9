"""The runnable examples of docs/language_more.md (each python block that starts
with `import numpy as np`) run as written, with their asserts, on the CPU
backend (and on the GPU where there is one)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.checks import PYTHON_DIR

DOC = Path(__file__).resolve().parents[2] / "docs" / "language_more.md"
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if b.startswith("import numpy as np")]


def test_the_guide_has_runnable_examples():
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("backend_name", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_guide_example_runs(tmp_path, number, backend_name):
    script = tmp_path / f"example_{number}.py"
    script.write_text(BLOCKS[number])
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MLIRGPU_BACKEND=backend_name)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"{BLOCKS[number]}\n{proc.stderr[-3000:]}"
