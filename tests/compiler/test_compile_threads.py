"""Compiling from several threads. Each compile stage (MLIR pipeline, LLVM,
ptxas, the CPU backend's JIT) runs in an MLIR context of its own and without
the GIL: other threads run meanwhile, and threads compiling at once get the
same results as one after another."""
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import _mlirgpu, ir
from mlirgpu.ir import passes
from mlirgpu.runtime import cpu as cpu_backend

from support.kernels_sgemm import sgemm_naive


class Witness:
    """A thread that counts while it gets the GIL. With a switch interval of
    an hour, it gets the GIL from the main thread only when the main thread
    releases it in a blocking call."""

    def __init__(self):
        self.count, self.done = 0, False
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        while not self.done:
            self.count += 1
            time.sleep(0.0002)  # gives the GIL back, to be taken again when it is free

    def __enter__(self):
        self.interval = sys.getswitchinterval()
        sys.setswitchinterval(3600)
        self.thread.start()
        time.sleep(0.01)  # the witness now waits for the GIL under the new interval
        return self

    def __exit__(self, *exc):
        sys.setswitchinterval(self.interval)
        self.done = True
        self.thread.join()


def ran_meanwhile(work):
    """How many times the witness thread ran while `work()` ran on this one."""
    with Witness() as witness:
        before = witness.count
        work()
        return witness.count - before


def test_compile_stages_release_the_gil():
    compilation = sgemm_naive[64, 32, 64, mg.f32].compilation("sm_90a")
    binary = "builtin.module(gpu-module-to-binary{format=isa})"
    assert ran_meanwhile(lambda: _mlirgpu.lower(compilation._nvvm, binary, objects=True)) > 0


def test_cpu_engine_compiles_without_the_gil():
    spec = sgemm_naive[48, 16, 48, mg.f32]
    cpu_backend.host_module(spec)
    assert ran_meanwhile(lambda: cpu_backend.engine(spec)) > 0


def test_execution_engine_compiles_without_the_gil():
    """ExecutionEngine (what host programs run on) JIT-compiles a copy in a
    context of its own, without the GIL, and the copy runs as the module would."""
    module = ir.Module.parse("""
    func.func @twice(%x: f64) -> f64 attributes {llvm.emit_c_interface} {
      %y = arith.addf %x, %x : f64
      return %y : f64
    }""")
    passes.run(module, cpu_backend.PIPELINE)
    engines = []
    # Ten compiles: one takes milliseconds, which a loaded machine may not schedule the witness within
    assert ran_meanwhile(lambda: engines.extend(_mlirgpu.ExecutionEngine(module, opt_level=3) for _ in range(10))) > 0
    assert [e.invoke("twice", [np.float64(1.5).tobytes()], [("scalar", "f64")]) for e in engines] == [(3.0,)] * 10


def test_pass_manager_on_a_shared_module_keeps_the_gil():
    """PassManager.run transforms a module of a Context that other threads
    may use: it holds the GIL (the threads below are told apart by this)."""
    module = sgemm_naive[64, 32, 64, mg.f32].module().clone()
    assert ran_meanwhile(lambda: passes.PassManager("canonicalize,cse").run(module)) == 0


def test_threads_compile_what_one_thread_compiles():
    sizes = [(32 + 8 * i, 16, 32) for i in range(8)]
    alone = [sgemm_naive[m, k, n, mg.f32].compilation("sm_90a").ptx for m, k, n in sizes]
    fresh = mg.kernel(sgemm_naive.function)  # the same kernel, none of its specializations made yet
    assert fresh.generics == sgemm_naive.generics
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda s: fresh[s[0], s[1], s[2], mg.f32].compilation("sm_90a").ptx, sizes))
    assert together == alone


def test_threads_compile_and_run_on_the_cpu():
    sizes = [16 + 4 * i for i in range(6)]

    def compile_and_run(m):
        A = np.random.rand(m, 8).astype(np.float32)
        B = np.random.rand(8, 16).astype(np.float32)
        C = np.zeros((m, 16), np.float32)
        spec = sgemm_naive[m, 8, 16, mg.f32]
        cpu_backend.run(spec, (A, B, C), grid=(1, 1, 1), block=(m, 16, 1))
        return np.abs(C - (A.astype(np.float64) @ B + 1)).max()  # the kernel adds one

    with ThreadPoolExecutor(6) as pool:
        errors = list(pool.map(compile_and_run, sizes))
    assert max(errors) < 1e-4


def test_a_failing_stage_raises_in_its_thread():
    """Diagnostics of a stage stay with the compile that made them."""
    def stage(pipeline):
        module = sgemm_naive[64, 32, 64, mg.f32].module()
        return _mlirgpu.lower(module, pipeline)

    with ThreadPoolExecutor(4) as pool:
        good = [pool.submit(stage, "canonicalize") for _ in range(4)]
        bad = [pool.submit(stage, "convert-func-to-spirv{no-such-option=1}") for _ in range(4)]
        assert all("gpu.func @sgemm_naive" in str(ir.Module.parse(f.result(), context=ir.Context())) for f in good)
        for f in bad:
            with pytest.raises(mg.MLIRError, match="no-such-option"):
                f.result()


def test_a_reused_context_keeps_nothing_of_the_compile_before():
    """Stages reuse private contexts: one stage's settings and diagnostics
    do not reach the next."""
    context = ir.Context(allow_unregistered_dialects=True)
    module = ir.Module.parse('"test.opaque"() : () -> ()', context=context)
    lowered = _mlirgpu.lower(module, "canonicalize")
    assert "test.opaque" in lowered
    # Text is parsed with unregistered dialects refused, whatever the context's last use allowed.
    with pytest.raises(mg.MLIRError, match="unregistered dialect"):
        _mlirgpu.lower(lowered, "canonicalize")
    with pytest.raises(mg.MLIRError, match="no-such-option") as failed:
        _mlirgpu.lower(module, "canonicalize{no-such-option=1}")
    with pytest.raises(mg.MLIRError) as bad_text:
        _mlirgpu.lower("func.func @f( {", "canonicalize")
    assert "no-such-option" not in str(bad_text.value) and "test.opaque" not in str(bad_text.value)
    assert len(bad_text.value.diagnostics) < len(failed.value.diagnostics) + 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a diagnostic left over from the failures would warn here
        assert 'sym_name = "g"' in _mlirgpu.lower("func.func @g() { return }", "canonicalize")
