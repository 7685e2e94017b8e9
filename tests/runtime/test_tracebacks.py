"""Errors raised while a kernel or vectorized function is traced or launched
have tracebacks that start at the user's code: mlirgpu's frames (and the
standard library's it calls) are hidden unless MLIRGPU_TRACEBACK=full."""
import os
import subprocess
import sys
import traceback

import numpy as np
import pytest

import mlirgpu as mg

PACKAGE = os.path.dirname(mg.__file__)


@mg.kernel
def misspelt(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = undefined_scale  # noqa: F821 (the error under test)


@mg.vectorize
def misspelt_elementwise(v):
    return v * undefined_scale  # noqa: F821 (the error under test)


def frames(error):
    return [entry.filename for entry in traceback.extract_tb(error.__traceback__)]


@pytest.mark.parametrize("call", [
    lambda: misspelt(np.zeros(4, np.float32), grid=1, block=4),
    lambda: misspelt[()].ir(),
    lambda: misspelt(np.zeros(4, np.float32), grid=1),
    lambda: misspelt_elementwise(np.zeros(3, np.float32)),
    lambda: mg.kernel(lambda x: None),
])
def test_the_traceback_holds_only_the_users_frames(call, backend):
    with pytest.raises((mg.CompileError, mg.LaunchError)) as caught:
        call()
    assert frames(caught.value) and set(frames(caught.value)) == {__file__}


SCRIPT = """
import numpy as np
import mlirgpu as mg

@mg.kernel
def misspelt(x: mg.memref[4, mg.f32]):
    x[mg.thread_idx.x] = undefined_scale

misspelt(np.zeros(4, np.float32), grid=1, block=4)
"""


@pytest.mark.parametrize("setting", ["", "full"])
def test_mlirgpu_traceback_full_shows_every_frame(tmp_path, setting):
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, MLIRGPU_BACKEND="cpu", MLIRGPU_TRACEBACK=setting,
               PYTHONPATH=os.pathsep.join([os.path.dirname(PACKAGE), os.environ.get("PYTHONPATH", "")]))
    stderr = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                            timeout=300).stderr
    shown = [line for line in stderr.splitlines() if line.startswith("  File ")]
    assert stderr.splitlines()[-2:] == ["mlirgpu.CompileError: " + f"{script}:7: NameError: name 'undefined_scale' "
                                        "is not defined", "    x[mg.thread_idx.x] = undefined_scale"]
    if setting == "full":
        assert any(PACKAGE in line for line in shown)
    else:
        assert shown == [f'  File "{script}", line 9, in <module>']
