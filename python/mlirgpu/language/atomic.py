"""mg.atomic: atomic operations on one memref element, with CUDA's memory model.

    old = mg.atomic.add(C, (i, j), x)                    # relaxed, device scope: CUDA's atomicAdd
    old = mg.atomic.max(C, i, x, scope="cta")            # atomicMax_block
    ticket = mg.atomic.add(count, 0, 1, order="acq_rel") # a release of this thread's writes, an
                                                         # acquire of the others'
    old = mg.atomic.cas(flags, i, 0, 1)                  # atomicCAS
    flag = mg.atomic.load(flags, i, order="acquire")     # cuda::atomic_ref::load
    mg.atomic.store(flags, i, 1, order="release")        # cuda::atomic_ref::store

Each read-modify-write returns the element's value from just before the
operation, as a traced scalar. `index` is one index or a tuple of them; the
value takes the memref's element type (Python numbers become constants of
it; a traced value of another dtype is an error, mg.cast it). Global and
shared memory both work.

`order` is the C++ memory order: "relaxed" (the default, as CUDA's atomicAdd),
"acquire", "release" or "acq_rel" (loads take relaxed or acquire, stores
relaxed or release). `scope` is the set of threads the ordering is with:
"cta" (the block), "gpu" (the default: the whole device) or "sys" (the
device, the host and peer devices). They become LLVM's atomic orderings and
sync scopes, which the NVPTX back end writes as PTX `atom.acquire.gpu`,
`atom.acq_rel.cta`, `ld.acquire.gpu`, ... Float max/min follow IEEE
maxNum/minNum (a NaN operand loses); PTX has no float atomic max/min, so they
become a compare-and-swap loop.
"""
from __future__ import annotations

from .. import ir
from .._mlirgpu import CompileError
from . import core as lang

__all__ = ["add", "max", "min", "exchange", "and_", "or_", "xor", "cas", "load", "store", "ORDERS", "SCOPES"]

# C++ memory orders as LLVM's AtomicOrdering (monotonic is C++'s relaxed).
ORDERINGS = {"relaxed": 2, "acquire": 4, "release": 5, "acq_rel": 6, "seq_cst": 7}

ORDERS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "gpu", "sys")


def _check(what, order, scope, orders=ORDERS):
    if order not in orders:
        raise CompileError(f"mg.atomic.{what}: order must be one of {', '.join(map(repr, orders))}, "
                           f"not {order!r}")
    if scope not in SCOPES:
        raise CompileError(f"mg.atomic.{what}: scope must be one of {', '.join(map(repr, SCOPES))}, not {scope!r}")


def _ordering(order):
    return ir.Attribute.integer(ORDERINGS[order], ir.Type.integer(64))


def _scope(scope):
    return ir.Attribute.string(lang.target().sync_scope(scope))


def _pointer(what, memref, index):
    if not isinstance(memref, lang.MemRef):
        raise CompileError(f"mg.atomic.{what} takes a memref first, not {type(memref).__name__}")
    if memref.dtype in (lang.bool_, lang.index):
        raise CompileError(f"mg.atomic.{what} on a {memref.dtype.name} memref is not supported")
    if what != "load":
        memref.check_writable(f"mg.atomic.{what}")
    indices = memref._indices(index if isinstance(index, tuple) else (index,))
    lang.target().check_access(memref, indices, lang.ATOMIC)
    return lang.element_pointer(memref, indices)


def _rmw(what, memref, index, value, kinds, order, scope):
    """kinds: (float op, signed op, unsigned op), LLVM atomicrmw operations; None where not defined."""
    _check(what, order, scope)
    pointer, space = _pointer(what, memref, index)
    dtype = memref.dtype
    float_kind, signed_kind, unsigned_kind = kinds
    kind = float_kind if lang.is_float(dtype) else unsigned_kind if dtype in lang.UNSIGNED else signed_kind
    if kind is None:
        raise CompileError(f"mg.atomic.{what} is not defined on {dtype.name} elements")
    value = lang.coerce(value, dtype, f"mg.atomic.{what}'s memref element type")
    return lang.target().atomic_rmw(kind, pointer, value, order, scope, space)


def add(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "relaxed",
        scope: str = "gpu") -> lang.Scalar:
    """memref[index] += value, atomically; returns the old value."""
    return _rmw("add", memref, index, value, ("fadd", "add", "add"), order, scope)


def max(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "relaxed",
        scope: str = "gpu") -> lang.Scalar:
    """memref[index] = max(memref[index], value), atomically; returns the old value."""
    return _rmw("max", memref, index, value, ("fmax", "max", "umax"), order, scope)


def min(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "relaxed",
        scope: str = "gpu") -> lang.Scalar:
    """memref[index] = min(memref[index], value), atomically; returns the old value."""
    return _rmw("min", memref, index, value, ("fmin", "min", "umin"), order, scope)


def exchange(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "relaxed",
             scope: str = "gpu") -> lang.Scalar:
    """memref[index] = value, atomically; returns the old value (CUDA's atomicExch)."""
    return _rmw("exchange", memref, index, value, ("xchg", "xchg", "xchg"), order, scope)


def and_(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "relaxed",
         scope: str = "gpu") -> lang.Scalar:
    """memref[index] &= value (integers), atomically; returns the old value."""
    return _rmw("and_", memref, index, value, (None, "and", "and"), order, scope)


def or_(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "relaxed",
        scope: str = "gpu") -> lang.Scalar:
    """memref[index] |= value (integers), atomically; returns the old value."""
    return _rmw("or_", memref, index, value, (None, "or", "or"), order, scope)


def xor(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "relaxed",
        scope: str = "gpu") -> lang.Scalar:
    """memref[index] ^= value (integers), atomically; returns the old value."""
    return _rmw("xor", memref, index, value, (None, "xor", "xor"), order, scope)


# A failed compare-and-swap only reads: its ordering drops the release half.
_FAILURE_ORDERS = {"relaxed": "relaxed", "acquire": "acquire", "release": "relaxed", "acq_rel": "acquire"}


def cas(memref: lang.MemRef, index: lang.Indices, expected: lang.Number, desired: lang.Number, *, order: str = "relaxed",
        scope: str = "gpu") -> lang.Scalar:
    """Compare and swap: if memref[index] equals `expected`, store `desired`;
    atomically; returns the old value (CUDA's atomicCAS; the swap happened
    iff the result equals `expected`). Integer elements only, as atomicCAS."""
    _check("cas", order, scope)
    attributes = {"success_ordering": _ordering(order), "failure_ordering": _ordering(_FAILURE_ORDERS[order]),
                  "syncscope": _scope(scope)}
    pointer, _ = _pointer("cas", memref, index)
    dtype = memref.dtype
    if not lang.is_integer(dtype):
        raise CompileError(f"mg.atomic.cas takes a memref of integers (as CUDA's atomicCAS), not {dtype.name}")
    expected = lang.coerce(expected, dtype, "mg.atomic.cas's memref element type")
    desired = lang.coerce(desired, dtype, "mg.atomic.cas's memref element type")
    t = lang.ir_type(dtype)
    pair = ir.Type.parse(f"!llvm.struct<({t}, i1)>")
    op = lang.emit("llvm.cmpxchg", [pointer, expected, desired], [pair], attributes=attributes)
    old = lang.emit("llvm.extractvalue", [op.result], [t], attributes={"position": ir.Attribute.dense_i64_array([0])})
    return lang.Scalar(old.result, dtype)


def _alignment(memref):
    # An atomic access is of a whole, naturally aligned element.
    return ir.Attribute.integer(memref.dtype.itemsize, ir.Type.integer(64))


def load(memref: lang.MemRef, index: lang.Indices, *, order: str = "acquire", scope: str = "gpu") -> lang.Scalar:
    """memref[index], read atomically ("relaxed" or "acquire", the default)."""
    _check("load", order, scope, ("relaxed", "acquire"))
    pointer, _ = _pointer("load", memref, index)
    attributes = {"ordering": _ordering(order), "syncscope": _scope(scope), "alignment": _alignment(memref)}
    op = lang.emit("llvm.load", [pointer], [lang.ir_type(memref.dtype)], attributes=attributes)
    return lang.Scalar(op.result, memref.dtype)


def store(memref: lang.MemRef, index: lang.Indices, value: lang.Number, *, order: str = "release", scope: str = "gpu") -> None:
    """memref[index] = value, written atomically ("relaxed" or "release", the default)."""
    _check("store", order, scope, ("relaxed", "release"))
    pointer, _ = _pointer("store", memref, index)
    attributes = {"ordering": _ordering(order), "syncscope": _scope(scope), "alignment": _alignment(memref)}
    value = lang.coerce(value, memref.dtype, "mg.atomic.store's memref element type")
    lang.emit("llvm.store", [value, pointer], attributes=attributes)
