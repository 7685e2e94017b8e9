"""Rewriting a kernel's Python source so that running it builds IR.

The kernel's source is parsed and its control flow rewritten (keeping the
user's line numbers):

    for t in range(...) / mg.range_(...)  ->  __mg_for(...)   scf.for
    if test: ... else: ...                ->  __mg_if(...)    scf.if when test is traced
    while test: ...                       ->  __mg_while(...) scf.while when test is traced
    f(args)                               ->  __mg_call(f, args)  (checks what may take traced values)

Each loop body and branch becomes a nested function that takes the
variables it assigns and returns their new values. The `__mg_*` names are
control_flow.HELPERS, which decide at trace time what each statement builds.
"""
from __future__ import annotations

import ast
import inspect
import linecache
import sys
import textwrap
import types

from .._mlirgpu import CompileError

__all__ = ["rewrite", "code_objects", "source_unavailable"]


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


def source_unavailable(function: types.FunctionType, error: Exception) -> CompileError:
    """The CompileError for a function whose source Python did not keep."""
    where = function.__code__.co_filename
    return CompileError(
        f"cannot read the source of {function.__qualname__} (defined in {where}): {error}. mlirgpu compiles a "
        f"kernel from its Python source, which Python does not keep for code run with `python -c`, exec() or "
        f"the plain interactive interpreter before Python 3.13. Define it in a .py file, a Jupyter notebook "
        f"cell, IPython, or the Python 3.13+ REPL.")


def rewrite(function: types.FunctionType, returns: bool = False) -> tuple[types.CodeType, list[str], list[str], str]:
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


def code_objects(function_code: types.CodeType) -> set[types.CodeType]:
    return set(_code_objects(function_code))
