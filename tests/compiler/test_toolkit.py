"""Where ptxas comes from (mlirgpu.compiler.toolkit), the driver-JIT path
taken without one, and `python -m mlirgpu.info`. Every case runs on the CPU:
the no-ptxas ones in a fresh interpreter whose CUDA_HOME names a toolkit
with libdevice (which the math functions link) and no ptxas: the search
happens at import."""
import json
import os
import stat
import subprocess
import sys
import types

import pytest

from mlirgpu.compiler import toolkit
from support.checks import run_isolated, toolkit_without_ptxas

KERNEL = '''
import mlirgpu as mg
N = mg.generics("N")

@mg.kernel
def add_one(X: mg.memref[N, mg.f32]):
    X[mg.thread_idx.x] = X[mg.thread_idx.x] + 1.0
'''


def fake_ptxas(directory):
    """An executable named ptxas in directory/bin; returns its path."""
    path = directory / "bin" / "ptxas"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def without_ptxas(tmp_path):
    return toolkit_without_ptxas(str(tmp_path))


def run_json(code, tmp_path, **env):
    """Runs `code` (which prints one JSON line last) in a new interpreter with
    `env` set; returns the parsed line."""
    script = tmp_path / "script.py"   # a file: the tracer reads kernels' source
    script.write_text("import json, os\n" + "".join(f"os.environ[{k!r}] = {v!r}\n" for k, v in env.items())
                      + code)
    proc = run_isolated(f"import runpy; runpy.run_path({str(script)!r})")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------

@pytest.fixture
def no_toolkit(monkeypatch, tmp_path):
    """No CUDA_HOME, a build-time toolkit without ptxas, an empty PATH."""
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(toolkit, "_mlirgpu", types.SimpleNamespace(CUDA_HOME=str(tmp_path / "no-toolkit")))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    return tmp_path


@pytest.fixture
def nowhere(no_toolkit, monkeypatch):
    """no_toolkit, and an installed nvcc wheel (CI may have one) hidden."""
    monkeypatch.setattr(toolkit, "_nvcc_wheel", lambda: None)
    return no_toolkit


def test_cuda_home_is_the_only_place_looked_at_when_set(monkeypatch, tmp_path):
    ptxas = fake_ptxas(tmp_path / "kit")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "kit"))
    assert toolkit.find() == toolkit.Toolkit(str(tmp_path / "kit"), ptxas, "CUDA_HOME")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "empty"))
    assert toolkit.find() is None


def test_the_toolkit_the_build_was_made_for(nowhere, monkeypatch):
    ptxas = fake_ptxas(nowhere / "usr-local-cuda")
    monkeypatch.setattr(toolkit._mlirgpu, "CUDA_HOME", str(nowhere / "usr-local-cuda"))
    assert toolkit.find() == toolkit.Toolkit(str(nowhere / "usr-local-cuda"), ptxas, "toolkit")


def test_the_nvcc_wheel_when_there_is_no_toolkit(no_toolkit, monkeypatch):
    site = no_toolkit / "site-packages"
    ptxas = fake_ptxas(site / "nvidia" / "cuda_nvcc")
    monkeypatch.syspath_prepend(str(site))
    # The search imports the `nvidia` namespace package: this one must not outlive the test.
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "nvidia"}
    try:
        found = toolkit.find()
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "nvidia"]:
            del sys.modules[name]
        sys.modules.update(saved)
    assert found.source == "nvidia-cuda-nvcc wheel" and found.ptxas == ptxas
    assert found.home == str(site / "nvidia" / "cuda_nvcc")


def test_ptxas_on_path_last(nowhere, monkeypatch):
    ptxas = fake_ptxas(nowhere / "opt")
    monkeypatch.setenv("PATH", str(nowhere / "opt" / "bin"))
    assert toolkit.find() == toolkit.Toolkit(str(nowhere / "opt"), ptxas, "PATH")


def test_nothing_found(nowhere):
    assert toolkit.find() is None


# --------------------------------------------------------------------------
# Without ptxas: PTX for the driver's JIT
# --------------------------------------------------------------------------

NO_PTXAS = KERNEL + '''
from mlirgpu.compiler import toolkit
out = {"ptxas": toolkit.PTXAS}
spec = add_one[32]
compilation = spec.compilation("sm_80")
out["format"], out["which"] = compilation.image_format, compilation.ptxas
image = spec.image("sm_80")
out["image is the ptx"] = image == compilation.ptx.encode() and b".entry add_one(" in image
for name, get in [("Compilation.cubin", lambda: compilation.cubin), ("spec.cubin", lambda: spec.cubin("sm_80")),
                  ("HostProgram cubin", lambda: mg.HostProgram(PROGRAM, "sm_80", format="cubin"))]:
    try:
        get()
        out[name] = "no error"
    except mg.CompileError as error:
        out[name] = str(error)
out["HostProgram default"] = mg.HostProgram(PROGRAM, "sm_80").format
print(json.dumps(out))
'''
PROGRAM = '''
PROGRAM = """
func.func @double(%x: f32) -> f32 {
  %y = arith.addf %x, %x : f32
  return %y : f32
}
"""
'''


def test_without_ptxas_the_image_is_ptx(tmp_path):
    out = run_json(PROGRAM + NO_PTXAS, tmp_path, CUDA_HOME=without_ptxas(tmp_path),
                   MLIRGPU_CACHE_DIR=str(tmp_path / "cache"))
    assert out["ptxas"] is None and out["format"] == "ptx" and out["which"] is None
    assert out["image is the ptx"]
    for name in ("Compilation.cubin", "spec.cubin", "HostProgram cubin"):
        assert out[name].startswith("no ptxas to make a cubin"), (name, out[name])
        assert "nvidia-cuda-nvcc-cu12" in out[name] and "CUDA_HOME" in out[name]
    assert out["HostProgram default"] == "ptx"


def test_with_ptxas_the_image_is_the_cubin(tmp_path):
    if toolkit.PTXAS is None:
        pytest.skip("no ptxas here")
    code = KERNEL + '''
spec = add_one[32]
compilation = spec.compilation("sm_80")
print(json.dumps([compilation.image_format, compilation.ptxas, spec.image("sm_80")[:4].hex()]))
'''
    out = run_json(code, tmp_path, MLIRGPU_CACHE_DIR=str(tmp_path / "cache"))
    assert out == ["cubin", toolkit.PTXAS.ptxas, b"\x7fELF".hex()]


def test_without_ptxas_a_kernel_runs_on_the_fake_driver(fake_libcuda, tmp_path):
    # The fake driver runs a kernel named add_scalar (X[i] += v) from its PTX.
    code = '''
import numpy as np
import mlirgpu as mg
N = mg.generics("N")

@mg.kernel
def add_scalar(X: mg.memref[N, mg.f32], v: mg.f32, n: mg.u32):
    X[mg.thread_idx.x] = X[mg.thread_idx.x] + v

X = mg.to_device(np.arange(32, dtype=np.float32))
add_scalar(X, 1.0, 32, grid=1, block=32)
print(json.dumps({"X": X.get().tolist(), "backend": mg.backend()}))
'''
    out = run_json(code, tmp_path, CUDA_HOME=without_ptxas(tmp_path), MLIRGPU_LIBCUDA=fake_libcuda,
                   MLIRGPU_CACHE_DIR=str(tmp_path / "cache"))
    assert out["backend"] == "cuda"
    assert out["X"] == [i + 1.0 for i in range(32)]


# --------------------------------------------------------------------------
# python -m mlirgpu.info
# --------------------------------------------------------------------------

def info(tmp_path, **env):
    environment = dict(os.environ, MLIRGPU_CACHE_DIR=str(tmp_path / "cache"), **env)
    environment["PYTHONPATH"] = run_isolated.__globals__["PYTHON_DIR"]
    proc = subprocess.run([sys.executable, "-m", "mlirgpu.info"], capture_output=True, text=True,
                          env=environment, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split(None, 1) if not line.startswith("GPU ") else ("GPU " + line.split()[1],
                line.split(None, 2)[2]) for line in proc.stdout.splitlines())


def test_info_without_driver_or_ptxas(tmp_path):
    lines = info(tmp_path, CUDA_HOME=without_ptxas(tmp_path), MLIRGPU_LIBCUDA="/nonexistent/libcuda.so.1")
    import mlirgpu
    import numpy
    assert lines["mlirgpu"].startswith(mlirgpu.__version__)
    assert lines["MLIR"].startswith("22.")
    assert lines["NumPy"] == numpy.__version__
    assert lines["Python"].startswith("%d.%d." % sys.version_info[:2])
    assert lines["CUDA"].startswith("driver  none:") and "CPU backend" in lines["CUDA"]
    assert lines["cache"] == str(tmp_path / "cache")
    assert lines["ptxas"] == "none found: kernels load as PTX, compiled by the driver's JIT"


def test_info_with_the_fake_driver_and_a_toolkit(fake_libcuda, tmp_path):
    ptxas = fake_ptxas(tmp_path / "kit")
    lines = info(tmp_path, CUDA_HOME=str(tmp_path / "kit"), MLIRGPU_LIBCUDA=fake_libcuda)
    assert lines["CUDA"] == "driver  12.8"
    assert lines["GPU 0"].startswith("Mock H100 80GB HBM3, sm_90a, ")
    assert lines["ptxas"] == f"{ptxas} (CUDA_HOME)"
