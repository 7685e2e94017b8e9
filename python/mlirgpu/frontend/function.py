"""@mg.func: device functions, traced per argument signature into a private
func.func of the kernel's module and called with func.call.

    @mg.func
    def axpy(a, x, y):                   # func.func in the gpu.module, per argument types
        return a * x + y
"""
import ast
import functools
import inspect
import linecache
import textwrap

from .. import ir
from .._mlirgpu import CompileError
from ..language import core as lang
from . import rewrite as tracer
from .trace import tracing

__all__ = ["func", "DeviceFunction", "at_return"]


class DeviceFunction:
    """A Python function traced into a private func.func of the kernel's
    gpu.module, once per argument signature, and called with func.call."""

    __mlirgpu__ = True  # tracer._call lets traced values into it

    def __init__(self, function):
        if not inspect.isfunction(function):
            raise TypeError(f"@mg.func decorates a function, not {type(function).__name__}")
        self.function = function
        self.signature = inspect.signature(function)
        for p in self.signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise CompileError(f"device function {function.__qualname__}: *args and **kwargs are not "
                                   f"supported")
        functools.update_wrapper(self, function)
        self._rewritten = None

    def __repr__(self):
        return f"<mlirgpu device function {self.function.__qualname__}>"

    def rewritten(self):
        if self._rewritten is None:
            self._rewritten = tracer.rewrite(self.function, returns=True)
        return self._rewritten

    def __call__(self, *args, **kwargs):
        if lang.state.tracer is None:
            raise CompileError(f"device function {self.function.__qualname__} can only be called from a kernel "
                               f"(or another device function) while it is traced")
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise CompileError(f"device function {self.function.__qualname__}: {error}") from None
        bound.apply_defaults()
        args = list(bound.arguments.values())
        key = tuple(_argument_key(self.function, name, a) for name, a in zip(bound.arguments, args))
        state = lang.module_state()
        stack = state.setdefault("device_stack", [])
        if self in stack:
            chain = " -> ".join(f.function.__qualname__ for f in stack[stack.index(self):] + [self])
            raise CompileError(f"device function {self.function.__qualname__} is recursive ({chain}): mlirgpu "
                               f"does not support recursion in device functions; write a loop")
        defined = state.setdefault("device_functions", {})
        entry = defined.get((self, key))
        if entry is None:
            stack.append(self)
            try:
                entry = defined[(self, key)] = self._define(args, state)
            finally:
                stack.pop()
        name, result_dtypes = entry
        operands = [a.value for a in args if isinstance(a, (lang.Scalar, lang.MemRef))]
        operands += lang.target().extra_call_operands()
        op = lang.emit("func.call", operands, [lang.ir_type(d) for d in result_dtypes],
                       attributes={"callee": ir.Attribute.symbol_ref(name)})
        results = [lang.Scalar(r, d) for r, d in zip(op.results, result_dtypes)]
        if not results:
            return None
        return results[0] if len(results) == 1 and not isinstance(entry, _TupleResult) else tuple(results)

    def _define(self, args, state):
        """Trace the function for these arguments into a func.func; (symbol, result dtypes)."""
        function = self.function
        rewritten = self.rewritten()
        filename = rewritten[3]
        where = ir.Location.file(filename, function.__code__.co_firstlineno, 0)
        name = lang.unique_symbol(function.__name__)
        caller = lang.current_trace()
        target = caller.target
        traced = [a for a in args if isinstance(a, (lang.Scalar, lang.MemRef))]
        types = [a.value.type for a in traced] + target.extra_argument_types()
        with lang.gpu_module_scope():
            op = ir.Operation.create("func.func", regions=1, location=where, attributes={
                "sym_name": ir.Attribute.string(name),
                "sym_visibility": ir.Attribute.string("private"),
                "function_type": ir.Attribute.type_attr(ir.Type.function(types, []))})
        block = op.regions[0].append_block(types, [where] * len(types))
        block_args = iter(block.arguments)
        parameters = []
        for a in args:
            if isinstance(a, lang.Scalar):
                parameters.append(lang.Scalar(next(block_args), a.dtype))
            elif isinstance(a, lang.MemRef):
                parameters.append(type(a)(next(block_args), a.dtype, a.extents, a.name, a.readonly))
            else:
                parameters.append(a)  # a Python number: a constant of this specialization
        with tracing(function, rewritten, caller.generic_values, target=target, module_state=state) as trace, \
                ir.InsertionPoint(block):
            # Inside its body the function's own name is the rewritten def (a cell
            # of the maker): make it this DeviceFunction, so recursion is seen.
            instance = trace.instance
            if function.__name__ in instance.__code__.co_freevars:
                cell = instance.__closure__[instance.__code__.co_freevars.index(function.__name__)]
                cell.cell_contents = self
            target.bind_extra_arguments(trace, list(block_args))
            result = instance(*parameters)
            try:
                values = _results(function, result)
            except CompileError as error:
                raise at_return(function, filename, error) from None
            lang.emit("func.return", values)
        op.set_attribute("function_type", ir.Attribute.type_attr(
            ir.Type.function(types, [v.value.type for v in values])))
        dtypes = [v.dtype for v in values]
        return _TupleResult((name, dtypes)) if isinstance(result, tuple) else (name, dtypes)


class _TupleResult(tuple):
    """(symbol, dtypes) of a device function that returns a tuple (of any length)."""


def _results(function, result):
    if result is None:
        return []
    values = list(result) if isinstance(result, tuple) else [result]
    for v in values:
        if not isinstance(v, lang.Scalar):
            what = "a Python number (make it mg.constant(...))" if lang.is_python_number(v) else type(v).__name__
            raise CompileError(f"device function {function.__qualname__} returns {what}: it may return traced "
                               f"scalars, a tuple of them, or nothing")
    return values


def at_return(function, filename, error):
    """`error` located at the function's return statement: returns are only
    allowed at its top level, so the first one there is the one that ran."""
    lines, first = inspect.getsourcelines(function)
    definition = ast.parse(textwrap.dedent("".join(lines))).body[0]
    returns = [s for s in definition.body if isinstance(s, ast.Return)]
    lineno = returns[0].lineno + first - 1 if returns else function.__code__.co_firstlineno
    return CompileError(f"{filename}:{lineno}: {error}\n    {linecache.getline(filename, lineno).strip()}")


def _argument_key(function, name, value):
    """What a specialization depends on for one argument."""
    if isinstance(value, lang.Scalar):
        return ("scalar", value.dtype)
    if isinstance(value, lang.MemRef):
        return ("memref", type(value), str(value.value.type), value.dtype, value.extents, value.readonly)
    if lang.is_python_number(value):
        return ("constant", type(value), value)
    raise CompileError(f"device function {function.__qualname__}: argument {name!r} is a "
                       f"{type(value).__name__}; device functions take traced scalars, memrefs and Python numbers")


def func(function):
    """`@mg.func`: a device function callable from kernels and from other
    device functions, traced per argument types (Python numbers are
    constants of the specialization) into a private func.func.

    For example::

        @mg.func
        def axpy(a, x, y):
            return a * x + y

        @mg.kernel
        def k(x: mg.memref[N, mg.f32], y: mg.memref[N, mg.f32]):
            i = mg.thread_idx.x
            y[i] = axpy(2.0, x[i], y[i])
    """
    return DeviceFunction(function)
