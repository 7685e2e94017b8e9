"""mlirgpu.passes: pipelines over modules, captured IR dumps and timing, errors."""
import io

import pytest

import mlirgpu as mg
from support.checks import assert_isolated, filecheck
from mlirgpu import ir, passes

REDUNDANT = """\
func.func @f(%a: f32, %b: f32) -> f32 {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %unused = arith.addi %c1, %c2 : index
  %0 = arith.addf %a, %b : f32
  %1 = arith.addf %a, %b : f32
  %2 = arith.mulf %0, %1 : f32
  return %2 : f32
}
"""

FOLDABLE = """\
func.func @g() -> index {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %0 = arith.addi %c1, %c2 : index
  return %0 : index
}
"""

NO_TARGET = """\
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @k() kernel {
      gpu.return
    }
  }
}
"""


def names(module):
    return [op.name for op in module.walk()]


def test_cse_merges_identical_operations(ctx):
    module = ir.Module.parse(REDUNDANT)
    assert passes.run(module, "cse") == ""
    assert names(module).count("arith.addf") == 1
    filecheck(str(module), r"%0 = arith\.addf %arg0, %arg1 : f32", r"%1 = arith\.mulf %0, %0 : f32",
              r"return %1 : f32")
    assert module.verify() is True


def test_canonicalize_folds_and_removes_dead_code(ctx):
    module = ir.Module.parse(FOLDABLE)
    passes.run(module, "canonicalize")
    assert names(module) == ["builtin.module", "func.func", "arith.constant", "func.return"]
    filecheck(str(module), r"%c3 = arith\.constant 3 : index", r"return %c3 : index")


def test_canonicalize_then_cse(ctx):
    module = ir.Module.parse(REDUNDANT)
    passes.run(module, "builtin.module(canonicalize,cse)")
    assert names(module) == ["builtin.module", "func.func", "arith.addf", "arith.mulf", "func.return"]


def test_anchored_and_unanchored_pipelines_agree(ctx):
    texts = []
    for pipeline in ("canonicalize,cse", "builtin.module(canonicalize,cse)",
                     "builtin.module(func.func(canonicalize,cse))", "func.func(canonicalize,cse)"):
        module = ir.Module.parse(REDUNDANT)
        passes.run(module, pipeline)
        texts.append(str(module))
    assert len(set(texts)) == 1
    assert "arith.addi" not in texts[0] and texts[0].count("arith.addf") == 1


def test_pass_manager_object(ctx):
    pm = passes.PassManager("canonicalize,cse")
    assert pm.pipeline == "canonicalize,cse"
    first, second = ir.Module.parse(REDUNDANT), ir.Module.parse(FOLDABLE)
    assert pm.run(first) == "" and pm.run(second) == ""
    assert "arith.addi" not in str(first) and "%c3" in str(second)


def test_print_ir_after_all(ctx, capsys):
    module = ir.Module.parse(REDUNDANT)
    report = passes.run(module, "canonicalize,cse", print_ir_after_all=True)
    filecheck(report, r"// -----// IR Dump After Canonicalizer \(canonicalize\) //----- //",
              r"func\.func @f", r"// -----// IR Dump After CSE \(cse\) //----- //", r"arith\.mulf %0, %0")
    assert "IR Dump Before" not in report
    out, err = capsys.readouterr()
    assert out == report and err == ""


def test_print_ir_before_all(ctx, capsys):
    module = ir.Module.parse(FOLDABLE)
    report = passes.run(module, "canonicalize", print_ir_before_all=True)
    filecheck(report, r"IR Dump Before Canonicalizer", r"arith\.addi %c1, %c2 : index")
    assert "IR Dump After" not in report
    assert capsys.readouterr().out == report


def test_print_ir_to_a_file(ctx, capsys):
    module = ir.Module.parse(FOLDABLE)
    sink = io.StringIO()
    report = passes.run(module, "canonicalize", print_ir_after_all=True, file=sink)
    assert sink.getvalue() == report and "IR Dump After" in report
    assert capsys.readouterr() == ("", "")


def test_timing_report(ctx, capsys):
    module = ir.Module.parse(REDUNDANT)
    report = passes.run(module, "canonicalize,cse", timing=True)
    filecheck(report, r"Execution time report", r"Total Execution Time: [0-9.]+ seconds",
              r"Canonicalizer", r"CSE", r"Total")
    assert capsys.readouterr().out == report


def test_nothing_printed_by_default(ctx, capfd):
    passes.run(ir.Module.parse(REDUNDANT), "canonicalize,cse")
    assert capfd.readouterr() == ("", "")


def test_verify_each_off(ctx):
    module = ir.Module.parse(REDUNDANT)
    assert passes.run(module, "cse", verify_each=False) == ""
    assert names(module).count("arith.addf") == 1


def test_unknown_pass(ctx):
    module = ir.Module.parse(REDUNDANT)
    with pytest.raises(mg.MLIRError, match="'no-such-pass' does not refer to a registered pass"):
        passes.run(module, "canonicalize,no-such-pass")
    assert str(module) == str(ir.Module.parse(REDUNDANT))


def test_malformed_pipeline(ctx):
    with pytest.raises(mg.MLIRError, match="unbalanced parentheses"):
        passes.run(ir.Module.parse(REDUNDANT), "func.func(canonicalize")


def test_bad_pass_option(ctx):
    with pytest.raises(mg.MLIRError, match="invalid pass pipeline"):
        passes.run(ir.Module.parse(REDUNDANT), "canonicalize{no-such-option=1}")


def test_bad_pass_option_value(ctx, capfd):
    """LLVM's option parser explains a bad value on llvm::errs(): that text
    belongs in the exception, not on fd 2."""
    with pytest.raises(mg.MLIRError, match="failed to add `canonicalize`") as e:
        passes.run(ir.Module.parse(REDUNDANT), "canonicalize{max-iterations=abc}")
    assert capfd.readouterr().err == ""
    assert "'abc' value invalid" in str(e.value)


def test_failing_pass_raises_with_diagnostics(ctx):
    module = ir.Module.parse(NO_TARGET)
    with pytest.raises(mg.MLIRError, match="pass pipeline 'builtin.module\\(gpu-module-to-binary\\)' failed") as e:
        passes.run(module, "gpu-module-to-binary")
    severity, location, message = e.value.diagnostics[0]
    assert (severity, location, message) == ("error", 'loc("-":2:3)', "the module has no target attributes")
    assert 'loc("-":2:3): error: the module has no target attributes' in str(e.value)


def test_pass_on_invalid_input_raises(ctx):
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        ir.Operation.create("func.func", regions=1, location=ir.Location.file("user.py", 4, 1),
                            attributes={"sym_name": ir.Attribute.string("f")}).regions[0].append_block()
    with pytest.raises(mg.MLIRError) as e:
        passes.run(module, "canonicalize")
    assert e.value.diagnostics[0][:2] == ("error", 'loc("user.py":4:1)')
    assert "requires attribute 'function_type'" in e.value.diagnostics[0][2]


def test_failures_print_nothing_to_stderr(ctx, capfd):
    for pipeline, text in (("gpu-module-to-binary", NO_TARGET), ("no-such-pass", REDUNDANT),
                           ("func.func(", REDUNDANT)):
        with pytest.raises(mg.MLIRError):
            passes.run(ir.Module.parse(text), pipeline)
    with pytest.raises(mg.MLIRError):
        passes.run(ir.Module.parse(NO_TARGET), "gpu-module-to-binary", print_ir_after_all=True, timing=True)
    with pytest.raises(mg.MLIRError):
        ir.Module.parse("func.func @f( {")
    with pytest.raises(mg.MLIRError):
        ir.Operation.create("arith.constant", results=[ir.Type.f32()]).verify()
    out, err = capfd.readouterr()
    assert err == ""
    assert out == ""


def test_dumps_do_not_reach_stderr(ctx, capfd):
    report = passes.run(ir.Module.parse(REDUNDANT), "canonicalize,cse", print_ir_before_all=True,
                        print_ir_after_all=True, timing=True)
    out, err = capfd.readouterr()
    assert err == ""
    assert out == report and "IR Dump Before" in out and "IR Dump After" in out and "Execution time" in out


def test_run_on_a_non_module(ctx):
    module = ir.Module.parse(REDUNDANT)
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Module, not mlirgpu\.ir\.Operation"):
        passes.run(module.operation, "canonicalize")


def test_pipeline_not_a_str(ctx):
    with pytest.raises(TypeError, match="must be str, not list"):
        passes.PassManager(["canonicalize"])


def test_module_wrappers_survive_a_pass(ctx):
    module = ir.Module.parse(REDUNDANT)
    body = module.body
    passes.run(module, "canonicalize,cse")
    assert module.operation.is_valid
    assert [op.name for op in body.operations] == ["func.func"]
    assert module.verify() is True


def test_pass_over_unverified_module():
    """Passes assume verified input: scf.for without a body made
    convert-scf-to-cf crash. run() must verify first and raise."""
    assert_isolated("""
        import mlirgpu as mg
        from mlirgpu import ir, passes
        with ir.Context():
            index = ir.Type.index()
            module = ir.Module.create()
            with ir.InsertionPoint(module.body):
                fn = ir.Operation.create("func.func", regions=1, attributes={
                    "sym_name": ir.Attribute.string("f"),
                    "function_type": ir.Attribute.type_attr(ir.Type.function([index], []))})
            block = fn.regions[0].append_block([index])
            i = block.arguments[0]
            with ir.InsertionPoint(block):
                ir.Operation.create("scf.for", operands=[i, i, i], regions=1,
                                    location=ir.Location.file("user.py", 3, 5))
                ir.Operation.create("func.return")
            try:
                passes.run(module, "convert-scf-to-cf")
                print("ran")
            except mg.MLIRError as error:
                print("MLIRError", *error.diagnostics[0][:2])
    """, 'MLIRError error loc("user.py":3:5)')
