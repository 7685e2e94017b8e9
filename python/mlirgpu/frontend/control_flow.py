"""The loops and branches that rewritten code (rewrite.py) builds while it is traced.

The rewrite turns each for, if and while statement into a call of one of
HELPERS, passing the statement's body (and branches) as nested functions of
the variables they assign. These helpers decide at trace time which of
those variables are loop-carried or branch results (those defined before the
statement, or, for an if, in both branches) and build the operation. A
Python condition or iterable keeps Python's own meaning: only traced ones
make scf.for, scf.if and scf.while, and mg.static_range unrolls.
"""
import builtins
import types

import numpy as np

from .. import ir
from ..language import core as lang
from ..language.intrinsics import Vector
from .._mlirgpu import CompileError

__all__ = ["HELPERS"]


def _vars(frame_locals, names):
    return tuple(frame_locals.get(name, lang.UNDEFINED) for name in names)



# ---------------------------------------------------------------------------
# Calls, and the iterables of for statements

class _Range:
    """The iterable of a for statement the tracer rewrote."""

    def __init__(self, bounds, iter_args=None):
        self.lo, self.hi, self.step = lang.python_range_args(bounds)
        self.iter_args = iter_args


def _call(function, *args, **kwargs):
    """Every call in a kernel: Python's range and mg.range_ become loop
    iterables; a plain Python function may not receive traced values."""
    if function is builtins.range:
        if kwargs:
            raise CompileError("range() takes no keyword arguments")
        return _Range(args)
    if function is lang.range_:
        iter_args = kwargs.pop("iter_args", None)
        if kwargs:
            raise CompileError(f"mg.range_ got unexpected keyword arguments {sorted(kwargs)}")
        return _Range(args, list(iter_args) if iter_args is not None else [])
    if function in (builtins.min, builtins.max) and any(isinstance(a, lang.Scalar) for a in args):
        from ..language import math as kmath
        result = args[0]
        for other in args[1:]:
            result = (kmath.min if function is builtins.min else kmath.max)(result, other)
        return result
    if function is builtins.print:
        raise CompileError("print() in a kernel would run once, while the kernel is traced, and print traced "
                           "values as placeholders: use mg.printf(\"x = %f\\n\", x), which every thread runs")
    traced = [a for a in list(args) + list(kwargs.values()) if isinstance(a, (lang.Scalar, lang.MemRef))]
    if traced:
        _check_not_host_math(function)
    if traced and isinstance(function, types.FunctionType) and not getattr(function, "__mlirgpu__", False) \
            and not function.__module__.startswith("mlirgpu"):
        raise CompileError(f"cannot call the Python function {function.__qualname__} on traced values: "
                           f"make it a device function with @mg.func, or compute inline")
    return function(*args, **kwargs)


def _check_not_host_math(function):
    """NumPy's and Python's math functions compute on the host, in Python: on
    traced values, point to the kernel language's spelling instead."""
    module = getattr(function, "__module__", None) or ""
    if isinstance(function, np.ufunc):
        owner = "np"
    elif module == "math" or module == "cmath":
        owner = module
    elif module.split(".")[0] == "numpy":
        owner = "np"
    else:
        return
    from ..language import math as kmath
    name = getattr(function, "__name__", "")
    spelling = {"absolute": "abs", "fabs": "abs", "minimum": "min", "maximum": "max", "fmin": "min",
                "fmax": "max", "power": "pow", "arctan2": "atan2"}.get(name, name)
    if spelling in ("min", "max", "abs"):
        hint = f"use Python's {spelling}() or mg.math.{spelling}"
    elif spelling in kmath.__all__:
        hint = f"use mg.math.{spelling}"
    elif name == "where":
        hint = "use mg.select(condition, a, b)"
    else:
        hint = "use mg.math (exp, log, sqrt, sin, cos, tanh, fma, ...), mg.select and operators"
    raise CompileError(f"{owner}.{name} computes on the host and cannot take traced values: inside a kernel {hint}")


def _loop_bounds(r):
    """(lo, count-or-hi, step, descending) as index values, emitted once per
    statement. scf.for needs a positive step: a Python negative step becomes
    a count of iterations, the body computing lo + j * step."""
    if isinstance(r.step, (int, np.integer)) and not isinstance(r.step, bool):
        if r.step == 0:
            raise CompileError("range() step must not be zero")
        if r.step < 0:
            if all(isinstance(b, (int, np.integer)) for b in (r.lo, r.hi)):
                count = builtins.max(0, (r.lo - r.hi - r.step - 1) // -r.step)
                return lang.as_index(r.lo, "a loop bound"), lang.as_index(count, "a loop bound"), \
                    lang.as_index(-r.step, "a loop step"), True
            lo, hi = lang.as_index(r.lo, "a loop bound"), lang.as_index(r.hi, "a loop bound")
            span = lo - hi + (-r.step - 1)
            count = lang.select(span > 0, span // -r.step, 0)
            return lo, count, lang.as_index(-r.step, "a loop step"), True
    return (lang.as_index(r.lo, "a loop bound"), lang.as_index(r.hi, "a loop bound"),
            lang.as_index(r.step, "a loop step"), False)


def _guess_dtype(value):
    """The dtype of a Python number carried through a traced loop when the
    body only ever combines it with Python numbers."""
    if isinstance(value, bool):
        return lang.bool_
    if isinstance(value, int):
        return lang.i32
    return lang.f32


def _is_number(value):
    return isinstance(value, (bool, int, float)) and not isinstance(value, lang.Scalar)


# ---------------------------------------------------------------------------
# What a traced region carries: scalars (typed by their dtype) and vectors
# (typed by a VectorType), each an iter_arg or a result of the region.

class VectorType:
    """The type of a Vector carried through a traced region."""

    __slots__ = ("dtype", "length")

    def __init__(self, dtype, length):
        self.dtype, self.length = dtype, length

    @property
    def name(self):
        return f"vector<{self.length}x{self.dtype.name}>"

    def __eq__(self, other):
        return isinstance(other, VectorType) and (self.dtype, self.length) == (other.dtype, other.length)

    def __hash__(self):
        return hash((self.dtype, self.length))


def _traced(value):
    return isinstance(value, (lang.Scalar, Vector))


def _type_of(value):
    return VectorType(value.dtype, value.length) if isinstance(value, Vector) else value.dtype


def _ir_type(carried_type):
    if isinstance(carried_type, VectorType):
        return ir.Type.vector([carried_type.length], lang.ir_type(carried_type.dtype))
    return lang.ir_type(carried_type)


def _value(value, carried_type):
    if isinstance(carried_type, VectorType):
        return Vector(value, carried_type.dtype, carried_type.length)
    return lang.Scalar(value, carried_type)


def _advice(carried_type, value):
    if isinstance(carried_type, VectorType) or isinstance(value, Vector):
        return "a variable keeps its kind (vector or scalar) and type through a loop"
    return "mg.cast one of them"


def _coerce(value, carried_type, what):
    """`value` as the carried type: lang.coerce's rules for scalars; a vector must be one of that type."""
    if isinstance(carried_type, VectorType):
        if not isinstance(value, Vector) or _type_of(value) != carried_type:
            got = _type_of(value).name if _traced(value) else type(value).__name__
            raise CompileError(f"{what} is a {carried_type.name} and must stay one, not become {got}")
        return value.value
    return lang.coerce(value, carried_type, what).value


def _result_values(op, dtypes):
    return [_value(v, d) for v, d in zip(op.results, dtypes)]


def _emit_loop(bounds, dtypes, inits, run):
    """scf.for over `bounds` carrying `inits` (Scalars of `dtypes`), its body
    traced by run(induction, block arguments) -> new values; (op, block, new)."""
    lo, hi, step, descending = bounds
    zero = lang.constant(0, lang.index) if descending else None
    types_ = [_ir_type(d) for d in dtypes]
    inits = [v.value if _traced(v) else v for v in inits]
    op = lang.emit("scf.for", [zero if descending else lo, hi, step, *inits], types_, regions=1)
    location = lang.location()
    block = op.regions[0].append_block([ir.Type.index(), *types_], [location] * (1 + len(types_)))
    induction, *args = block.arguments
    with ir.InsertionPoint(block):
        lang.target().loop_iteration(_trip_count(0 if descending else lo, hi, step))
        induction = lang.Scalar(induction, lang.index)
        if descending:
            induction = lo - induction * step
        new = run(induction, [_value(a, d) for a, d in zip(args, dtypes)])
    return op, block, list(new)


def _trip_count(lo, hi, step):
    """The iterations of scf.for lo..hi by step where all three are constants, else None."""
    bounds = [lang.constant_value(v) for v in (lo, hi, step)]
    if None in bounds or bounds[2] <= 0:
        return None
    return max(0, -(-(bounds[1] - bounds[0]) // bounds[2]))


def _yield(block, values, dtypes, what):
    with ir.InsertionPoint(block):
        lang.emit("scf.yield", [_coerce(v, d, w) for v, d, w in zip(values, dtypes, what)])


class _Flat:
    """The variables of a traced region with each list or tuple of traced
    scalars and Python numbers (nested too: a register tile `acc[i][j]`)
    spread into one variable per element, so that each element is carried
    (an scf.for/scf.while iter_arg, an scf.if result) like a lone scalar.
    Each region is given fresh lists rebuilt from its own values: the body
    may mutate them (`acc[i] += x`), and after the region the name holds a
    new list of the region's results."""

    def __init__(self, names, initial):
        self.shapes = [_shape(v) for v in initial]
        self.names, self.initial = [], []
        for name, value, shape in zip(names, initial, self.shapes):
            if shape is None:
                self.names.append(name)
                self.initial.append(value)
            else:
                leaves = list(_leaves(value))
                self.names.extend(f"{name}{path}" for path in _paths(shape))
                self.initial.extend(leaves)
        self.original_names = names

    def unflatten(self, flat):
        flat, out = list(flat), []
        for shape in self.shapes:
            if shape is None:
                out.append(flat.pop(0))
            else:
                out.append(_build(shape, flat))
        return out

    def flatten(self, values):
        out = []
        for name, value, shape in zip(self.original_names, values, self.shapes):
            if shape is None:
                out.append(value)
            elif _shape(value) != shape:
                raise CompileError(f"{name!r} is a list of traced values carried through a traced region, "
                                   f"and must keep its length and element kinds there (each element a traced "
                                   f"scalar or a Python number), not become {_describe(value)}")
            else:
                out.extend(_leaves(value))
        return out

    def wrap(self, function, leading=0):
        """`function` (leading targets, then the variables) taking and returning flat values."""
        def flat_function(*args):
            return self.flatten(function(*args[:leading], *self.unflatten(args[leading:])))
        return flat_function


def _shape(value):
    """The nesting of a list/tuple whose leaves are traced scalars or Python
    numbers, as (type, [element shapes]) with None for a leaf; None if
    `value` is not such a container."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    shapes = []
    for item in value:
        if isinstance(item, (list, tuple)):
            inner = _shape(item)
            if inner is None:
                return None
            shapes.append(inner)
        elif _traced(item) or _is_number(item):
            shapes.append(None)
        else:
            return None
    return (type(value), tuple(shapes))


def _leaves(value):
    for item in value:
        if isinstance(item, (list, tuple)):
            yield from _leaves(item)
        else:
            yield item


def _paths(shape, prefix=""):
    for k, inner in enumerate(shape[1]):
        if inner is None:
            yield f"{prefix}[{k}]"
        else:
            yield from _paths(inner, f"{prefix}[{k}]")


def _build(shape, flat):
    kind, inner = shape
    return kind(flat.pop(0) if s is None else _build(s, flat) for s in inner)


def _describe(value):
    return f"a {type(value).__name__} of {len(value)}" if isinstance(value, (list, tuple)) else \
        type(value).__name__


def _for(iterable, body, ntargets, names, initial, lineno):
    items = getattr(iterable, "_traced_items", None)
    if items is not None:
        # A sequence of traced items (mg.TileScheduler's work units): a range() loop over their
        # indices, so that values updated in the body are carried from one item to the next.
        count, item = items()
        iterable, indexed = _Range((count,)), body
        body = lambda i, *values: indexed(item(i), *values)  # noqa: E731
    if not isinstance(iterable, _Range):
        # A Python iterable (mg.static_range, a list, ...): unrolled, lists mutated in place as in Python.
        values = list(initial)
        for item in iterable:
            targets = list(item) if ntargets > 1 else [item]
            values = list(body(*targets, *values))
        return tuple(values)
    if ntargets != 1:
        raise CompileError("a range() loop has one target")
    flat = _Flat(names, initial)
    return tuple(flat.unflatten(_for_range(iterable, flat.wrap(body, 1), flat.names, flat.initial, lineno)))


def _for_range(iterable, body, names, initial, lineno):
    traced, numbers, python = [], [], {}  # carried as they are; Python numbers; Python objects
    for i, value in enumerate(initial):
        if isinstance(value, lang.Undefined):
            continue  # local to the body (or left undefined by an earlier region)
        if _traced(value):
            traced.append(i)
        elif _is_number(value):
            numbers.append(i)
        else:
            python[i] = value
    bounds = _loop_bounds(iterable)

    def run_with(carried, python_numbers):
        def run(induction, args):
            values = [lang.UNDEFINED] * len(names)
            for i, v in python.items():
                values[i] = v
            for i in python_numbers:
                values[i] = initial[i]
            for i, a in zip(carried, args):
                values[i] = a
            new = body(induction, *values)
            for i, v in python.items():
                if new[i] is not v and isinstance(v, lang.MemRef):
                    raise CompileError(f"the memref {names[i]!r} is reassigned in a traced loop")
                if new[i] is not v:
                    raise CompileError(f"the Python value {names[i]!r} ({type(v).__name__}) is changed in a "
                                       f"traced loop: make it a traced value (mg.constant) or keep it constant")
            return new
        return run

    dtypes = {i: _type_of(initial[i]) for i in traced}
    if numbers:
        # A probe loop, the Python numbers going in as they are, tells their
        # types: those of the traced values they become in the body.
        probe, _, new = _emit_loop(bounds, [dtypes[i] for i in traced], [initial[i] for i in traced],
                                   run_with(traced, numbers))
        for i in numbers:
            dtypes[i] = new[i].dtype if isinstance(new[i], lang.Scalar) else _guess_dtype(initial[i])
        probe.erase()
    carried = traced + numbers
    inits = [_coerce(initial[i], dtypes[i], f"loop-carried {names[i]!r}") for i in carried]
    op, block, new = _emit_loop(bounds, [dtypes[i] for i in carried], inits, run_with(carried, ()))
    for i in carried:
        if _traced(new[i]) and _type_of(new[i]) != dtypes[i]:
            raise CompileError(f"loop-carried variable {names[i]!r} is {dtypes[i].name} before the loop and "
                               f"{_type_of(new[i]).name} at the end of its body: {_advice(dtypes[i], new[i])}")
    _yield(block, [new[i] for i in carried], [dtypes[i] for i in carried],
           [f"loop-carried {names[i]!r}" for i in carried])
    results = dict(zip(carried, _result_values(op, [dtypes[i] for i in carried])))
    return tuple(results.get(i, python.get(i, lang.Undefined(names[i], f"the loop at line {lineno}")))
                 for i in range(len(names)))


def _for_explicit(iterable, body, ncarried, lineno):
    """for k, *carried in mg.range_(..., iter_args=[...]): ...; x = yield x"""
    if not isinstance(iterable, _Range) or iterable.iter_args is None:
        raise CompileError("the explicit loop form needs mg.range_(..., iter_args=[...])")
    initial = iterable.iter_args
    if len(initial) != ncarried:
        raise CompileError(f"mg.range_ has {len(initial)} iter_args but the loop unpacks {ncarried}")
    for value in initial:
        if not isinstance(value, lang.Scalar) and not _is_number(value):
            raise CompileError("iter_args must be traced values or Python numbers")
    bounds = _loop_bounds(iterable)

    def run(induction, args):
        yielded = body(induction, *args)[0]
        yielded = list(yielded) if isinstance(yielded, (tuple, list)) else [yielded]
        if len(yielded) != ncarried:
            raise CompileError(f"the loop yields {len(yielded)} values for {ncarried} iter_args")
        return yielded

    dtypes = [v.dtype if isinstance(v, lang.Scalar) else None for v in initial]
    if None in dtypes:
        traced = [i for i, d in enumerate(dtypes) if d is not None]

        def probe_run(induction, args):
            values = list(initial)
            for i, a in zip(traced, args):
                values[i] = a
            return run(induction, values)

        probe, _, new = _emit_loop(bounds, [dtypes[i] for i in traced], [initial[i] for i in traced], probe_run)
        dtypes = [d if d is not None else (new[i].dtype if isinstance(new[i], lang.Scalar) else
                                           _guess_dtype(initial[i])) for i, d in enumerate(dtypes)]
        probe.erase()
    what = [f"iter_args[{i}]" for i in range(ncarried)]
    inits = [lang.coerce(v, d, w) for v, d, w in zip(initial, dtypes, what)]
    op, block, new = _emit_loop(bounds, dtypes, inits, run)
    _yield(block, new, dtypes, what)
    return tuple(_result_values(op, dtypes))


class _scratch:
    """Operations emitted inside are removed at exit: for probes whose
    results only decide how to build the real operation."""

    def __enter__(self):
        self.block = ir.InsertionPoint.current().block
        self.count = len(self.block.operations)
        return self

    def __exit__(self, *exc):
        for op in reversed(self.block.operations[self.count:]):
            op.erase()


def _if(test, then_fn, else_fn, names, initial, lineno):
    if not isinstance(test, lang.Scalar):
        chosen = then_fn if test else else_fn
        out = chosen(*initial)
        return tuple(v if v is not lang.UNDEFINED else lang.Undefined(n, f"a branch at line {lineno}")
                     for n, v in zip(names, out))
    if test.dtype != lang.bool_:
        raise CompileError(f"an if condition must be a comparison (bool), not a {test.dtype.name} value: "
                           f"compare it, e.g. `if x != 0:`")
    flat = _Flat(names, initial)
    return tuple(flat.unflatten(_traced_if(test, flat.wrap(then_fn), flat.wrap(else_fn), flat.names,
                                           flat.initial, lineno)))


def _traced_if(test, then_fn, else_fn, names, initial, lineno):
    # Probe: trace both branches in a scratch scf.if to learn what they yield.
    with _scratch():
        probe = lang.emit("scf.if", [test], [], regions=2)
        outs = []
        for region, branch in zip(probe.regions, (then_fn, else_fn)):
            with ir.InsertionPoint(region.append_block()):
                outs.append(list(branch(*initial)))
    results, same = [], {}  # (index, dtype) leaving the if as its results; Python values either way
    for i, name in enumerate(names):
        a, b = outs[0][i], outs[1][i]
        if isinstance(a, lang.Undefined) or isinstance(b, lang.Undefined):
            continue  # defined in one branch only (here or in an earlier region): local to it
        if _traced(a) or _traced(b):
            if _traced(a) and _traced(b) and _type_of(a) != _type_of(b):
                raise CompileError(f"{name!r} is {_type_of(a).name} in one branch and {_type_of(b).name} in the "
                                   f"other: mg.cast one of them")
            results.append((i, _type_of(a) if _traced(a) else _type_of(b)))
        elif a is b or (type(a) is type(b) and a == b):
            same[i] = a
        elif _is_number(a) and _is_number(b):
            same[i] = lang.Choice(test, a, b)
        else:
            raise CompileError(f"{name!r} gets different Python values in the two branches of a traced if "
                               f"({a!r} and {b!r})")
    op = lang.emit("scf.if", [test], [_ir_type(d) for _, d in results], regions=2)
    for region, branch in zip(op.regions, (then_fn, else_fn)):
        with ir.InsertionPoint(region.append_block()):
            out = list(branch(*initial))
            lang.emit("scf.yield", [_coerce(out[i], d, f"{names[i]!r} after the if") for i, d in results])
    values = dict(zip([i for i, _ in results], _result_values(op, [d for _, d in results])))
    return tuple(values.get(i, same.get(i, initial[i] if initial[i] is not lang.UNDEFINED else
                                        lang.Undefined(n, f"one branch of the if at line {lineno}")))
                 for i, n in enumerate(names))


def _while(cond_fn, body_fn, names, initial, lineno):
    with _scratch():
        traced_condition = isinstance(cond_fn(*initial), lang.Scalar)
    if not traced_condition:
        values = list(initial)
        while cond_fn(*values):
            values = list(body_fn(*values))
        return tuple(values)
    flat = _Flat(names, initial)
    return tuple(flat.unflatten(_traced_while(lambda *v: cond_fn(*flat.unflatten(v)), flat.wrap(body_fn),
                                              flat.names, flat.initial, lineno)))


def _traced_while(cond_fn, body_fn, names, initial, lineno):
    carried = [i for i, v in enumerate(initial) if _traced(v) or _is_number(v)]
    dtypes = {i: _type_of(initial[i]) if _traced(initial[i]) else _guess_dtype(initial[i]) for i in carried}
    location = lang.location()

    def values_from(block):
        values = list(initial)
        for i, a in zip(carried, block.arguments):
            values[i] = _value(a, dtypes[i])
        return values

    def build():
        types_ = [_ir_type(dtypes[i]) for i in carried]
        inits = [_coerce(initial[i], dtypes[i], f"loop-carried {names[i]!r}") for i in carried]
        op = lang.emit("scf.while", inits, types_, regions=2)
        before = op.regions[0].append_block(types_, [location] * len(types_))
        after = op.regions[1].append_block(types_, [location] * len(types_))
        with ir.InsertionPoint(before):
            condition = cond_fn(*values_from(before))
            if not isinstance(condition, lang.Scalar) or condition.dtype != lang.bool_:
                raise CompileError("a while condition on traced values must be a comparison (bool)")
            lang.emit("scf.condition", [condition, *before.arguments])
        with ir.InsertionPoint(after):
            lang.target().loop_iteration(None)
            new = list(body_fn(*values_from(after)))
        return op, after, new

    if any(not isinstance(initial[i], lang.Scalar) for i in carried):
        with _scratch():  # Python numbers take the types their traced updates have
            _, _, new = build()
        for i in carried:
            if not isinstance(initial[i], lang.Scalar) and isinstance(new[i], lang.Scalar):
                dtypes[i] = new[i].dtype
    op, after, new = build()
    for i in carried:
        if _traced(new[i]) and _type_of(new[i]) != dtypes[i]:
            raise CompileError(f"loop-carried variable {names[i]!r} is {dtypes[i].name} before the loop and "
                               f"{_type_of(new[i]).name} at the end of its body: {_advice(dtypes[i], new[i])}")
    _yield(after, [new[i] for i in carried], [dtypes[i] for i in carried],
           [f"loop-carried {names[i]!r}" for i in carried])
    results = dict(zip(carried, _result_values(op, [dtypes[i] for i in carried])))
    return tuple(results.get(i, initial[i] if initial[i] is not lang.UNDEFINED else
                             lang.Undefined(n, f"the while loop at line {lineno}")) for i, n in enumerate(names))


HELPERS = {"__mg_for": _for, "__mg_for_explicit": _for_explicit, "__mg_if": _if, "__mg_while": _while,
           "__mg_vars": _vars, "__mg_call": _call}

