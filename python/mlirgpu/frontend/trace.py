"""Tracing: running a rewritten Python function on traced values.

Kernels, device functions and element-wise functions are all traced the same
way: the function's rewritten code (rewrite.py) is instantiated with values
for its free names (closure variables and generics), and called on traced
arguments while a `Trace` is active, so every operation the language emits
lands at the current insertion point with the user's line as its location.
Any error raised meanwhile becomes a CompileError that points at that line.

    with tracing(function, rewritten, generic_values, target=target) as trace:
        with ir.InsertionPoint(block):
            result = trace.instance(*arguments)
"""
import contextlib
import linecache
import sys

from .. import ir
from .._mlirgpu import CompileError
from ..language import core as lang
from ..language.generics import Generic
from ..targets.gpu import GpuLowering
from .control_flow import HELPERS
from .rewrite import code_objects

__all__ = ["Trace", "instantiate", "tracing", "trace_error"]


class Trace:
    """One function being traced: where its operations' locations come from,
    the target they are for, and the state shared by everything traced into
    one module (shared arrays, device functions, symbols)."""

    def __init__(self, instance, codes, filename, def_line, target, module_state, generic_values, generic_names):
        self.instance, self.codes, self.filename, self.def_line = instance, codes, filename, def_line
        self.target, self.module_state, self.generic_values = target, module_state, generic_values
        self._generic_names = generic_names
        self._locations = {}

    def bind_generics(self, values):
        """Give generics (by name) values made once the parameters exist: a
        dynamic size is the traced extent of the array it sizes."""
        self.generic_values.update(values)
        free = self.instance.__code__.co_freevars
        for i, cell in enumerate(self.instance.__closure__ or ()):
            if self._generic_names.get(free[i]) in values:
                cell.cell_contents = values[self._generic_names[free[i]]]
        self.instance.__globals__.update({name: values[generic] for name, generic in self._generic_names.items()
                                          if generic in values and name not in free})

    def location(self):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code not in self.codes:
            frame = frame.f_back
        line = frame.f_lineno if frame is not None else self.def_line
        location = self._locations.get(line)
        if location is None:
            location = self._locations[line] = ir.Location.file(self.filename, line, 0)
        return location

    def __enter__(self):
        self._outer = lang.state.tracer
        lang.state.tracer = self
        return self

    def __exit__(self, *exc):
        lang.state.tracer = self._outer


def instantiate(function, code, free, values):
    """The rewritten function, with `values` (by name) bound as its free variables."""
    namespace = dict(function.__globals__)
    namespace.update(HELPERS)
    exec(code, namespace)
    return namespace["__mg_make"](*[values[n] for n in free])


@contextlib.contextmanager
def tracing(function, rewritten, generic_values=None, *, target=None, module_state=None):
    """Instantiate `function`'s rewritten form (rewrite.rewrite's result) and
    yield its active Trace, whose `instance` is the function to call on
    traced values. Generics (by name in `generic_values`) read as their
    values, in the function's globals and as PEP 695 parameters; `target`
    (default: the GPU) and `module_state` (default: a new one) are what the
    language's operations consult. Errors raised inside become CompileErrors
    at the user's line."""
    code, free, generic_params, filename = rewritten
    generic_values = dict(generic_values or {})
    values = dict(zip(function.__code__.co_freevars, (c.cell_contents for c in function.__closure__ or ())))
    # Which names read which generic: Trace.bind_generics rebinds them.
    generic_names = {name: value.name for scope in (function.__globals__, values) for name, value in scope.items()
                     if isinstance(value, Generic)} | {p: p for p in generic_params}
    # Generics read from the enclosing function (a kernel defined in a test or a factory) too.
    values.update({name: generic_values[value.name] for name, value in values.items()
                   if isinstance(value, Generic) and value.name in generic_values})
    values.update({p: generic_values[p] for p in generic_params if p in generic_values})
    for name in free:
        if name not in values:
            raise CompileError(f"{function.__qualname__}: no value for {name!r}")
    instance = instantiate(function, code, free, values)
    instance.__globals__.update({name: generic_values[value.name] for name, value in function.__globals__.items()
                                 if isinstance(value, Generic) and value.name in generic_values})
    codes = code_objects(instance.__code__)
    trace = Trace(instance, codes, filename, function.__code__.co_firstlineno, target or GpuLowering(),
                  {} if module_state is None else module_state, generic_values, generic_names)
    try:
        with trace:
            yield trace
    except Exception as error:
        raise trace_error(error, codes, filename) from None


def trace_error(error, trace_codes, filename):
    """A CompileError pointing at the user's line for any error raised while
    tracing (CompileErrors from mlirgpu keep their message)."""
    lines = [line for frame, line in _walk_tb(error.__traceback__) if frame.f_code in trace_codes]
    line = lines[-1] if lines else None
    message = str(error) if isinstance(error, CompileError) else f"{type(error).__name__}: {error}"
    if line is None or message.startswith(f"{filename}:"):
        return error if isinstance(error, CompileError) else CompileError(message)
    new = CompileError(f"{filename}:{line}: {message}\n    {linecache.getline(filename, line).strip()}")
    new.filename, new.lineno = filename, line
    return new


def _walk_tb(tb):
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
