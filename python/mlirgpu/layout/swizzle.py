"""Swizzles: bit permutations of indices that spread a tile over shared-memory banks.

`Swizzle(bits, base, shift)` XORs the `bits` bits that start at bit
`base + shift` of an index into the `bits` bits that start at bit `base`
(a negative shift goes the other way). Composed with a layout it gives the
swizzled shared-memory layouts that tensor-core code reads without bank
conflicts; the hardware's 128-byte swizzle is `Swizzle(3, 4, 3)` on byte
offsets (`Swizzle(3, 3, 3)` on indices of 2-byte elements).

>>> sw = Swizzle(3, 4, 3)
>>> [sw(i) for i in (0, 16, 128, 144, 1024)]
[0, 16, 144, 128, 1024]
"""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from .core import Layout, _as_layout
from .inttuple import IntTuple, IntTupleLike, is_int

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# An int, or a traced integer of the kernel language (which has &, >>, << and ^ too).
_Traced = TypeVar("_Traced")

__all__ = ["Swizzle", "ComposedLayout"]


class Swizzle:
    """The index function i -> i ^ ((i & yyy) >> shift), where yyy selects
    `bits` bits starting at bit `base + shift`.

    >>> print(Swizzle(3, 4, 3))
    Sw<3,4,3>
    >>> Swizzle(2, 0, 2)(0b1100)   # bits 2-3 (11) land on bits 0-1
    15

    `bits`, `base` >= 0 and |shift| >= bits (so the bits read and the bits
    changed do not overlap and the swizzle is its own inverse). The three
    are kept as the attributes `bits`, `base` and `shift`.
    """

    __slots__ = ("bits", "base", "shift")

    def __init__(self, bits: int, base: int, shift: int) -> None:
        for name, v in (("bits", bits), ("base", base), ("shift", shift)):
            if not is_int(v):
                raise TypeError(f"Swizzle's {name} must be an integer, not {type(v).__name__}")
        if bits < 0 or base < 0:
            raise ValueError(f"Swizzle({bits}, {base}, {shift}): bits and base must be non-negative")
        if abs(shift) < bits:
            raise ValueError(
                f"Swizzle({bits}, {base}, {shift}): |shift| must be at least bits, "
                "or the bits it reads would overlap the bits it changes"
            )
        self.bits = bits
        self.base = base
        self.shift = shift

    @property
    def source_mask(self) -> int:
        """The bits read: `Swizzle(3, 4, 3).source_mask` is 0b1110000000 (bits 7-9)."""
        return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

    @property
    def target_mask(self) -> int:
        """The bits changed: `Swizzle(3, 4, 3).target_mask` is 0b1110000 (bits 4-6)."""
        return ((1 << self.bits) - 1) << (self.base - min(0, self.shift))

    def __call__(self, index: int) -> int:
        if not is_int(index):
            raise TypeError(f"a swizzle maps an integer index, not {type(index).__name__}")
        return self.apply(index)

    def apply(self, index: _Traced) -> _Traced:
        """The swizzle of `index` without checking that it is an int: it is
        only combined with &, shifts and ^, so a traced integer of the kernel
        language (mg.mma.layout_index) goes through this same function."""
        moved = index & self.source_mask
        moved = moved >> self.shift if self.shift >= 0 else moved << -self.shift
        return index ^ moved

    def __eq__(self, other):
        if not isinstance(other, Swizzle):
            return NotImplemented
        return (self.bits, self.base, self.shift) == (other.bits, other.base, other.shift)

    def __hash__(self):
        return hash((Swizzle, self.bits, self.base, self.shift))

    def __str__(self):
        return f"Sw<{self.bits},{self.base},{self.shift}>"

    def __repr__(self):
        return f"Swizzle({self.bits}, {self.base}, {self.shift})"


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
        from . import pictures

        return pictures.show(self, figure=figure)

    def _repr_png_(self):
        from . import pictures

        return pictures.png(self)
