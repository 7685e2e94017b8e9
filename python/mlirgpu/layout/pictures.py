"""Pictures of layouts: a grid of indices as text, or as a matplotlib figure.

matplotlib is optional: without it the text pictures work as before and
asking for a figure raises ImportError saying what to install.

>>> from mlirgpu.layout import Layout
>>> print(grid(Layout((2, 4), (4, 1))))
(2,4):(4,1)
      0  1  2  3
   +------------
 0 |  0  1  2  3
 1 |  4  5  6  7
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .inttuple import IntTuple, as_int_tuple, product

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class Drawable(Protocol):
    """What is drawn: core.py's Layout or ComposedLayout (this file imports
    neither: core.py imports it for their .show methods)."""

    shape: IntTuple
    size: int
    rank: int

    def __call__(self, *coord) -> int: ...

__all__ = ["grid", "tv_grid", "show", "show_tv", "layout_figure", "tv_figure"]

# Above this many cells a notebook shows the text form instead of drawing a
# figure that would be unreadable and slow to render.
FIGURE_CELL_LIMIT = 4096
# The text picture shows at most this many rows and columns, the first ones
# (a 10^9 x 10^9 layout prints as quickly as a small one); tv_grid, whose
# every (thread, value) pair must be visited, refuses larger tiles.
TEXT_ROWS, TEXT_COLUMNS = 128, 64
TV_CELL_LIMIT = 1 << 16


def _rows_cols(layout):
    """(rows, cols) of the grid a layout draws as: mode 0 by mode 1."""
    if layout.rank == 1:
        return 1, layout.size
    if layout.rank == 2:
        return product(layout.shape[0]), product(layout.shape[1])
    raise ValueError(
        f"{layout} has rank {layout.rank}: only rank-1 and rank-2 layouts are drawn "
        "(group its modes into two first, e.g. with make_layout)"
    )


def _cells(layout, rows=None, cols=None):
    """The grid of indices, its first `rows` x `cols` (default: all):
    cells[r][c] = layout(r, c) (or layout(c) for rank 1)."""
    all_rows, all_cols = _rows_cols(layout)
    rows, cols = min(all_rows, rows or all_rows), min(all_cols, cols or all_cols)
    if layout.rank == 1:
        return [[layout(c) for c in range(cols)]]
    return [[layout(r, c) for c in range(cols)] for r in range(rows)]


def _text(title, cells, rows=None, cols=None):
    """The grid as text; `rows` x `cols` the whole grid's size where `cells` is its first part."""
    more_rows, more_cols = rows is not None and rows > len(cells), cols is not None and cols > len(cells[0])
    if more_rows or more_cols:
        title += f"  (the first {len(cells)} of {rows} rows, {len(cells[0])} of {cols} columns)"
    width = max(2, len(str(len(cells[0]) - 1)), max(len(str(v)) for row in cells for v in row))
    label = max(len(str(len(cells) - 1)), 3 if more_rows else 0)
    body = (width + 1) * (len(cells[0]) + more_cols) - 1
    tail = " ..." if more_cols else ""
    lines = [title, " " * (label + 4) + " ".join(f"{c:>{width}}" for c in range(len(cells[0]))) + tail]
    lines.append(" " * (label + 2) + "+" + "-" * (body + 1))
    for r, row in enumerate(cells):
        lines.append(f" {r:>{label}} | " + " ".join(f"{v:>{width}}" for v in row) + tail)
    if more_rows:
        lines.append(f" {'...':>{label}} |")
    return "\n".join(lines)


def grid(layout: Drawable) -> str:
    """The text picture of a rank-1 or rank-2 layout (or swizzled layout):
    its string form, then a grid whose cell (r, c) holds `layout(r, c)`:
    the first TEXT_ROWS rows and TEXT_COLUMNS columns, "..." marking more.

    >>> from mlirgpu.layout import Layout
    >>> print(grid(Layout(4, 2)))
    4:2
          0  1  2  3
       +------------
     0 |  0  2  4  6
    """
    rows, cols = _rows_cols(layout)
    return _text(str(layout), _cells(layout, TEXT_ROWS, TEXT_COLUMNS), rows, cols)


def _tv_cells(tv_layout, tile_shape):
    """cells[r][c] = (thread, value) of the first pair that lands on (r, c), or None."""
    rows, cols = tile_shape
    if tv_layout.rank != 2:
        raise ValueError(f"a thread-value layout has two modes (thread, value); {tv_layout} has {tv_layout.rank}")
    threads = product(tv_layout.shape[0])
    values = product(tv_layout.shape[1])
    if max(rows * cols, threads * values) > TV_CELL_LIMIT:
        raise ValueError(f"{tv_layout} on a {rows}x{cols} tile is too large to picture (at most "
                         f"{TV_CELL_LIMIT} cells and (thread, value) pairs)")
    cells = [[None] * cols for _ in range(rows)]
    for v in range(values):
        for t in range(threads):
            index = tv_layout(t, v)
            if index >= rows * cols:
                raise ValueError(
                    f"{tv_layout} maps thread {t}, value {v} to {index}, outside the {rows}x{cols} tile"
                )
            r, c = index % rows, index // rows
            if cells[r][c] is None:
                cells[r][c] = (t, v)
    return cells


def _tile_shape(tile_shape):
    tile_shape = as_int_tuple(tile_shape, "tile_shape")
    if not isinstance(tile_shape, tuple) or len(tile_shape) != 2:
        raise ValueError(f"tile_shape must be (rows, columns), not {tile_shape!r}")
    return tile_shape


def tv_grid(tv_layout: Drawable, tile_shape: tuple[int, int]) -> str:
    """The text picture of a thread-value layout: `tv_layout` maps
    (thread, value) to the column-major index of a cell of a
    `tile_shape = (rows, columns)` tile; each cell shows T<thread>V<value>
    (the first pair that lands there; "." where none does).

    >>> from mlirgpu.layout import Layout
    >>> print(tv_grid(Layout((2, 2), (1, 2)), (2, 2)))
    (2,2):(1,2)
            0    1
       +----------
     0 | T0V0 T0V1
     1 | T1V0 T1V1
    """
    rows, cols = _tile_shape(tile_shape)
    cells = _tv_cells(tv_layout, (rows, cols))
    labels = [["." if x is None else f"T{x[0]}V{x[1]}" for x in row] for row in cells]
    return _text(str(tv_layout), labels)


def _pyplot_free_figure(rows, cols):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("drawing a figure needs matplotlib (pip install matplotlib)") from None
    scale = 0.45
    fig = Figure(figsize=(max(2.0, cols * scale + 0.8), max(1.2, rows * scale + 0.8)))
    ax = fig.add_subplot()
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.xaxis.tick_top()
    ax.set_xticks([c + 0.5 for c in range(cols)], [str(c) for c in range(cols)], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(rows)], [str(r) for r in range(rows)], fontsize=7)
    ax.tick_params(length=0)
    return fig, ax


def _draw(ax, r, c, text, colour):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((c, r), 1, 1, facecolor=colour, edgecolor="black", linewidth=0.5))
    ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=6 if len(text) > 3 else 7)


# Eight pale colours, one per index modulo 8, as CuTe's pictures shade them.
_PALETTE = ["#ffffff", "#e0e0e0", "#ffd8d8", "#d8ffd8", "#d8d8ff", "#ffffd0", "#ffd8ff", "#d0ffff"]


def layout_figure(layout: Drawable) -> Figure:
    """A matplotlib Figure of the grid of indices of a rank-1 or rank-2
    layout, cells shaded by index modulo 8: `layout_figure(Layout((4, 8))).savefig("layout.png")`.
    ValueError for more than FIGURE_CELL_LIMIT cells, which no figure shows legibly."""
    rows, cols = _rows_cols(layout)
    if rows * cols > FIGURE_CELL_LIMIT:
        raise ValueError(f"{layout} has {rows}x{cols} cells, too many for a figure (at most "
                         f"{FIGURE_CELL_LIMIT}): print its text picture, which shows the first ones")
    cells = _cells(layout)
    fig, ax = _pyplot_free_figure(len(cells), len(cells[0]))
    for r, row in enumerate(cells):
        for c, v in enumerate(row):
            _draw(ax, r, c, str(v), _PALETTE[v % 8])
    ax.set_title(str(layout), fontsize=8)
    return fig


def tv_figure(tv_layout: Drawable, tile_shape: tuple[int, int]) -> Figure:
    """A matplotlib Figure of a thread-value layout: cells labelled T#V#,
    coloured by thread: `tv_figure(mma.M16N8K16_F16.c, (16, 8))`."""
    rows, cols = _tile_shape(tile_shape)
    cells = _tv_cells(tv_layout, (rows, cols))
    fig, ax = _pyplot_free_figure(rows, cols)
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    for r, row in enumerate(cells):
        for c, x in enumerate(row):
            if x is None:
                _draw(ax, r, c, ".", "#ffffff")
            else:
                _draw(ax, r, c, f"T{x[0]}\nV{x[1]}", cmap(x[0] % 20))
    ax.set_title(str(tv_layout), fontsize=8)
    return fig


def show(layout: Drawable, figure: bool = False) -> Figure | None:
    """Print the text picture of `layout` (see `grid`), or with
    `figure=True` return a matplotlib Figure of it.

    >>> from mlirgpu.layout import Layout
    >>> show(Layout(3, 1))
    3:1
          0  1  2
       +---------
     0 |  0  1  2
    """
    if figure:
        return layout_figure(layout)
    print(grid(layout))


def show_tv(tv_layout: Drawable, tile_shape: tuple[int, int], figure: bool = False) -> Figure | None:
    """Print the text picture of a thread-value layout (see `tv_grid`), or
    with `figure=True` return a matplotlib Figure, cells coloured by thread.

    >>> from mlirgpu.layout import Layout
    >>> show_tv(Layout((2, 2), (1, 2)), (2, 2))
    (2,2):(1,2)
            0    1
       +----------
     0 | T0V0 T0V1
     1 | T1V0 T1V1
    """
    if figure:
        return tv_figure(tv_layout, tile_shape)
    print(tv_grid(tv_layout, tile_shape))


def png(layout):
    """PNG bytes of the layout's figure for a notebook, or None (the notebook
    then shows the text) where matplotlib is missing or the picture would be
    too large or is not drawable."""
    try:
        rows, cols = _rows_cols(layout)
    except ValueError:
        return None
    if rows * cols > FIGURE_CELL_LIMIT:
        return None
    try:
        fig = layout_figure(layout)
    except ImportError:
        return None
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", dpi=100)
    return buffer.getvalue()
