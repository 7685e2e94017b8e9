"""Integer tuples: an integer, or a tuple of integer tuples.

Shapes, strides and coordinates of a layout are integer tuples. These are
the few functions on them that the layout algebra is written with; they are
public because coordinates are integer tuples too. Each refuses an integer
tuple nested more than MAX_DEPTH (256) levels deep with ValueError.

>>> product((2, (3, 4)))
24
>>> flatten(((2, 3), (4, (5, 6))))
(2, 3, 4, 5, 6)
"""
import operator
from collections.abc import Sequence
from typing import SupportsIndex, TypeAlias, TypeVar, Union

__all__ = [
    "is_int",
    "is_tuple",
    "as_int_tuple",
    "product",
    "flatten",
    "rank",
    "depth",
    "congruent",
    "prefix_product",
    "shape_div",
    "idx2crd",
    "crd2idx",
    "IntTuple",
    "IntTupleLike",
    "MAX_DEPTH",
]

#: An integer, or a tuple of integer tuples: a shape, a stride or a coordinate.
IntTuple: TypeAlias = Union[int, tuple["IntTuple", ...]]
#: What as_int_tuple accepts: integer-like objects, and lists or tuples of them.
IntTupleLike: TypeAlias = Union[SupportsIndex, Sequence["IntTupleLike"]]
# A traced integer of the kernel language, which crd2idx computes with as with an int.
_Traced = TypeVar("_Traced")

#: The deepest an integer tuple (or a coordinate, a tiler, a profile) may nest.
#: The algebra recurses once per level, so every public function refuses a
#: deeper one with ValueError at its entry, as IR nested deeper than 256 is,
#: instead of running into Python's recursion limit somewhere inside.
MAX_DEPTH = 256


def _check_depth(t, what="integer tuple"):
    """`t`, once a walk without recursion has found its tuples and lists
    nest at most MAX_DEPTH deep; ValueError naming `what` otherwise."""
    stack = [(t, 0)]
    while stack:
        x, level = stack.pop()
        if isinstance(x, (tuple, list)):
            if level == MAX_DEPTH:
                raise ValueError(f"{what} nests more than {MAX_DEPTH} levels deep")
            stack.extend((e, level + 1) for e in x)
    return t


def is_int(x: object) -> bool:
    """True for an integer (bool excluded): `is_int(3)` is True, `is_int((3,))` False."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_tuple(x: object) -> bool:
    """True for a tuple: `is_tuple((2, 3))` is True, `is_tuple(2)` False."""
    return isinstance(x, tuple)


def as_int_tuple(x: IntTupleLike, what: str = "value") -> IntTuple:
    """`x` as an integer tuple: lists become tuples, integer-like objects
    (NumPy integers) become ints; anything else raises TypeError.

    >>> as_int_tuple([2, [3, 4]])
    (2, (3, 4))

    A value nested more than MAX_DEPTH deep raises ValueError.
    """
    return _as_int_tuple(_check_depth(x, what), what)


def _as_int_tuple(x, what):
    if isinstance(x, (tuple, list)):
        return tuple(_as_int_tuple(e, what) for e in x)
    if isinstance(x, bool):
        raise TypeError(f"{what} must be an integer or a tuple of them, not bool")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(
            f"{what} must be an integer or a (nested) tuple of integers, not {type(x).__name__}"
        ) from None


def product(t: IntTuple) -> int:
    """The product of all integers in `t`: `product((2, (3, 4)))` is 24."""
    return _product(_check_depth(t))


def _product(t):
    if is_tuple(t):
        result = 1
        for e in t:
            result *= _product(e)
        return result
    return t


def flatten(t: IntTuple) -> tuple[int, ...]:
    """The integers of `t` in order, as one flat tuple: `flatten((2, (3, 4)))` is (2, 3, 4).
    An integer flattens to a 1-tuple."""
    return _flatten(_check_depth(t))


def _flatten(t):
    if is_tuple(t):
        return tuple(x for e in t for x in _flatten(e))
    return (t,)


def rank(t: IntTuple) -> int:
    """The number of top-level modes: `rank((2, (3, 4)))` is 2, `rank(5)` is 1."""
    return len(t) if is_tuple(t) else 1


def depth(t: IntTuple) -> int:
    """The nesting depth: `depth(5)` is 0, `depth((2, 3))` is 1, `depth((2, (3, 4)))` is 2."""
    return _depth(_check_depth(t))


def _depth(t):
    if is_tuple(t):
        return 1 + max((_depth(e) for e in t), default=0)
    return 0


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """True when `a` and `b` have the same tree structure:
    `congruent((2, (3, 4)), (1, (2, 6)))` is True, `congruent((2, 3), 6)` False."""
    return _congruent(_check_depth(a), _check_depth(b))


def _congruent(a, b):
    if is_tuple(a) and is_tuple(b):
        return len(a) == len(b) and all(_congruent(x, y) for x, y in zip(a, b))
    return not is_tuple(a) and not is_tuple(b)


def prefix_product(shape: IntTuple, init: int = 1) -> IntTuple:
    """Column-major (compact, first mode fastest) strides for `shape`,
    congruent with it: `prefix_product((2, (3, 4)))` is (1, (2, 6))."""
    return _prefix_product(_check_depth(shape, "shape"), init)


def _prefix_product(shape, init):
    if is_tuple(shape):
        result = []
        for mode in shape:
            result.append(_prefix_product(mode, init))
            init *= _product(mode)
        return tuple(result)
    return init


def shape_div(a: IntTuple, b: IntTuple) -> IntTuple:
    """Divide shape `a` by `b` from the left, mode by mode: the shape that is
    left of `a` after its first `b` elements (column-major).

    >>> shape_div((4, 6), 8)
    (1, 3)

    Raises ValueError where a mode neither divides nor is divided by what is
    left of `b`, since the result would not be a shape.
    """
    return _shape_div(_check_depth(a, "shape"), _check_depth(b, "shape"))


def _shape_div(a, b):
    if is_tuple(a):
        if is_tuple(b):
            if len(a) != len(b):
                raise ValueError(f"shape_div: {a} and {b} have different ranks")
            return tuple(_shape_div(x, y) for x, y in zip(a, b))
        result = []
        for mode in a:
            result.append(_shape_div(mode, b))
            b = _shape_div(b, _product(mode))
        return tuple(result)
    if is_tuple(b):
        return _shape_div(a, _product(b))
    if a % b != 0 and b % a != 0:
        raise ValueError(f"shape_div: {a} and {b} do not divide one another")
    return (a + b - 1) // b


def idx2crd(index: int, shape: IntTuple) -> IntTuple:
    """The natural coordinate (congruent with `shape`) of a linear index, with
    the first mode running fastest (column-major, as CuTe counts).

    >>> idx2crd(7, (2, (3, 4)))
    (1, (0, 1))

    An index past the end carries on in the last mode, as `crd2idx` does.
    """
    return _idx2crd(index, _check_depth(shape, "shape"))


def _idx2crd(index, shape):
    if is_tuple(shape):
        result = []
        for i, mode in enumerate(shape):
            if i == len(shape) - 1:
                result.append(_idx2crd(index, mode))
            else:
                n = _product(mode)
                result.append(_idx2crd(index % n, mode))
                index //= n
        return tuple(result)
    return index


def crd2idx(coord: IntTuple | _Traced, shape: IntTuple, stride: IntTuple | None = None) -> int | _Traced:
    """The index of a coordinate: the inner product of the natural coordinate
    with `stride` (column-major strides of `shape` when omitted).

    `coord` may be an integer (a linear index into `shape`), a natural
    coordinate congruent with `shape`, or anything in between (an integer
    for a whole sub-mode).

    >>> crd2idx((1, 2), (4, 8), (8, 1))
    10
    >>> crd2idx(5, (2, 4))           # linear index 5 is coordinate (1, 2)
    5
    >>> crd2idx((1, 1), ((2, 2), 4), ((1, 4), 2))
    3

    The coordinate's integers are only combined with +, *, // and %, so a
    traced integer of the kernel language goes through this same function
    (mg.mma.layout_index) and becomes index arithmetic. Terms that are 0
    whatever the coordinate (a stride of 0, a size-1 mode before the last)
    are left out rather than added, so that they emit no operations there.
    """
    _check_depth(coord, "coordinate")
    _check_depth(shape, "shape")
    if stride is None:
        stride = _prefix_product(shape, 1)
    return _crd2idx(coord, shape, _check_depth(stride, "stride"))


def _crd2idx(coord, shape, stride):
    if is_tuple(coord):
        if not is_tuple(shape) or len(coord) != len(shape):
            raise ValueError(f"coordinate {_fmt(coord)} does not match shape {_fmt(shape)}")
        result = 0
        for c, s, d in zip(coord, shape, stride):
            result = _plus(result, _crd2idx(c, s, d))
        return result
    if is_tuple(shape):
        result = 0
        for i, (s, d) in enumerate(zip(shape, stride)):
            if i == len(shape) - 1:
                result = _plus(result, _crd2idx(coord, s, d))
            else:
                n = _product(s)
                if n != 1:
                    result = _plus(result, _crd2idx(coord % n, s, d))
                    coord //= n
        return result
    return 0 if stride == 0 else coord * stride


def _plus(a, b):
    """a + b, where an int 0 on either side is left out instead of added."""
    if is_int(b) and b == 0:
        return a
    if is_int(a) and a == 0:
        return b
    return a + b


def _fmt(t):
    """CuTe's spelling of an integer tuple: (2,(3,4))."""
    if is_tuple(t):
        return "(" + ",".join(_fmt(e) for e in t) + ")"
    return str(t)
