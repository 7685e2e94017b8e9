"""mg.math: math on traced values inside a kernel (the math and arith dialects).

Floating-point functions take and return the operand's float type; `abs`,
`min` and `max` also take integers. Python numbers take the other operand's
type, as with operators.
"""
from . import core as lang
from .._mlirgpu import CompileError

__all__ = ["exp", "exp2", "log", "log2", "log10", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
           "floor", "ceil", "round", "trunc", "fma", "abs", "min", "max", "pow", "atan2"]


def _float_unary(name):
    def function(x):
        if not isinstance(x, lang.Scalar) or not lang.is_float(x.dtype):
            raise CompileError(f"mg.math.{name} takes a traced float value")
        return lang.Scalar(lang.emit(f"math.{name}", [x], [x.value.type]).result, x.dtype)
    function.__name__ = name
    function.__doc__ = f"math.{name} of a traced float."
    return function


exp, exp2, log, log2, log10 = (_float_unary(n) for n in ("exp", "exp2", "log", "log2", "log10"))
sqrt, rsqrt, sin, cos, tan, tanh, erf = (_float_unary(n) for n in ("sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf"))
floor, ceil, round = (_float_unary(n) for n in ("floor", "ceil", "round"))


def trunc(x):
    """x rounded toward zero (floor or ceil by sign: NVVM has no lowering for math.trunc)."""
    if not isinstance(x, lang.Scalar) or not lang.is_float(x.dtype):
        raise CompileError("mg.math.trunc takes a traced float value")
    return lang.select(x < 0, ceil(x), floor(x))


def _float_binary(a, b, what):
    a, b = lang.unify(a, b, what)
    if not lang.is_float(a.dtype):
        raise CompileError(f"{what} takes float values, not {a.dtype.name}")
    return a, b


def pow(x, y):
    """x ** y (math.powf)."""
    x, y = _float_binary(x, y, "mg.math.pow")
    return lang.Scalar(lang.emit("math.powf", [x, y], [x.value.type]).result, x.dtype)


def atan2(y, x):
    y, x = _float_binary(y, x, "mg.math.atan2")
    return lang.Scalar(lang.emit("math.atan2", [y, x], [x.value.type]).result, x.dtype)


def fma(a, b, c):
    """a * b + c, rounded once (math.fma)."""
    a, b = _float_binary(a, b, "mg.math.fma")
    c = lang.coerce(c, a.dtype, "mg.math.fma's addend")
    return lang.Scalar(lang.emit("math.fma", [a, b, c], [a.value.type]).result, a.dtype)


def abs(x):
    if not isinstance(x, lang.Scalar):
        raise CompileError("mg.math.abs takes a traced value")
    if lang.is_float(x.dtype):
        return lang.Scalar(lang.emit("math.absf", [x], [x.value.type]).result, x.dtype)
    if x.dtype in lang.UNSIGNED or x.dtype == lang.index:
        return x
    return lang.Scalar(lang.emit("math.absi", [x], [x.value.type]).result, x.dtype)


def _minmax(a, b, which):
    a, b = lang.unify(a, b, f"mg.math.{which}")
    if lang.is_float(a.dtype):
        name = "minnumf" if which == "min" else "maxnumf"
    elif a.dtype in lang.UNSIGNED or a.dtype in (lang.index, lang.bool_):
        name = "minui" if which == "min" else "maxui"
    else:
        name = "minsi" if which == "min" else "maxsi"
    return lang.Scalar(lang.emit(f"arith.{name}", [a, b], [a.value.type]).result, a.dtype)


def min(a, b):
    """The smaller of two values (floats: the non-NaN one)."""
    return _minmax(a, b, "min")


def max(a, b):
    """The larger of two values (floats: the non-NaN one)."""
    return _minmax(a, b, "max")
