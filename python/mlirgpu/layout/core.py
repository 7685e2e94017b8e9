"""Layouts and their algebra.

A layout is a pair of integer tuples, a shape and a stride, and the function
they define: a coordinate in the shape maps to the inner product of the
coordinate with the stride. Everything else here (coalesce, composition,
complement, inverses, divides and products) is arithmetic on those pairs that
answers a question about the function.

>>> L = Layout((4, 8), (8, 1))
>>> print(L, L(3, 5), L.size, L.cosize)
(4,8):(8,1) 29 32 32
"""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias, Union

from . import inttuple, pictures
from .inttuple import IntTuple, IntTupleLike, _check_depth, _fmt, as_int_tuple, congruent, is_int, is_tuple, prefix_product, product
from .swizzle import Swizzle

__all__ = [
    "Layout",
    "make_layout",
    "column_major",
    "row_major",
    "make_ordered_layout",
    "flatten",
    "append",
    "prepend",
    "coalesce",
    "composition",
    "complement",
    "right_inverse",
    "left_inverse",
    "logical_divide",
    "zipped_divide",
    "tiled_divide",
    "flat_divide",
    "logical_product",
    "blocked_product",
    "raked_product",
    "ComposedLayout",
]

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: A coordinate of a layout: integers, nested tuples of them, and None where a mode is left free (a slice).
Coordinate: TypeAlias = Union[int, None, tuple["Coordinate", ...], list["Coordinate"]]
#: A composition's or a divide's right-hand side: a layout, n (meaning n:1), or one of those per mode.
Tiler: TypeAlias = Union["Layout", int, tuple[Union["Tiler", None], ...]]


class Layout:
    """A function from coordinates to indices, given by a shape and a stride.

    `shape` is an integer or a nested tuple of positive integers (each tuple a
    mode, nested tuples hierarchical modes); `stride` is congruent with it and
    non-negative. Without `stride` the layout is column-major: the first
    mode runs fastest, as CuTe's default.

    >>> Layout((4, 8))
    Layout((4, 8), (1, 4))
    >>> L = Layout(((2, 2), 4), ((1, 4), 2))
    >>> print(L, L.rank, L.depth, L.size, L.cosize)
    ((2,2),4):((1,4),2) 2 2 16 12

    Calling a layout maps a coordinate to an index. The coordinate may be a
    linear index (column-major over the whole shape), a natural coordinate
    congruent with the shape, several integers (one per mode), or a mix
    (an integer for a whole hierarchical mode):

    >>> L(9), L(1, 2), L((1, 0), 2), L(((1, 0), 2))
    (5, 5, 5, 5)

    A coordinate with `None` in place of some modes slices: the result is the
    layout of the modes left free (the offset of the fixed ones is
    `L(coordinate with None replaced by 0)`).

    >>> print(Layout((4, 8), (8, 1))(None, 3))
    4:8
    """

    __slots__ = ("_shape", "_stride")

    def __init__(self, shape: IntTupleLike, stride: IntTupleLike | None = None) -> None:
        shape = as_int_tuple(shape, "shape")
        for s in inttuple.flatten(shape):
            if s < 1:
                raise ValueError(f"shape {_fmt(shape)}: every extent must be positive")
        if stride is None:
            stride = prefix_product(shape)
        else:
            stride = as_int_tuple(stride, "stride")
            if not congruent(shape, stride):
                raise ValueError(
                    f"stride {_fmt(stride)} does not have the structure of shape {_fmt(shape)}"
                )
            for d in inttuple.flatten(stride):
                if d < 0:
                    raise ValueError(f"stride {_fmt(stride)}: strides must be non-negative")
        self._shape = shape
        self._stride = stride

    # -- what it is ---------------------------------------------------------

    @property
    def shape(self) -> IntTuple:
        """The shape, an integer or a nested tuple: `Layout((4, 8), (8, 1)).shape` is (4, 8)."""
        return self._shape

    @property
    def stride(self) -> IntTuple:
        """The stride, congruent with the shape: `Layout((4, 8), (8, 1)).stride` is (8, 1)."""
        return self._stride

    @property
    def size(self) -> int:
        """How many coordinates: `Layout((4, 8)).size` is 32."""
        return product(self._shape)

    @property
    def cosize(self) -> int:
        """One past the largest index: `Layout((4, 8), (8, 1)).cosize` is 32,
        `Layout(4, 2).cosize` is 7."""
        return 1 + sum(
            (s - 1) * d for s, d in zip(inttuple.flatten(self._shape), inttuple.flatten(self._stride))
        )

    @property
    def rank(self) -> int:
        """How many top-level modes: `Layout(((2, 2), 4)).rank` is 2, `Layout(8).rank` is 1."""
        return inttuple.rank(self._shape)

    @property
    def depth(self) -> int:
        """How deeply the shape nests: `Layout(8).depth` is 0, `Layout((4, 8)).depth` 1,
        `Layout(((2, 2), 4)).depth` 2."""
        return inttuple.depth(self._shape)

    # -- modes --------------------------------------------------------------

    def __len__(self):
        return self.rank

    def __iter__(self):
        return (self[i] for i in range(self.rank))

    def __getitem__(self, i: int | slice) -> Layout:
        """Mode `i` as a layout, or a range of modes (`L[1:]`) as one layout.

        >>> L = Layout(((2, 2), 4), ((1, 4), 2))
        >>> print(L[0], L[1], L[-1:])
        (2,2):(1,4) 4:2 (4):(2)
        """
        if not is_tuple(self._shape):
            modes = ((self._shape, self._stride),)
        else:
            modes = tuple(zip(self._shape, self._stride))
        if isinstance(i, slice):
            picked = modes[i]
            return Layout(tuple(m[0] for m in picked), tuple(m[1] for m in picked))
        s, d = modes[i]
        return Layout(s, d)

    # -- as a function ------------------------------------------------------

    def __call__(self, *coord: Coordinate) -> int | Layout:
        if not coord:
            raise TypeError("a layout is called with a coordinate: L(i), L(i, j) or L((i, j))")
        coord = _check_depth(coord[0] if len(coord) == 1 else coord, "coordinate")
        if _has_none(coord):
            return _slice(self, coord)
        coord = as_int_tuple(coord, "coordinate")
        return inttuple.crd2idx(coord, self._shape, self._stride)

    def crd2idx(self, coord: IntTupleLike) -> int:
        """The index of `coord`: the same as calling the layout.
        `Layout((4, 8), (8, 1)).crd2idx((3, 5))` is 29."""
        return inttuple.crd2idx(as_int_tuple(coord, "coordinate"), self._shape, self._stride)

    def idx2crd(self, index: int) -> IntTuple:
        """The natural coordinate of the `index`-th element in column-major
        order: `Layout((4, 8), (8, 1)).idx2crd(7)` is (3, 1)."""
        return inttuple.idx2crd(index, self._shape)

    def indices(self) -> list[int]:
        """All indices, in column-major order of coordinates.

        >>> Layout((2, 3), (3, 1)).indices()
        [0, 3, 1, 4, 2, 5]
        """
        return [self(i) for i in range(self.size)]

    # -- value semantics ----------------------------------------------------

    def __eq__(self, other):
        if not isinstance(other, Layout):
            return NotImplemented
        return self._shape == other._shape and self._stride == other._stride

    def __hash__(self):
        return hash((Layout, self._shape, self._stride))

    def __str__(self):
        return f"{_fmt(self._shape)}:{_fmt(self._stride)}"

    def __repr__(self):
        return f"Layout({self._shape!r}, {self._stride!r})"

    # -- pictures (in .show) -------------------------------------------------

    def show(self, figure: bool = False) -> Figure | None:
        """Draw the layout: a grid of indices printed as text, or with
        `figure=True` a matplotlib Figure (returned). Rank-2 layouts draw as
        a grid of rows (mode 0) by columns (mode 1); rank-1 layouts as one row.

        >>> Layout((2, 3), (3, 1)).show()
        (2,3):(3,1)
              0  1  2
           +---------
         0 |  0  1  2
         1 |  3  4  5
        """
        return pictures.show(self, figure=figure)

    def _repr_png_(self):
        return pictures.png(self)


def _has_none(coord):
    if coord is None:
        return True
    if isinstance(coord, (tuple, list)):
        return any(_has_none(c) for c in coord)
    return False


def _kept(coord, t):
    """The parts of `t` that `coord` leaves free (`None`), in order."""
    if coord is None:
        return (t,)
    if is_tuple(coord):
        if not is_tuple(t) or len(coord) != len(t):
            raise ValueError(f"slice {coord!r} does not match shape {_fmt(t)}")
        return tuple(x for c, e in zip(coord, t) for x in _kept(c, e))
    return ()


def _zero_none(coord):
    if coord is None:
        return 0
    if isinstance(coord, (tuple, list)):
        return tuple(_zero_none(c) for c in coord)
    return coord


def _tuples(coord):
    if isinstance(coord, (tuple, list)):
        return tuple(_tuples(c) for c in coord)
    return coord


def _slice(layout, coord):
    coord = _tuples(coord)
    if is_tuple(coord) and not is_tuple(layout.shape):
        raise ValueError(f"slice {coord!r} does not match shape {_fmt(layout.shape)}")
    as_int_tuple(_zero_none(coord), "coordinate")
    shapes = _kept(coord, layout.shape)
    strides = _kept(coord, layout.stride)
    if len(shapes) == 1:
        return Layout(shapes[0], strides[0])
    return Layout(shapes, strides)


def _as_layout(x, what="argument"):
    if isinstance(x, Layout):
        return x
    if is_int(x):
        return Layout(x, 1)
    raise TypeError(f"{what} must be a Layout or an integer (n meaning n:1), not {type(x).__name__}")


def _unflatten(flat, structure):
    """`flat` (a sequence) regrouped like the integer tuple `structure`."""
    it = iter(flat)

    def build(t):
        return tuple(build(e) for e in t) if is_tuple(t) else next(it)

    return build(structure)


# -- building layouts ---------------------------------------------------------


def make_layout(*modes: Layout | int) -> Layout:
    """The layout whose i-th mode is the i-th argument (concatenation).

    >>> print(make_layout(Layout(4, 1), Layout((2, 3), (4, 8))))
    (4,(2,3)):(1,(4,8))
    """
    modes = [_as_layout(m, "make_layout's argument") for m in modes]
    return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))


def column_major(shape: IntTupleLike) -> Layout:
    """The compact layout of `shape` whose first mode runs fastest (Fortran
    order, CuTe's default; the same as `Layout(shape)`).

    >>> print(column_major((4, 8)))
    (4,8):(1,4)
    """
    return Layout(shape)


def row_major(shape: IntTupleLike) -> Layout:
    """The compact layout of `shape` whose last mode runs fastest (C order,
    NumPy's default); nested modes too run last-fastest.

    >>> print(row_major((4, 8)), row_major(((2, 3), 4)))
    (4,8):(8,1) ((2,3),4):((12,4),1)
    """
    shape = as_int_tuple(shape, "shape")
    leaves = inttuple.flatten(shape)
    strides = [0] * len(leaves)
    running = 1
    for k in reversed(range(len(leaves))):
        strides[k] = running
        running *= leaves[k]
    return Layout(shape, _unflatten(strides, shape))


def make_ordered_layout(shape: IntTupleLike, order: IntTupleLike) -> Layout:
    """The compact layout of `shape` whose modes run in the given `order`:
    the mode with the smallest order is fastest (stride 1), then the next.
    `order` has one integer per integer of `shape` (flat or nested like it).

    >>> print(make_ordered_layout((4, 8, 2), (1, 0, 2)))
    (4,8,2):(8,1,32)
    """
    shape = as_int_tuple(shape, "shape")
    leaves = inttuple.flatten(shape)
    ranks = inttuple.flatten(as_int_tuple(order, "order"))
    if len(ranks) != len(leaves):
        raise ValueError(f"order {order!r} needs one entry per mode of shape {_fmt(shape)}")
    strides = [0] * len(leaves)
    running = 1
    for k in sorted(range(len(leaves)), key=lambda k: (ranks[k], k)):
        strides[k] = running
        running *= leaves[k]
    return Layout(shape, _unflatten(strides, shape))


def flatten(x: Layout | IntTuple) -> Layout | tuple[int, ...]:
    """A layout with its modes flattened to depth 1 (same function), or the
    integers of an integer tuple as one flat tuple.

    >>> print(flatten(Layout(((2, 2), 4), ((1, 4), 2))))
    (2,2,4):(1,4,2)
    >>> flatten((2, (3, 4)))
    (2, 3, 4)
    """
    if isinstance(x, Layout):
        return Layout(inttuple.flatten(x.shape), inttuple.flatten(x.stride))
    return inttuple.flatten(x)


def append(layout: Layout, mode: Layout | int | None = None) -> Layout:
    """`layout` with one more mode at the end (`1:0`, a trivial mode, by default).

    >>> print(append(Layout(4, 1), Layout(3, 4)))
    (4,3):(1,4)
    """
    mode = Layout(1, 0) if mode is None else _as_layout(mode, "mode")
    return make_layout(*layout, mode)


def prepend(layout: Layout, mode: Layout | int | None = None) -> Layout:
    """`layout` with one more mode at the front (`1:0` by default).

    >>> print(prepend(Layout(4, 1), Layout(3, 4)))
    (3,4):(4,1)
    """
    mode = Layout(1, 0) if mode is None else _as_layout(mode, "mode")
    return make_layout(mode, *layout)


def _pad(layout, rank):
    """`layout` as a tuple-shaped layout of `rank` modes, trivial modes added."""
    modes = list(layout)
    modes += [Layout(1, 0)] * (rank - len(modes))
    return make_layout(*modes)


# -- the algebra ---------------------------------------------------------------


def coalesce(layout: Layout | int, profile: IntTuple | None = None) -> Layout:
    """The simplest layout with the same function and size: modes of extent
    1 dropped, neighbours that run on as one (s0:d0, s1:s0*d0) merged.

    >>> print(coalesce(Layout((2, (1, 6)), (1, (6, 2)))))
    12:1

    With a tuple `profile`, coalesce mode by mode (mode i alone with profile
    entry i; modes past the profile are kept), so the rank is kept:

    >>> print(coalesce(Layout((2, (1, 6)), (1, (6, 2))), (1, 1)))
    (2,6):(1,2)
    """
    layout = _as_layout(layout, "coalesce's layout")
    if is_tuple(_check_depth(profile, "coalesce's profile")):
        if len(profile) > layout.rank:
            raise ValueError(f"profile {profile!r} has more modes than {layout}")
        modes = [coalesce(layout[i], p) for i, p in enumerate(profile)]
        modes += list(layout)[len(profile):]
        return make_layout(*modes)
    shapes, strides = [], []
    for s, d in zip(inttuple.flatten(layout.shape), inttuple.flatten(layout.stride)):
        if s == 1:
            continue
        if shapes and shapes[-1] * strides[-1] == d:
            shapes[-1] *= s
            continue
        shapes.append(s)
        strides.append(d)
    if not shapes:
        return Layout(1, 0)
    if len(shapes) == 1:
        return Layout(shapes[0], strides[0])
    return Layout(tuple(shapes), tuple(strides))


def composition(a: Layout | int | Swizzle | ComposedLayout, b: Tiler | None) -> Layout | ComposedLayout:
    """The layout R = a o b with R(c) = a(b(c)) for every coordinate c of b
    whose index b(c) lies in a's domain [0, a.size) (R has b's shape).

    >>> print(composition(Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1))))
    ((2,2),3):((24,2),8)

    `b` may be an integer n (meaning n:1) or a tuple, a "tiler", of layouts,
    integers, tuples or None, applied mode by mode (None keeps a's mode):

    >>> print(composition(Layout((12, (4, 8)), (59, (13, 1))), (Layout(3, 4), Layout(8, 2))))
    (3,(2,4)):(236,(26,1))

    `a` may be a `Swizzle` or a swizzled layout: the result is then a
    `ComposedLayout` that applies the swizzle last.

    Raises ValueError when a o b is not a layout: b's strides or extents do
    not divide a's modes, or b's modes together reach past the end of one of
    a's modes (their offsets would carry into the next mode, where a is not
    linear).
    """
    if isinstance(a, Swizzle):
        return ComposedLayout(a, 0, _as_layout(b, "composition's second argument"))
    if isinstance(a, ComposedLayout):
        return ComposedLayout(a.outer, a.offset, composition(a.inner, b))
    a = _as_layout(a, "composition's first argument")
    if b is None:
        return a
    if is_tuple(b):
        return _by_mode(composition, a, b, "composition")
    b = _as_layout(b, "composition's second argument")
    flat = coalesce(a)
    shapes = inttuple.flatten(flat.shape)
    strides = inttuple.flatten(flat.stride)
    # a o (b0, b1, ...) = (a o b0, a o b1, ...) only while a is additive over
    # the sums of b's modes: the largest digit each mode of b puts in each of
    # a's modes (all but the last, which runs on without bound) must add up
    # below that mode's extent, or the sum carries into the next mode.
    digits = [0] * len(shapes)
    parts = [
        _compose_mode(a, b, shapes, strides, s, d, digits)
        for s, d in zip(inttuple.flatten(b.shape), inttuple.flatten(b.stride))
    ]
    for k in range(len(shapes) - 1):
        if digits[k] >= shapes[k]:
            raise ValueError(
                f"composition {a} o {b}: the modes of {b} together reach past mode "
                f"{shapes[k]}:{strides[k]} of {a}, so the result is not a layout"
            )
    if not is_tuple(b.shape):
        return parts[0]
    return Layout(_unflatten([p.shape for p in parts], b.shape), _unflatten([p.stride for p in parts], b.shape))


def _by_mode(op, a, tiler, name):
    if len(_check_depth(tiler, f"{name}'s tiler")) > a.rank:
        raise ValueError(f"{name}: tiler of {len(tiler)} modes for {a} of rank {a.rank}")
    modes = [op(a[i], t) for i, t in enumerate(tiler)]
    modes += list(a)[len(tiler):]
    return make_layout(*modes)


def _compose_mode(a, b, shapes, strides, rest_shape, rest_stride, digits):
    """a o (rest_shape:rest_stride), one integral mode of b, where a coalesces
    to shapes:strides; adds to digits[k] the largest digit it puts in a's mode k."""
    if rest_stride == 0 or rest_shape == 1:
        return Layout(rest_shape, 0)
    out_shape, out_stride = [], []
    requested = f"{a} o {b}"
    # Walk a's modes from the fastest: the first rest_stride elements are
    # skipped, then rest_shape elements are taken, mode by mode; a's last
    # mode runs on without bound.
    for k, (s, d) in enumerate(zip(shapes[:-1], strides[:-1])):
        if rest_shape == 1:
            break
        if s % rest_stride != 0 and rest_stride % s != 0:
            raise ValueError(f"composition {requested}: stride {rest_stride} does not divide mode {s}:{d} of {a}")
        next_shape = -(-s // rest_stride)
        next_stride = -(-rest_stride // s)
        if next_shape == 1:
            rest_stride = next_stride
            continue
        taken = min(next_shape, rest_shape)
        if rest_shape % taken != 0:
            raise ValueError(f"composition {requested}: {rest_shape} elements do not split at mode {s}:{d} of {a}")
        out_shape.append(taken)
        out_stride.append(rest_stride * d)
        digits[k] += (taken - 1) * rest_stride
        rest_shape //= taken
        rest_stride = next_stride
    if rest_shape != 1:
        out_shape.append(rest_shape)
        out_stride.append(rest_stride * strides[-1])
    if len(out_shape) == 1:
        return Layout(out_shape[0], out_stride[0])
    return Layout(tuple(out_shape), tuple(out_stride))


def complement(layout: Layout | int, cotarget: IntTuple | None = None) -> Layout:
    """The layout of the indices `layout` leaves out: a layout C, ordered by
    increasing stride, such that `make_layout(layout, C)` is one-to-one and
    covers [0, cotarget) (cotarget defaults to layout's cosize; a shape means
    its size).

    >>> print(complement(Layout(4, 2), 24))
    (2,3):(1,8)
    >>> print(complement(Layout((2, 2), (1, 6)), 24))
    (3,2):(2,12)

    Raises ValueError when `layout` is not one-to-one or its strides do not
    nest (each stride a multiple of the previous mode's extent).
    """
    layout = _as_layout(layout, "complement's layout")
    if cotarget is None:
        cotarget = layout.cosize
    cotarget = product(as_int_tuple(cotarget, "cotarget"))
    if cotarget < 1:
        raise ValueError(f"complement: cotarget must be positive, not {cotarget}")
    modes = sorted(
        (d, s)
        for s, d in zip(inttuple.flatten(layout.shape), inttuple.flatten(layout.stride))
        if s != 1 and d != 0
    )
    out_shape, out_stride = [], []
    covered = 1
    for d, s in modes:
        if d % covered != 0:
            raise ValueError(
                f"complement of {layout}: mode {s}:{d} overlaps the modes before it "
                f"(stride {d} is not a multiple of {covered})"
            )
        out_shape.append(d // covered)
        out_stride.append(covered)
        covered = s * d
    out_shape.append(-(-cotarget // covered))
    out_stride.append(covered)
    return coalesce(Layout(tuple(out_shape), tuple(out_stride)))


def right_inverse(layout: Layout | int) -> Layout:
    """A layout R with `layout(R(i)) == i` for every i < R.size, as large as
    such a compact inverse can be.

    >>> print(right_inverse(Layout((4, 8), (8, 1))))
    (8,4):(4,1)
    >>> print(right_inverse(Layout(4, 2)))   # no index but 0 is reached by stride 1
    1:0
    """
    flat = coalesce(_as_layout(layout, "right_inverse's layout"))
    shapes = inttuple.flatten(flat.shape)
    strides = inttuple.flatten(flat.stride)
    positions = prefix_product(shapes)
    out_shape, out_stride = [], []
    reached = 1
    while True:
        k = next((k for k, (s, d) in enumerate(zip(shapes, strides)) if d == reached and s != 1), None)
        if k is None:
            break
        out_shape.append(shapes[k])
        out_stride.append(positions[k])
        reached = shapes[k] * strides[k]
    if not out_shape:
        return Layout(1, 0)
    return coalesce(Layout(tuple(out_shape), tuple(out_stride)))


def left_inverse(layout: Layout | int) -> Layout:
    """A layout L with `L(layout(i)) == i` for every i < layout.size, for a
    one-to-one `layout`.

    >>> print(left_inverse(Layout((4, 8), (8, 1))))
    (8,4):(4,1)
    >>> print(left_inverse(Layout(4, 2)))
    (2,4):(4,1)

    Raises ValueError when `layout` is not one-to-one.
    """
    layout = _as_layout(layout, "left_inverse's layout")
    return right_inverse(make_layout(layout, complement(layout)))


def logical_divide(layout: Layout | ComposedLayout, tiler: Tiler) -> Layout | ComposedLayout:
    """Split `layout` into tiles: mode 0 of the result is the first tile (the
    elements `tiler` picks), mode 1 runs over the tiles.

    >>> print(logical_divide(Layout((4, 2, 3), (2, 1, 8)), Layout(4, 2)))
    ((2,2),(2,3)):((4,1),(2,8))

    With a tuple tiler the division is mode by mode (each mode i becomes
    (tile, rest)), as for dividing a matrix into 2-D tiles. A swizzled
    layout divides its inner layout and keeps the swizzle outermost.

    >>> print(logical_divide(Layout((9, (4, 8)), (59, (13, 1))), (Layout(3, 3), Layout((2, 4), (1, 8)))))
    ((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))
    """
    layout = _divisible(layout, "logical_divide")
    if not isinstance(layout, Layout):
        return _swizzled(layout, logical_divide(layout.inner, tiler))
    if is_tuple(tiler):
        return _by_mode(logical_divide, layout, tiler, "logical_divide")
    tiler = _as_layout(tiler, "tiler")
    return composition(layout, make_layout(tiler, complement(tiler, layout.size)))


def _divisible(layout, name):
    """A layout, or a swizzled layout: dividing S o L is S o (L divided)."""
    if isinstance(layout, ComposedLayout):
        return layout
    return _as_layout(layout, f"{name}'s layout")


def _swizzled(composed, inner):
    return ComposedLayout(composed.outer, composed.offset, inner)


def _zip_tiles(divided, tiler):
    """((tile modes), (rest modes)) from a mode-by-mode divide."""
    if not is_tuple(tiler):
        return divided
    r = len(tiler)
    modes = list(divided)
    tiles = [modes[i][0] for i in range(r)]
    rests = [modes[i][1] for i in range(r)] + modes[r:]
    return make_layout(make_layout(*tiles), make_layout(*rests))


def zipped_divide(layout: Layout | ComposedLayout, tiler: Tiler) -> Layout | ComposedLayout:
    """`logical_divide` with the tile modes gathered into mode 0 and the rest
    into mode 1: ((tile), (rest)), so `result(None, k)` is the k-th tile.

    >>> print(zipped_divide(Layout((9, (4, 8)), (59, (13, 1))), (Layout(3, 3), Layout((2, 4), (1, 8)))))
    ((3,(2,4)),(3,(2,2))):((177,(13,2)),(59,(26,1)))
    """
    if is_tuple(tiler) and not all(is_int(t) or isinstance(t, Layout) for t in tiler):
        raise TypeError("zipped, tiled and flat divides take a tiler of layouts or integers, one per mode")
    layout = _divisible(layout, "zipped_divide")
    if not isinstance(layout, Layout):
        return _swizzled(layout, zipped_divide(layout.inner, tiler))
    return _zip_tiles(logical_divide(layout, tiler), tiler)


def tiled_divide(layout: Layout | ComposedLayout, tiler: Tiler) -> Layout | ComposedLayout:
    """`zipped_divide` with the rest modes unpacked: ((tile), rest0, rest1, ...).

    >>> print(tiled_divide(Layout((9, (4, 8)), (59, (13, 1))), (Layout(3, 3), Layout((2, 4), (1, 8)))))
    ((3,(2,4)),3,(2,2)):((177,(13,2)),59,(26,1))
    """
    layout = _divisible(layout, "tiled_divide")
    if not isinstance(layout, Layout):
        return _swizzled(layout, tiled_divide(layout.inner, tiler))
    z = zipped_divide(layout, tiler)
    return make_layout(z[0], *z[1])


def flat_divide(layout: Layout | ComposedLayout, tiler: Tiler) -> Layout | ComposedLayout:
    """`zipped_divide` with both parts unpacked: (tile0, tile1, ..., rest0, rest1, ...).

    >>> print(flat_divide(Layout((9, (4, 8)), (59, (13, 1))), (Layout(3, 3), Layout((2, 4), (1, 8)))))
    (3,(2,4),3,(2,2)):(177,(13,2),59,(26,1))
    """
    layout = _divisible(layout, "flat_divide")
    if not isinstance(layout, Layout):
        return _swizzled(layout, flat_divide(layout.inner, tiler))
    z = zipped_divide(layout, tiler)
    return make_layout(*z[0], *z[1])


def logical_product(block: Layout | int, tiler: Tiler) -> Layout:
    """Repeat `block` as `tiler` says: mode 0 of the result is the block,
    mode 1 the layout of the copies (`tiler` composed with the block's
    complement, so copies never overlap).

    >>> print(logical_product(Layout((2, 2), (4, 1)), Layout(6, 1)))
    ((2,2),(2,3)):((4,1),(2,8))
    >>> print(logical_product(Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))))
    ((2,5),(3,4)):((5,1),(10,30))

    A tuple tiler multiplies mode by mode.
    """
    block = _as_layout(block, "logical_product's block")
    if is_tuple(tiler):
        return _by_mode(logical_product, block, tiler, "logical_product")
    tiler = _as_layout(tiler, "tiler")
    return make_layout(block, composition(complement(block, block.size * tiler.cosize), tiler))


def _zipped_product(block, tiler):
    block = _as_layout(block, "block")
    tiler = _as_layout(tiler, "tiler")
    r = max(block.rank, tiler.rank)
    product_ = logical_product(_pad(block, r), _pad(tiler, r))
    return list(product_[0]), list(product_[1])


def blocked_product(block: Layout | int, tiler: Layout | int) -> Layout:
    """Repeat `block` as `tiler` says, mode by mode, block fastest: mode i of
    the result is (block mode i, tiler mode i), so the copies sit side by
    side as whole blocks. Each mode comes out coalesced.

    >>> print(blocked_product(Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))))
    (6,(5,4)):(5,(1,30))

    (Before coalescing, mode 0 is (2,3):(5,10): 2 rows of the block, then 3 blocks.)
    """
    blocks, copies = _zipped_product(block, tiler)
    result = make_layout(*(make_layout(b, c) for b, c in zip(blocks, copies)))
    return coalesce(result, (1,) * result.rank)


def raked_product(block: Layout | int, tiler: Layout | int) -> Layout:
    """Like `blocked_product` with the copies fastest: mode i is (tiler mode
    i, block mode i), so the copies interleave element by element. Each mode
    comes out coalesced.

    >>> print(raked_product(Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))))
    ((3,2),(4,5)):((10,5),(30,1))
    """
    blocks, copies = _zipped_product(block, tiler)
    result = make_layout(*(make_layout(c, b) for b, c in zip(blocks, copies)))
    return coalesce(result, (1,) * result.rank)


# -- swizzled layouts: a Swizzle (or a Layout) after a layout -------------------

class ComposedLayout:
    """The function c -> outer(offset + inner(c)): a layout `inner`, shifted
    by `offset`, then passed through `outer` (a Swizzle or a Layout). Its
    shape, size and coordinates are inner's.

    The three parts are the attributes `outer`, `offset` and `inner`.
    `composition(Swizzle(...), layout)` builds one with offset 0:

    >>> from mlirgpu.layout import composition, row_major
    >>> S = composition(Swizzle(3, 0, 3), row_major((8, 8)))
    >>> print(S)
    Sw<3,0,3> o 0 o (8,8):(8,1)
    >>> [S(1, j) for j in range(8)]
    [9, 8, 11, 10, 13, 12, 15, 14]
    """

    __slots__ = ("outer", "offset", "inner")

    def __init__(self, outer: Swizzle | Layout, offset: int, inner: Layout | int) -> None:
        if not isinstance(outer, (Swizzle, Layout)):
            raise TypeError(f"ComposedLayout's outer function must be a Swizzle or a Layout, not {type(outer).__name__}")
        if not is_int(offset):
            raise TypeError(f"ComposedLayout's offset must be an integer, not {type(offset).__name__}")
        self.outer = outer
        self.offset = offset
        self.inner = _as_layout(inner, "ComposedLayout's inner layout")

    @property
    def shape(self) -> IntTuple:
        """The inner layout's shape: `ComposedLayout(Swizzle(1, 0, 1), 0, Layout((2, 4))).shape` is (2, 4)."""
        return self.inner.shape

    @property
    def size(self) -> int:
        """The inner layout's size: 8 for `ComposedLayout(Swizzle(1, 0, 1), 0, Layout((2, 4)))`."""
        return self.inner.size

    @property
    def rank(self) -> int:
        """The inner layout's rank: 2 for `ComposedLayout(Swizzle(1, 0, 1), 0, Layout((2, 4)))`."""
        return self.inner.rank

    def __len__(self):
        return self.inner.rank

    def __iter__(self):
        return (self[i] for i in range(self.inner.rank))

    def __getitem__(self, i: int | slice) -> ComposedLayout:
        """Mode i, still swizzled: ComposedLayout(outer, offset, inner[i])."""
        return ComposedLayout(self.outer, self.offset, self.inner[i])

    def __call__(self, *coord: IntTupleLike) -> int:
        index = self.inner(*coord)
        if isinstance(index, Layout):
            raise TypeError("slicing a swizzled layout is not supported; slice its inner layout")
        return self.outer(self.offset + index)

    def indices(self) -> list[int]:
        """All indices, in column-major order of coordinates.

        >>> ComposedLayout(Swizzle(1, 0, 1), 0, Layout(4, 1)).indices()
        [0, 1, 3, 2]
        """
        return [self(i) for i in range(self.size)]

    def __eq__(self, other):
        if not isinstance(other, ComposedLayout):
            return NotImplemented
        return (self.outer, self.offset, self.inner) == (other.outer, other.offset, other.inner)

    def __hash__(self):
        return hash((ComposedLayout, self.outer, self.offset, self.inner))

    def __str__(self):
        return f"{self.outer} o {self.offset} o {self.inner}"

    def __repr__(self):
        return f"ComposedLayout({self.outer!r}, {self.offset!r}, {self.inner!r})"

    def show(self, figure: bool = False) -> Figure | None:
        """Draw the indices as a grid, like `Layout.show`.

        >>> from mlirgpu.layout import composition, row_major
        >>> composition(Swizzle(1, 0, 1), row_major((2, 2))).show()
        Sw<1,0,1> o 0 o (2,2):(2,1)
              0  1
           +------
         0 |  0  1
         1 |  3  2
        """
        return pictures.show(self, figure=figure)

    def _repr_png_(self):
        return pictures.png(self)
