"""Leak checks: run a cycle many times after a warm-up; the process's resident
memory must not grow by more than a few MB. (`pytest -s` prints the growth.)"""
import io

import numpy as np
import pytest

import mlirgpu as mg
from mlirgpu import _mlirgpu, ir, passes
from support.leaks import MB, growth
from support.sgemm_ir import build_sgemm_module

TEXT = """\
func.func @f(%a: f32, %b: f32) -> f32 {
  %0 = arith.addf %a, %b : f32
  %1 = arith.mulf %0, %b : f32
  return %1 : f32
}
"""


def ir_cycle_in(context):
    def ir_cycle(i):
        module = ir.Module.parse(TEXT, context=context)
        operations = module.walk()
        assert len(operations) == 5
        text = str(module) + module.print(generic=True, debug_info=True)
        assert "arith.mulf" in text
        fn = operations[1]
        block = fn.regions[0].blocks[0]
        a, b = block.arguments
        with context, ir.InsertionPoint.at_block_terminator(block), ir.Location.file("leak.py", 1, 1):
            sub = ir.Operation.create("arith.subf", operands=[a, b], results=[ir.Type.f32()])
        assert sub.result.type.width == 32 and a.num_uses == 2
        sub.clone().erase()
        sub.erase()
        module.verify()
        for op in module.walk(post_order=True):
            op.attributes, op.location, op.operands, op.results  # noqa: B018
        del module, operations, fn, block, a, b, sub
    return ir_cycle


def ir_error_cycle_in(context):
    def ir_error_cycle(i):
        with pytest.raises(mg.MLIRError):
            ir.Module.parse("func.func @f( {", context=context)
        with pytest.raises(mg.MLIRError):
            ir.Type.parse("memref<4xf32", context=context)
        op = ir.Operation.create("arith.constant", results=[ir.Type.f32(context=context)], context=context)
        with pytest.raises(mg.MLIRError):
            op.verify()
        with pytest.raises(ValueError):
            ir.Operation.create("arith.nonesuch", context=context)
        op.erase()
        with pytest.raises(mg.InvalidObjectError):
            op.name  # noqa: B018
    return ir_error_cycle


def test_ir_build_and_free_does_not_leak():
    grown = growth(ir_cycle_in(ir.Context()), 10_000, warmup=1_000)
    assert grown < 8 * MB, f"{grown / MB:.1f} MB"


def test_ir_errors_do_not_leak():
    grown = growth(ir_error_cycle_in(ir.Context()), 10_000, warmup=1_000)
    assert grown < 8 * MB, f"{grown / MB:.1f} MB"


def test_contexts_are_freed():
    def context_cycle(i):
        context = ir.Context()
        ir_cycle_in(context)(i)
    grown = growth(context_cycle, 2_000, warmup=200)
    assert grown < 8 * MB, f"{grown / MB:.1f} MB"


def test_passes_do_not_leak():
    context = ir.Context()

    def pass_cycle(i):
        module = ir.Module.parse(TEXT, context=context)
        stale = module.walk()
        report = passes.run(module, "canonicalize,cse", print_ir_after_all=(i % 10 == 0), file=io.StringIO())
        assert not stale[1].is_valid
        with pytest.raises(mg.MLIRError):
            passes.run(module, "no-such-pass")
        del report
    grown = growth(pass_cycle, 2_000, warmup=200)
    assert grown < 8 * MB, f"{grown / MB:.1f} MB"


def test_compile_does_not_leak():
    context = ir.Context()
    module = build_sgemm_module(256, 128, 256, context=context)

    def compile_cycle(i):
        ptx = mg.compile_ptx(module, chip="sm_90a" if i % 2 else "sm_80")
        assert ".entry sgemm_naive(" in ptx
    grown = growth(compile_cycle, 200, warmup=20)
    assert grown < 16 * MB, f"{grown / MB:.1f} MB"


def test_lowering_many_kernels_keeps_memory_bounded():
    # Compile stages run in reused private contexts, which keep every name and
    # constant they have seen: each is retired after some uses, or this grows
    # by about 15 MB per 1000 lowerings.
    def module_text(i):
        funcs = "\n".join(f"func.func @kernel_{i}_{j}(%a: f32) -> f32 {{\n  %c = arith.constant {i}.{j}5 : f32\n"
                          f"  %0 = arith.addf %a, %c : f32\n  return %0 : f32\n}}" for j in range(20))
        return f"module {{\n{funcs}\n}}"

    def lowering_cycle(i):
        lowered = _mlirgpu.lower(module_text(i), "canonicalize,convert-arith-to-llvm,convert-func-to-llvm")
        assert f'sym_name = "kernel_{i}_19"' in lowered
    grown = growth(lowering_cycle, 1000, warmup=200)
    assert grown < 4 * MB, f"{grown / MB:.1f} MB"


def test_build_and_compile_does_not_leak():
    context = ir.Context()

    def build_and_compile_cycle(i):
        compilation = mg.Compilation(build_sgemm_module(256, 128, 256, context=context), chip="sm_90a")
        assert "define ptx_kernel" in compilation.llvm_ir and ".target sm_90a" in compilation.ptx
    grown = growth(build_and_compile_cycle, 100, warmup=10)
    assert grown < 16 * MB, f"{grown / MB:.1f} MB"


def test_vectorize_calls_do_not_leak():
    # The CPU backend's calls: classification, broadcast views, engine invocations, outputs.
    from support.backends import current_backend

    @mg.vectorize
    def axpy(a, x, y):
        return a * x + y

    x = np.ones((64, 33), np.float32)
    y = np.ones(33, np.float32)

    def vectorize_cycle(i):
        got = axpy(2.0, x, y)
        assert got[0, 0] == 3.0
        axpy(1.0, x, x, out=got)
        with pytest.raises(mg.LaunchError):
            axpy(1.0, x, np.ones(7, np.float32))
    with current_backend("cpu"):
        grown = growth(vectorize_cycle, 5_000, warmup=500)
    assert grown < 8 * MB, f"{grown / MB:.1f} MB"
