"""Indexing through a layout with traced coordinates: mg.mma.layout_index
and mg.mma.tile, a 1-d memref (usually shared memory) seen through a layout
of mlirgpu.layout (a Layout, or a swizzled ComposedLayout).

With Python int coordinates the index is the layout's own, computed while
tracing; with traced ones the same functions of mlirgpu.layout (the
layout's crd2idx, the swizzle's bit operations) run on the traced values and
emit index arithmetic.
"""
from __future__ import annotations

from .._mlirgpu import CompileError
from ..layout import ComposedLayout, Layout, Swizzle
from ..layout.inttuple import crd2idx
from . import core as lang

__all__ = ["layout_index", "Tile", "tile"]


def layout_index(layout: Layout | ComposedLayout | Swizzle, *coord: lang.Index) -> lang.Index:
    """`layout` (a Layout, a Swizzle-composed layout, or a Swizzle) applied
    to `coord`, one integer per mode (or one for the whole layout): a Python
    int where every coordinate is, else a traced index."""
    coord = [lang.as_index(c, "a layout coordinate") if isinstance(c, lang.Scalar) else c for c in coord]
    for c in coord:
        if not isinstance(c, lang.Scalar) and (not isinstance(c, int) or isinstance(c, bool)):
            raise CompileError(f"a layout coordinate is an int or a traced integer, not {type(c).__name__}")
    if isinstance(layout, Swizzle):
        if len(coord) != 1:
            raise CompileError("a swizzle maps one index")
        return layout(coord[0]) if isinstance(coord[0], int) else layout.apply(coord[0])
    if isinstance(layout, ComposedLayout):
        inner = layout_index(layout.inner, *coord)
        return layout_index(layout.outer, inner + layout.offset if layout.offset else inner)
    if not isinstance(layout, Layout):
        raise CompileError(f"not a layout: {layout!r}")
    if all(isinstance(c, int) for c in coord):
        try:
            return layout(*coord)
        except (TypeError, ValueError, IndexError) as error:
            raise CompileError(f"cannot index {layout} at {tuple(coord)}: {error}") from error
    if len(coord) == 1:
        return crd2idx(coord[0], layout.shape, layout.stride)
    if len(coord) != layout.rank:
        raise CompileError(f"the layout {layout} has {layout.rank} modes, got {len(coord)} coordinates")
    return crd2idx(tuple(coord), layout.shape, layout.stride)


class Tile:
    """A 1-d memref seen through a layout: `t[coord]` loads and stores
    memref[layout(coord)]; `t.index(*coord)` is the index itself."""

    __slots__ = ("memref", "layout", "offset")

    def __init__(self, memref: lang.MemRef, layout: Layout | ComposedLayout, offset: lang.Index = 0) -> None:
        self.memref, self.layout, self.offset = memref, layout, offset

    def index(self, *coord: lang.Index) -> lang.Index:
        index = layout_index(self.layout, *coord)
        return index if isinstance(self.offset, int) and self.offset == 0 else index + self.offset

    def at(self, offset: lang.Index) -> Tile:
        """The same layout starting `offset` elements further (another stage of a buffer)."""
        return Tile(self.memref, self.layout, self.offset + offset)

    def __getitem__(self, coord: lang.Index | tuple[lang.Index, ...]) -> lang.Scalar:
        coord = coord if isinstance(coord, tuple) else (coord,)
        return self.memref[self.index(*coord)]

    def __setitem__(self, coord: lang.Index | tuple[lang.Index, ...], value: lang.Number) -> None:
        coord = coord if isinstance(coord, tuple) else (coord,)
        self.memref[self.index(*coord)] = value

    def __repr__(self):
        return f"<tile {self.layout} of {self.memref!r}>"


def tile(memref: lang.MemRef, layout: Layout | ComposedLayout) -> Tile:
    """`memref` (1-d, usually shared memory) indexed through `layout`."""
    if not isinstance(memref, lang.MemRef) or len(memref.shape) != 1:
        raise CompileError(f"mg.mma.tile views a 1-d memref, not {memref!r}")
    if not isinstance(layout, (Layout, ComposedLayout)):
        raise CompileError(f"mg.mma.tile takes a Layout or a swizzled ComposedLayout, not {layout!r}")
    cosize = _cosize(layout)
    length = memref.extents[0]  # None for dynamic shared memory, whose length is the launch's
    if length is not None and cosize > length:
        raise CompileError(f"the layout {layout} reaches index {cosize - 1}, past the memref's "
                           f"{length} elements")
    return Tile(memref, layout)


def _cosize(layout):
    if isinstance(layout, ComposedLayout):
        top = layout.offset + _cosize(layout.inner) - 1
        if isinstance(layout.outer, Swizzle):
            # A swizzle changes the bits below its source bits' top: the index stays under that power of two.
            bits = layout.outer.source_mask | layout.outer.target_mask
            return (top | bits) + 1
        return layout.outer.cosize
    return layout.cosize
