"""mlirgpu.ir: one test per bad input; each checks the class and the message.

Tests that could crash the interpreter (use-after-free in the C extension)
run in a fresh interpreter through checks.assert_isolated, so that a crash
fails that test alone.
"""
import gc
import re

import pytest

import mlirgpu as mg
from support.checks import assert_isolated
from mlirgpu import ir, passes

LINE_COL = re.compile(r'^loc\(".*":\d+:\d+\)$')

FUNC_TEXT = """\
func.func @f(%a: f32, %b: f32) -> f32 {
  %0 = arith.addf %a, %b : f32
  %1 = arith.mulf %0, %b : f32
  return %1 : f32
}
"""


def f32():
    return ir.Type.f32()


def func_op(name="f", inputs=(), results=(), location=None):
    fn = ir.Operation.create("func.func", regions=1, location=location, attributes={
        "sym_name": ir.Attribute.string(name),
        "function_type": ir.Attribute.type_attr(ir.Type.function(list(inputs), list(results))),
    })
    fn.regions[0].append_block(list(inputs))
    return fn


def parsed():
    """(module, func, entry block, [addf, mulf, return])."""
    module = ir.Module.parse(FUNC_TEXT)
    fn = module.body.operations[0]
    block = fn.regions[0].blocks[0]
    return module, fn, block, block.operations


def constant(value=1):
    return ir.Operation.create("arith.constant", results=[ir.Type.index()],
                               attributes={"value": ir.Attribute.integer(value, ir.Type.index())})


def test_error_classes():
    assert issubclass(mg.MLIRError, mg.Error) and issubclass(mg.CompileError, mg.Error)
    assert issubclass(mg.InvalidObjectError, mg.Error) and issubclass(mg.InvalidObjectError, RuntimeError)
    assert issubclass(mg.Error, Exception)
    assert mg.MLIRError.__module__ == "mlirgpu" and mg.MLIRError.__name__ == "MLIRError"


# --------------------------------------------------------------------------
# Parse errors: MLIRError with (severity, location with line:col, message)
# --------------------------------------------------------------------------

def only_error(excinfo):
    errors = [d for d in excinfo.value.diagnostics if d[0] == "error"]
    assert len(errors) == 1, excinfo.value.diagnostics
    severity, location, message = errors[0]
    assert LINE_COL.match(location), location
    return location, message


def test_module_parse_error(ctx):
    text = "func.func @f() {\n  %0 = arith.addf 1\n}\n"
    with pytest.raises(mg.MLIRError, match="cannot parse the module") as excinfo:
        ir.Module.parse(text)
    location, message = only_error(excinfo)
    assert location.endswith(":2:18)")  # line 2, at the "1"
    assert message == "expected SSA operand"
    assert "expected SSA operand" in str(excinfo.value)
    assert all(isinstance(d, tuple) and len(d) == 3 for d in excinfo.value.diagnostics)


def test_module_parse_unregistered_operation(ctx):
    with pytest.raises(mg.MLIRError) as excinfo:
        ir.Module.parse('"mydialect.op"() : () -> ()')
    location, message = only_error(excinfo)
    assert re.search(r":1:\d+\)$", location)
    assert "unregistered dialect" in message


def test_module_parse_undefined_value(ctx):
    with pytest.raises(mg.MLIRError) as excinfo:
        ir.Module.parse("func.func @f() -> f32 {\n  return %nope : f32\n}")
    location, message = only_error(excinfo)
    assert location.endswith(":2:10)")
    assert "use of undeclared SSA value name" in message


def test_type_parse_error(ctx):
    with pytest.raises(mg.MLIRError, match="cannot parse type") as excinfo:
        ir.Type.parse("memref<4xf32")
    location, message = only_error(excinfo)
    assert location.endswith(":1:12)")
    assert "expected ',' or '>' in memref type" in message


def test_type_parse_trailing_characters(ctx):
    with pytest.raises(mg.MLIRError) as excinfo:
        ir.Type.parse("i32 garbage")
    assert "found trailing characters" in only_error(excinfo)[1]


def test_attribute_parse_error(ctx):
    with pytest.raises(mg.MLIRError, match="cannot parse attribute") as excinfo:
        ir.Attribute.parse("[1, 2")
    location, message = only_error(excinfo)
    assert location.endswith(":1:4)")
    assert "expected ',' or ']'" in message


def test_attribute_parse_unknown_dialect_attribute(ctx):
    with pytest.raises(mg.MLIRError) as excinfo:
        ir.Attribute.parse("#arith<nonesuch ogt>")
    assert "unknown attribute `nonesuch` in dialect `arith`" in only_error(excinfo)[1]


# --------------------------------------------------------------------------
# verify(): MLIRError located where the op was made
# --------------------------------------------------------------------------

def test_verify_wrong_operand_types(ctx):
    i32 = ir.Type.integer(32)
    fn = func_op(inputs=[i32, i32])
    x, y = fn.regions[0].blocks[0].arguments
    loc = ir.Location.file("user.py", 7, 3)
    with ir.InsertionPoint(fn.regions[0].blocks[0]):
        ir.Operation.create("arith.addf", operands=[x, y], results=[i32], location=loc)
        ir.Operation.create("func.return")
    with pytest.raises(mg.MLIRError, match="verification failed") as excinfo:
        fn.verify()
    severity, location, message = excinfo.value.diagnostics[0]
    assert (severity, location) == ("error", 'loc("user.py":7:3)')
    assert "'arith.addf' op operand #0 must be floating-point-like" in message
    assert 'loc("user.py":7:3): error:' in str(excinfo.value)


def test_verify_missing_terminator(ctx):
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func_op(location=ir.Location.file("user.py", 1, 1))
    with ir.InsertionPoint(fn.regions[0].blocks[0]):
        constant()
    last = fn.regions[0].blocks[0].operations[-1]
    with pytest.raises(mg.MLIRError) as excinfo:
        module.verify()
    severity, location, message = excinfo.value.diagnostics[0]
    assert severity == "error" and location == str(last.location)
    assert "block with no terminator" in message


def test_verify_missing_terminator_located(ctx):
    fn = func_op()
    with ir.InsertionPoint(fn.regions[0].blocks[0]):
        ir.Operation.create("arith.constant", results=[f32()], location=ir.Location.file("user.py", 9, 2),
                            attributes={"value": ir.Attribute.float(1.0, f32())})
    with pytest.raises(mg.MLIRError) as excinfo:
        fn.verify()
    assert excinfo.value.diagnostics[0][:2] == ("error", 'loc("user.py":9:2)')
    assert "block with no terminator" in excinfo.value.diagnostics[0][2]


def test_verify_missing_required_attribute(ctx):
    op = ir.Operation.create("arith.constant", results=[f32()], location=ir.Location.file("user.py", 3, 4))
    with pytest.raises(mg.MLIRError) as excinfo:
        op.verify()
    assert excinfo.value.diagnostics[0][:2] == ("error", 'loc("user.py":3:4)')
    assert "requires attribute 'value'" in excinfo.value.diagnostics[0][2]


def test_verify_return_type_mismatch(ctx):
    fn = func_op(inputs=[f32()], results=[ir.Type.index()])
    with ir.InsertionPoint(fn.regions[0].blocks[0]):
        ir.Operation.create("func.return", operands=[fn.regions[0].blocks[0].arguments[0]],
                            location=ir.Location.file("user.py", 2, 8))
    with pytest.raises(mg.MLIRError) as excinfo:
        fn.verify()
    assert excinfo.value.diagnostics[0][:2] == ("error", 'loc("user.py":2:8)')
    assert "doesn't match function result type" in excinfo.value.diagnostics[0][2]


def test_diagnostics_do_not_leak_into_the_next_call(ctx):
    with pytest.raises(mg.MLIRError):
        ir.Type.parse("memref<")
    assert ir.Type.parse("f32") == f32()
    with pytest.raises(mg.MLIRError) as excinfo:
        ir.Attribute.parse("[")
    assert len([d for d in excinfo.value.diagnostics if d[0] == "error"]) == 1


# --------------------------------------------------------------------------
# Operation names
# --------------------------------------------------------------------------

def test_unknown_operation_name(ctx):
    with pytest.raises(ValueError, match=r"unknown operation 'arith\.nonesuch'"):
        ir.Operation.create("arith.nonesuch")


def test_unknown_dialect_name(ctx):
    with pytest.raises(ValueError, match=r"unknown operation 'nodialect\.op'"):
        ir.Operation.create("nodialect.op")


@pytest.mark.parametrize("name", ["nodot", ".op", "dialect.", ""])
def test_malformed_operation_name(ctx, name):
    with pytest.raises(ValueError, match="operation name must be 'dialect.op'"):
        ir.Operation.create(name)


# --------------------------------------------------------------------------
# Wrong Python types
# --------------------------------------------------------------------------

def test_create_operand_not_a_value(ctx):
    with pytest.raises(TypeError, match=r"operand #1 must be an mlirgpu\.ir\.Value, not int"):
        ir.Operation.create("arith.addf", operands=[constant().result, 1], results=[ir.Type.index()])


def test_create_operands_not_a_sequence(ctx):
    with pytest.raises(TypeError, match="operands must be a sequence of Values"):
        ir.Operation.create("arith.addf", operands=5)


def test_create_result_not_a_type(ctx):
    with pytest.raises(TypeError, match=r"result type must be an mlirgpu\.ir\.Type, not str"):
        ir.Operation.create("arith.constant", results=["f32"])


def test_create_attributes_not_a_dict(ctx):
    with pytest.raises(TypeError, match="attributes must be a dict of str to Attribute, not list"):
        ir.Operation.create("arith.constant", attributes=[("value", ir.Attribute.unit())])


def test_create_attribute_value_not_an_attribute(ctx):
    with pytest.raises(TypeError, match=r"attribute value must be an mlirgpu\.ir\.Attribute, not int"):
        ir.Operation.create("arith.constant", attributes={"value": 1})


def test_create_attribute_name_not_a_str(ctx):
    with pytest.raises(TypeError, match="attribute name must be a str, not int"):
        ir.Operation.create("arith.constant", attributes={1: ir.Attribute.unit()})


def test_create_regions_not_an_int(ctx):
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        ir.Operation.create("scf.execute_region", regions="1")


def test_create_regions_negative(ctx):
    with pytest.raises(ValueError, match="regions must be a count in 0..64, got -1"):
        ir.Operation.create("scf.execute_region", regions=-1)


def test_create_location_not_a_location(ctx):
    with pytest.raises(TypeError, match=r"location must be an mlirgpu\.ir\.Location, not str"):
        ir.Operation.create("func.return", location="user.py:1")


def test_create_context_not_a_context(ctx):
    with pytest.raises(TypeError, match=r"context must be an mlirgpu\.ir\.Context, not str"):
        ir.Operation.create("func.return", context="ctx")


def test_create_successor_not_a_block(ctx):
    with ir.InsertionPoint(func_op().regions[0].blocks[0]):
        with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Block, not int"):
            ir.Operation.create("cf.br", successors=[0])


def test_create_name_not_a_str(ctx):
    with pytest.raises(TypeError, match="must be str, not bytes"):
        ir.Operation.create(b"func.return")


def test_module_parse_text_not_a_str(ctx):
    with pytest.raises(TypeError, match="must be str, not bytes"):
        ir.Module.parse(b"module {}")


def test_module_parse_context_not_a_context(ctx):
    with pytest.raises(TypeError, match=r"context must be an mlirgpu\.ir\.Context, not int"):
        ir.Module.parse("", context=1)


def test_type_memref_element_not_a_type(ctx):
    with pytest.raises(TypeError, match=r"element_type must be an mlirgpu\.ir\.Type, not str"):
        ir.Type.memref([4], "f32")


def test_type_memref_shape_not_a_sequence(ctx):
    with pytest.raises(TypeError, match="shape must be a sequence of ints"):
        ir.Type.memref(4, f32())


def test_type_memref_shape_entry_not_an_int(ctx):
    with pytest.raises(TypeError, match="shape entries must be ints or None, not float"):
        ir.Type.memref([4.0], f32())


def test_type_memref_memory_space_not_int_or_attribute(ctx):
    with pytest.raises(TypeError, match=r"memory_space must be an mlirgpu\.ir\.Attribute, not str"):
        ir.Type.memref([4], f32(), "shared")


def test_type_vector_dynamic_size(ctx):
    with pytest.raises(TypeError, match="shape entries must be ints, not NoneType"):
        ir.Type.vector([None], f32())


def test_type_function_input_not_a_type(ctx):
    with pytest.raises(TypeError, match=r"input type must be an mlirgpu\.ir\.Type, not int"):
        ir.Type.function([1], [])


def test_type_function_results_not_a_sequence(ctx):
    with pytest.raises(TypeError, match="expected a sequence"):
        ir.Type.function([], 5)


def test_attribute_array_element_not_an_attribute(ctx):
    with pytest.raises(TypeError, match=r"array element must be an mlirgpu\.ir\.Attribute, not int"):
        ir.Attribute.array([1])


def test_attribute_dictionary_value_not_an_attribute(ctx):
    with pytest.raises(TypeError, match=r"attribute value must be an mlirgpu\.ir\.Attribute, not str"):
        ir.Attribute.dictionary({"a": "b"})


def test_attribute_type_of_a_non_type(ctx):
    with pytest.raises(TypeError, match=r"type must be an mlirgpu\.ir\.Type, not str"):
        ir.Attribute.type_attr("f32")


def test_attribute_dense_array_entry_not_an_int(ctx):
    with pytest.raises(TypeError, match="values must be ints"):
        ir.Attribute.dense_i64_array([1.5])


def test_location_fused_entry_not_a_location(ctx):
    with pytest.raises(TypeError, match=r"location must be an mlirgpu\.ir\.Location, not int"):
        ir.Location.fused([1])


def test_location_name_child_not_a_location(ctx):
    with pytest.raises(TypeError, match=r"child must be an mlirgpu\.ir\.Location, not str"):
        ir.Location.name("n", "child")


def test_location_file_name_not_a_str(ctx):
    with pytest.raises(TypeError, match="must be str, not int"):
        ir.Location.file(3, 1)


def test_set_attribute_value_not_an_attribute(ctx):
    with pytest.raises(TypeError, match=r"attribute must be an mlirgpu\.ir\.Attribute, not int"):
        func_op().set_attribute("sym_name", 1)


def test_get_attribute_name_not_a_str(ctx):
    with pytest.raises(TypeError, match="name must be a str, not int"):
        func_op().get_attribute(1)


def test_block_add_argument_not_a_type(ctx):
    with pytest.raises(TypeError, match=r"type must be an mlirgpu\.ir\.Type, not str"):
        func_op().regions[0].blocks[0].add_argument("f32")


def test_block_append_not_an_operation(ctx):
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Operation, not str"):
        func_op().regions[0].blocks[0].append("func.return")


def test_region_append_block_argument_not_a_type(ctx):
    with pytest.raises(TypeError, match=r"argument type must be an mlirgpu\.ir\.Type, not str"):
        func_op().regions[0].append_block(["f32"])


def test_region_append_block_locations_count(ctx):
    with pytest.raises(ValueError, match="1 argument types but 0 locations"):
        func_op().regions[0].append_block([f32()], [])


def test_value_replace_all_uses_with_non_value(ctx):
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Value, not int"):
        constant().result.replace_all_uses_with(0)


def test_insertion_point_of_a_non_block(ctx):
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Block, not mlirgpu\.ir\.Operation"):
        ir.InsertionPoint(func_op())


def test_insertion_point_before_a_non_operation(ctx):
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Operation, not mlirgpu\.ir\.Block"):
        ir.InsertionPoint.before(func_op().regions[0].blocks[0])


def test_insertion_point_insert_a_non_operation(ctx):
    with pytest.raises(TypeError, match=r"expected an mlirgpu\.ir\.Operation, not int"):
        ir.InsertionPoint(func_op().regions[0].blocks[0]).insert(1)


def test_wrapper_types_cannot_be_instantiated():
    for cls in (ir.Type, ir.Attribute, ir.Location, ir.Operation, ir.Block, ir.Region, ir.Value, ir.Module):
        with pytest.raises(TypeError, match="cannot create"):
            cls()


# --------------------------------------------------------------------------
# Bad values
# --------------------------------------------------------------------------

def test_memref_negative_size(ctx):
    with pytest.raises(ValueError, match="shape entries must be >= 0, got -2"):
        ir.Type.memref([4, -2], f32())


def test_vector_negative_size(ctx):
    with pytest.raises(ValueError, match="shape entries must be >= 0, got -1"):
        ir.Type.vector([-1], f32())


def test_vector_zero_size(ctx):
    with pytest.raises(mg.MLIRError, match="vector types must have positive constant sizes"):
        ir.Type.vector([0], f32())


def test_memref_negative_memory_space(ctx):
    with pytest.raises(ValueError, match="memory_space must be >= 0, got -1"):
        ir.Type.memref([4], f32(), -1)


def test_memref_invalid_element_type(ctx):
    with pytest.raises(mg.MLIRError, match="invalid memref element type"):
        ir.Type.memref([4], ir.Type.function([], []))


def test_integer_width_zero(ctx):
    with pytest.raises(ValueError, match="integer width must be in 1..16777215, got 0"):
        ir.Type.integer(0)


def test_integer_width_too_big(ctx):
    with pytest.raises(ValueError, match="integer width must be in 1..16777215, got 16777216"):
        ir.Type.integer(1 << 24)


def test_integer_width_negative(ctx):
    with pytest.raises(ValueError, match="got -8"):
        ir.Type.integer(-8)


def test_integer_attribute_of_float_type(ctx):
    with pytest.raises(TypeError, match="an integer attribute needs an integer or index type"):
        ir.Attribute.integer(1, f32())


def test_integer_attribute_wider_than_64_bits(ctx):
    with pytest.raises(OverflowError, match="does not fit in i64"):
        ir.Attribute.integer(1 << 70)


def test_integer_attribute_value_does_not_fit_its_type(ctx):
    """300 is no i8: MLIR would silently keep 300 mod 256 = 44."""
    with pytest.raises(OverflowError, match="i8"):
        ir.Attribute.integer(300, ir.Type.integer(8))


def test_integer_attribute_negative_for_unsigned_type(ctx):
    """-1 is no ui8: MLIR would keep 255."""
    with pytest.raises(OverflowError, match="ui8"):
        ir.Attribute.integer(-1, ir.Type.integer(8, signed=False))


def test_float_attribute_of_integer_type(ctx):
    with pytest.raises(mg.MLIRError, match="expected floating point type"):
        ir.Attribute.float(1.0, ir.Type.integer(32))


def test_dense_i32_array_overflow(ctx):
    with pytest.raises(OverflowError, match="does not fit in 32 bits"):
        ir.Attribute.dense_i32_array([1 << 31])


def test_location_negative_line(ctx):
    """A negative line must not wrap around to 4294967295."""
    with pytest.raises((ValueError, OverflowError), match="line|negative|unsigned"):
        ir.Location.file("user.py", -1)


def test_location_line_too_big(ctx):
    """2**32 + 5 must not wrap around to line 5."""
    with pytest.raises((ValueError, OverflowError), match="line|unsigned|too large"):
        ir.Location.file("user.py", 2**32 + 5)


def test_result_of_an_operation_without_results(ctx):
    with pytest.raises(ValueError, match="the operation has 0 results, not exactly one"):
        ir.Operation.create("func.return").result


def test_result_of_an_operation_with_two_results(ctx):
    op = ir.Operation.create("arith.addui_extended", results=[ir.Type.integer(32), ir.Type.integer(1)])
    with pytest.raises(ValueError, match="the operation has 2 results, not exactly one"):
        op.result


def test_get_missing_attribute(ctx):
    with pytest.raises(KeyError, match="nonesuch"):
        func_op().get_attribute("nonesuch")


def test_remove_missing_attribute(ctx):
    with pytest.raises(KeyError, match="nonesuch"):
        func_op().remove_attribute("nonesuch")


@pytest.mark.parametrize("prop, make, message", [
    ("width", ir.Type.index, "only integer and float types have a width"),
    ("signed", ir.Type.f32, "only integer types have signedness"),
    ("shape", ir.Type.f32, "only ranked shaped types"),
    ("element_type", ir.Type.index, "only shaped types"),
    ("memory_space", lambda: ir.Type.vector([4], ir.Type.f32()), "only memref types have a memory space"),
    ("inputs", ir.Type.f32, "only function types have inputs and results"),
    ("results", ir.Type.index, "only function types have inputs and results"),
])
def test_type_property_of_the_wrong_kind(ctx, prop, make, message):
    with pytest.raises(TypeError, match=message):
        getattr(make(), prop)


def test_attribute_value_of_an_opaque_kind(ctx):
    with pytest.raises(TypeError, match="this kind of attribute has no Python value; use str"):
        ir.Attribute.parse("#gpu<dim x>").value


def test_successors_without_insertion_point(ctx):
    block = func_op().regions[0].blocks[0]
    with pytest.raises(ValueError, match="an operation with successors must be created at an InsertionPoint"):
        ir.Operation.create("cf.br", successors=[block])


def test_successor_in_another_module(ctx):
    other = func_op("g")
    with ir.InsertionPoint(func_op().regions[0].blocks[0]):
        with pytest.raises(ValueError, match="successor #0 is outside the IR tree of the insertion point"):
            ir.Operation.create("cf.br", successors=[other.regions[0].blocks[0]])


def test_at_block_terminator_without_terminator(ctx):
    with pytest.raises(ValueError, match="the block has no terminator"):
        ir.InsertionPoint.at_block_terminator(func_op().regions[0].blocks[0])


def test_insertion_point_before_a_detached_operation(ctx):
    with pytest.raises(ValueError, match="the operation is not in a block of another operation"):
        ir.InsertionPoint.before(constant())


def test_replace_all_uses_with_a_value_of_another_module(ctx):
    _, _, block, _ = parsed()
    _, _, other, _ = parsed()
    with pytest.raises(ValueError, match="the two values are in different IR trees"):
        block.arguments[0].replace_all_uses_with(other.arguments[0])


def test_replace_all_uses_with_a_result_of_a_user(ctx):
    _, _, block, (addf, mulf, _) = parsed()
    with pytest.raises(ValueError, match="a value cannot be used inside the operation that defines it"):
        block.arguments[0].replace_all_uses_with(addf.results[0])
    assert addf.operands[0] == block.arguments[0]


@pytest.mark.parametrize("parse", [
    "ir.Module.parse('module {' * 4000 + '}' * 4000)",
    "ir.Type.parse('tensor<' * 4000 + 'f32' + '>' * 4000)",
    "ir.Attribute.parse('[' * 4000 + ']' * 4000)",
    "_mlirgpu.lower('module {' * 4000 + '}' * 4000, 'canonicalize')",
    "mg.HostProgram('module {' * 4000 + '}' * 4000)",
    "passes.run(ir.Module.parse('module {}'), 'builtin.module(' * 100000 + 'canonicalize' + ')' * 100000)",
    "_mlirgpu.lower('module {}', 'func.func(' * 100000 + ')' * 100000)",
])
def test_deeply_nested_text_raises_instead_of_overflowing_the_stack(parse):
    assert_isolated(f"""
        import threading
        import mlirgpu as mg
        from mlirgpu import _mlirgpu, ir, passes
        def parse():
            with ir.Context():
                try:
                    {parse}
                except mg.MLIRError as e:
                    print("refused:", e)
        threading.stack_size(1 << 20)  # a parse on a thread with a small stack
        thread = threading.Thread(target=parse)
        thread.start()
        thread.join()
        parse()
    """, "nests brackets deeper than 256 levels")


def test_deeply_nested_operations_built_in_python_are_refused():
    # Before the limit, a few ten thousand nested operations crashed str() and clone().
    assert_isolated("""
        from mlirgpu import ir
        def nest(block, levels):  # `levels` operations, each in the last one's region; the innermost block
            for _ in range(levels):
                with ir.InsertionPoint(block):
                    op = ir.Operation.create("scf.execute_region", regions=1)
                block = op.regions[0].append_block()
            return block
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.create()
            deepest = nest(module.body, 255)                 # inside the module and 255 operations
            try:
                nest(deepest, 40000)
            except ValueError as e:
                print("refused:", e)
            top = ir.Operation.create("scf.execute_region", regions=1)
            nest(top.regions[0].append_block(), 200)
            try:
                ir.InsertionPoint(deepest).insert(top)       # 256 + 201 deep
            except ValueError as e:
                print("refused:", e)
            ir.InsertionPoint(module.body).insert(top)       # 1 + 201 deep
            print(str(module).count("scf.execute_region"), module.operation.clone() is not None)
    """, "refused: inserting the operation would nest operations 257 deep: IR nests at most 256 deep "
         "(see docs/ir.md)\n"
         "refused: inserting the operation would nest operations 457 deep: IR nests at most 256 deep "
         "(see docs/ir.md)\n456 True")


def test_nesting_within_the_limit_and_in_strings_parses(ctx):
    ir.Type.parse("tuple<" * 200 + "f32" + ">" * 200)
    ir.Attribute.parse('"' + "{" * 1000 + '"')
    ir.Module.parse('module attributes {test.t = "\\"{{{{"} {}')


# --------------------------------------------------------------------------
# Objects of different Contexts
# --------------------------------------------------------------------------

@pytest.fixture
def other():
    return ir.Context()


def test_mixed_context_operand(ctx, other):
    value = ir.Operation.create("arith.constant", results=[ir.Type.index(context=other)], context=other,
                                attributes={"value": ir.Attribute.integer(1, ir.Type.index(context=other))}).result
    with pytest.raises(ValueError, match="operand #0 belongs to a different Context"):
        ir.Operation.create("arith.addi", operands=[value, value], results=[ir.Type.index()])


def test_mixed_context_result_type(ctx, other):
    with pytest.raises(ValueError, match="result type belongs to a different Context"):
        ir.Operation.create("arith.constant", results=[ir.Type.f32(context=other)])


def test_mixed_context_attribute(ctx, other):
    with pytest.raises(ValueError, match="attribute value belongs to a different Context"):
        ir.Operation.create("arith.constant", attributes={"value": ir.Attribute.unit(context=other)})


def test_mixed_context_location(ctx, other):
    with pytest.raises(ValueError, match="location belongs to a different Context"):
        ir.Operation.create("func.return", location=ir.Location.unknown(context=other), context=ctx)


def test_mixed_context_insertion_point(ctx, other):
    with other:
        block = func_op().regions[0].blocks[0]
    with ir.InsertionPoint(block):
        # The insertion point's context is implied; naming another one is a mismatch.
        assert ir.Operation.create("func.return").context is other
        with pytest.raises(ValueError, match="the current InsertionPoint belongs to a different Context"):
            ir.Operation.create("func.return", context=ctx)


def test_mixed_context_block_append(ctx, other):
    op = ir.Operation.create("func.return", context=other)
    with pytest.raises(ValueError, match="the operation and the block belong to different Contexts"):
        func_op().regions[0].blocks[0].append(op)


def test_mixed_context_function_type(ctx, other):
    with pytest.raises(ValueError, match="input type belongs to a different Context"):
        ir.Type.function([ir.Type.f32(context=other)], [])


def test_mixed_context_array_attribute(ctx, other):
    with pytest.raises(ValueError, match="array element belongs to a different Context"):
        ir.Attribute.array([ir.Attribute.unit(context=other)])


def test_mixed_context_memory_space(ctx, other):
    with pytest.raises(ValueError, match="memory_space belongs to a different Context"):
        ir.Type.memref([4], f32(), ir.Attribute.parse("#gpu.address_space<workgroup>", context=other))


def test_mixed_context_set_attribute(ctx, other):
    with pytest.raises(ValueError, match="attribute belongs to a different Context"):
        func_op().set_attribute("x", ir.Attribute.unit(context=other))


def test_mixed_context_block_argument(ctx, other):
    with pytest.raises(ValueError, match="type belongs to a different Context"):
        func_op().regions[0].blocks[0].add_argument(ir.Type.f32(context=other))


def test_mixed_context_successor(ctx, other):
    with other:
        foreign = func_op().regions[0].blocks[0]
    with ir.InsertionPoint(func_op().regions[0].blocks[0]):
        with pytest.raises(ValueError, match="successor belongs to a different Context"):
            ir.Operation.create("cf.br", successors=[foreign])


# --------------------------------------------------------------------------
# Erased operations and IR rewritten by passes: InvalidObjectError
# --------------------------------------------------------------------------

def test_use_of_erased_operation(ctx):
    _, _, _, (add, mul, ret) = parsed()
    ret.erase()
    for use in (lambda: ret.name, lambda: str(ret), lambda: ret.results, lambda: ret.location,
                lambda: ret.erase(), lambda: ret.verify(), lambda: ret.clone(), lambda: ret.walk(),
                lambda: ret.set_attribute("x", ir.Attribute.unit())):
        with pytest.raises(mg.InvalidObjectError, match="the operation was erased"):
            use()


def test_value_of_erased_operation(ctx):
    _, _, _, (add, mul, ret) = parsed()
    value = mul.result
    ret.erase()
    mul.erase()
    with pytest.raises(mg.InvalidObjectError, match="the value belongs to an operation that was erased"):
        value.type


def test_block_argument_of_erased_operation(ctx):
    _, fn, block, _ = parsed()
    argument = block.arguments[0]
    fn.erase()
    with pytest.raises(mg.InvalidObjectError, match="the value belongs to an operation that was erased"):
        argument.num_uses


def test_block_of_erased_operation(ctx):
    _, fn, block, _ = parsed()
    fn.erase()
    with pytest.raises(mg.InvalidObjectError, match="the block belongs to an operation that was erased"):
        block.operations


def test_region_of_erased_operation(ctx):
    _, fn, _, _ = parsed()
    region = fn.regions[0]
    fn.erase()
    with pytest.raises(mg.InvalidObjectError, match="the region belongs to an operation that was erased"):
        region.append_block()


def test_nested_operation_of_erased_operation(ctx):
    _, fn, _, (add, _, _) = parsed()
    fn.erase()
    with pytest.raises(mg.InvalidObjectError, match="the operation was erased"):
        add.operands


def test_insertion_point_in_erased_operation(ctx):
    _, fn, block, _ = parsed()
    ip = ir.InsertionPoint(block)
    fn.erase()
    with pytest.raises(mg.InvalidObjectError, match="the block belongs to an operation that was erased"):
        with ip:
            constant()


def test_insertion_point_before_erased_operation(ctx):
    _, _, _, (add, mul, ret) = parsed()
    ip = ir.InsertionPoint.before(ret)
    ret.erase()
    with pytest.raises(mg.InvalidObjectError, match="the operation was erased"):
        ip.insert(constant())


def test_operation_inside_module_after_a_pass(ctx):
    module, fn, block, (add, mul, ret) = parsed()
    value, argument, region = add.result, block.arguments[0], fn.regions[0]
    passes.run(module, "canonicalize")
    for use, message in ((lambda: fn.name, "the operation was erased, or rewritten by a pass"),
                         (lambda: str(add), "the operation was erased, or rewritten by a pass"),
                         (lambda: block.operations, "the block belongs to an operation that was erased"),
                         (lambda: region.blocks, "the region belongs to an operation that was erased"),
                         (lambda: value.type, "the value belongs to an operation that was erased"),
                         (lambda: argument.type, "the value belongs to an operation that was erased")):
        with pytest.raises(mg.InvalidObjectError, match=message):
            use()
    # The module itself and fresh wrappers work.
    assert module.operation.is_valid and not fn.is_valid
    assert [op.name for op in module.body.operations[0].regions[0].blocks[0].operations] == [
        "arith.addf", "arith.mulf", "func.return"]


def test_erased_operation_is_not_equal_to_a_new_one(ctx):
    _, _, block, (add, mul, ret) = parsed()
    ret.erase()
    replacement = ir.Operation.create("func.return", operands=[mul.result])
    block.append(replacement)
    assert replacement != ret and not ret.is_valid


def test_successor_insertion_point_in_erased_operation(ctx):
    """The insertion point's block belongs to an erased func: the check must
    come before any look at that block (it read freed memory)."""
    assert_isolated("""
        import mlirgpu as mg
        from mlirgpu import ir
        with ir.Context():
            ft = ir.Attribute.type_attr(ir.Type.function([], []))
            f = ir.Operation.create("func.func", regions=1,
                                    attributes={"sym_name": ir.Attribute.string("f"), "function_type": ft})
            g = ir.Operation.create("func.func", regions=1,
                                    attributes={"sym_name": ir.Attribute.string("g"), "function_type": ft})
            ip = ir.InsertionPoint(f.regions[0].append_block())
            target = g.regions[0].append_block()
            f.erase()
            try:
                with ip:
                    ir.Operation.create("cf.br", successors=[target])
            except Exception as error:
                print(type(error).__name__, error)
    """, "InvalidObjectError the block belongs to an operation that was erased")


# --------------------------------------------------------------------------
# Erasing and inserting
# --------------------------------------------------------------------------

def test_erase_operation_whose_result_has_uses(ctx):
    module, _, _, (add, mul, ret) = parsed()
    with pytest.raises(ValueError, match="cannot erase an operation whose results .* still have uses"):
        add.erase()
    assert add.is_valid and "arith.addf" in str(module)


def test_erase_operation_whose_nested_value_has_outside_uses(ctx):
    module, fn, block, _ = parsed()
    outside = ir.Operation.create("arith.addf", operands=[block.arguments[0], block.arguments[1]],
                                  results=[f32()])
    with pytest.raises(ValueError, match="still have uses"):
        fn.erase()
    outside.erase()
    fn.erase()
    assert module.body.operations == []


def test_erase_operation_whose_block_is_a_branch_target_elsewhere(ctx):
    """A cf.br in @f jumps to a block of @g: erasing @g would leave the
    branch pointing at freed memory (it crashed)."""
    assert_isolated("""
        from mlirgpu import ir
        with ir.Context():
            module = ir.Module.create()
            ft = ir.Attribute.type_attr(ir.Type.function([], []))
            with ir.InsertionPoint(module.body):
                f = ir.Operation.create("func.func", regions=1,
                                        attributes={"sym_name": ir.Attribute.string("f"), "function_type": ft})
                g = ir.Operation.create("func.func", regions=1,
                                        attributes={"sym_name": ir.Attribute.string("g"), "function_type": ft})
            target = g.regions[0].append_block()
            with ir.InsertionPoint(target):
                ir.Operation.create("func.return")
            with ir.InsertionPoint(f.regions[0].append_block()):
                branch = ir.Operation.create("cf.br", successors=[target])
            try:
                g.erase()
                print("erased", branch.successors, module.print(generic=True))
            except ValueError as error:
                print("ValueError", error)
    """, "ValueError")


def test_insert_attached_operation(ctx):
    module, fn, _, (add, _, _) = parsed()
    with pytest.raises(ValueError, match="the operation is already in a block"):
        module.body.append(add)


def test_insert_attached_operation_at_insertion_point(ctx):
    module, fn, _, _ = parsed()
    with pytest.raises(ValueError, match="only a detached operation can be inserted"):
        ir.InsertionPoint(module.body).insert(fn)


def test_insert_module_into_itself(ctx):
    module = ir.Module.create()
    with pytest.raises(ValueError, match="cannot insert an operation into its own region"):
        module.body.append(module.operation)


def test_insert_operation_into_its_own_region(ctx):
    fn = func_op()
    with pytest.raises(ValueError, match="cannot insert an operation into its own region"):
        fn.regions[0].blocks[0].append(fn)


def test_insert_operation_into_a_region_nested_in_it(ctx):
    outer = ir.Operation.create("scf.execute_region", regions=1, results=[])
    with ir.InsertionPoint(outer.regions[0].append_block()):
        inner = ir.Operation.create("scf.execute_region", regions=1)
    with pytest.raises(ValueError, match="cannot insert an operation into its own region"):
        inner.regions[0].append_block().append(outer)


def test_insert_operation_with_operands_from_another_module(ctx):
    _, _, other_block, _ = parsed()
    _, _, block, _ = parsed()
    op = ir.Operation.create("arith.addf", operands=[other_block.arguments[0], other_block.arguments[1]],
                             results=[f32()])
    with pytest.raises(ValueError, match="operand #0 is defined outside the IR tree of the block"):
        block.append(op)


def test_create_at_insertion_point_with_operands_from_another_module(ctx):
    _, _, other_block, _ = parsed()
    _, _, block, _ = parsed()
    with ir.InsertionPoint(block):
        with pytest.raises(ValueError, match="operand #1 is defined outside the IR tree of the block"):
            ir.Operation.create("arith.addf", operands=[block.arguments[0], other_block.arguments[0]],
                                results=[f32()])
    assert len(block.operations) == 3


def test_insert_operation_with_operands_of_a_detached_operation(ctx):
    _, _, block, _ = parsed()
    loose = constant(3)
    op = ir.Operation.create("arith.addi", operands=[loose.result, loose.result], results=[ir.Type.index()])
    with pytest.raises(ValueError, match="operand #0 is defined outside the IR tree"):
        block.append(op)


# --------------------------------------------------------------------------
# `with` out of order
# --------------------------------------------------------------------------

def test_insertion_point_exited_out_of_order(ctx):
    block = func_op().regions[0].blocks[0]
    first, second = ir.InsertionPoint(block), ir.InsertionPoint(block)
    first.__enter__()
    second.__enter__()
    try:
        with pytest.raises(RuntimeError, match="InsertionPoint exited out of order"):
            first.__exit__(None, None, None)
    finally:
        second.__exit__(None, None, None)
        first.__exit__(None, None, None)
    assert ir.InsertionPoint.current() is None


def test_insertion_point_exited_without_enter(ctx):
    with pytest.raises(RuntimeError, match="InsertionPoint exited out of order"):
        ir.InsertionPoint(func_op().regions[0].blocks[0]).__exit__(None, None, None)


def test_context_exited_out_of_order(ctx):
    inner = ir.Context()
    inner.__enter__()
    try:
        with pytest.raises(RuntimeError, match="Context exited out of order"):
            ctx.__exit__(None, None, None)
    finally:
        inner.__exit__(None, None, None)
    assert ir.Context.current() is ctx


def test_location_exited_out_of_order(ctx):
    with pytest.raises(RuntimeError, match="Location exited out of order"):
        ir.Location.unknown().__exit__(None, None, None)


# --------------------------------------------------------------------------
# Objects outliving their owners
# --------------------------------------------------------------------------

def test_objects_outlive_module_and_context():
    context = ir.Context()
    module = ir.Module.parse(FUNC_TEXT, context=context)
    fn = module.body.operations[0]
    block = fn.regions[0].blocks[0]
    region = fn.regions[0]
    mul = block.operations[1]
    value = mul.result
    argument = block.arguments[0]
    t = ir.Type.memref([4], ir.Type.f32(context=context))
    attr = ir.Attribute.string("kept", context=context)
    loc = ir.Location.file("kept.py", 1, 2, context=context)
    del module, fn, block, region, context
    gc.collect()
    assert str(mul) == "%1 = arith.mulf %0, %arg1 : f32"
    assert value.type == ir.Type.f32(context=mul.context)
    assert value.num_uses == 1 and argument.num_uses == 1
    assert argument.owner.owner.get_attribute("sym_name").value == "f"
    assert mul.parent.parent.name == "builtin.module"
    assert "func.func @f" in str(mul.parent.parent)
    assert str(t) == "memref<4xf32>" and t.element_type.width == 32
    assert attr.value == "kept" and str(loc) == 'loc("kept.py":1:2)'
    assert t.context is attr.context is loc.context is mul.context


def test_detached_operation_keeps_its_operands_alive(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    argument = module.body.operations[0].regions[0].blocks[0].arguments[0]
    op = ir.Operation.create("arith.negf", operands=[argument], results=[f32()])
    del module, argument
    gc.collect()
    assert op.operands[0].type == f32()
    assert op.operands[0].owner.owner.name == "func.func"
    assert "arith.negf" in str(op)


def test_clone_outlives_its_original(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    mul = module.body.operations[0].regions[0].blocks[0].operations[1]
    copy = mul.clone()
    del module, mul
    gc.collect()
    assert copy.name == "arith.mulf"
    assert [v.type for v in copy.operands] == [f32(), f32()]


def test_block_and_region_outlive_detached_owner(ctx):
    block = func_op(inputs=[f32()]).regions[0].blocks[0]
    region = ir.Operation.create("scf.execute_region", regions=1).regions[0]
    gc.collect()
    assert block.owner.name == "func.func"
    assert block.arguments[0].type == f32()
    region.append_block()
    assert len(region.blocks) == 1


def test_detached_clone_survives_a_pass_erasing_what_it_uses(ctx):
    """A clone of an op of @f still uses @f's argument; symbol-dce then erases
    the private @f. The clone must not be left pointing into freed IR (it
    crashed): either the pass keeps @f alive, or the clone reports itself
    invalid."""
    assert_isolated("""
        import gc
        import mlirgpu as mg
        from mlirgpu import ir, passes
        with ir.Context():
            module = ir.Module.parse(
                "func.func private @f(%a: f32) -> f32 {\\n"
                "  %0 = arith.addf %a, %a : f32\\n  return %0 : f32\\n}")
            add = module.body.operations[0].regions[0].blocks[0].operations[0]
            copy = add.clone()
            del add
            try:
                passes.run(module, "symbol-dce")
            except ValueError as error:
                print("refused:", type(error).__name__)
            try:
                print(copy, [str(v.type) for v in copy.operands])
            except mg.InvalidObjectError:
                print("invalid")
            del copy, module
            gc.collect()
            print("survived")
    """, "survived")
