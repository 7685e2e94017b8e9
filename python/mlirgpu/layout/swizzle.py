"""Swizzles: bit permutations of indices that spread a tile over shared-memory banks.

`Swizzle(bits, base, shift)` XORs the `bits` bits that start at bit
`base + shift` of an index into the `bits` bits that start at bit `base`
(a negative shift goes the other way). Composed with a layout it gives the
swizzled shared-memory layouts that tensor-core code reads without bank
conflicts; the hardware's 128-byte swizzle is `Swizzle(3, 4, 3)` on byte
offsets (`Swizzle(3, 3, 3)` on indices of 2-byte elements). A swizzled layout
is core.py's ComposedLayout: the layout algebra composes and divides it.

>>> sw = Swizzle(3, 4, 3)
>>> [sw(i) for i in (0, 16, 128, 144, 1024)]
[0, 16, 144, 128, 1024]
"""
from __future__ import annotations

from typing import TypeVar

from .inttuple import is_int

# An int, or a traced integer of the kernel language (which has &, >>, << and ^ too).
_Traced = TypeVar("_Traced")

__all__ = ["Swizzle"]


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
