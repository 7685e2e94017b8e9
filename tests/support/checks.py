"""Helpers shared by the tests: FileCheck-style text checks and running code
in a fresh interpreter (so that a crash fails one test instead of the run),
on the fake CUDA driver of support/fake_cuda among others."""
import json
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


# What a script on the fake driver starts with (run_on_fake): the driver and a compile cache of the
# test's, its call log through _fake, and kernels that load as PTX, which the fake driver reads.
FAKE_PRELUDE = '''
import ctypes, json, os
os.environ["MLIRGPU_LIBCUDA"] = {fake!r}
os.environ["MLIRGPU_CACHE_DIR"] = {cache!r}
os.environ["CUDA_HOME"] = {no_ptxas!r}
os.environ.update({environment!r})
import numpy as np
import mlirgpu as mg
import mlirgpu._mlirgpu as C

_fake = ctypes.CDLL({fake!r})
_fake.fake_log.restype = ctypes.c_char_p
out = {{}}
'''


def run_on_fake(fake_libcuda, tmp_path, code, environment=None):
    """Runs `code` (the test module's prelude, then the test's body) after
    FAKE_PRELUDE in a fresh interpreter on the fake driver, with the
    environment variables `environment` set; returns the dict `out` the code
    fills, as JSON gives it back. The code runs from a file: the tracer
    reads kernels' sources."""
    script = tmp_path / "script.py"
    script.write_text(FAKE_PRELUDE.format(fake=fake_libcuda, cache=str(tmp_path / "cache"),
                                          no_ptxas=toolkit_without_ptxas(str(tmp_path)),
                                          environment=environment or {})
                      + code + "\nprint(json.dumps(out))\n")
    proc = run_isolated(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


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


def on_two_streams(torch, count, call, out_like, rounds=3):
    """Calls call(step, i, None) and call(step, i, out) (out: out_like(), a
    new array) for each step of `rounds` and each i of `count`, even i on
    torch's current stream and odd i on a side stream that first waits for
    it, as calls after an op's first launch from C; [(step, i, result)] once
    the GPU is done."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    results = []
    for step in range(rounds):
        for i in range(count):
            with torch.cuda.stream(side if i % 2 else main):
                results += [(step, i, call(step, i, None)), (step, i, call(step, i, out_like()))]
    torch.cuda.synchronize()
    return results


def assert_each_close(results, expected, tolerance=2e-2):
    """Each (step, i, result) of on_two_streams within `tolerance` of
    expected(step, i), relative to its largest magnitude."""
    for step, i, result in results:
        want = expected(step, i)
        error = ((result.float() - want).abs().max() / want.abs().max()).item()
        assert error < tolerance, (step, i, error)
