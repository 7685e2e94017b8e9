"""Property-based fuzzing of the IR layer (Hypothesis): random programs of
IR calls (creating operations with operands, results, regions and
attributes, cloning, moving operations between modules, erasing, replacing
uses, dropping the last reference to a module, printing, verifying, walking)
run against a pool of live objects. Each call either does what it says or
raises a documented exception class; nothing may crash the interpreter.

Run by tests/system/test_fuzz.py in a process of its own (a crash fails that test
instead of ending the suite); `pytest tests/support/fuzz_ir.py` runs it directly."""
import gc
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlirgpu import ir  # noqa: E402
from mlirgpu._mlirgpu import InvalidObjectError, MLIRError  # noqa: E402

# What the IR layer documents for bad input (docs/ir.md).
DOCUMENTED = (ValueError, TypeError, OverflowError, MLIRError, InvalidObjectError)

FUZZ = settings(max_examples=int(os.environ.get("MLIRGPU_FUZZ_EXAMPLES", "150")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TYPES = ["i1", "i8", "i32", "i64", "index", "f16", "f32", "f64", "memref<4xf32>", "vector<4xi32>"]
OP_NAMES = ["test.op", "test.other", "arith.addi", "arith.constant", "func.return", "scf.yield", "memref.load"]

index = st.integers(min_value=0, max_value=15)
create = st.tuples(st.just("create"), st.sampled_from(OP_NAMES), st.lists(index, max_size=3),
                   st.lists(st.sampled_from(TYPES), max_size=3), st.integers(0, 2), st.booleans(), index,
                   st.dictionaries(st.sampled_from(["a", "b", "value", "sym_name"]),
                                   st.one_of(st.integers(-2**70, 2**70), st.text(max_size=8), st.booleans()),
                                   max_size=2))
command = st.one_of(
    st.tuples(st.just("module")),
    create, create, create,  # most programs are mostly building
    st.tuples(st.just("block"), index, st.lists(st.sampled_from(TYPES), max_size=2)),
    st.tuples(st.just("clone"), index),
    st.tuples(st.just("insert"), index, index, st.booleans()),
    st.tuples(st.just("erase"), index),
    st.tuples(st.just("replace"), index, index),
    st.tuples(st.just("drop_module"), index),
    st.tuples(st.just("drop_op"), index),
    st.tuples(st.just("print"), index, st.booleans()),
    st.tuples(st.just("verify"), index),
    st.tuples(st.just("walk"), index),
    st.tuples(st.just("attribute"), index, st.sampled_from(["a", "value", "sym_name"]), st.integers(-5, 5)),
)


def pick(pool, i):
    return pool[i % len(pool)] if pool else None


class Program:
    """The pool a random program works on, and its interpreter."""

    def __init__(self, context):
        self.context = context
        self.modules = [ir.Module.create()]
        self.ops, self.values, self.blocks = [], [], []

    def where(self, i):
        """An insertion point: the body of a module or of a block made so far."""
        targets = [m.body for m in self.modules] + self.blocks
        return pick(targets, i)

    def run(self, cmd):
        kind = cmd[0]
        if kind == "module":
            self.modules.append(ir.Module.create())
        elif kind == "create":
            _, name, operands, results, regions, detached, at, attributes = cmd
            values = [v for v in (pick(self.values, i) for i in operands) if v is not None]
            attrs = {k: (ir.Attribute.string(v) if isinstance(v, str) else ir.Attribute.bool(v)
                         if isinstance(v, bool) else ir.Attribute.integer(v)) for k, v in attributes.items()}
            types = [ir.Type.parse(t) for t in results]
            block = self.where(at)
            if detached or block is None:
                op = ir.Operation.create(name, operands=values, results=types, attributes=attrs, regions=regions,
                                         detached=True)
            else:
                with ir.InsertionPoint(block):
                    op = ir.Operation.create(name, operands=values, results=types, attributes=attrs,
                                             regions=regions)
            self.ops.append(op)
            self.values.extend(op.results)
        elif kind == "block":
            op = pick(self.ops, cmd[1])
            if op is not None and op.regions:
                block = op.regions[0].append_block([ir.Type.parse(t) for t in cmd[2]])
                self.blocks.append(block)
                self.values.extend(block.arguments)
        elif kind == "clone":
            op = pick(self.ops, cmd[1])
            if op is not None:
                clone = op.clone()
                self.ops.append(clone)
                self.values.extend(clone.results)
        elif kind == "insert":
            op, block = pick(self.ops, cmd[1]), self.where(cmd[2])
            if op is not None and block is not None:
                point = ir.InsertionPoint.at_block_begin(block) if cmd[3] else ir.InsertionPoint(block)
                point.insert(op)
        elif kind == "erase":
            op = pick(self.ops, cmd[1])
            if op is not None:
                op.erase()
        elif kind == "replace":
            a, b = pick(self.values, cmd[1]), pick(self.values, cmd[2])
            if a is not None and b is not None:
                a.replace_all_uses_with(b)
        elif kind == "drop_module":
            if len(self.modules) > 1:
                del self.modules[cmd[1] % len(self.modules)]
                self.blocks = [b for b in self.blocks if b is not None]
                gc.collect()
        elif kind == "drop_op":
            if self.ops:
                del self.ops[cmd[1] % len(self.ops)]
                gc.collect()
        elif kind == "print":
            thing = pick(self.modules + self.ops, cmd[1])
            text = thing.print(generic=cmd[2]) if isinstance(thing, ir.Module) else str(thing)
            assert isinstance(text, str)
        elif kind == "verify":
            thing = pick(self.modules + self.ops, cmd[1])
            assert thing.verify() is True
        elif kind == "walk":
            module = pick(self.modules, cmd[1])
            names = [op.name for op in module.walk()]
            assert names[0] == "builtin.module" or names[-1] == "builtin.module"
        elif kind == "attribute":
            op = pick(self.ops, cmd[1])
            if op is not None:
                op.set_attribute(cmd[2], ir.Attribute.integer(cmd[3]))
                assert op.get_attribute(cmd[2]).value == cmd[3]


@FUZZ
@given(st.lists(command, min_size=1, max_size=25))
def test_random_ir_programs_raise_only_documented_errors(program):
    with ir.Context(allow_unregistered_dialects=True) as context:
        state = Program(context)
        for cmd in program:
            try:
                state.run(cmd)
            except DOCUMENTED:
                pass
        # Whatever happened, everything still reachable prints or says why not.
        for thing in state.modules + state.ops:
            try:
                str(thing)
            except InvalidObjectError:
                pass
    del state
    gc.collect()


@FUZZ
@given(st.lists(st.sampled_from(TYPES), min_size=1, max_size=4), st.integers(0, 3))
def test_clones_outlive_their_source_module(types, erase_at):
    """A clone of an operation whose operands come from its module keeps what
    it uses alive (or refuses); printing it after the module is dropped works."""
    with ir.Context(allow_unregistered_dialects=True):
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            producer = ir.Operation.create("test.producer", results=[ir.Type.parse(t) for t in types])
            holder = ir.Operation.create("test.holder", regions=1)
            block = holder.regions[0].append_block()
            with ir.InsertionPoint(block):
                ir.Operation.create("test.user", operands=list(producer.results))
        clone = holder.clone()
        ops = [producer, holder]
        try:
            ops[erase_at % 2].erase()
        except DOCUMENTED:
            pass
        del module, producer, holder, block, ops
        gc.collect()
        try:
            assert "test.user" in str(clone)
        except InvalidObjectError:
            pass
        other = ir.Module.create()
        try:
            ir.InsertionPoint(other.body).insert(clone)
        except DOCUMENTED:
            pass
        str(other)
