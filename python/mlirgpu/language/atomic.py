"""mg.atomic: atomic read-modify-write of one memref element.

    old = mg.atomic.add(C, (i, j), x)        # memref.atomic_rmw addf / addi
    old = mg.atomic.max(C, i, x)             # maxnumf / maxs / maxu
    old = mg.atomic.cas(flags, i, 0, 1)      # memref.generic_atomic_rmw

Each returns the element's value from just before the operation, as a
traced scalar. `index` is one index or a tuple of them; the value takes the
memref's element type (Python numbers become constants of it; a traced value
of another dtype is an error, mg.cast it). Global and shared memory both
work. Float max/min follow IEEE maxNum/minNum (a NaN operand loses); PTX has
no float atomic max/min, so they lower to a compare-and-swap loop.
"""
from .. import ir
from .._mlirgpu import CompileError
from . import core as lang

__all__ = ["add", "max", "min", "exchange", "and_", "or_", "xor", "cas"]

# arith::AtomicRMWKind
_KINDS = {"addf": 0, "addi": 1, "andi": 2, "assign": 3, "maxnumf": 5, "maxs": 6, "maxu": 7,
          "minnumf": 9, "mins": 10, "minu": 11, "ori": 14, "xori": 15}


def _target(what, memref, index):
    if not isinstance(memref, lang.MemRef):
        raise CompileError(f"mg.atomic.{what} takes a memref first, not {type(memref).__name__}")
    if memref.dtype == lang.bool_:
        raise CompileError(f"mg.atomic.{what} on a bool memref is not supported")
    indices = memref._indices(index if isinstance(index, tuple) else (index,))
    lang.target().check_access(memref, indices, lang.ATOMIC)
    return indices


def _rmw(what, memref, index, value, kinds):
    """kinds: (float kind, signed kind, unsigned kind); None where not defined."""
    indices = _target(what, memref, index)
    dtype = memref.dtype
    float_kind, signed_kind, unsigned_kind = kinds
    kind = float_kind if lang.is_float(dtype) else \
        unsigned_kind if dtype in lang.UNSIGNED or dtype == lang.index else signed_kind
    if kind is None:
        raise CompileError(f"mg.atomic.{what} is not defined on {dtype.name} elements")
    value = lang.coerce(value, dtype, f"mg.atomic.{what}'s memref element type")
    op = lang.emit("memref.atomic_rmw", [value, memref.value, *indices], [lang.ir_type(dtype)],
                   attributes={"kind": ir.Attribute.integer(_KINDS[kind])})
    return lang.Scalar(op.result, dtype)


def add(memref, index, value):
    """memref[index] += value, atomically; returns the old value."""
    return _rmw("add", memref, index, value, ("addf", "addi", "addi"))


def max(memref, index, value):
    """memref[index] = max(memref[index], value), atomically; returns the old value."""
    return _rmw("max", memref, index, value, ("maxnumf", "maxs", "maxu"))


def min(memref, index, value):
    """memref[index] = min(memref[index], value), atomically; returns the old value."""
    return _rmw("min", memref, index, value, ("minnumf", "mins", "minu"))


def exchange(memref, index, value):
    """memref[index] = value, atomically; returns the old value (CUDA's atomicExch)."""
    return _rmw("exchange", memref, index, value, ("assign", "assign", "assign"))


def and_(memref, index, value):
    """memref[index] &= value (integers), atomically; returns the old value."""
    return _rmw("and_", memref, index, value, (None, "andi", "andi"))


def or_(memref, index, value):
    """memref[index] |= value (integers), atomically; returns the old value."""
    return _rmw("or_", memref, index, value, (None, "ori", "ori"))


def xor(memref, index, value):
    """memref[index] ^= value (integers), atomically; returns the old value."""
    return _rmw("xor", memref, index, value, (None, "xori", "xori"))


def cas(memref, index, expected, desired):
    """Compare and swap: if memref[index] equals `expected`, store `desired`;
    atomically; returns the old value (CUDA's atomicCAS; the swap happened
    iff the result equals `expected`). Integer elements only, as atomicCAS:
    MLIR 22 cannot lower memref.generic_atomic_rmw on floats (llvm.cmpxchg
    takes integers or pointers)."""
    indices = _target("cas", memref, index)
    dtype = memref.dtype
    if not lang.is_integer(dtype):
        raise CompileError(f"mg.atomic.cas takes a memref of integers (as CUDA's atomicCAS), not {dtype.name}")
    expected = lang.coerce(expected, dtype, "mg.atomic.cas's memref element type")
    desired = lang.coerce(desired, dtype, "mg.atomic.cas's memref element type")
    t = lang.ir_type(dtype)
    op = lang.emit("memref.generic_atomic_rmw", [memref.value, *indices], [t], regions=1)
    block = op.regions[0].append_block([t])
    current = lang.Scalar(block.arguments[0], dtype)
    with ir.InsertionPoint(block):
        new = lang.select(current == expected, desired, current)
        lang.emit("memref.atomic_yield", [new])
    return lang.Scalar(op.result, dtype)
