"""mg.math: math on traced values inside a kernel (the math and arith dialects).

Floating-point functions take and return the operand's float type; `abs`,
`min` and `max` also take integers. Python numbers take the other operand's
type, as with operators. Every function also takes a Vector (mg.vload's
result) and works on each of its lanes; the other operands of a binary
function may then be vectors of the same type, scalars or Python numbers.

Accuracy: by default the accurate versions (libdevice's on the GPU, as
CUDA's expf, logf, ...). Under `@mg.kernel(fastmath=True)` every call carries
MLIR's `fast` flags, and exp, log, sin, cos, pow, ... become the GPU's
approximate instructions, as nvcc's --use_fast_math. The approximate forms
also have names of their own, for one call in an accurate kernel:

    y = mg.math.fast_exp(x)     # CUDA's __expf: ex2.approx of x * log2(e)
    r = mg.math.rcp_approx(x)   # rcp.approx.ftz.f32 (f32 only)
    p = mg.math.exp2_approx(x)  # ex2.approx.ftz.f32 (f32 only): one instruction

On the CPU backend the approximate forms compute what the accurate ones do
(the host has no such instructions); results agree within the GPU's
documented error of the approximations.
"""
from __future__ import annotations

from .. import ir
from .._mlirgpu import CompileError
from . import core as lang
from .intrinsics import Vector

__all__ = ["exp", "exp2", "log", "log2", "log10", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
           "floor", "ceil", "round", "trunc", "fma", "abs", "min", "max", "pow", "atan2",
           "fast_exp", "fast_exp2", "fast_log", "fast_log2", "fast_sin", "fast_cos", "fast_pow", "fast_div",
           "rcp_approx", "exp2_approx"]


def _flags(approximate=False):
    """The fastmath attribute of a math operation: `fast` under fastmath=True,
    `afn` (approximate functions) for the fast_* names."""
    if lang.fastmath():
        return {"fastmath": ir.Attribute.parse("#arith.fastmath<fast>")}
    return {"fastmath": ir.Attribute.parse("#arith.fastmath<afn>")} if approximate else None


def _wrap(value, like):
    return Vector(value, like.dtype, like.length) if isinstance(like, Vector) else lang.Scalar(value, like.dtype)


def _float_operand(x, what):
    if not isinstance(x, (lang.Scalar, Vector)) or not lang.is_float(x.dtype):
        raise CompileError(f"{what} takes a traced float value or vector")
    return x


def _float_unary(name, approximate=False, operation=None):
    operation = operation or name

    def function(x):
        x = _float_operand(x, f"mg.math.{function.__name__}")
        return _wrap(lang.emit(f"math.{operation}", [x.value], [x.value.type], _flags(approximate)).result, x)
    function.__name__ = name
    function.__doc__ = (f"math.{operation} of a traced float (or each lane of a vector)" +
                        (", approximate (fastmath<afn>)." if approximate else "."))
    return function


exp, exp2, log, log2, log10 = (_float_unary(n) for n in ("exp", "exp2", "log", "log2", "log10"))
sqrt, rsqrt, sin, cos, tan, tanh, erf = (_float_unary(n) for n in ("sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf"))
floor, ceil, round = (_float_unary(n) for n in ("floor", "ceil", "round"))
fast_exp, fast_exp2, fast_log, fast_log2, fast_sin, fast_cos = (
    _float_unary(f"fast_{n}", True, n) for n in ("exp", "exp2", "log", "log2", "sin", "cos"))


def trunc(x: lang.Number) -> lang.Scalar:
    """x rounded toward zero (floor or ceil by sign: NVVM has no lowering for math.trunc)."""
    x = _float_operand(x, "mg.math.trunc")
    if isinstance(x, Vector):
        zero = Vector(lang.emit("vector.broadcast", [lang.constant(0.0, x.dtype)], [x.value.type]).result,
                      x.dtype, x.length)
        negative = lang.emit("arith.cmpf", [x.value, zero.value], [ir.Type.vector([x.length], ir.Type.integer(1))],
                             {"predicate": ir.Attribute.integer(4, ir.Type.integer(64))}).result
        return _wrap(lang.emit("arith.select", [negative, ceil(x).value, floor(x).value], [x.value.type]).result, x)
    return lang.select(x < 0, ceil(x), floor(x))


def _binary(a, b, what, floats=True):
    """Both operands of one type: two Scalars (lang.unify's rules), or Vectors
    (a scalar or number meeting a vector is broadcast to it)."""
    if isinstance(a, Vector) or isinstance(b, Vector):
        vector = a if isinstance(a, Vector) else b
        a, b = (vector._operand(x, what) for x in (a, b))
    else:
        a, b = lang.unify(a, b, what)
    if floats and not lang.is_float(a.dtype):
        raise CompileError(f"{what} takes float values, not {a.dtype.name}")
    return a, b


def pow(x: lang.Number, y: lang.Number) -> lang.Scalar:
    """x ** y (math.powf)."""
    x, y = _binary(x, y, "mg.math.pow")
    return _wrap(lang.emit("math.powf", [x.value, y.value], [x.value.type], _flags()).result, x)


def fast_pow(x: lang.Number, y: lang.Number) -> lang.Scalar:
    """x ** y, approximate (CUDA's __powf)."""
    x, y = _binary(x, y, "mg.math.fast_pow")
    return _wrap(lang.emit("math.powf", [x.value, y.value], [x.value.type], _flags(True)).result, x)


def fast_div(x: lang.Number, y: lang.Number) -> lang.Scalar:
    """x / y, approximate (CUDA's __fdividef: div.approx.f32 on the GPU)."""
    x, y = _binary(x, y, "mg.math.fast_div")
    fast = {"fastmath": ir.Attribute.parse("#arith.fastmath<fast>")}
    return _wrap(lang.emit("arith.divf", [x.value, y.value], [x.value.type], fast).result, x)


def rcp_approx(x: lang.Number) -> lang.Scalar:
    """1 / x, approximate: PTX rcp.approx.ftz.f32 on the GPU (f32 only)."""
    return _f32_instruction(x, rcp_approx, "rcp.approx.ftz.f32", lambda lane: lang.target().reciprocal_approx(lane))


def exp2_approx(x: lang.Number) -> lang.Scalar:
    """2 ** x, approximate: PTX ex2.approx.ftz.f32 on the GPU (f32 only).

    One instruction where exp2 and fast_exp2 (ex2.approx.f32, which keeps
    subnormals) take four: subnormal inputs and results are flushed to
    zero. The exponentials of a softmax, whose subnormal terms cannot move
    a sum that holds a 1, are what it is for."""
    return _f32_instruction(x, exp2_approx, "ex2.approx.ftz.f32", lambda lane: lang.target().exp2_approx(lane))


def _f32_instruction(x, function, instruction, scalar):
    """`function` (an mg.math name for one f32 PTX `instruction`) of x: `scalar` of an
    f32 value, lane by lane of a vector."""
    x = _float_operand(x, f"mg.math.{function.__name__}")
    if x.dtype != lang.f32:
        raise CompileError(f"mg.math.{function.__name__} takes f32 values ({instruction}), not {x.dtype.name}")
    if isinstance(x, Vector):
        return _wrap(lang.emit("vector.from_elements", [scalar(lane) for lane in x], [x.value.type]).result, x)
    return scalar(x)


def atan2(y: lang.Number, x: lang.Number) -> lang.Scalar:
    y, x = _binary(y, x, "mg.math.atan2")
    return _wrap(lang.emit("math.atan2", [y.value, x.value], [x.value.type], _flags()).result, x)


def fma(a: lang.Number, b: lang.Number, c: lang.Number) -> lang.Scalar:
    """a * b + c, rounded once (math.fma)."""
    a, b = _binary(a, b, "mg.math.fma")
    if isinstance(a, Vector):
        c = a._operand(c, "mg.math.fma")
    else:
        c = lang.coerce(c, a.dtype, "mg.math.fma's addend")
    return _wrap(lang.emit("math.fma", [a.value, b.value, c.value], [a.value.type], _flags()).result, a)


def abs(x: lang.Scalar | Vector) -> lang.Scalar | Vector:
    if not isinstance(x, (lang.Scalar, Vector)):
        raise CompileError("mg.math.abs takes a traced value")
    if lang.is_float(x.dtype):
        return _wrap(lang.emit("math.absf", [x.value], [x.value.type], _flags()).result, x)
    if x.dtype in lang.UNSIGNED or x.dtype == lang.index:
        return x
    return _wrap(lang.emit("math.absi", [x.value], [x.value.type]).result, x)


def _minmax(a, b, which):
    a, b = _binary(a, b, f"mg.math.{which}", floats=False)
    if lang.is_float(a.dtype):
        name = "minnumf" if which == "min" else "maxnumf"
    elif a.dtype in lang.UNSIGNED or a.dtype == lang.bool_:  # mg.index is signed, as in comparisons
        name = "minui" if which == "min" else "maxui"
    else:
        name = "minsi" if which == "min" else "maxsi"
    return _wrap(lang.emit(f"arith.{name}", [a.value, b.value], [a.value.type]).result, a)


def min(a: lang.Number | Vector, b: lang.Number | Vector) -> lang.Scalar | Vector:
    """The smaller of two values (floats: the non-NaN one)."""
    return _minmax(a, b, "min")


def max(a: lang.Number | Vector, b: lang.Number | Vector) -> lang.Scalar | Vector:
    """The larger of two values (floats: the non-NaN one)."""
    return _minmax(a, b, "max")
