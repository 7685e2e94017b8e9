"""mlirgpu.ir: building and printing each kind of IR object (CPU only)."""
import pytest

from support.checks import filecheck
import mlirgpu
from mlirgpu import ir


def f32():
    return ir.Type.f32()


def func_op(name, inputs, results, *, location=None):
    """A func.func @name at the current insertion point (or detached), with an entry block."""
    fn = ir.Operation.create("func.func", regions=1, location=location, attributes={
        "sym_name": ir.Attribute.string(name),
        "function_type": ir.Attribute.type_attr(ir.Type.function(inputs, results)),
    })
    fn.regions[0].append_block(inputs)
    return fn


# --------------------------------------------------------------------------
# Context
# --------------------------------------------------------------------------

def test_default_context_is_one_object_outside_with():
    first = ir.Context.current()
    assert isinstance(first, ir.Context)
    assert ir.Context.current() is first
    assert ir.Type.f32().context is first


def test_with_context_makes_it_current_and_restores():
    outer, inner = ir.Context(), ir.Context()
    default = ir.Context.current()
    with outer as entered:
        assert entered is outer
        assert ir.Context.current() is outer
        with inner:
            assert ir.Context.current() is inner
            assert ir.Type.index().context is inner
        assert ir.Context.current() is outer
        assert ir.Attribute.unit().context is outer
    assert ir.Context.current() is default


def test_context_allow_unregistered_dialects():
    assert ir.Context().allow_unregistered_dialects is False
    open_ctx = ir.Context(allow_unregistered_dialects=True)
    assert open_ctx.allow_unregistered_dialects is True
    op = ir.Operation.create("mydialect.thing", results=[ir.Type.f32(context=open_ctx)], context=open_ctx)
    assert op.name == "mydialect.thing"
    assert '"mydialect.thing"() : () -> f32' in str(op)
    module = ir.Module.parse('"mydialect.other"() : () -> ()', context=open_ctx)
    assert [op.name for op in module.body.operations] == ["mydialect.other"]
    # Allowed is not registered.
    assert open_ctx.is_registered_operation("mydialect.thing") is False


def test_context_is_registered_operation(ctx):
    for name in ("arith.addf", "func.func", "gpu.func", "gpu.module", "scf.for", "memref.load",
                 "cf.cond_br", "nvvm.read.ptx.sreg.tid.x", "llvm.func"):
        assert ctx.is_registered_operation(name) is True, name
    for name in ("arith.nonesuch", "nodialect.op", "arith", ""):
        assert ctx.is_registered_operation(name) is False, name


# --------------------------------------------------------------------------
# Location
# --------------------------------------------------------------------------

def test_location_file(ctx):
    loc = ir.Location.file("kernel.py", 12, 3)
    assert str(loc) == 'loc("kernel.py":12:3)'
    assert repr(loc) == 'Location(loc("kernel.py":12:3))'
    assert (loc.filename, loc.line, loc.col) == ("kernel.py", 12, 3)
    assert loc.context is ctx
    assert ir.Location.file("kernel.py", 7).col == 0


def test_location_name_unknown_fused(ctx):
    child = ir.Location.file("a.py", 1, 2)
    named = ir.Location.name("acc", child)
    assert str(named) == 'loc("acc"("a.py":1:2))'
    assert str(ir.Location.name("bare")) == 'loc("bare")'
    unknown = ir.Location.unknown()
    assert str(unknown) == "loc(unknown)"
    fused = ir.Location.fused([child, ir.Location.file("b.py", 3, 4)])
    assert str(fused) == 'loc(fused["a.py":1:2, "b.py":3:4])'
    # Only file:line:col locations have a file, line and column.
    for loc in (named, unknown, fused):
        assert (loc.filename, loc.line, loc.col) == (None, None, None)


def test_location_equality_and_hash(ctx):
    a, b = ir.Location.file("x.py", 1, 1), ir.Location.file("x.py", 1, 1)
    assert a == b and hash(a) == hash(b)
    assert a != ir.Location.file("x.py", 2, 1)
    assert len({a, b, ir.Location.unknown()}) == 2


def test_with_location_locates_new_operations(ctx):
    outer, inner = ir.Location.file("outer.py", 1, 1), ir.Location.file("inner.py", 2, 5)
    module = ir.Module.create()
    with ir.InsertionPoint(module.body), outer:
        first = ir.Operation.create("arith.constant", results=[f32()],
                                    attributes={"value": ir.Attribute.float(1.0, f32())})
        with inner:
            second = ir.Operation.create("arith.constant", results=[f32()],
                                         attributes={"value": ir.Attribute.float(2.0, f32())})
        third = ir.Operation.create("arith.constant", results=[f32()],
                                    attributes={"value": ir.Attribute.float(3.0, f32())})
        explicit = ir.Operation.create("arith.constant", results=[f32()], location=ir.Location.name("here"),
                                       attributes={"value": ir.Attribute.float(4.0, f32())})
    after = ir.Operation.create("arith.constant", results=[f32()],
                                attributes={"value": ir.Attribute.float(5.0, f32())})
    assert first.location == outer and third.location == outer
    assert second.location == inner
    assert str(explicit.location) == 'loc("here")'
    assert str(after.location) == "loc(unknown)"
    text = module.print(debug_info=True)
    filecheck(text,
              r'arith\.constant 1\.0+e\+00 : f32 loc\((#loc\d*|"outer\.py":1:1)\)',
              r'arith\.constant 2\.0+e\+00 : f32 loc\((#loc\d*|"inner\.py":2:5)\)',
              r'arith\.constant 3\.0+e\+00 : f32 loc\((#loc\d*|"outer\.py":1:1)\)',
              r'arith\.constant 4\.0+e\+00 : f32 loc\((#loc\d*|"here")\)')
    assert 'loc("outer.py":1:1)' in text and 'loc("inner.py":2:5)' in text
    assert "outer.py" not in str(module)


# --------------------------------------------------------------------------
# Type
# --------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "i1", "i32", "si8", "ui64", "index", "f16", "bf16", "f32", "f64", "none",
    "memref<4x?xf32>", "memref<8xf16, 3>", "memref<2x2xf32, #gpu.address_space<workgroup>>",
    "vector<4xf32>", "vector<2x8xbf16>", "(f32, index) -> i1", "() -> ()", "tensor<?x4xf32>",
    "!llvm.ptr", "!gpu.async.token",
])
def test_type_parse_round_trip(ctx, text):
    t = ir.Type.parse(text)
    assert str(t) == text
    assert repr(t) == f"Type({text})"
    assert t.context is ctx
    assert ir.Type.parse(str(t)) == t


@pytest.mark.parametrize("width", [1, 8, 16, 32, 64, 128])
def test_type_integer_signedness(ctx, width):
    signless, signed, unsigned = (ir.Type.integer(width), ir.Type.integer(width, True),
                                  ir.Type.integer(width, signed=False))
    assert (str(signless), str(signed), str(unsigned)) == (f"i{width}", f"si{width}", f"ui{width}")
    assert (signless.signed, signed.signed, unsigned.signed) == (None, True, False)
    assert signless.width == signed.width == unsigned.width == width
    assert signless.is_integer and not signless.is_float and not signless.is_index
    assert len({signless, signed, unsigned}) == 3


def test_type_index_and_floats(ctx):
    index = ir.Type.index()
    assert str(index) == "index" and index.is_index and not index.is_integer
    for make, text, width in ((ir.Type.f16, "f16", 16), (ir.Type.bf16, "bf16", 16),
                              (ir.Type.f32, "f32", 32), (ir.Type.f64, "f64", 64)):
        t = make()
        assert str(t) == text
        assert t.is_float and not t.is_integer
        assert t.width == width
        assert t == ir.Type.parse(text)
    assert ir.Type.f16() != ir.Type.bf16()
    assert str(ir.Type.none()) == "none"


def test_type_memref_static_and_dynamic(ctx):
    static = ir.Type.memref([256, 128], f32())
    assert str(static) == "memref<256x128xf32>"
    assert static.is_memref and not static.is_vector
    assert static.shape == (256, 128)
    assert static.element_type == f32()
    assert static.memory_space is None
    dynamic = ir.Type.memref([None, 4, None], ir.Type.f16())
    assert str(dynamic) == "memref<?x4x?xf16>"
    assert dynamic.shape == (None, 4, None)
    assert ir.Type.memref([ir.DYNAMIC, 4, None], ir.Type.f16()) == dynamic
    assert str(ir.Type.memref([], f32())) == "memref<f32>"
    assert ir.Type.memref([], f32()).shape == ()


def test_type_memref_strided_layout(ctx):
    layout = ir.Attribute.strided_layout(None, [None, 0, 1])
    assert str(layout) == "strided<[?, 0, 1], offset: ?>"
    assert str(ir.Attribute.strided_layout(4, [8])) == "strided<[8], offset: 4>"
    t = ir.Type.memref([None, 3, 5], f32(), layout=layout)
    assert str(t) == "memref<?x3x5xf32, strided<[?, 0, 1], offset: ?>>"
    assert t == ir.Type.parse("memref<?x3x5xf32, strided<[?, 0, 1], offset: ?>>")
    with pytest.raises(mlirgpu.MLIRError, match="the number of strides to match the rank"):
        ir.Type.memref([None, 3, 5], f32(), layout=ir.Attribute.strided_layout(0, [1]))
    with pytest.raises(TypeError, match="strides must be ints or None"):
        ir.Attribute.strided_layout(0, ["1"])
    with pytest.raises(TypeError, match="offset must be an int or None"):
        ir.Attribute.strided_layout(1.5, [1])


def test_attribute_identity_map(ctx):
    assert str(ir.Attribute.identity_map(2)) == "affine_map<(d0, d1) -> (d0, d1)>"
    assert str(ir.Attribute.identity_map(0)) == "affine_map<() -> ()>"
    assert ir.Attribute.identity_map(3) == ir.Attribute.parse("affine_map<(a, b, c) -> (a, b, c)>")
    with pytest.raises(ValueError, match="rank must be >= 0"):
        ir.Attribute.identity_map(-1)
    assert str(ir.Attribute.permutation_map([2, 0, 1])) == "affine_map<(d0, d1, d2) -> (d2, d0, d1)>"
    assert ir.Attribute.permutation_map([0, 1]) == ir.Attribute.identity_map(2)
    for bad in ([0, 0], [1, 2], [-1]):
        with pytest.raises(ValueError, match="each of 0 .. len - 1 once"):
            ir.Attribute.permutation_map(bad)
    with pytest.raises(TypeError, match="permutation entries must be ints, not str"):
        ir.Attribute.permutation_map(["0"])


def test_type_memref_memory_space(ctx):
    shared = ir.Type.memref([32, 32], f32(), 3)
    assert str(shared) == "memref<32x32xf32, 3>"
    assert shared.memory_space == ir.Attribute.integer(3, ir.Type.integer(64))
    assert shared.memory_space.value == 3
    # Space 0 is the default space: no attribute.
    assert ir.Type.memref([4], f32(), 0) == ir.Type.memref([4], f32())
    assert ir.Type.memref([4], f32(), 0).memory_space is None
    workgroup = ir.Attribute.parse("#gpu.address_space<workgroup>")
    typed = ir.Type.memref([4], f32(), memory_space=workgroup)
    assert str(typed) == "memref<4xf32, #gpu.address_space<workgroup>>"
    assert typed.memory_space == workgroup
    assert typed == ir.Type.parse("memref<4xf32, #gpu.address_space<workgroup>>")


def test_type_vector(ctx):
    v = ir.Type.vector([2, 4], f32())
    assert str(v) == "vector<2x4xf32>"
    assert v.is_vector and not v.is_memref
    assert v.shape == (2, 4)
    assert v.element_type == f32()
    assert ir.Type.vector([4], ir.Type.f16()) == ir.Type.parse("vector<4xf16>")


def test_type_function(ctx):
    index, f16 = ir.Type.index(), ir.Type.f16()
    fn = ir.Type.function([f32(), index], [f16])
    assert str(fn) == "(f32, index) -> f16"
    assert fn.is_function
    assert fn.inputs == [f32(), index]
    assert fn.results == [f16]
    empty = ir.Type.function([], [])
    assert str(empty) == "() -> ()" and empty.inputs == [] and empty.results == []
    assert ir.Type.function([], [f32(), f32()]).results == [f32(), f32()]


def test_type_equality_and_hashing(ctx):
    assert ir.Type.f32() == ir.Type.f32() == ir.Type.parse("f32")
    assert hash(ir.Type.f32()) == hash(ir.Type.parse("f32"))
    assert ir.Type.f32() != ir.Type.f64()
    assert ir.Type.integer(32) != ir.Type.integer(32, True)
    assert ir.Type.memref([4], f32()) != ir.Type.memref([5], f32())
    assert ir.Type.memref([None], f32()) != ir.Type.memref([4], f32())
    assert {ir.Type.f32(): "a"}[ir.Type.parse("f32")] == "a"
    assert len({ir.Type.f32(), ir.Type.parse("f32"), ir.Type.index()}) == 2
    # Not equal to other kinds, nor to the same type of another Context.
    assert ir.Type.f32() != ir.Attribute.type_attr(ir.Type.f32())
    assert ir.Type.f32() != "f32"
    assert ir.Type.f32() != ir.Type.f32(context=ir.Context())


# --------------------------------------------------------------------------
# Attribute
# --------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "5 : i32", "1.500000e+00 : f32", '"hello"', "true", "unit", "f32", "[1, \"x\"]",
    "{a = 1 : i64, b = \"c\"}", "@sym", "array<i32: 1, 2, 3>", "array<i64: 4>", "#gpu<dim x>",
    "#gpu.address_space<workgroup>", "dense<1.000000e+00> : vector<4xf32>",
    '#nvvm.target<chip = "sm_90a", features = "+ptx80">',
])
def test_attribute_parse_round_trip(ctx, text):
    a = ir.Attribute.parse(text)
    assert str(a) == text
    assert repr(a) == f"Attribute({text})"
    assert a.context is ctx
    assert ir.Attribute.parse(str(a)) == a


def test_attribute_integer(ctx):
    i32, i64 = ir.Type.integer(32), ir.Type.integer(64)
    default = ir.Attribute.integer(5)
    assert str(default) == "5 : i64" and default.value == 5
    assert str(ir.Attribute.integer(-7, i32)) == "-7 : i32"
    assert ir.Attribute.integer(-7, i32).value == -7
    assert ir.Attribute.integer(2**63 - 1, i64).value == 2**63 - 1
    assert ir.Attribute.integer(255, ir.Type.integer(8, False)).value == 255
    assert ir.Attribute.integer(-1, ir.Type.integer(8, True)).value == -1
    assert str(ir.Attribute.integer(3, ir.Type.index())) == "3 : index"
    assert ir.Attribute.integer(3, ir.Type.index()).value == 3
    assert ir.Attribute.integer(1, ir.Type.integer(1)).value in (1, -1)  # i1: MLIR prints true
    assert ir.Attribute.integer(5, i32) == ir.Attribute.parse("5 : i32")
    assert ir.Attribute.integer(5, i32) != ir.Attribute.integer(5, i64)


def test_attribute_float(ctx):
    default = ir.Attribute.float(1.5)
    assert str(default) == "1.500000e+00 : f64" and default.value == 1.5
    single = ir.Attribute.float(0.25, f32())
    assert str(single) == "2.500000e-01 : f32" and single.value == 0.25
    assert ir.Attribute.float(0.5, ir.Type.f16()).value == 0.5
    assert ir.Attribute.float(-2.0, ir.Type.bf16()).value == -2.0
    assert ir.Attribute.float(1.0, f32()) == ir.Attribute.parse("1.0 : f32")


def test_attribute_string_bool_unit_symbol(ctx):
    s = ir.Attribute.string("kernels")
    assert str(s) == '"kernels"' and s.value == "kernels"
    assert ir.Attribute.string("with \"quotes\"").value == 'with "quotes"'
    assert str(ir.Attribute.bool(True)) == "true" and ir.Attribute.bool(True).value is True
    assert str(ir.Attribute.bool(False)) == "false" and ir.Attribute.bool(False).value is False
    assert str(ir.Attribute.unit()) == "unit" and ir.Attribute.unit().value is True
    ref = ir.Attribute.symbol_ref("sgemm")
    assert str(ref) == "@sgemm" and ref.value == "sgemm"


def test_attribute_type_attr(ctx):
    t = ir.Type.function([f32()], [])
    a = ir.Attribute.type_attr(t)
    assert str(a) == "(f32) -> ()"
    assert a.value == t
    assert a == ir.Attribute.type_attr(ir.Type.parse("(f32) -> ()"))


def test_attribute_array_and_dictionary(ctx):
    one, name = ir.Attribute.integer(1), ir.Attribute.string("x")
    arr = ir.Attribute.array([one, name])
    assert str(arr) == '[1, "x"]'
    assert arr.value == [one, name]
    assert ir.Attribute.array([]).value == []
    d = ir.Attribute.dictionary({"b": name, "a": one})
    assert str(d) == '{a = 1 : i64, b = "x"}'  # MLIR sorts by name
    assert d.value == {"a": one, "b": name}
    nested = ir.Attribute.array([arr, d])
    assert nested.value[0].value[1].value == "x"


def test_attribute_dense_arrays(ctx):
    a32 = ir.Attribute.dense_i32_array([1, -2, 2**31 - 1])
    assert str(a32) == "array<i32: 1, -2, 2147483647>"
    assert a32.value == [1, -2, 2**31 - 1]
    a64 = ir.Attribute.dense_i64_array([2**40, 0])
    assert str(a64) == "array<i64: 1099511627776, 0>"
    assert a64.value == [2**40, 0]
    assert str(ir.Attribute.dense_i32_array([])) == "array<i32>"
    assert a32 != ir.Attribute.dense_i64_array([1, -2, 2**31 - 1])


def test_attribute_type_property(ctx):
    """`.type` is the type of a typed attribute (integer, float), else None."""
    i32 = ir.Type.integer(32)
    assert ir.Attribute.integer(5, i32).type == i32
    assert ir.Attribute.float(1.0, ir.Type.f16()).type == ir.Type.f16()
    assert ir.Attribute.integer(5).type == ir.Type.integer(64)
    assert ir.Attribute.parse("dense<1.0> : vector<4xf32>").type == ir.Type.vector([4], f32())
    assert ir.Attribute.unit().type is None


def test_attribute_equality_and_hashing(ctx):
    assert ir.Attribute.string("a") == ir.Attribute.parse('"a"')
    assert hash(ir.Attribute.string("a")) == hash(ir.Attribute.parse('"a"'))
    assert ir.Attribute.string("a") != ir.Attribute.string("b")
    assert ir.Attribute.unit() == ir.Attribute.unit()
    assert len({ir.Attribute.unit(), ir.Attribute.unit(), ir.Attribute.bool(True)}) == 2


# --------------------------------------------------------------------------
# Module
# --------------------------------------------------------------------------

FUNC_TEXT = """\
module {
  func.func @axpy(%arg0: f32, %arg1: f32, %arg2: f32) -> f32 {
    %0 = arith.mulf %arg0, %arg1 : f32
    %1 = arith.addf %0, %arg2 : f32
    return %1 : f32
  }
}
"""


def test_module_create(ctx):
    module = ir.Module.create()
    assert str(module) == "module {\n}\n"
    assert module.context is ctx
    assert module.operation.name == "builtin.module"
    assert module.operation.parent is None
    assert isinstance(module.body, ir.Block)
    assert module.body.operations == []
    assert module.body.owner == module.operation
    assert module.verify() is True
    located = ir.Module.create(location=ir.Location.file("m.py", 3, 1))
    assert str(located.operation.location) == 'loc("m.py":3:1)'


def test_module_parse_and_print(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    assert str(module) == FUNC_TEXT
    assert module.verify() is True
    assert [op.name for op in module.body.operations] == ["func.func"]
    generic = module.print(generic=True)
    filecheck(generic, r'^"builtin\.module"\(\) \(\{', r'"func\.func"\(\) <\{function_type = \(f32, f32, f32\) -> f32, '
              r'sym_name = "axpy"\}>', r'"arith\.mulf"\(%arg0, %arg1\)', r'"func\.return"\(%1\) : \(f32\) -> \(\)')
    other = ir.Context()
    assert ir.Module.parse(FUNC_TEXT, context=other).context is other


def test_module_walk_pre_and_post_order(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    pre = [op.name for op in module.walk()]
    assert pre == ["builtin.module", "func.func", "arith.mulf", "arith.addf", "func.return"]
    post = [op.name for op in module.walk(post_order=True)]
    assert post == ["arith.mulf", "arith.addf", "func.return", "func.func", "builtin.module"]
    fn = module.body.operations[0]
    assert [op.name for op in fn.walk()] == ["func.func", "arith.mulf", "arith.addf", "func.return"]
    # Walking twice gives the same wrappers.
    assert module.walk()[2] is module.walk()[2]


def test_module_clone_is_independent(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    copy = module.clone()
    assert isinstance(copy, ir.Module)
    assert str(copy) == str(module)
    copy.body.operations[0].set_attribute("sym_name", ir.Attribute.string("renamed"))
    assert "@renamed" in str(copy)
    assert str(module) == FUNC_TEXT
    del module
    assert copy.verify() is True


# --------------------------------------------------------------------------
# Operation
# --------------------------------------------------------------------------

def test_operation_create_with_operands_results_attributes(ctx):
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func_op("f", [f32(), f32()], [f32()])
    x, y = fn.regions[0].blocks[0].arguments
    loc = ir.Location.file("ops.py", 4, 2)
    with ir.InsertionPoint(fn.regions[0].blocks[0]):
        add = ir.Operation.create("arith.addf", operands=[x, y], results=[f32()], location=loc,
                                  attributes={"fastmath": ir.Attribute.parse("#arith.fastmath<fast>"),
                                              "my.tag": ir.Attribute.string("t")})
        ret = ir.Operation.create("func.return", operands=[add.result])
    assert add.name == "arith.addf"
    assert add.context is ctx
    assert add.operands == [x, y]
    assert len(add.results) == 1 and add.results[0] == add.result
    assert add.result.type == f32()
    assert add.location == loc
    assert add.regions == [] and add.successors == []
    assert set(add.attributes) == {"fastmath", "my.tag"}
    assert str(add.get_attribute("fastmath")) == "#arith.fastmath<fast>"
    assert ret.results == [] and ret.operands == [add.result]
    assert module.verify() is True
    filecheck(str(module), r"func\.func @f\(%arg0: f32, %arg1: f32\) -> f32 \{",
              r'%0 = arith\.addf %arg0, %arg1 fastmath<fast> \{my\.tag = "t"\} : f32', r"return %0 : f32")


def test_operation_attributes_get_set_remove(ctx):
    fn = func_op("f", [], [])
    assert fn.get_attribute("sym_name").value == "f"
    assert set(fn.attributes) == {"sym_name", "function_type"}
    fn.set_attribute("sym_name", ir.Attribute.string("g"))
    assert fn.get_attribute("sym_name") == ir.Attribute.string("g")
    fn.set_attribute("my.flag", ir.Attribute.unit())
    assert fn.attributes["my.flag"] == ir.Attribute.unit()
    assert "my.flag" in str(fn)
    fn.remove_attribute("my.flag")
    assert "my.flag" not in fn.attributes and "my.flag" not in str(fn)
    with pytest.raises(KeyError, match="my.flag"):
        fn.get_attribute("my.flag")
    with pytest.raises(KeyError, match="absent"):
        fn.remove_attribute("absent")
    # `attributes` is a snapshot.
    snapshot = fn.attributes
    snapshot["x"] = ir.Attribute.unit()
    assert "x" not in fn.attributes


def test_operation_regions_parent_block(ctx):
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func_op("f", [f32()], [])
    entry = fn.regions[0].blocks[0]
    with ir.InsertionPoint(entry):
        ret = ir.Operation.create("func.return")
    assert len(fn.regions) == 1
    assert fn.regions[0].owner == fn
    assert fn.parent == module.operation and fn.block == module.body
    assert ret.parent == fn and ret.block == entry
    assert ret.parent.parent == module.operation
    detached = ir.Operation.create("func.return")
    assert detached.parent is None and detached.block is None
    many = ir.Operation.create("scf.execute_region", regions=1)
    assert len(many.regions) == 1
    assert len(ir.Operation.create("scf.if", operands=[], regions=2).regions) == 2


def test_operation_successors_between_blocks(ctx):
    i1, i32 = ir.Type.integer(1), ir.Type.integer(32)
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func_op("select", [i1, i32, i32], [i32])
    region = fn.regions[0]
    entry = region.blocks[0]
    then_block, else_block, join = region.append_block(), region.append_block(), region.append_block([i32])
    cond, x, y = entry.arguments
    with ir.InsertionPoint(entry):
        cond_br = ir.Operation.create("cf.cond_br", operands=[cond], successors=[then_block, else_block],
                                      attributes={"operandSegmentSizes": ir.Attribute.dense_i32_array([1, 0, 0])})
    with ir.InsertionPoint(then_block):
        br_then = ir.Operation.create("cf.br", operands=[x], successors=[join])
    with ir.InsertionPoint(else_block):
        ir.Operation.create("cf.br", operands=[y], successors=[join])
    with ir.InsertionPoint(join):
        ir.Operation.create("func.return", operands=[join.arguments[0]])
    assert cond_br.successors == [then_block, else_block]
    assert br_then.successors == [join]
    assert br_then.successors[0].owner == fn
    assert join.arguments[0].num_uses == 1
    assert module.verify() is True
    filecheck(str(module),
              r"func\.func @select\(%arg0: i1, %arg1: i32, %arg2: i32\) -> i32 \{",
              r"cf\.cond_br %arg0, \^bb1, \^bb2",
              r"\^bb1:  // pred: \^bb0", r"cf\.br \^bb3\(%arg1 : i32\)",
              r"\^bb2:  // pred: \^bb0", r"cf\.br \^bb3\(%arg2 : i32\)",
              r"\^bb3\(%0: i32\):  // 2 preds: \^bb1, \^bb2", r"return %0 : i32")


def test_operation_erase(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    block = module.body.operations[0].regions[0].blocks[0]
    mul, add, ret = block.operations
    ret.erase()
    assert not ret.is_valid
    assert repr(ret) == "<mlirgpu.ir.Operation (invalid)>"
    add.erase()
    assert [op.name for op in block.operations] == ["arith.mulf"]
    assert "arith.addf" not in str(module)
    assert mul.is_valid
    # A detached operation can be erased too.
    detached = ir.Operation.create("func.return")
    detached.erase()
    assert not detached.is_valid


def test_operation_clone(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    fn = module.body.operations[0]
    copy = fn.clone()
    assert copy is not fn and copy != fn
    assert copy.parent is None and copy.block is None
    assert str(copy).rstrip() == str(fn).rstrip()
    copy.set_attribute("sym_name", ir.Attribute.string("axpy2"))
    module.body.append(copy)
    assert [op.get_attribute("sym_name").value for op in module.body.operations] == ["axpy", "axpy2"]
    assert copy.parent == module.operation
    assert module.verify() is True


def test_operation_print_generic_and_repr(ctx):
    op = ir.Operation.create("arith.constant", results=[ir.Type.index()],
                             attributes={"value": ir.Attribute.integer(7, ir.Type.index())})
    assert str(op) == "%c7 = arith.constant 7 : index\n"
    assert op.print() == str(op)
    assert op.print(generic=True) == '%0 = "arith.constant"() <{value = 7 : index}> : () -> index\n'
    assert op.print(debug_info=True).rstrip().endswith("loc(unknown)")
    assert repr(op) == "<mlirgpu.ir.Operation arith.constant>"


def test_operation_identity_and_equality(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    fn = module.body.operations[0]
    assert module.body.operations[0] is fn
    assert fn.regions[0].blocks[0].operations[0].parent is fn
    assert hash(fn) == hash(module.walk()[1])
    assert fn != module.operation


def test_operation_detached_ignores_insertion_point(ctx):
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        op = ir.Operation.create("func.return", detached=True)
        attached = ir.Operation.create("func.return")
    assert op.parent is None
    assert module.body.operations == [attached]


# --------------------------------------------------------------------------
# Block, Region, Value
# --------------------------------------------------------------------------

def test_block_arguments_operations_append(ctx):
    fn = func_op("f", [f32(), ir.Type.index()], [])
    block = fn.regions[0].blocks[0]
    assert [a.type for a in block.arguments] == [f32(), ir.Type.index()]
    extra = block.add_argument(ir.Type.f16(), ir.Location.file("arg.py", 1, 1))
    assert extra.index == 2 and extra.type == ir.Type.f16()
    assert extra.is_block_argument and extra.owner == block
    assert len(block.arguments) == 3
    assert block.operations == []
    ret = ir.Operation.create("func.return")
    block.append(ret)
    assert block.operations == [ret]
    assert ret.parent == fn
    assert block.owner == fn
    assert block.region == fn.regions[0]
    assert str(block).startswith("^bb0(%arg0: f32, %arg1: index, %arg2: f16):")
    assert "func.return" in str(block)


def test_region_blocks_append_block_owner(ctx):
    op = ir.Operation.create("scf.execute_region", regions=1)
    region = op.regions[0]
    assert region.blocks == [] and region.owner == op
    first = region.append_block()
    second = region.append_block([f32(), ir.Type.index()],
                                 [ir.Location.file("a.py", 1, 1), ir.Location.file("b.py", 2, 2)])
    assert region.blocks == [first, second]
    assert first.arguments == []
    assert [a.type for a in second.arguments] == [f32(), ir.Type.index()]
    assert first.region == region and second.owner == op
    with ir.Location.file("c.py", 3, 3):
        third = region.append_block([f32()])
    assert len(region.blocks) == 3 and third.arguments[0].type == f32()


def test_value_properties(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    fn = module.body.operations[0]
    block = fn.regions[0].blocks[0]
    a, b, c = block.arguments
    mul, add, ret = block.operations
    assert a.type == f32()
    assert a.is_block_argument and a.index == 0 and c.index == 2
    assert a.owner == block and isinstance(a.owner, ir.Block)
    assert a.num_uses == 1 and c.num_uses == 1
    result = mul.result
    assert not result.is_block_argument and result.index == 0
    assert result.owner is mul and isinstance(result.owner, ir.Operation)
    assert result.num_uses == 1
    assert str(result) == "%0 = arith.mulf %arg0, %arg1 : f32"
    assert str(a) == "<block argument> of type 'f32' at index: 0"
    assert add.operands[0] == result and hash(add.operands[0]) == hash(result)
    assert add.operands[1] == c and add.operands[1] != a


def test_value_replace_all_uses_with(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    block = module.body.operations[0].regions[0].blocks[0]
    a, b, c = block.arguments
    mul, add, ret = block.operations
    mul.result.replace_all_uses_with(a)
    assert mul.result.num_uses == 0 and a.num_uses == 2
    assert add.operands == [a, c]
    mul.erase()
    assert module.verify() is True
    filecheck(str(module), r"%0 = arith\.addf %arg0, %arg2 : f32", r"return %0 : f32")


def test_value_replaced_by_itself_keeps_its_uses(ctx):
    module = ir.Module.parse(FUNC_TEXT)
    mul = module.body.operations[0].regions[0].blocks[0].operations[0]
    mul.result.replace_all_uses_with(mul.result)   # returns: nothing to replace
    assert mul.result.num_uses == 1


def _outer_with_block(name="arith.addi"):
    """A detached operation with a result and one block in its region."""
    outer = ir.Operation.create(name, results=[ir.Type.integer(32)], regions=1, detached=True)
    return outer, outer.regions[0].append_block([ir.Type.integer(32)])


# A value used inside the operation that defines it never dominates its use,
# and MLIR's verifier (which printing runs first) crashed checking one inside a
# detached operation. Each way of making such a use is refused; the operation
# then still prints and verifies.
def test_operation_cannot_use_a_result_of_the_operation_it_is_created_in(ctx):
    outer, block = _outer_with_block()
    with ir.InsertionPoint(block), pytest.raises(ValueError, match="inside the operation that defines it"):
        ir.Operation.create("arith.constant", operands=[outer.result], results=[ir.Type.integer(8)])
    assert "arith.addi" in str(outer)
    with pytest.raises(mlirgpu.MLIRError):
        outer.verify()  # arith.addi wants operands, not a region: an error, not a crash


def test_operation_using_a_result_of_its_destination_cannot_be_inserted():
    with ir.Context(allow_unregistered_dialects=True):
        outer, block = _outer_with_block("test.outer")
        user = ir.Operation.create("test.user", operands=[outer.result], detached=True)
        with pytest.raises(ValueError, match="operand #0 of 'test.user'.*inside the operation that defines it"):
            ir.InsertionPoint(block).insert(user)
        assert "test.outer" in str(outer) and "test.user" in str(user)


def test_use_inside_an_operation_cannot_be_replaced_by_its_result():
    with ir.Context(allow_unregistered_dialects=True):
        outer, block = _outer_with_block("test.outer")
        with ir.InsertionPoint(block):
            inner = ir.Operation.create("test.holder", regions=1)
        with ir.InsertionPoint(inner.regions[0].append_block()):
            user = ir.Operation.create("test.user", operands=[block.arguments[0]])
        with pytest.raises(ValueError, match="inside the operation that defines"):
            block.arguments[0].replace_all_uses_with(outer.result)
        assert user.operands[0] == block.arguments[0]
        assert outer.verify() is True
        assert "test.user" in str(outer)


def test_value_of_a_multi_result_operation(ctx):
    op = ir.Operation.create("arith.addui_extended", operands=[], results=[ir.Type.integer(32), ir.Type.integer(1)])
    low, carry = op.results
    assert (low.index, carry.index) == (0, 1)
    assert (low.type, carry.type) == (ir.Type.integer(32), ir.Type.integer(1))
    assert low.owner is op and carry.owner is op
    assert low != carry


# --------------------------------------------------------------------------
# InsertionPoint
# --------------------------------------------------------------------------

def constant(value):
    return ir.Operation.create("arith.constant", results=[ir.Type.index()],
                               attributes={"value": ir.Attribute.integer(value, ir.Type.index())})


def constants(block):
    return [op.get_attribute("value").value for op in block.operations if op.name == "arith.constant"]


def test_insertion_point_at_end(ctx):
    block = func_op("f", [], []).regions[0].blocks[0]
    ip = ir.InsertionPoint(block)
    assert ip.block == block
    with ip as entered:
        assert entered is ip
        constant(1)
        constant(2)
    ip.insert(constant(3))
    assert constants(block) == [1, 2, 3]


def test_insertion_point_at_block_begin(ctx):
    block = func_op("f", [], []).regions[0].blocks[0]
    with ir.InsertionPoint.at_block_begin(block):  # empty block: the end
        constant(10)
    with ir.InsertionPoint.at_block_begin(block):
        constant(1)
        constant(2)
    assert constants(block) == [1, 2, 10]


def test_insertion_point_at_block_terminator_and_before(ctx):
    block = func_op("f", [], []).regions[0].blocks[0]
    with ir.InsertionPoint(block):
        first = constant(1)
        ret = ir.Operation.create("func.return")
    with ir.InsertionPoint.at_block_terminator(block):
        constant(2)
    with ir.InsertionPoint.before(first):
        constant(0)
    ir.InsertionPoint.before(ret).insert(constant(3))
    assert constants(block) == [0, 1, 2, 3]
    assert block.operations[-1] == ret
    assert ir.InsertionPoint.before(first).block == block


def test_insertion_point_current_and_nesting(ctx):
    outer_block = func_op("f", [], []).regions[0].blocks[0]
    inner_block = func_op("g", [], []).regions[0].blocks[0]
    assert ir.InsertionPoint.current() is None
    outer, inner = ir.InsertionPoint(outer_block), ir.InsertionPoint(inner_block)
    with outer:
        assert ir.InsertionPoint.current() is outer
        constant(1)
        with inner:
            assert ir.InsertionPoint.current() is inner
            constant(2)
        constant(3)
    assert ir.InsertionPoint.current() is None
    constant(4)  # no insertion point: detached
    assert constants(outer_block) == [1, 3]
    assert constants(inner_block) == [2]


def test_insertion_point_stack_unwinds_on_exception(ctx):
    block = func_op("f", [], []).regions[0].blocks[0]
    with pytest.raises(ZeroDivisionError):
        with ir.InsertionPoint(block), ir.Location.file("z.py", 1, 1):
            1 / 0
    assert ir.InsertionPoint.current() is None
    assert str(constant(1).location) == "loc(unknown)"


# --------------------------------------------------------------------------
# Whole functions built through Operation.create
# --------------------------------------------------------------------------

def test_build_func_with_arith(ctx):
    """f(x, y, n) = (x * y + 2.0) as f32, n * 4 + 1 as index."""
    index = ir.Type.index()
    module = ir.Module.create()
    with ir.InsertionPoint(module.body), ir.Location.file("build.py", 1, 1):
        fn = ir.Operation.create("func.func", regions=1, attributes={
            "sym_name": ir.Attribute.string("compute"),
            "function_type": ir.Attribute.type_attr(ir.Type.function([f32(), f32(), index], [f32(), index])),
            "sym_visibility": ir.Attribute.string("private"),
        })
    entry = fn.regions[0].append_block([f32(), f32(), index])
    x, y, n = entry.arguments
    with ir.InsertionPoint(entry), ir.Location.file("build.py", 2, 1):
        two = ir.Operation.create("arith.constant", results=[f32()],
                                  attributes={"value": ir.Attribute.float(2.0, f32())}).result
        four = ir.Operation.create("arith.constant", results=[index],
                                   attributes={"value": ir.Attribute.integer(4, index)}).result
        one = ir.Operation.create("arith.constant", results=[index],
                                  attributes={"value": ir.Attribute.integer(1, index)}).result
        prod = ir.Operation.create("arith.mulf", operands=[x, y], results=[f32()]).result
        total = ir.Operation.create("arith.addf", operands=[prod, two], results=[f32()]).result
        scaled = ir.Operation.create("arith.muli", operands=[n, four], results=[index]).result
        plus = ir.Operation.create("arith.addi", operands=[scaled, one], results=[index]).result
        cmp = ir.Operation.create("arith.cmpf", operands=[total, two], results=[ir.Type.integer(1)],
                                  attributes={"predicate": ir.Attribute.integer(2)}).result  # ogt
        picked = ir.Operation.create("arith.select", operands=[cmp, total, two], results=[f32()]).result
        ir.Operation.create("func.return", operands=[picked, plus])
    assert module.verify() is True
    filecheck(str(module),
              r"func\.func private @compute\(%arg0: f32, %arg1: f32, %arg2: index\) -> \(f32, index\) \{",
              r"%(\w+) = arith\.constant 2\.000000e\+00 : f32",
              r"%c4 = arith\.constant 4 : index",
              r"%c1 = arith\.constant 1 : index",
              r"%0 = arith\.mulf %arg0, %arg1 : f32",
              r"%1 = arith\.addf %0, %cst : f32",
              r"%2 = arith\.muli %arg2, %c4 : index",
              r"%3 = arith\.addi %2, %c1 : index",
              r"%4 = arith\.cmpf ogt, %1, %cst : f32",
              r"%5 = arith\.select %4, %1, %cst : f32",
              r"return %5, %3 : f32, index")
    filecheck(module.print(debug_info=True), r'loc\("build\.py":2:1\)')


def test_build_gpu_module_with_kernel(ctx):
    buffer = ir.Type.memref([16], f32())
    module = ir.Module.create()
    module.operation.set_attribute("gpu.container_module", ir.Attribute.unit())
    with ir.InsertionPoint(module.body):
        gpu_module = ir.Operation.create("gpu.module", regions=1,
                                         attributes={"sym_name": ir.Attribute.string("kernels")})
    with ir.InsertionPoint(gpu_module.regions[0].append_block()):
        kernel = ir.Operation.create("gpu.func", regions=1, attributes={
            "sym_name": ir.Attribute.string("scale"),
            "function_type": ir.Attribute.type_attr(ir.Type.function([buffer, f32()], [])),
            "gpu.kernel": ir.Attribute.unit(),
        })
    body = kernel.regions[0].append_block([buffer, f32()])
    data, factor = body.arguments
    with ir.InsertionPoint(body):
        tid = ir.Operation.create("gpu.thread_id", results=[ir.Type.index()],
                                  attributes={"dimension": ir.Attribute.parse("#gpu<dim x>")}).result
        value = ir.Operation.create("memref.load", operands=[data, tid], results=[f32()]).result
        scaled = ir.Operation.create("arith.mulf", operands=[value, factor], results=[f32()]).result
        ir.Operation.create("memref.store", operands=[scaled, data, tid])
        ir.Operation.create("gpu.return")
    assert module.verify() is True
    assert kernel.get_attribute("function_type").value == ir.Type.function([buffer, f32()], [])
    filecheck(str(module),
              r"^module attributes \{gpu\.container_module\} \{",
              r"gpu\.module @kernels \{",
              r"gpu\.func @scale\(%arg0: memref<16xf32>, %arg1: f32\) kernel \{",
              r"%thread_id_x = gpu\.thread_id\s+x",
              r"%0 = memref\.load %arg0\[%thread_id_x\] : memref<16xf32>",
              r"%1 = arith\.mulf %0, %arg1 : f32",
              r"memref\.store %1, %arg0\[%thread_id_x\] : memref<16xf32>",
              r"gpu\.return")
    assert [op.name for op in module.walk()] == [
        "builtin.module", "gpu.module", "gpu.func", "gpu.thread_id", "memref.load", "arith.mulf",
        "memref.store", "gpu.return"]


def test_with_stacks_are_per_thread(ctx):
    import threading
    block = func_op("f", [], []).regions[0].blocks[0]
    seen = {}

    def other_thread():
        seen["ip"] = ir.InsertionPoint.current()
        seen["context"] = ir.Context.current()
        seen["op_parent"] = ir.Operation.create("func.return").parent

    with ir.InsertionPoint(block):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen["ip"] is None
    assert seen["context"] is not ctx and isinstance(seen["context"], ir.Context)
    assert seen["op_parent"] is None
    assert block.operations == []
