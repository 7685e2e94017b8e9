"""Helpers shared by the tests: FileCheck-style text checks and running code
in a fresh interpreter (so that a crash fails one test instead of the run)."""
import os
import re
import subprocess
import sys
import tempfile
import textwrap

import mlirgpu

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(mlirgpu.__file__)))
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (where `support` is a package) and its folders of test files: a test
# imports another test file's module by its name, in pytest's process (conftest.py
# puts these on sys.path) and in the processes it starts (PYTHONPATH).
TEST_PATH = [TESTS_DIR] + sorted(entry.path for entry in os.scandir(TESTS_DIR)
                                 if entry.is_dir() and entry.name not in ("support", "__pycache__"))


def filecheck(text, *patterns):
    """Each regex of `patterns` must match `text`, in this order (CHECK lines).
    Returns the matches."""
    position, matches = 0, []
    for pattern in patterns:
        match = re.compile(pattern, re.MULTILINE).search(text, position)
        assert match is not None, f"no match for {pattern!r} after offset {position} in:\n{text}"
        matches.append(match)
        position = match.end()
    return matches


def run_isolated(code, timeout=180):
    """Runs `code` in a new interpreter that imports this checkout's mlirgpu,
    from a script file: kernels need their source, which `python -c` code
    has not before Python 3.13. Returns the CompletedProcess (text mode)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, *TEST_PATH, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as directory:
        script = os.path.join(directory, "isolated.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(code))
        return subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=timeout, env=env)


def run_on_fake_driver(script, fake_libcuda, library):
    """Runs `script` (a file: it takes the fake driver's path and an exported
    library's) in a new interpreter that loads the fake CUDA driver; its
    stdout's lines, after checking that it exited normally."""
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(fake_libcuda))
    env.pop("MLIRGPU_BACKEND", None)
    done = subprocess.run([sys.executable, str(script), fake_libcuda, str(library)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def assert_isolated(code, expected_stdout):
    """`code` must exit normally (no crash) and print `expected_stdout` (a substring)."""
    proc = run_isolated(code)
    assert proc.returncode == 0, (f"the interpreter died with status {proc.returncode} "
                                  f"(negative: killed by that signal)\nstdout:\n{proc.stdout}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")
    assert expected_stdout in proc.stdout, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def toolkit_without_ptxas(directory):
    """directory/no-ptxas: a CUDA toolkit directory with this machine's
    libdevice (nvvm/, which kernels' math functions link) and no ptxas. As
    CUDA_HOME it sends kernels to the driver's JIT as PTX."""
    from mlirgpu.compiler import toolkit
    home = os.path.join(directory, "no-ptxas")
    os.makedirs(home, exist_ok=True)
    source = toolkit.PTXAS.home if toolkit.PTXAS else os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if not os.path.lexists(os.path.join(home, "nvvm")):
        os.symlink(os.path.join(source, "nvvm"), os.path.join(home, "nvvm"))
    return home


def ptxas_accepts(ptx, chip, tmp_path, verbose=False):
    """The CUDA toolkit's ptxas assembles `ptx` for `chip` (its stderr, warnings included).
    With `verbose` (ptxas -v) the stderr also reports each function's registers and spills,
    so that a test can require that nothing spills."""
    ptxas = os.path.join(mlirgpu.compiler.CUDA_HOME, "bin", "ptxas")
    path = tmp_path / f"kernel_{chip}.ptx"
    path.write_text(ptx)
    proc = subprocess.run([ptxas, f"-arch={chip}", *(["-v"] if verbose else []), str(path),
                           "-o", str(tmp_path / f"kernel_{chip}.cubin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr
