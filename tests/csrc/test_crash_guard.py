"""A crash inside MLIR or LLVM (a trap, a bad access) while passes run
becomes a CompileError naming the pass, and the process goes on: other
contexts compile and run as before, and a crash outside a pass still ends
the process as it would without mlirgpu. The crash comes from a pass made
for these tests, which raises SIGTRAP as a trap inside an MLIR pass does."""
import os
import subprocess
import sys

import pytest

from support.checks import PYTHON_DIR

SCRIPT = r'''
import json, numpy as np, mlirgpu as mg
from mlirgpu import ir
from mlirgpu.ir.passes import PassManager
out = {}
program = "module { func.func @f(%x: memref<4xf32>) { return } }"
for attempt in range(2):
    try:
        PassManager("canonicalize,cse")._run_then_crash(ir.Module.parse(program, context=ir.Context()))
    except mg.CompileError as e:
        out.setdefault("errors", []).append(str(e))
# The process goes on: a host program in a fresh context compiles and runs.
prog = mg.HostProgram("""
module {
  func.func @total(%x: memref<4xf32>) -> f32 {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %zero = arith.constant 0.0 : f32
    %s = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %zero) -> (f32) {
      %v = memref.load %x[%i] : memref<4xf32>
      %a = arith.addf %acc, %v : f32
      scf.yield %a : f32
    }
    return %s : f32
  }
}""")
out["total"] = float(prog("total", np.arange(4, dtype=np.float32)))
print(json.dumps(out))
'''


def _environment():
    """A plain environment, with what the extension's build may need: its library path (a build
    against shared MLIR), the sanitizers' runtime and options (.ci/sanitize)."""
    env = {"PYTHONPATH": PYTHON_DIR, "PATH": "/usr/bin:/bin"}
    for name in ("LD_LIBRARY_PATH", "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def run(code, **kwargs):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=_environment(), **kwargs)


def test_a_trap_inside_a_pass_is_a_compile_error_naming_it():
    import json
    done = run(SCRIPT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["errors"]) == 2                     # caught each time, not only the first
    for message in out["errors"]:
        assert "MLIR crashed in pass 'MlirgpuCrashTest (mlirgpu-crash-test)'" in message
        assert "of 'builtin.module(canonicalize,cse)'" in message and "SIGTRAP" in message
    assert out["total"] == 6.0


def test_a_crash_outside_a_pass_still_ends_the_process():
    import signal
    done = run("import os, signal, mlirgpu\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert done.returncode == -signal.SIGSEGV


THREADS_SCRIPT = r'''
import json, sys
from concurrent.futures import ThreadPoolExecutor
import mlirgpu as mg
from mlirgpu import _mlirgpu, ir
sys.path.insert(0, sys.argv[1])
from support.sgemm_ir import build_sgemm_module
FATAL = ("builtin.module(gpu.module(canonicalize, cse), "
         "gpu-lower-to-nvvm-pipeline{cubin-chip=sm_90a cubin-features=+ptx60 cubin-format=isa})")
GOOD = FATAL.replace("+ptx60", "+ptx80")
with ir.Context():
    module = build_sgemm_module(64, 64, 64)
text = str(module)

def stage(i):
    try:
        if i % 3 == 0:
            return "ok " + _mlirgpu.lower(module, GOOD, objects=True)[0][0]
        _mlirgpu.lower(module, "canonicalize" if i % 3 == 1 else FATAL, _then_crash=i % 3 == 1)
        return "no error"
    except mg.CompileError as e:
        return str(e)

with ThreadPoolExecutor(6) as pool:
    results = list(pool.map(stage, range(18)))
print(json.dumps({"results": results, "unchanged": str(module) == text,
                  "after": len(_mlirgpu.lower(module, GOOD, objects=True)[0][2])}))
'''


def test_crashes_in_threads_compiling_at_once_stay_in_their_threads():
    """Stages run without the GIL, several at once: a trap or an LLVM fatal
    error in one thread's stage is a CompileError naming the pass in that
    thread, the others compile, and the module they all read is unchanged."""
    import json
    from support.checks import TESTS_DIR
    done = subprocess.run([sys.executable, "-c", THREADS_SCRIPT, TESTS_DIR], capture_output=True, text=True,
                          timeout=300, env=_environment())
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for i, message in enumerate(out["results"]):
        if i % 3 == 0:
            assert message == "ok kernels", message
        elif i % 3 == 1:
            assert message.startswith("MLIR crashed in pass 'mlirgpu-crash-test' of 'builtin.module(canonicalize)'")
            assert "SIGTRAP" in message and "the module and its context work as before" in message
        else:
            assert message.startswith("LLVM fatal error in pass 'gpu-lower-to-nvvm-pipeline'"), message
            assert "PTX version 6.0 does not support target 'sm_90a'" in message
    assert out["unchanged"] and out["after"] > 0
