"""Fingerprints of the values a kernel reads as globals or closure cells.

A fingerprint is a canonical string: equal values give equal strings in
every process, so a kernel's compile-cache key can name the globals it read.
See docs/design/compile_cache.md for what each kind of value gives.
"""
from __future__ import annotations

import hashlib
import types
from collections.abc import Mapping

import numpy

from .._mlirgpu import DType

__all__ = ["MAX_ARRAY_BYTES", "fingerprint", "fingerprint_globals"]

# A global array becomes a constant of the kernel; CUDA's constant bank is
# 64 KiB, and anything larger should be a kernel argument instead.
MAX_ARRAY_BYTES = 64 * 1024
_ARRAY_KINDS = "biufc"


def fingerprint(value: object) -> str:
    """A canonical string for a value a kernel may read as a global or closure
    variable: equal values give equal strings in every process, different
    values (or types: 1, 1.0, True, numpy.int32(1)) give different ones.

    Supported: None, bool, int, float, complex, str, bytes; tuples, lists and
    dicts of supported values; numpy scalars, dtypes, ufuncs and arrays of
    numbers up to MAX_ARRAY_BYTES; mlirgpu dtypes; Python functions (module,
    qualname and a hash of the code object); builtin functions, classes and
    modules (by name). Anything else raises TypeError.
    """
    return _fingerprint(value, set())


def _fingerprint(value, active):
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is complex:
        return repr(value)
    if kind is str or kind is bytes:
        return repr(value)
    if isinstance(value, DType):
        return f"mlirgpu.{value.name}"
    if isinstance(value, numpy.generic):
        return f"numpy.{kind.__name__}({value.item()!r})"
    if isinstance(value, numpy.dtype):
        return f"numpy.dtype({value.str!r})" if value.fields is None else f"numpy.dtype({value.descr!r})"
    if kind is numpy.ndarray:
        return _fingerprint_array(value)
    if kind in (tuple, list, dict):
        if id(value) in active:
            raise TypeError(f"cannot fingerprint a {kind.__name__} that contains itself")
        active.add(id(value))
        try:
            if kind is dict:
                items = sorted(f"{_fingerprint(k, active)}: {_fingerprint(v, active)}"
                               for k, v in value.items())
                return "{" + ", ".join(items) + "}"
            items = [_fingerprint(v, active) for v in value]
            if kind is tuple:
                return "(" + ", ".join(items) + (",)" if len(items) == 1 else ")")
            return "[" + ", ".join(items) + "]"
        finally:
            active.discard(id(value))
    if kind is types.FunctionType:
        return f"function {value.__module__}.{value.__qualname__} code:{_code_digest(value.__code__)}"
    # A builtin bound to an object ("abc".upper) is as unknown as the object.
    if kind is types.BuiltinFunctionType and type(value.__self__) in (type(None), types.ModuleType):
        return f"builtin {getattr(value, '__module__', None)}.{value.__qualname__}"
    if kind is numpy.ufunc:
        return f"numpy.ufunc {value.__name__}"
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    if kind is types.ModuleType:
        return f"module {value.__name__}"
    # Layouts, swizzles and MMA atoms are immutable compile-time integers, shown whole by their repr.
    if kind.__module__.startswith("mlirgpu.layout."):
        return f"{kind.__module__}.{kind.__qualname__} {value!r}"
    raise TypeError(f"cannot fingerprint a value of type {kind.__module__}.{kind.__qualname__}")


def _fingerprint_array(array):
    if array.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"cannot fingerprint a numpy array of dtype {array.dtype} (numbers only)")
    if array.nbytes > MAX_ARRAY_BYTES:
        raise TypeError(f"cannot fingerprint a numpy array of {array.nbytes} bytes (at most "
                        f"{MAX_ARRAY_BYTES}): pass it to the kernel as an argument")
    data = hashlib.sha256(numpy.ascontiguousarray(array).tobytes()).hexdigest()
    return f"numpy.ndarray({array.dtype.str!r}, {array.shape!r}, sha256:{data})"


def _code_digest(code):
    """sha256 of what a code object does, not where it is: positions, file
    names and line tables are left out (they do not reach the cubin), and
    marshal is not used (its bytes depend on reference counts)."""
    digest = hashlib.sha256()
    _hash_code(code, digest)
    return digest.hexdigest()


def _hash_code(code, digest):
    digest.update(repr((code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                        code.co_flags, code.co_names, code.co_varnames, code.co_freevars,
                        code.co_cellvars)).encode())
    digest.update(code.co_code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            digest.update(b"<code>")
            _hash_code(const, digest)
        elif isinstance(const, frozenset):
            digest.update(("frozenset" + repr(sorted(repr(c) for c in const))).encode())
        else:
            digest.update((type(const).__name__ + ":" + repr(const) + "\0").encode())


def fingerprint_globals(values: Mapping[str, object]) -> tuple[str, dict[str, str]]:
    """(digest, details) for the globals and closure values a kernel reads,
    given as a mapping name -> value: digest is the sha256 of their
    fingerprints, details maps each name to a readable form (for the reason
    a recompile logs). Raises TypeError naming the value it cannot fingerprint."""
    digest = hashlib.sha256()
    details = {}
    for name in sorted(values):
        try:
            text = fingerprint(values[name])
        except TypeError as error:
            raise TypeError(f"global {name!r}: {error}") from None
        digest.update(f"{len(name)}:{name}{len(text)}:{text}".encode())
        details[name] = text if len(text) <= 80 else text[:77] + "..."
    return digest.hexdigest(), details
