"""The kernel language: traced values and the operations on them.

While a kernel is traced, every value it computes on the GPU is a `Scalar`
(an MLIR value with an mlirgpu dtype) and every array parameter a
`MemRef`. Operators on them emit arith/memref/gpu operations at the current
insertion point, each located at the user's line.

Type rules (docs/language.md):
- Two traced operands must have the same dtype; nothing is converted
  silently. `mg.cast(v, dtype)` converts explicitly.
- A Python int meets any integer or index operand and takes its type; with a
  float operand it takes the float type. A Python float takes the type of a
  float operand; with an integer operand it is an error.
- `/` is float division (integers: use `//`); `//` and `%` on integers
  truncate toward zero, as in CUDA C. Comparisons give `bool_` (i1).
- Memref indices are `index`; integer-typed indices are converted with
  arith.index_cast (lossless for the sizes a GPU addresses).
"""
from __future__ import annotations

import builtins
import contextlib
import threading
from collections.abc import Iterable, Sequence
from typing import NoReturn, TypeAlias, Union

import numpy as np

from .. import ir
from .._mlirgpu import (CompileError, DType, bf16, bool_, f8e4m3, f8e5m2, f16, f32, f64, i8, i16, i32, i64, index,
                        u8, u16, u32, u64)

__all__ = ["Scalar", "MemRef", "constant", "cast", "thread_idx", "block_idx", "block_dim", "grid_dim",
           "range_", "static_range", "select", "element_pointer", "address_space"]

#: An operand: a traced scalar, or a Python number (a constant of the other operand's type).
Number: TypeAlias = Union["Scalar", bool, int, float]
#: An index: a traced integer or a Python int.
Index: TypeAlias = Union["Scalar", int]
#: A memref's indices: one Index per dimension (a lone one for a 1-d memref).
Indices: TypeAlias = Union[Index, tuple[Index, ...]]

# The kinds of memory access a lowering may check (GpuLowering.check_access in mlirgpu.targets).
LOAD, STORE, ATOMIC, VECTOR_LOAD, VECTOR_STORE = range(5)

FLOATS = (f16, bf16, f32, f64)
# 8-bit floats are storage only: TMA copies them and wgmma multiplies them; no
# arithmetic or conversion of single values.
FLOATS8 = (f8e4m3, f8e5m2)
SIGNED = (i8, i16, i32, i64)
UNSIGNED = (u8, u16, u32, u64)


def ir_type(dtype):
    """The MLIR type of an mlirgpu dtype: integers are signless, as arith wants."""
    if dtype == index:
        return ir.Type.index()
    if dtype == bool_:
        return ir.Type.integer(1)
    if dtype in FLOATS:
        return {f16: ir.Type.f16, bf16: ir.Type.bf16, f32: ir.Type.f32, f64: ir.Type.f64}[dtype]()
    if dtype in FLOATS8:
        return ir.Type.parse({f8e4m3: "f8E4M3FN", f8e5m2: "f8E5M2"}[dtype])
    return ir.Type.integer(dtype.itemsize * 8)


def is_float(dtype):
    return dtype in FLOATS


def is_integer(dtype):
    return dtype in SIGNED or dtype in UNSIGNED or dtype == index


def integer_range(dtype):
    """(lowest, highest) of an integer dtype or bool_: the one range check of
    constants, kernel scalars, host-program scalars and vectorize scalars
    (NumPy would wrap an out-of-range Python int silently)."""
    if dtype == bool_:
        return 0, 1
    bits = dtype.itemsize * 8
    return (0, 2 ** bits - 1) if dtype in UNSIGNED else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)


# ---------------------------------------------------------------------------
# Tracing state: the kernel being traced and where its operations go.

class _State(threading.local):
    tracer = None  # the active tracer.Trace, if any
    # While integer // and % follow NumPy (mg.vectorize): called as (condition, warning) at each,
    # for each condition NumPy warns about.
    division_faults = None


state = _State()


def current_trace():
    if state.tracer is None:
        raise CompileError("mlirgpu kernel operations can only be used inside an @mg.kernel while it is traced")
    return state.tracer


def location():
    """The user's line that is running now, as an MLIR location."""
    return current_trace().location()


def target():
    """The lowering (mlirgpu.targets) the code being traced is for."""
    return current_trace().target


def module_state():
    """A dict shared by everything traced into one kernel's module (the
    kernel and the device functions it calls): shared arrays, device
    function specializations, the device-function call stack."""
    return current_trace().module_state


def _top_level():
    """The function (gpu.func or func.func) being traced into, at the top of
    its gpu.module (or builtin.module when the target traces for the host)."""
    op = ir.InsertionPoint.current().block.owner
    while op is not None and (op.parent is None or op.parent.name not in ("gpu.module", "builtin.module")):
        op = op.parent
    if op is None:
        raise CompileError("no gpu.module around the code being traced")
    return op


@contextlib.contextmanager
def gpu_module_scope():
    """Insert into the module of the function being traced, before it."""
    with ir.InsertionPoint.before(_top_level()):
        yield


def require(what, ptx=None, sm=None):
    """Records that the module uses `what`, which needs PTX ISA `ptx` (x10)
    or chip sm_`sm` at least: the compiler raises the PTX version it writes
    to `ptx`, and refuses an older chip with a CompileError naming `what`."""
    state = module_state()
    if ptx is not None and ptx > state.get("min_ptx", (0, ""))[0]:
        state["min_ptx"] = (ptx, what)
    if sm is not None and sm > state.get("min_sm", (0, ""))[0]:
        state["min_sm"] = (sm, what)


def unique_symbol(name):
    """`name`, or name_2, name_3, ...: a symbol not yet used in the module."""
    state = module_state()
    used = state.get("symbols")
    if used is None:
        used = state["symbols"] = {op.get_attribute("sym_name").value for op in _top_level().block.operations
                                   if "sym_name" in op.attributes}
    symbol, n = name, 1
    while symbol in used:
        n += 1
        symbol = f"{name}_{n}"
    used.add(symbol)
    return symbol


def emit(name, operands=(), results=(), attributes=None, regions=0):
    """An operation at the current insertion point, at the user's line."""
    return ir.Operation.create(name, operands=[o.value if isinstance(o, Scalar) else o for o in operands],
                               results=results, attributes=attributes, regions=regions, location=location())


# ---------------------------------------------------------------------------
# Variables without a value

class Undefined:
    """A variable with no value at this point (assigned only later, or only
    inside a traced region); any use of one raises CompileError."""

    def __init__(self, name=None, where=None):
        self.name, self.where = name, where

    def fail(self, *args, **kwargs):
        raise CompileError(f"variable {self.name!r} is used where it has no value: it is assigned only "
                           f"inside {self.where or 'a traced region'}, and a traced region's values stay "
                           f"inside it unless the variable also has a value before it")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = fail
    __getitem__ = __setitem__ = __call__ = __bool__ = __index__ = __iter__ = fail
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __float__ = __int__ = fail

    def __getattr__(self, name):
        self.fail()

    def __repr__(self):
        return f"<undefined {self.name}>"


UNDEFINED = Undefined()


def _check_defined(value):
    if isinstance(value, Undefined):
        value.fail()


class Choice:
    """A Python number picked by a traced condition (a variable given two
    different numbers in the branches of a traced if). It has no type until it
    meets a traced value: then it is arith.select of two constants of that
    value's type, as a lone Python number would be one constant."""

    def __init__(self, condition, if_true, if_false):
        self.condition, self.if_true, self.if_false = condition, if_true, if_false

    def as_type(self, dtype, what):
        if not is_float(dtype) and (isinstance(self.if_true, float) or isinstance(self.if_false, float)):
            raise CompileError(f"{what}: a Python float meets a {dtype.name} value")
        return select(self.condition, constant(self.if_true, dtype), constant(self.if_false, dtype))

    def __repr__(self):
        return f"<{self.if_true!r} or {self.if_false!r}, by a traced condition>"


# ---------------------------------------------------------------------------
# Scalars

class Scalar:
    """A traced scalar: an MLIR value and its mlirgpu dtype."""

    __slots__ = ("value", "dtype")

    def __init__(self, value: ir.Value, dtype: DType) -> None:
        self.value, self.dtype = value, dtype

    def __repr__(self):
        return f"<traced {self.dtype.name} {self.value}>"

    def __bool__(self):
        raise CompileError("a traced value has no Python truth value: `and`, `or`, `not` and "
                           "chained comparisons on traced values are not supported; use `&`, `|`, "
                           "`~` on comparisons, or nested `if`s")

    def __index__(self):
        raise CompileError("a traced value cannot be used where Python needs an int (a size, a "
                           "Python range over a traced bound): use range() in a for loop, which "
                           "becomes scf.for")

    __int__ = __index__

    def __float__(self):
        raise CompileError("a traced value cannot become a Python float: Python's math functions and "
                           "NumPy cannot take traced values; use mg.math (mg.math.sqrt, mg.math.exp, ...)")

    def __iter__(self):
        raise CompileError("a traced scalar is not iterable")

    # arithmetic
    def __add__(self, other): return _arith(self, other, "addf", "addi", "+")
    def __radd__(self, other): return _arith(other, self, "addf", "addi", "+")
    def __sub__(self, other): return _arith(self, other, "subf", "subi", "-")
    def __rsub__(self, other): return _arith(other, self, "subf", "subi", "-")
    def __mul__(self, other): return _arith(self, other, "mulf", "muli", "*")
    def __rmul__(self, other): return _arith(other, self, "mulf", "muli", "*")
    def __truediv__(self, other): return _div(self, other)
    def __rtruediv__(self, other): return _div(other, self)
    def __floordiv__(self, other): return _intdiv(self, other, "div", "//")
    def __rfloordiv__(self, other): return _intdiv(other, self, "div", "//")
    def __mod__(self, other): return _intdiv(self, other, "rem", "%")
    def __rmod__(self, other): return _intdiv(other, self, "rem", "%")
    def __and__(self, other): return _bitwise(self, other, "andi", "&")
    def __rand__(self, other): return _bitwise(other, self, "andi", "&")
    def __or__(self, other): return _bitwise(self, other, "ori", "|")
    def __ror__(self, other): return _bitwise(other, self, "ori", "|")
    def __xor__(self, other): return _bitwise(self, other, "xori", "^")
    def __rxor__(self, other): return _bitwise(other, self, "xori", "^")
    def __lshift__(self, other): return _bitwise(self, other, "shli", "<<")
    def __rshift__(self, other):
        a, b = unify(self, other, ">>")
        return _bitwise(a, b, "shrui" if a.dtype in UNSIGNED else "shrsi", ">>")

    def __pow__(self, exponent):
        if isinstance(exponent, int) and not isinstance(exponent, bool) and 0 <= exponent <= 16:
            result = self if exponent else _lift(1, self, "**")
            for _ in range(exponent - 1):
                result = result * self
            return result
        if is_float(self.dtype):
            from . import math
            return math.pow(self, exponent)
        raise CompileError("** on integers takes a Python int exponent in 0..16")

    def __neg__(self):
        if is_float(self.dtype):
            return Scalar(emit("arith.negf", [self], [self.value.type], arith_attributes("negf")).result, self.dtype)
        return _arith(0, self, "subf", "subi", "-")

    def __pos__(self):
        return self

    def __invert__(self):
        if self.dtype == bool_:
            return _bitwise(self, True, "xori", "~")
        if not is_integer(self.dtype):
            raise CompileError(f"~ needs an integer or bool operand, not {self.dtype.name}")
        all_ones = 2 ** (self.dtype.itemsize * 8) - 1 if self.dtype in UNSIGNED else -1
        return _bitwise(self, all_ones, "xori", "~")

    def __abs__(self):
        from . import math
        return math.abs(self)

    # comparisons
    def __eq__(self, other): return _compare(self, other, "eq")
    def __ne__(self, other): return _compare(self, other, "ne")
    def __lt__(self, other): return _compare(self, other, "lt")
    def __le__(self, other): return _compare(self, other, "le")
    def __gt__(self, other): return _compare(self, other, "gt")
    def __ge__(self, other): return _compare(self, other, "ge")

    __hash__ = None


def _no_arithmetic(dtype, what):
    if dtype in FLOATS8:
        raise CompileError(f"{what} on {dtype.name} values: 8-bit floats are storage only here "
                           f"(TMA copies them, mg.wgmma multiplies them)")


def is_python_number(x):
    return isinstance(x, (bool, int, float, np.generic)) and not isinstance(x, Scalar)


def constant(value: bool | int | float, dtype: DType) -> Scalar:
    """`value` as a traced constant of `dtype`.

    For example::

        one = mg.constant(1.0, mg.f32)
        zero = mg.constant(0, dtype)           # a dtype generic works too
    """
    dtype = as_dtype(dtype)
    if isinstance(value, Scalar):
        raise CompileError("mg.constant takes a Python number; use mg.cast to convert a traced value")
    if not isinstance(value, (bool, int, float, np.generic)):
        raise CompileError(f"mg.constant takes a Python number, not {type(value).__name__}")
    _no_arithmetic(dtype, "mg.constant")
    t = ir_type(dtype)
    if is_float(dtype):
        attr = ir.Attribute.float(float(value), t)
    elif dtype == bool_:
        attr = ir.Attribute.integer(1 if value else 0, t)
    else:
        if isinstance(value, float) and not float(value).is_integer():
            raise CompileError(f"{value!r} is not an integer: cannot be a {dtype.name} constant")
        v = int(value)
        lo, hi = integer_range(dtype)
        if not lo <= v <= hi:
            raise CompileError(f"{v} does not fit in {dtype.name}")
        bits = dtype.itemsize * 8
        if dtype in UNSIGNED and v >= 2 ** (bits - 1):
            v -= 2 ** bits  # signless bits
        attr = ir.Attribute.integer(v, t)
    return Scalar(emit("arith.constant", results=[t], attributes={"value": attr}).result, dtype)


def constant_value(value):
    """The int an integer operand is known to be at trace time (a Python int,
    or a Scalar or Value of arith.constant; unsigned ones as their signless
    bits), else None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    value = value.value if isinstance(value, Scalar) else value
    if not isinstance(value, ir.Value) or value.is_block_argument or value.owner.name != "arith.constant":
        return None
    constant = value.owner.get_attribute("value").value
    return constant if isinstance(constant, int) and not isinstance(constant, bool) else None


def as_dtype(dtype):
    if isinstance(dtype, DType):
        return dtype
    from .. import _mlirgpu
    try:
        return _mlirgpu.dtype(dtype)
    except (TypeError, ValueError) as error:
        raise CompileError(f"not a dtype: {dtype!r}") from error


def _lift(x, like, op):
    """A Python number as a constant of the type of `like` (see the module's rules)."""
    if isinstance(x, Scalar):
        return x
    _check_defined(x)
    if isinstance(x, Choice):
        return x.as_type(like.dtype, op)
    if not is_python_number(x):
        raise CompileError(f"unsupported operand for {op}: {type(x).__name__}")
    if isinstance(x, np.generic):
        return constant(x, as_dtype(x.dtype))
    if isinstance(x, float) and not is_float(like.dtype):
        raise CompileError(f"a Python float meets a {like.dtype.name} value in {op}: "
                           f"write an integer, or mg.cast the value to a float type")
    return constant(x, like.dtype)


def unify(a, b, op):
    """Both operands as Scalars of one dtype, or CompileError."""
    if not isinstance(a, Scalar) and not isinstance(b, Scalar):
        raise CompileError(f"{op} needs a traced operand")
    for x in (a, b):
        if isinstance(x, Scalar):
            _no_arithmetic(x.dtype, op)
    a = _lift(a, b, op) if not isinstance(a, Scalar) else a
    b = _lift(b, a, op) if not isinstance(b, Scalar) else b
    if a.dtype != b.dtype:
        common = widened(a.dtype, b.dtype)
        if common is None:
            raise CompileError(f"operands of {op} have types {a.dtype.name} and {b.dtype.name}, which neither "
                               f"holds every value of the other: mg.cast one of them")
        a, b = cast(a, common), cast(b, common)
    return a, b


# Integer widths for widening: mg.index is a signed 64-bit integer.
_SIGNED_BITS = {i8: 8, i16: 16, i32: 32, i64: 64, index: 64}
_UNSIGNED_BITS = {u8: 8, u16: 16, u32: 32, u64: 64}
_FLOAT_RANK = {f16: 1, bf16: 1, f32: 2, f64: 3}


def widened(a: DType, b: DType) -> DType | None:
    """The type two operand types widen to without losing a value, as C,
    NumPy and Triton promote them: the wider integer of one signedness, an
    unsigned one beside a wider signed one (u32 with i64 or index: i64 or
    index; u8 with i8: i16), the wider float (f16 with bf16: f32). None for
    an integer with a float, a bool with a number, or u64 with a signed type."""
    if a == b:
        return a
    if is_float(a) and is_float(b):
        return f32 if {a, b} == {f16, bf16} else max(a, b, key=_FLOAT_RANK.__getitem__)
    if a in _SIGNED_BITS and b in _SIGNED_BITS:  # index wins a tie with i64: it indexes memrefs
        return max(a, b, key=lambda t: (_SIGNED_BITS[t], t == index))
    if a in _UNSIGNED_BITS and b in _UNSIGNED_BITS:
        return max(a, b, key=_UNSIGNED_BITS.__getitem__)
    signed, unsigned = (a, b) if a in _SIGNED_BITS else (b, a)
    if signed not in _SIGNED_BITS or unsigned not in _UNSIGNED_BITS:
        return None
    if _SIGNED_BITS[signed] > _UNSIGNED_BITS[unsigned]:
        return signed
    return {8: i16, 16: i32, 32: i64}.get(_UNSIGNED_BITS[unsigned])


# Float + - * may be contracted into fused multiply-adds, as nvcc does by
# default (--fmad=true): without `contract`, LLVM's NVPTX back end writes
# mul.rn/add.rn, which ptxas may not fuse, and a matmul runs at half the FMA rate.
_CONTRACTED = ("addf", "subf", "mulf")


def fastmath():
    """Whether the kernel being traced has @mg.kernel(fastmath=True)."""
    return bool(module_state().get("fastmath"))


def arith_attributes(name):
    """The attributes of arith.<name>: fastmath<contract> for float + - *, and
    fastmath<fast> for every float operation under @mg.kernel(fastmath=True)."""
    if fastmath() and name in _CONTRACTED + ("divf", "negf"):
        return {"fastmath": ir.Attribute.parse("#arith.fastmath<fast>")}
    return {"fastmath": ir.Attribute.parse("#arith.fastmath<contract>")} if name in _CONTRACTED else None


def _arith(a, b, float_op, int_op, op):
    a, b = unify(a, b, op)
    if a.dtype == bool_:
        raise CompileError(f"{op} on bool values: use &, | or ^")
    name = float_op if is_float(a.dtype) else int_op
    return Scalar(emit("arith." + name, [a, b], [a.value.type], arith_attributes(name)).result, a.dtype)


def _div(a, b):
    a, b = unify(a, b, "/")
    if not is_float(a.dtype):
        raise CompileError(f"/ on {a.dtype.name} values: use // for integer division, or mg.cast to a float type")
    return Scalar(emit("arith.divf", [a, b], [a.value.type], arith_attributes("divf")).result, a.dtype)


def _intdiv(a, b, kind, op):
    a, b = unify(a, b, op)
    if is_float(a.dtype):
        if kind == "rem":
            # C's fmod: a - trunc(a / b) * b (NVVM has no lowering for arith.remf)
            from . import math
            return a - math.trunc(a / b) * b
        raise CompileError(f"// on {a.dtype.name} values: use / (and mg.math.floor)")
    if a.dtype == bool_:
        raise CompileError(f"{op} on bool values")
    suffix = "ui" if a.dtype in UNSIGNED else "si"
    faults = state.division_faults
    if faults is None:
        divisor = target().check_division(a, b)
        return Scalar(emit(f"arith.{kind}{suffix}", [a, divisor], [a.value.type]).result, a.dtype)
    # NumPy's answers where the hardware traps: 0 for a zero divisor, MIN // -1 wrapping to MIN (and
    # MIN % -1 to 0, what dividing by 1 gives), each reported for the warning NumPy gives.
    zero, ufunc = constant(0, a.dtype), "floor_divide" if kind == "div" else "remainder"
    by_zero = _compare(b, zero, "eq")
    trapping = by_zero
    faults(by_zero, f"divide by zero encountered in {ufunc}")
    if suffix == "si":
        overflow = _bitwise(_compare(a, constant(integer_range(a.dtype)[0], a.dtype), "eq"),
                            _compare(b, constant(-1, a.dtype), "eq"), "andi", "&")
        trapping = _bitwise(by_zero, overflow, "ori", "|")
        if kind == "div":
            faults(overflow, f"overflow encountered in {ufunc}")
    divisor = select(trapping, constant(1, a.dtype), b)
    result = Scalar(emit(f"arith.{kind}{suffix}", [a, divisor], [a.value.type]).result, a.dtype)
    return select(by_zero, zero, result)


def _bitwise(a, b, name, op):
    a, b = unify(a, b, op)
    if is_float(a.dtype):
        raise CompileError(f"{op} on {a.dtype.name} values: bitwise operators need integers or bools")
    return Scalar(emit("arith." + name, [a, b], [a.value.type]).result, a.dtype)


_FLOAT_PREDICATES = {"eq": 1, "gt": 2, "ge": 3, "lt": 4, "le": 5, "ne": 6}  # ordered oeq, ogt, ...; une = 13
_INT_PREDICATES = {"eq": 0, "ne": 1, "lt": 2, "le": 3, "gt": 4, "ge": 5}  # signed slt.. ; unsigned +4


def _compare(a, b, how):
    a, b = unify(a, b, {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[how])
    i1 = ir.Type.integer(1)
    if is_float(a.dtype):
        predicate = 13 if how == "ne" else _FLOAT_PREDICATES[how]  # une: NaN != anything
        op = emit("arith.cmpf", [a, b], [i1], {"predicate": ir.Attribute.integer(predicate, ir.Type.integer(64))})
    else:
        predicate = _INT_PREDICATES[how]
        if how in ("lt", "le", "gt", "ge") and (a.dtype in UNSIGNED or a.dtype == bool_):
            predicate += 4  # ult, ule, ugt, uge
        op = emit("arith.cmpi", [a, b], [i1], {"predicate": ir.Attribute.integer(predicate, ir.Type.integer(64))})
    return Scalar(op.result, bool_)


def select(condition: Scalar, if_true: Number, if_false: Number) -> Scalar:
    """`if_true` where `condition` holds, else `if_false` (arith.select).

    For example::

        y[i] = mg.select(x[i] > 0.0, x[i], 0.0 * x[i])    # a ReLU without a branch
    """
    if not isinstance(condition, Scalar) or condition.dtype != bool_:
        raise CompileError("mg.select needs a traced bool condition (a comparison)")
    a, b = unify(if_true, if_false, "mg.select")
    return Scalar(emit("arith.select", [condition, a, b], [a.value.type]).result, a.dtype)


def cast(value: Number, dtype: DType) -> Scalar:
    """`value` converted to `dtype` (arith casts; floats to ints truncate toward zero).

    For example::

        j = mg.cast(x[i], mg.i32)              # f32 -> i32, truncating
        y[i] = mg.cast(mg.thread_idx.x, mg.f32)
    """
    dtype = as_dtype(dtype)
    if is_python_number(value):
        return constant(value, dtype)
    if not isinstance(value, Scalar):
        raise CompileError(f"mg.cast takes a traced value or a Python number, not {type(value).__name__}")
    src = value.dtype
    if src == dtype:
        return value
    _no_arithmetic(src, "mg.cast")
    _no_arithmetic(dtype, "mg.cast")
    if dtype == bool_:  # truth, as in C: nonzero is true
        return value != 0
    t = ir_type(dtype)

    def op(name):
        return Scalar(emit("arith." + name, [value], [t]).result, dtype)

    if is_float(src) and is_float(dtype):
        if src == bf16 or dtype == bf16:
            if src in (f16, bf16) and dtype in (f16, bf16):  # through f32: no direct op
                return cast(cast(value, f32), dtype)
        return op("extf" if dtype.itemsize > src.itemsize else "truncf")
    if is_float(src):
        if dtype == index:
            return cast(cast(value, i64), index)
        return op("fptoui" if dtype in UNSIGNED or dtype == bool_ else "fptosi")
    if is_float(dtype):
        if src == index:
            return cast(cast(value, i64), dtype)
        return op("uitofp" if src in UNSIGNED or src == bool_ else "sitofp")
    if src == index or dtype == index:
        if src == bool_:
            return cast(cast(value, i32), index)
        return op("index_castui" if src in UNSIGNED else "index_cast")
    sb, db = src.itemsize * 8 if src != bool_ else 1, dtype.itemsize * 8 if dtype != bool_ else 1
    if db > sb:
        return op("extui" if src in UNSIGNED or src == bool_ else "extsi")
    if db < sb:
        return op("trunci")
    return Scalar(value.value, dtype)  # same width: the signless bits are the same, only the reading differs


def as_index(value, what="an index"):
    """A memref index or loop bound: a traced integer or a Python int, as `index`."""
    _check_defined(value)
    if isinstance(value, Scalar):
        if value.dtype == index:
            return value
        if is_integer(value.dtype):
            return cast(value, index)
        raise CompileError(f"{what} must be an integer, got a {value.dtype.name} value")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return constant(int(value), index)
    raise CompileError(f"{what} must be an integer, got {type(value).__name__}")


def coerce(value, dtype, what):
    """`value` as a Scalar of exactly `dtype` (Python numbers become constants)."""
    _check_defined(value)
    if isinstance(value, Choice):
        return value.as_type(dtype, what)
    if isinstance(value, Scalar):
        if value.dtype != dtype:
            raise CompileError(f"{what} is {dtype.name} but the value is {value.dtype.name}: mg.cast it")
        return value
    if is_python_number(value):
        if isinstance(value, float) and not is_float(dtype):
            raise CompileError(f"{what} is {dtype.name} but the value is a Python float")
        return constant(value, dtype)
    raise CompileError(f"{what} takes a number, not {type(value).__name__}")


# ---------------------------------------------------------------------------
# Memrefs

class MemRef:
    """A traced array parameter (or shared-memory array): `A[i, j]` loads,
    `A[i, j] = v` stores, `A.shape` its sizes. `extents` holds the static
    sizes, None for a dynamic one. `name` (the parameter's) is for the CPU
    backend's bounds-check errors."""

    __slots__ = ("value", "dtype", "extents", "name", "readonly")

    def __init__(self, value: ir.Value, dtype: DType, shape: Iterable[int | None], name: str | None = None,
                 readonly: bool = False) -> None:
        self.value, self.dtype, self.extents, self.name = value, dtype, tuple(shape), name
        self.readonly = readonly

    def check_writable(self, what: str) -> None:
        if self.readonly:
            raise CompileError(f"{what} to {self.name!r}, which is declared .readonly()")

    def __repr__(self):
        return f"<traced memref {'x'.join('?' if d is None else str(d) for d in self.extents)}x{self.dtype.name}>"

    @property
    def shape(self) -> tuple[Index, ...]:
        """The sizes: a Python int where static, a traced index (memref.dim) where dynamic."""
        return tuple(d if d is not None else
                     Scalar(emit("memref.dim", [self.value, constant(k, index)], [ir.Type.index()]).result, index)
                     for k, d in enumerate(self.extents))

    @property
    def ndim(self) -> int:
        return len(self.extents)

    def _indices(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if len(key) != len(self.extents):
            raise CompileError(f"a {len(self.extents)}-d memref takes {len(self.extents)} indices, got {len(key)}")
        if any(isinstance(k, slice) for k in key):
            raise CompileError("slices of a memref are only supported for 1-d shared memory (s[a:b])")
        return [as_index(k) for k in key]

    def __getitem__(self, key: Indices) -> Scalar:
        indices = self._indices(key)
        target().check_access(self, indices, LOAD)
        return Scalar(emit("memref.load", [self.value, *indices], [ir_type(self.dtype)]).result, self.dtype)

    def __setitem__(self, key, value):
        self.check_writable("a store")
        indices = self._indices(key)
        value = coerce(value, self.dtype, "the memref's element type")
        target().check_access(self, indices, STORE)
        emit("memref.store", [value, self.value, *indices])

    def __len__(self):
        if self.extents[0] is None:
            raise CompileError("len() of a memref whose first size is dynamic: use A.shape[0], a traced value")
        return self.extents[0]

    def __bool__(self):
        raise CompileError("a memref has no Python truth value")


# ---------------------------------------------------------------------------
# Thread, block and grid indices

class _Dim3:
    """thread_idx / block_idx / block_dim / grid_dim: `.x`, `.y`, `.z` as index values."""

    def __init__(self, op, name):
        self._op, self._name = op, name

    def _get(self, axis):
        return target().index(self._op, axis)

    x = property(lambda self: self._get("x"))
    y = property(lambda self: self._get("y"))
    z = property(lambda self: self._get("z"))

    def __repr__(self):
        return f"mlirgpu.{self._name}"


thread_idx = _Dim3("gpu.thread_id", "thread_idx")
block_idx = _Dim3("gpu.block_id", "block_idx")
block_dim = _Dim3("gpu.block_dim", "block_dim")
grid_dim = _Dim3("gpu.grid_dim", "grid_dim")


# ---------------------------------------------------------------------------
# Loops the tracer rewrites

def range_(*bounds: Index, iter_args: Sequence[Number] | None = None) -> NoReturn:
    """`for k in mg.range_(lo, hi, step)` (bounds traced or Python ints) becomes scf.for;
    `for k, acc in mg.range_(n, iter_args=[acc]): ...; acc = yield acc` is the
    explicit loop-carried form. Only valid as the iterable of a for statement
    in a kernel, which the tracer rewrites.

    For example::

        for k in mg.range_(0, K, 2):                      # like range(0, K, 2)
            acc += A[r, k]
        for k, acc in mg.range_(K, iter_args=[acc]):      # explicitly carried values
            acc += A[r, k]
            acc = yield acc
    """
    raise CompileError("mg.range_ can only be the iterable of a `for` statement in an @mg.kernel")


def static_range(*args: int) -> range:
    """A Python range that the tracer unrolls: bounds must be Python ints.

    For example::

        for j in mg.static_range(4):           # four copies of the body
            acc[j] += a * b[j]
    """
    for a in args:
        if isinstance(a, Scalar):
            raise CompileError("mg.static_range needs Python int bounds: it unrolls at trace time")
    return builtins.range(*args)


def python_range_args(args):
    """(lo, hi, step) of range(...) arguments."""
    if not 1 <= len(args) <= 3:
        raise CompileError(f"range takes 1 to 3 arguments, got {len(args)}")
    if len(args) == 1:
        return 0, args[0], 1
    if len(args) == 2:
        return args[0], args[1], 1
    return args



# ---------------------------------------------------------------------------
# Element pointers: for the operations MLIR's memref dialect has no form of
# (atomics with an ordering and scope, loads and stores with cache hints)

_ADDRESS_SPACES = {"#gpu.address_space<workgroup>": 3, "#gpu.address_space<global>": 1}


def address_space(memref: MemRef) -> int:
    """The LLVM address space of a memref's type (3 for shared memory on the GPU, else 0)."""
    text = str(memref.value.type)
    return next((space for name, space in _ADDRESS_SPACES.items() if name in text), 0)


def element_pointer(memref: MemRef, indices: Sequence[Scalar]) -> tuple[ir.Value, int]:
    """(pointer, address space): an !llvm.ptr to memref[indices] (`indices` as
    index Scalars), the aligned base pointer plus the element's offset from
    the memref's strided metadata. A memref of no memory space is global
    memory on the GPU: the target says in which address space it points."""
    rank = len(memref.extents)
    space = address_space(memref)
    memory_space = str(memref.value.type).rsplit(", ", 1)[-1][:-1] if space else None
    base_type = ir.Type.parse(f"memref<{ir_type(memref.dtype)}{', ' + memory_space if memory_space else ''}>")
    metadata = emit("memref.extract_strided_metadata", [memref.value],
                    [base_type] + [ir.Type.index()] * (1 + 2 * rank))
    offset = Scalar(metadata.results[1], index)
    strides = [Scalar(metadata.results[2 + rank + d], index) for d in range(rank)]
    for i, stride in zip(indices, strides):
        offset = offset + i * stride
    base = Scalar(emit("memref.extract_aligned_pointer_as_index", [memref.value], [ir.Type.index()]).result, index)
    address = cast(base + offset * memref.dtype.itemsize, i64)
    pointer = emit("llvm.inttoptr", [address], [ir.Type.parse(f"!llvm.ptr<{space}>" if space else "!llvm.ptr")])
    if space:
        return pointer.result, space
    return target().global_pointer(pointer.result)
