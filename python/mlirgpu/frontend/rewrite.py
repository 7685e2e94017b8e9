"""Tracing a kernel's Python source into a gpu.func.

The kernel's source is parsed and its control flow rewritten (keeping the
user's line numbers) so that running it builds IR:

    for t in range(...) / mg.range_(...)  ->  __mg_for(...)   scf.for
    if test: ... else: ...                ->  __mg_if(...)    scf.if when test is traced
    while test: ...                       ->  __mg_while(...) scf.while when test is traced
    f(args)                               ->  __mg_call(f, args)  (checks what may take traced values)

Each loop body and branch becomes a nested function that takes the
variables it assigns and returns their new values; the helpers below decide at
trace time which of them are loop-carried or branch results (those defined
before the statement, or, for an if, in both branches) and build the
operation. A Python condition or iterable keeps Python's own meaning: only
traced ones make scf operations, and mg.static_range unrolls.
"""
import ast
import builtins
import inspect
import linecache
import sys
import textwrap
import types

import numpy as np

from .. import ir
from ..language import core as lang
from ..language.intrinsics import Vector
from .._mlirgpu import CompileError

__all__ = ["rewrite", "code_objects", "source_unavailable", "HELPERS"]


def _vars(frame_locals, names):
    return tuple(frame_locals.get(name, lang.UNDEFINED) for name in names)


# ---------------------------------------------------------------------------
# The AST rewrite

class _Unsupported(ast.NodeVisitor):
    """Finds what the rewrite cannot express, with the user's line."""

    def __init__(self, filename, first_line):
        self.filename, self.first_line = filename, first_line

    def fail(self, node, message):
        raise CompileError(f"{self.filename}:{node.lineno}: {message}\n    {_source_line(self.filename, node.lineno)}")

    def visit_Break(self, node):
        self.fail(node, "`break` is not supported in a kernel loop (it becomes scf.for/scf.while): "
                        "use a condition on the loop's work instead")

    def visit_Continue(self, node):
        self.fail(node, "`continue` is not supported in a kernel loop: use an if around the rest of the body")

    def visit_Try(self, node):
        self.fail(node, "try/except is not supported in a kernel")

    def visit_With(self, node):
        self.fail(node, "`with` is not supported in a kernel")

    def visit_Lambda(self, node):
        self.fail(node, "lambda is not supported in a kernel: use @mg.func for device functions")

    def visit_FunctionDef(self, node):
        self.fail(node, "nested functions are not supported in a kernel: use @mg.func for device functions")

    def visit_Global(self, node):
        self.fail(node, "`global` is not supported in a kernel")

    def visit_Nonlocal(self, node):
        self.fail(node, "`nonlocal` is not supported in a kernel")

    def visit_Yield(self, node):
        self.fail(node, "`yield` is only valid as `x = yield x` at the end of a `for ... in mg.range_(..., "
                        "iter_args=[...])` body")

    visit_YieldFrom = visit_Yield
    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_For(self, node):
        last = node.body[-1]
        if _is_explicit_range(node) and isinstance(last, ast.Assign) and isinstance(last.value, ast.Yield):
            # `x = yield x` closing the explicit mg.range_ form is the one yield allowed
            for child in [node.target, node.iter] + node.body[:-1] + node.orelse:
                self.visit(child)
            if last.value.value is not None:
                self.visit(last.value.value)
            return
        self.generic_visit(node)


def _is_explicit_range(node):
    return _is_range_call(node.iter, {"range_"}) and any(k.arg == "iter_args" for k in node.iter.keywords)


def _assigned(statements, local_names=frozenset()):
    """Names a list of statements assigns (not counting nested scopes), in
    order, counting `x[i] = ...` as assigning x where x is one of the
    function's `local_names` (a list mutated in a traced loop is carried)."""
    names = []

    class Visitor(ast.NodeVisitor):
        def visit_Name(self, node):
            if isinstance(node.ctx, ast.Store) and node.id not in names:
                names.append(node.id)

        def visit_Subscript(self, node):
            if isinstance(node.ctx, ast.Store):
                base = node.value
                while isinstance(base, ast.Subscript):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in local_names and base.id not in names:
                    names.append(base.id)
            self.generic_visit(node)

        def visit_FunctionDef(self, node):  # a nested scope: rejected elsewhere
            pass

    for statement in statements:
        Visitor().visit(statement)
    return names


def _target_names(target):
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts]
    raise CompileError(f"line {target.lineno}: a kernel loop target must be a name or a tuple of names")


def _is_range_call(node, names):
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id in names) or \
        (isinstance(func, ast.Attribute) and func.attr in names)


class _Rewriter(ast.NodeTransformer):
    def __init__(self, filename, returns=False, local_names=frozenset()):
        self.filename = filename
        self.returns = returns  # device functions (@mg.func) may return values
        self.local_names = local_names  # the function's parameters and assigned names
        self.counter = 0

    def fresh(self, kind):
        self.counter += 1
        return f"__mg_{kind}_{self.counter}"

    def fail(self, node, message):
        raise CompileError(f"{self.filename}:{node.lineno}: {message}\n    {_source_line(self.filename, node.lineno)}")

    # function bodies made of statements, ending in `return (names...)`
    def body_function(self, name, params, statements, returns, node):
        returns_node = ast.Return(value=ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Load()) for n in returns],
                                                  ctx=ast.Load()))
        function = ast.FunctionDef(name=name, args=ast.arguments(
            posonlyargs=[], args=[ast.arg(arg=p) for p in params], vararg=None, kwonlyargs=[], kw_defaults=[],
            kwarg=None, defaults=[]), body=statements + [returns_node], decorator_list=[], returns=None,
            type_params=[])
        if sys.version_info < (3, 12):
            del function.type_params
        for n in ast.walk(function):
            if not hasattr(n, "lineno") or n is function or n is returns_node:
                ast.copy_location(n, node)
        return function

    def call_helper(self, helper, args, node):
        return ast.copy_location(ast.Call(func=ast.Name(id=helper, ctx=ast.Load()), args=args, keywords=[]), node)

    def assign_back(self, names, value, node):
        if not names:
            return ast.copy_location(ast.Expr(value=value), node)
        return ast.copy_location(ast.Assign(
            targets=[ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Store()) for n in names], ctx=ast.Store())],
            value=value), node)

    def vars_call(self, names, node):
        return self.call_helper("__mg_vars", [
            ast.Call(func=ast.Name(id="locals", ctx=ast.Load()), args=[], keywords=[]),
            ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load())], node)

    def names_tuple(self, names):
        return ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load())

    def check_no_return(self, statements):
        for statement in statements:
            for n in ast.walk(statement):
                if isinstance(n, ast.Return):
                    self.fail(n, "`return` inside a loop or a branch of a kernel is not supported (it would need "
                                 "to leave a traced region); only an early-exit guard `if cond: return` at the "
                                 "top level of the body is: put the rest of the work in an if/else")

    def visit_all(self, statements):
        """The rewritten statements: one may become several."""
        out = []
        for statement in statements:
            new = self.visit(statement)
            out.extend(new if isinstance(new, list) else [new])
        return out

    def visit_Return(self, node):
        if node.value is not None and not self.returns:
            self.fail(node, "a kernel cannot return a value: write results to an array parameter")
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        return ast.copy_location(ast.Call(func=ast.Name(id="__mg_call", ctx=ast.Load()),
                                          args=[node.func] + node.args, keywords=node.keywords), node)

    def visit_For(self, node):
        if node.orelse:
            self.fail(node, "for/else is not supported in a kernel")
        self.check_no_return(node.body)
        explicit = _is_explicit_range(node)
        targets = _target_names(node.target)
        body = node.body
        if explicit:
            last = body[-1] if body else None
            if not (isinstance(last, ast.Assign) and isinstance(last.value, ast.Yield)):
                self.fail(node, "a `for ... in mg.range_(..., iter_args=[...])` body must end with "
                                "`x = yield x` (the values carried to the next iteration)")
            yielded = last.value.value
            out_names = _target_names(last.targets[0]) if len(last.targets) == 1 else None
            if out_names is None:
                self.fail(last, "the final `yield` must assign to a name or a tuple of names")
            body = body[:-1] + [ast.copy_location(ast.Assign(
                targets=[ast.Tuple(elts=[ast.Name(id="__mg_yielded", ctx=ast.Store())], ctx=ast.Store())],
                value=ast.Tuple(elts=[yielded], ctx=ast.Load())), last)]
        body = self.visit_all(body)
        iterable = self.visit(node.iter)
        name = self.fresh("body")
        if explicit:
            # params: induction variable and the carried targets; returns what was yielded
            function = self.body_function(name, targets, body, ["__mg_yielded"], node)
            call = self.call_helper("__mg_for_explicit", [iterable, ast.Name(id=name, ctx=ast.Load()),
                                                          ast.Constant(len(targets) - 1), ast.Constant(node.lineno)],
                                    node)
            return [function, self.assign_back(out_names, call, node)]
        carried = [n for n in _assigned(body, self.local_names) if n not in targets]
        function = self.body_function(name, targets + carried, body, carried, node)
        call = self.call_helper("__mg_for", [iterable, ast.Name(id=name, ctx=ast.Load()),
                                             ast.Constant(len(targets)), self.names_tuple(carried),
                                             self.vars_call(carried, node), ast.Constant(node.lineno)], node)
        return [function, self.assign_back(carried, call, node)]

    def visit_If(self, node):
        self.check_no_return(node.body + node.orelse)
        test = self.visit(node.test)
        then_body, else_body = self.visit_all(node.body), self.visit_all(node.orelse)
        names = _assigned(then_body + else_body, self.local_names)
        then_name, else_name = self.fresh("then"), self.fresh("else")
        then_fn = self.body_function(then_name, names, then_body or [ast.Pass()], names, node)
        else_fn = self.body_function(else_name, names, else_body or [ast.Pass()], names, node)
        call = self.call_helper("__mg_if", [test, ast.Name(id=then_name, ctx=ast.Load()),
                                            ast.Name(id=else_name, ctx=ast.Load()), self.names_tuple(names),
                                            self.vars_call(names, node), ast.Constant(node.lineno)], node)
        return [then_fn, else_fn, self.assign_back(names, call, node)]

    def visit_While(self, node):
        if node.orelse:
            self.fail(node, "while/else is not supported in a kernel")
        self.check_no_return(node.body)
        test = self.visit(node.test)
        body = self.visit_all(node.body)
        names = _assigned(body, self.local_names)
        cond_name, body_name = self.fresh("cond"), self.fresh("body")
        cond_fn = self.body_function(cond_name, names, [], [], node)
        cond_fn.body = [ast.copy_location(ast.Return(value=test), node)]
        body_fn = self.body_function(body_name, names, body, names, node)
        call = self.call_helper("__mg_while", [ast.Name(id=cond_name, ctx=ast.Load()),
                                               ast.Name(id=body_name, ctx=ast.Load()), self.names_tuple(names),
                                               self.vars_call(names, node), ast.Constant(node.lineno)], node)
        return [cond_fn, body_fn, self.assign_back(names, call, node)]


def _source_line(filename, lineno):
    return linecache.getline(filename, lineno).strip()


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _is_guard(statement):
    """`if cond: return` (no value, no else): an early exit."""
    return (isinstance(statement, ast.If) and not statement.orelse and len(statement.body) == 1
            and isinstance(statement.body[0], ast.Return) and statement.body[0].value is None)


def _guards_to_else(statements):
    """The top-level guard `if cond: return` followed by the rest of the body
    becomes `if cond: pass / else: rest`: a thread that leaves early is one
    that skips the rest, which a traced if can express."""
    for i, statement in enumerate(statements):
        if _is_guard(statement):
            skip = ast.copy_location(ast.Pass(), statement.body[0])
            guard = ast.copy_location(ast.If(test=statement.test, body=[skip],
                                             orelse=_guards_to_else(statements[i + 1:])), statement)
            return statements[:i] + [guard]
    return statements


def source_unavailable(function, error):
    """The CompileError for a function whose source Python did not keep."""
    where = function.__code__.co_filename
    return CompileError(
        f"cannot read the source of {function.__qualname__} (defined in {where}): {error}. mlirgpu compiles a "
        f"kernel from its Python source, which Python does not keep for code run with `python -c`, exec() or "
        f"the plain interactive interpreter before Python 3.13. Define it in a .py file, a Jupyter notebook "
        f"cell, IPython, or the Python 3.13+ REPL.")


def rewrite(function, returns=False):
    """(code, free names, generic parameter names, filename) of the rewritten
    function: running `code` defines `__mg_make(*free)`, which returns the
    rewritten function given values for its free names (closure variables
    and PEP 695 generics; see `instantiate`). `returns`: `return value` is
    allowed (device functions)."""
    try:
        lines, first_line = inspect.getsourcelines(function)
    except (OSError, TypeError) as error:
        raise source_unavailable(function, error) from error
    filename = inspect.getsourcefile(function) or function.__code__.co_filename
    source = textwrap.dedent("".join(lines))
    tree = ast.parse(source)
    ast.increment_lineno(tree, first_line - 1)
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef):
        raise CompileError(f"{filename}:{first_line}: @mg.kernel decorates a plain def")
    definition.decorator_list = []
    generic_params = []
    if sys.version_info >= (3, 12):
        generic_params = [p.name for p in definition.type_params]
        definition.type_params = []
    for arg in definition.args.args:
        arg.annotation = None
    definition.returns = None
    for statement in definition.body:
        _Unsupported(filename, first_line).visit(statement)
    definition.body = _guards_to_else(definition.body)
    local_names = frozenset([a.arg for a in definition.args.args] + _assigned(definition.body))
    definition.body = _Rewriter(filename, returns, local_names).visit_all(definition.body)
    free = list(function.__code__.co_freevars) + [p for p in generic_params if p not in function.__code__.co_freevars]
    maker = ast.FunctionDef(
        name="__mg_make", args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in free], vararg=None,
                                             kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=[definition, ast.Return(value=ast.Name(id=definition.name, ctx=ast.Load()))],
        decorator_list=[], returns=None, type_params=[])
    if sys.version_info < (3, 12):
        del maker.type_params
    module = ast.Module(body=[maker], type_ignores=[])
    ast.copy_location(maker, definition)
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec")
    return code, free, generic_params, filename


# ---------------------------------------------------------------------------
# Runtime helpers the rewritten code calls

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
        induction = lang.Scalar(induction, lang.index)
        if descending:
            induction = lo - induction * step
        new = run(induction, [_value(a, d) for a, d in zip(args, dtypes)])
    return op, block, list(new)


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


def code_objects(function_code):
    return set(_code_objects(function_code))
