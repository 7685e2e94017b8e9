"""CuTe-style layouts: shapes and strides of compile-time integers, and their algebra.

A layout maps coordinates to indices (`Layout((4, 8), (8, 1))(3, 5) == 29`).
The algebra (composition, complement, inverses, divides, products) builds
tiles, thread partitions, swizzled shared-memory tiles and the fragments of
tensor-core instructions from a few such layouts; `mma` and `wgmma` hold the
layouts and descriptor arithmetic of NVIDIA's tensor-core instructions. This
package is pure Python: it needs nothing but the standard library (matplotlib,
where installed, draws the pictures).

>>> from mlirgpu.layout import Layout, composition, logical_divide
>>> L = Layout((4, 8), (8, 1))
>>> print(L, L(3, 5), L.size, L.cosize)
(4,8):(8,1) 29 32 32
"""

from .core import (
    ComposedLayout,
    Layout,
    append,
    blocked_product,
    coalesce,
    column_major,
    complement,
    composition,
    flat_divide,
    flatten,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    make_ordered_layout,
    prepend,
    raked_product,
    right_inverse,
    row_major,
    tiled_divide,
    zipped_divide,
)
from .inttuple import crd2idx, idx2crd, product
from .pictures import grid, show, show_tv, tv_grid
from .swizzle import Swizzle
from . import mma, wgmma

__all__ = [
    "Layout",
    "ComposedLayout",
    "Swizzle",
    "make_layout",
    "column_major",
    "row_major",
    "make_ordered_layout",
    "flatten",
    "append",
    "prepend",
    "product",
    "idx2crd",
    "crd2idx",
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
    "grid",
    "tv_grid",
    "show",
    "show_tv",
    "mma",
    "wgmma",
]
