"""@mg.func: device functions, traced per argument signature into a private
func.func of the kernel's module and called with func.call.

    @mg.func
    def axpy(a, x, y):                   # func.func in the gpu.module, per argument types
        return a * x + y
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import textwrap
import types

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

    def __init__(self, function: types.FunctionType) -> None:
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
        operands = [v for a in args if isinstance(a, (lang.Scalar, lang.MemRef)) for v in _operands(a)]
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
        types = [t for a in args if isinstance(a, (lang.Scalar, lang.MemRef)) for t in _argument_types(a)]
        types += target.extra_argument_types()
        with lang.gpu_module_scope():
            op = ir.Operation.create("func.func", regions=1, location=where, attributes={
                "sym_name": ir.Attribute.string(name),
                "sym_visibility": ir.Attribute.string("private"),
                "function_type": ir.Attribute.type_attr(ir.Type.function(types, []))})
        block = op.regions[0].append_block(types, [where] * len(types))
        block_args = iter(block.arguments)
        with tracing(function, rewritten, caller.generic_values, target=target, module_state=state) as trace, \
                ir.InsertionPoint(block):
            parameters = []
            for a in args:
                if isinstance(a, lang.Scalar):
                    parameters.append(lang.Scalar(next(block_args), a.dtype))
                elif isinstance(a, lang.MemRef):
                    parameters.append(type(a)(_rebuilt(a, block_args), a.dtype, a.extents, a.name, a.readonly))
                else:
                    parameters.append(a)  # a Python number: a constant of this specialization
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


# A kernel's memrefs pass to functions as bare pointers on the GPU, which only
# a memref of static sizes and the identity layout can be. Any other (dynamic
# extents, a strided view) goes as its strided metadata: the base buffer (a
# rank-0 memref: a bare pointer), the offset, the sizes and the strides; the
# function views the buffer through them again (memref.reinterpret_cast).

def _split(memref):
    """Whether `memref` passes to a function as its strided metadata."""
    text = str(memref.value.type)
    return "?" in text or "strided<" in text


def _static_layout(memref):
    """The offset and strides of `memref`'s type, each an int or ir.DYNAMIC:
    those of its strided layout, or row-major ones for the identity layout."""
    text = str(memref.value.type)
    if "strided<" in text:
        layout = text[text.index("strided<") + len("strided<"):]
        strides_text, rest = layout[1:].split("]", 1)
        offset_text = rest.split("offset:", 1)[1].split(">", 1)[0].strip() if "offset:" in rest else "0"
        number = lambda t: ir.DYNAMIC if t.strip() == "?" else int(t)
        return number(offset_text), [number(t) for t in strides_text.split(",") if t.strip()]
    strides, product = [], 1
    for size in reversed(memref.value.type.shape):
        strides.insert(0, product)
        product = ir.DYNAMIC if product == ir.DYNAMIC or size is None else product * size
    return 0, strides


def _base_type(memref):
    space = lang.address_space(memref)
    memory_space = str(memref.value.type).rsplit(", ", 1)[-1][:-1] if space else None
    return ir.Type.parse(f"memref<{lang.ir_type(memref.dtype)}{', ' + memory_space if memory_space else ''}>")


def _argument_types(value):
    if isinstance(value, lang.MemRef) and _split(value):
        return [_base_type(value)] + [ir.Type.index()] * (1 + 2 * len(value.extents))
    return [value.value.type]


def _operands(value):
    if isinstance(value, lang.MemRef) and _split(value):
        return list(lang.emit("memref.extract_strided_metadata", [value.value], _argument_types(value)).results)
    return [value.value]


def _rebuilt(memref, block_args):
    """The function's view of a memref argument, from its block arguments."""
    if not _split(memref):
        return next(block_args)
    rank = len(memref.extents)
    base, offset = next(block_args), next(block_args)
    sizes = [next(block_args) for _ in range(rank)]
    strides = [next(block_args) for _ in range(rank)]
    # The view's type is the caller's: what it gives statically stays static.
    static_offset, static_strides = _static_layout(memref)
    static_sizes = [ir.DYNAMIC if n is None else n for n in memref.value.type.shape]
    offsets = [offset] if static_offset == ir.DYNAMIC else []
    sizes = [v for v, n in zip(sizes, static_sizes) if n == ir.DYNAMIC]
    strides = [v for v, n in zip(strides, static_strides) if n == ir.DYNAMIC]
    return lang.emit("memref.reinterpret_cast", [base, *offsets, *sizes, *strides], [memref.value.type], attributes={
        "operandSegmentSizes": ir.Attribute.dense_i32_array([1, len(offsets), len(sizes), len(strides)]),
        "static_offsets": ir.Attribute.dense_i64_array([static_offset]),
        "static_sizes": ir.Attribute.dense_i64_array(static_sizes),
        "static_strides": ir.Attribute.dense_i64_array(static_strides)}).result


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


def func(function: types.FunctionType) -> DeviceFunction:
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
