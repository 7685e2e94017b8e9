"""mlirgpu.layout: the worked examples of CuTe's layout-algebra documentation,
the fragment layouts of mma.sync/ldmatrix against the PTX ISA's tables, wgmma
descriptors against hand-checked values, pictures, errors, and the user guide
(docs/layouts.md) run block by block."""
import ast
import contextlib
import doctest
import io
import pathlib
import re
import sys

import pytest

import mlirgpu.layout as layout_pkg
from mlirgpu.layout import (
    ComposedLayout,
    Layout,
    Swizzle,
    append,
    blocked_product,
    coalesce,
    column_major,
    complement,
    composition,
    crd2idx,
    flat_divide,
    flatten,
    grid,
    idx2crd,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    make_ordered_layout,
    mma,
    prepend,
    product,
    raked_product,
    right_inverse,
    row_major,
    show,
    show_tv,
    tiled_divide,
    tv_grid,
    wgmma,
    zipped_divide,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "mlirgpu" / "layout"


def L(shape, stride=None):
    return Layout(shape, stride)


# -- the layout itself ----------------------------------------------------------


def test_the_readme_example():
    lay = Layout((4, 8), (8, 1))
    assert (str(lay), lay(3, 5), lay.size, lay.cosize) == ("(4,8):(8,1)", 29, 32, 32)


def test_default_stride_is_column_major():
    assert Layout((4, 8)) == Layout((4, 8), (1, 4))
    assert Layout(((2, 3), 4)).stride == ((1, 2), 6)
    assert Layout(5).stride == 1


def test_properties_of_a_hierarchical_layout():
    lay = L(((2, 2), 4), ((1, 4), 2))
    assert str(lay) == "((2,2),4):((1,4),2)"
    assert (lay.rank, lay.depth, lay.size, lay.cosize) == (2, 2, 16, 12)
    assert lay.shape == ((2, 2), 4) and lay.stride == ((1, 4), 2)
    assert (L(8).rank, L(8).depth, L((8,)).rank, L((8,)).depth) == (1, 0, 1, 1)


def test_coordinates_integer_natural_and_mixed():
    lay = L(((2, 2), 4), ((1, 4), 2))
    # Linear index 13 is natural coordinate ((1, 0), 3): 1 + 3*2.
    assert lay(13) == lay(((1, 0), 3)) == lay((1, 0), 3) == lay(1, 3) == 7
    for i in range(lay.size):
        assert lay(lay.idx2crd(i)) == lay(i)
    assert lay.idx2crd(13) == ((1, 0), 3)
    assert lay.crd2idx(((1, 0), 3)) == 7


def test_idx2crd_and_crd2idx_functions():
    assert idx2crd(7, (2, (3, 4))) == (1, (0, 1))
    assert crd2idx((1, (0, 1)), (2, (3, 4))) == 7
    assert crd2idx((1, 2), (4, 8), (8, 1)) == 10
    assert crd2idx(5, (2, 4)) == 5


def test_mode_access_and_slicing():
    lay = L((4, (2, 3)), (1, (16, 4)))
    assert lay[0] == L(4, 1)
    assert lay[1] == L((2, 3), (16, 4))
    assert lay[-1] == lay[1]
    assert lay[0:1] == L((4,), (1,))
    assert [str(m) for m in lay] == ["4:1", "(2,3):(16,4)"]
    assert len(lay) == 2
    with pytest.raises(IndexError):
        lay[2]
    assert L((4, 8), (8, 1))(None, 3) == L(4, 8)
    assert L((4, 8), (8, 1))(2, None) == L(8, 1)
    assert lay(None, (1, None)) == lay([None, [1, None]]) == L((4, 3), (1, 4))


def test_equality_and_hash():
    a, b = L((4, 8), (8, 1)), Layout([4, 8], [8, 1])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != L((4, 8)) and a != "(4,8):(8,1)"
    assert repr(a) == "Layout((4, 8), (8, 1))"


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    lay = Layout((np.int64(4), np.int32(8)), (np.int64(8), 1))
    assert lay == L((4, 8), (8, 1)) and lay(np.int64(3), 5) == 29


@pytest.mark.parametrize(
    "shape, stride, error",
    [
        ((4, 0), None, ValueError),
        ((4, -2), None, ValueError),
        ((4, 8), (1,), ValueError),
        ((4, 8), (1, (2, 3)), ValueError),
        ((4, 8), (1, -4), ValueError),
        ((4, 2.5), None, TypeError),
        ("48", None, TypeError),
        ((4, True), None, TypeError),
    ],
)
def test_bad_layouts(shape, stride, error):
    with pytest.raises(error):
        Layout(shape, stride)


def test_bad_coordinates():
    lay = L((4, 8), (8, 1))
    with pytest.raises(TypeError):
        lay()
    with pytest.raises(ValueError):
        lay(1, 2, 3)
    with pytest.raises(TypeError):
        lay(1.5)


def _nested(levels, leaf=2):
    """`leaf` inside `levels` one-element tuples: (((leaf,),),) for 3."""
    for _ in range(levels):
        leaf = (leaf,)
    return leaf


_DEEP = _nested(5000)
_LAYOUT = Layout((4, 8))


@pytest.mark.parametrize(
    "call",
    [
        lambda: Layout(_DEEP),
        lambda: Layout(((4, 8),), (_DEEP,)),
        lambda: Layout([_DEEP]),
        lambda: column_major(_DEEP),
        lambda: row_major(_DEEP),
        lambda: make_ordered_layout((4, 8), _DEEP),
        lambda: flatten(_DEEP),
        lambda: product(_DEEP),
        lambda: idx2crd(3, _DEEP),
        lambda: crd2idx(_DEEP, (4, 8)),
        lambda: crd2idx(3, _DEEP),
        lambda: _LAYOUT(_DEEP),
        lambda: _LAYOUT(_nested(5000, None)),
        lambda: _LAYOUT.crd2idx(_DEEP),
        lambda: coalesce(_LAYOUT, _DEEP),
        lambda: composition(_LAYOUT, _DEEP),
        lambda: complement(_LAYOUT, _DEEP),
        lambda: logical_divide(_LAYOUT, _DEEP),
        lambda: logical_product(_LAYOUT, _DEEP),
        lambda: tv_grid(_LAYOUT, _DEEP),
    ],
)
def test_deep_integer_tuples_are_a_value_error(call):
    """A shape, coordinate, tiler or profile nested thousands of levels deep is
    refused at the entry, not a RecursionError from inside the algebra."""
    with pytest.raises(ValueError, match="nests more than 256 levels deep"):
        call()


def test_the_nesting_bound_is_256_levels():
    deepest = Layout(_nested(256))
    assert deepest.depth == 256 and deepest.size == 2
    assert coalesce(deepest) == Layout(2, 1)
    assert composition(Layout(4, 2), deepest) == Layout(_nested(256), _nested(256, 2))
    assert composition(deepest, Layout(2, 1)) == Layout(2, 1)
    assert deepest(_nested(256, 1)) == 1 and deepest.indices() == [0, 1]
    assert "0  1" in grid(deepest)
    with pytest.raises(ValueError, match="nests more than 256 levels deep"):
        Layout(_nested(257))
    with pytest.raises(ValueError, match="nests more than 256 levels deep"):
        make_layout(deepest)


def test_building_helpers():
    assert str(column_major((4, 8))) == "(4,8):(1,4)"
    assert str(row_major((4, 8))) == "(4,8):(8,1)"
    assert str(row_major(((2, 3), 4))) == "((2,3),4):((12,4),1)"
    assert str(make_ordered_layout((4, 8, 2), (1, 0, 2))) == "(4,8,2):(8,1,32)"
    assert str(make_ordered_layout((2, (3, 4)), (2, (0, 1)))) == "(2,(3,4)):(12,(1,3))"
    assert str(make_layout(L(4, 1), L((2, 3), (4, 8)))) == "(4,(2,3)):(1,(4,8))"
    assert str(flatten(L(((2, 2), 4), ((1, 4), 2)))) == "(2,2,4):(1,4,2)"
    assert str(append(L(4, 1))) == "(4,1):(1,0)"
    assert str(prepend(L((4, 2), (1, 4)), L(3, 8))) == "(3,4,2):(8,1,4)"
    with pytest.raises(ValueError):
        make_ordered_layout((4, 8), (0,))


# -- CuTe's worked examples -------------------------------------------------------


def test_coalesce_examples():
    a = L((2, (1, 6)), (1, (6, 2)))
    assert str(coalesce(a)) == "12:1"
    assert str(coalesce(a, (1, 1))) == "(2,6):(1,2)"
    assert str(coalesce(L((2, 4), (1, 2)))) == "8:1"
    assert str(coalesce(L((1, 1), (3, 5)))) == "1:0"
    assert str(coalesce(L((4, 3), (1, 5)))) == "(4,3):(1,5)"


def test_composition_examples():
    # R(i) = A(B(i)), listed value by value in CuTe's documentation.
    a, b = L((6, 2), (8, 2)), L((4, 3), (3, 1))
    r = composition(a, b)
    assert str(r) == "((2,2),3):((24,2),8)"
    assert r.indices() == [0, 24, 2, 26, 8, 32, 10, 34, 16, 40, 18, 42]
    assert str(composition(L(20, 2), L((5, 4), (4, 1)))) == "(5,4):(8,2)"
    assert str(composition(L((10, 2), (16, 4)), L((5, 4), (1, 5)))) == "(5,(2,2)):(16,(80,4))"


def test_composition_with_tilers():
    a = L((12, (4, 8)), (59, (13, 1)))
    assert str(composition(a, (L(3, 4), L(8, 2)))) == "(3,(2,4)):(236,(26,1))"
    assert str(composition(a, (3, 8))) == "(3,(4,2)):(59,(13,1))"
    assert composition(a, (None, 8)) == make_layout(a[0], composition(a[1], 8))
    with pytest.raises(ValueError):
        composition(a, (3, 8, 2))


def test_composition_that_is_not_a_layout():
    with pytest.raises(ValueError, match="does not divide"):
        composition(L((3, 4), (1, 3 * 5)), L(2, 2))
    with pytest.raises(ValueError, match="do not split"):
        composition(L((4, 4), (1, 10)), L(6, 1))
    # (2,2):(1,1) reaches 1 + 1 = 2 in a's first mode, whose extent is 2:
    # a(2) is 10, not a(1) + a(1).
    with pytest.raises(ValueError, match="reach past"):
        composition(L((2, 2), (1, 10)), L((2, 2), (1, 1)))
    assert composition(L(4, 1), L((2, 2), (1, 1))) == L((2, 2), (1, 1))
    with pytest.raises(TypeError):
        composition(L(4, 1), "4:1")


def test_complement_examples():
    assert str(complement(L(4, 1), 24)) == "6:4"
    assert str(complement(L(6, 4), 24)) == "4:1"
    assert str(complement(L((4, 6), (1, 4)), 24)) == "1:0"
    assert str(complement(L(4, 2), 24)) == "(2,3):(1,8)"
    assert str(complement(L((2, 4), (1, 6)), 24)) == "3:2"
    assert str(complement(L((2, 2), (1, 6)), 24)) == "(3,2):(2,12)"
    assert str(complement(L(4, 2))) == "2:1"  # cotarget defaults to the cosize, 7
    assert complement(L(4, 1), (4, 6)) == complement(L(4, 1), 24)


def test_complement_of_an_overlapping_layout():
    with pytest.raises(ValueError, match="overlaps"):
        complement(L((2, 2), (1, 1)), 8)
    with pytest.raises(ValueError, match="overlaps"):
        complement(L((4, 2), (1, 2)), 16)


def test_inverses():
    assert str(right_inverse(L((4, 8), (8, 1)))) == "(8,4):(4,1)"
    assert str(right_inverse(L(4, 2))) == "1:0"
    assert str(left_inverse(L(4, 2))) == "(2,4):(4,1)"
    tv = mma.M16N8K16_F16.a
    inverse = right_inverse(tv)
    assert inverse.size == 256
    assert all(tv(inverse(i)) == i for i in range(256))
    with pytest.raises(ValueError):
        left_inverse(L((2, 2), (1, 1)))


def test_logical_divide_examples():
    assert str(logical_divide(L((4, 2, 3), (2, 1, 8)), L(4, 2))) == "((2,2),(2,3)):((4,1),(2,8))"
    a = L((9, (4, 8)), (59, (13, 1)))
    tiler = (L(3, 3), L((2, 4), (1, 8)))
    ld = logical_divide(a, tiler)
    assert str(ld) == "((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))"
    assert (ld[0][0].size, ld[0][1].size, ld[1][0].size, ld[1][1].size) == (3, 3, 8, 4)


def test_zipped_tiled_flat_divide():
    a = L((9, (4, 8)), (59, (13, 1)))
    tiler = (L(3, 3), L((2, 4), (1, 8)))
    zd = zipped_divide(a, tiler)
    assert str(zd) == "((3,(2,4)),(3,(2,2))):((177,(13,2)),(59,(26,1)))"
    assert (zd[0].size, zd[1].size) == (24, 12)
    assert zd[0].indices() == composition(a, tiler).indices()
    assert str(tiled_divide(a, tiler)) == "((3,(2,4)),3,(2,2)):((177,(13,2)),59,(26,1))"
    assert str(flat_divide(a, tiler)) == "(3,(2,4),3,(2,2)):(177,(13,2),59,(26,1))"
    # A shape tiler: 4x8 tiles of a 16x32 row-major matrix; tile (1, 2) starts at row 4, column 16.
    tiles = zipped_divide(row_major((16, 32)), (4, 8))
    assert str(tiles) == "((4,8),(4,4)):((32,1),(128,8))"
    assert tiles(0, (1, 2)) == 4 * 32 + 16
    with pytest.raises(TypeError):
        zipped_divide(a, ((3, 3), 8))


def test_logical_product_examples():
    assert str(logical_product(L((2, 2), (4, 1)), L(6, 1))) == "((2,2),(2,3)):((4,1),(2,8))"
    assert str(logical_product(L((2, 2), (4, 1)), L((4, 2), (2, 1)))) == "((2,2),(4,2)):((4,1),(8,2))"
    # By mode, with the tiler CuTe's documentation uses to lay a 2x5 row-major block 3x4 times.
    by_mode = logical_product(L((2, 5), (5, 1)), (L(3, 5), L(4, 6)))
    assert str(by_mode) == "((2,3),(5,4)):((5,10),(1,30))"


def test_blocked_and_raked_products():
    block, tiler = L((2, 5), (5, 1)), L((3, 4), (1, 3))
    blocked = blocked_product(block, tiler)
    assert str(blocked) == "(6,(5,4)):(5,(1,30))"
    assert blocked.indices() == logical_product(block, (L(3, 5), L(4, 6))).indices()
    assert str(raked_product(block, tiler)) == "((3,2),(4,5)):((10,5),(30,1))"
    # Rank 1 by rank 2: the block is padded with a trivial mode.
    assert str(blocked_product(L(4, 1), L((2, 3)))) == "(8,3):(1,8)"


# -- swizzles -----------------------------------------------------------------------


def test_swizzle_function():
    sw = Swizzle(3, 4, 3)
    assert str(sw) == "Sw<3,4,3>" and repr(sw) == "Swizzle(3, 4, 3)"
    assert (sw.source_mask, sw.target_mask) == (0b1110000000, 0b0001110000)
    # Byte offset of row r, 16-byte chunk c in a 128-byte-row tile: the chunk moves to c ^ (r % 8).
    for r in range(16):
        for c in range(8):
            assert sw(r * 128 + c * 16 + 5) == r * 128 + (c ^ (r % 8)) * 16 + 5
    assert Swizzle(2, 0, -2)(0b0011) == 0b1111
    assert Swizzle(3, 4, 3) == Swizzle(3, 4, 3) != Swizzle(2, 4, 3)


@pytest.mark.parametrize("args, error", [((3, 4, 2), ValueError), ((-1, 4, 3), ValueError), ((3, 4.0, 3), TypeError)])
def test_bad_swizzles(args, error):
    with pytest.raises(error):
        Swizzle(*args)


def test_swizzled_layout():
    tile = composition(Swizzle(3, 3, 3), row_major((8, 64)))  # 8 rows of 128 bytes of f16
    assert isinstance(tile, ComposedLayout)
    assert str(tile) == "Sw<3,3,3> o 0 o (8,64):(64,1)"
    assert (tile.shape, tile.size, tile.rank) == ((8, 64), 512, 2)
    for r in range(8):
        for c in range(64):
            assert tile(r, c) == r * 64 + ((c // 8) ^ r) * 8 + c % 8
    assert sorted(tile.indices()) == list(range(512))
    # Composing further keeps the swizzle outermost: the first 8 columns of each row.
    sub = composition(tile, (8, 8))
    assert str(sub) == "Sw<3,3,3> o 0 o (8,8):(64,1)"
    assert sub(3, 1) == tile(3, 1)
    assert str(tile[1]) == "Sw<3,3,3> o 0 o 64:1"
    assert ComposedLayout(Swizzle(1, 0, 1), 2, L(2, 1)).indices() == [3, 2]
    # Dividing a swizzled tile divides its layout; the swizzle still applies last.
    for divide in (logical_divide, zipped_divide, tiled_divide, flat_divide):
        tiles = divide(tile, (4, 16))
        assert tiles == ComposedLayout(tile.outer, 0, divide(tile.inner, (4, 16)))
    tiles = zipped_divide(tile, (4, 16))
    assert tiles(0, (1, 2)) == tile(4, 32) and tiles((3, 5), (1, 3)) == tile(7, 53)
    with pytest.raises(TypeError):
        tile(None, 1)


# -- pictures ----------------------------------------------------------------------


def test_text_grid():
    assert grid(L((2, 3), (3, 1))) == (
        "(2,3):(3,1)\n"
        "      0  1  2\n"
        "   +---------\n"
        " 0 |  0  1  2\n"
        " 1 |  3  4  5"
    )
    # Rank 1 draws as one row; hierarchical modes draw by their size.
    assert grid(L(3, 2)).splitlines()[-1] == " 0 |  0  2  4"
    assert grid(L(((2, 2), 2), ((1, 4), 2))).splitlines()[-1] == " 3 |  5  7"


def test_show_prints_the_grid(capsys):
    lay = L((4, 8), (8, 1))
    lay.show()
    assert capsys.readouterr().out == grid(lay) + "\n"
    show(composition(Swizzle(1, 0, 1), row_major((2, 2))))
    assert capsys.readouterr().out.splitlines()[-1] == " 1 |  3  2"


def test_rank_three_is_not_drawn():
    with pytest.raises(ValueError, match="rank 3"):
        L((2, 2, 2)).show()
    assert L((2, 2, 2))._repr_png_() is None


def test_thread_value_grid():
    text = tv_grid(mma.M16N8K16_F16.c, (16, 8))
    lines = text.splitlines()
    assert lines[0] == "((4,8),(2,2)):((32,1),(16,8))"
    assert lines[3].split() == ["0", "|", "T0V0", "T0V1", "T1V0", "T1V1", "T2V0", "T2V1", "T3V0", "T3V1"]
    assert lines[3 + 9].split()[2:4] == ["T4V2", "T4V3"]
    with pytest.raises(ValueError, match="outside"):
        tv_grid(mma.M16N8K16_F16.c, (8, 8))
    with pytest.raises(ValueError):
        tv_grid(L(4), (2, 2))
    # Cells no (thread, value) reaches show '.'.
    assert tv_grid(L((2, 1), (1, 0)), (2, 2)).splitlines()[-1].split()[2:] == ["T1V0", "."]


def test_show_tv_prints(capsys):
    show_tv(L((2, 2), (1, 2)), (2, 2))
    assert capsys.readouterr().out.splitlines()[-1].split() == ["1", "|", "T1V0", "T1V1"]


def test_a_huge_layout_shows_its_first_rows_and_columns(capsys):
    from mlirgpu.layout import pictures

    huge = L((10**9, 10**9), (1, 10**9))
    huge.show()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "(1000000000,1000000000):(1,1000000000)  (the first 128 of 1000000000 rows, " \
                       "64 of 1000000000 columns)"
    assert len(lines) == 3 + pictures.TEXT_ROWS + 1 and lines[-1].split() == ["...", "|"]
    assert lines[3].split()[:3] == ["0", "|", "0"] and lines[3].split()[-1] == "..."
    assert len(lines[1].split()) == pictures.TEXT_COLUMNS + 1
    assert "..." not in grid(L((4, 8), (8, 1)))
    with pytest.raises(ValueError, match="too many for a figure"):
        pictures.layout_figure(huge)
    with pytest.raises(ValueError, match="too large to picture"):
        show_tv(L((10**9, 10**9), (1, 10**9)), (10**9, 10**9))


def test_figures_with_matplotlib():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    fig = L((4, 8), (8, 1)).show(figure=True)
    assert isinstance(fig, Figure)
    assert len(fig.axes[0].patches) == 32
    assert sorted(int(t.get_text()) for t in fig.axes[0].texts) == list(range(32))
    tv = show_tv(mma.M16N8K16_F16.a, (16, 16), figure=True)
    labels = {t.get_text() for t in tv.axes[0].texts}
    assert len(labels) == 256 and "T31\nV7" in labels
    # Cells of one thread share a colour, cells of different threads (mod 20) do not.
    colours = {}
    for patch, text in zip(tv.axes[0].patches, tv.axes[0].texts):
        colours.setdefault(text.get_text().split("\n")[0], set()).add(patch.get_facecolor())
    assert all(len(c) == 1 for c in colours.values())
    assert colours["T0"] != colours["T1"]
    png = L((4, 8), (8, 1))._repr_png_()
    assert png.startswith(b"\x89PNG")
    assert composition(Swizzle(3, 0, 3), row_major((8, 8)))._repr_png_().startswith(b"\x89PNG")
    assert L((128, 128))._repr_png_() is None  # too many cells: the notebook shows the text


def test_without_matplotlib(monkeypatch):
    # A None entry in sys.modules makes the import fail, as if it were not installed.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    lay = L((4, 8), (8, 1))
    assert lay._repr_png_() is None
    with pytest.raises(ImportError, match="pip install matplotlib"):
        lay.show(figure=True)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        show_tv(mma.M16N8K16_F16.c, (16, 8), figure=True)
    assert grid(lay).startswith("(4,8):(8,1)")


# -- mma.sync and ldmatrix fragments against the PTX ISA's tables -----------------


def ptx_m16n8k16_a(lane, i):
    group, tig = lane >> 2, lane % 4
    row = group if i in (0, 1, 4, 5) else group + 8
    col = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def ptx_m16n8k16_b(lane, i):
    """(k, n) of b_i in the 16x8 K x N matrix."""
    group, tig = lane >> 2, lane % 4
    return tig * 2 + (i & 1) + (8 if i >= 2 else 0), group


def ptx_m16n8_c(lane, i):
    group, tig = lane >> 2, lane % 4
    return (group if i < 2 else group + 8), tig * 2 + (i & 1)


def ptx_m16n8k8_tf32_a(lane, i):
    group, tig = lane >> 2, lane % 4
    return (group if i in (0, 2) else group + 8), (tig if i < 2 else tig + 4)


def ptx_m16n8k8_tf32_b(lane, i):
    group, tig = lane >> 2, lane % 4
    return (tig if i == 0 else tig + 4), group


def check_fragment(layout, rows, cols, values, reference):
    seen = set()
    for lane in range(32):
        for i in range(values):
            index = layout(lane, i)
            assert reference(lane, i) == (index % rows, index // rows), (lane, i)
            seen.add(index)
    assert seen == set(range(rows * cols))  # every element held exactly once
    assert layout.size == 32 * values


@pytest.mark.parametrize("atom", [mma.M16N8K16_F16, mma.M16N8K16_BF16])
def test_m16n8k16_fragments(atom):
    assert atom.shape == (16, 8, 16)
    check_fragment(atom.a, 16, 16, 8, ptx_m16n8k16_a)
    # B's tile is N x K: its (n, k) is the PTX table's (k, n) transposed.
    check_fragment(atom.b, 8, 16, 4, lambda lane, i: ptx_m16n8k16_b(lane, i)[::-1])
    check_fragment(atom.c, 16, 8, 4, ptx_m16n8_c)
    assert atom.a_coordinate(5, 2) == (9, 2)
    assert atom.b_coordinate(5, 3) == (1, 11)
    assert atom.c_coordinate(31, 3) == (15, 7)
    assert (atom.a_tile, atom.b_tile, atom.c_tile) == ((16, 16), (8, 16), (16, 8))


def test_m16n8k8_tf32_fragments():
    atom = mma.M16N8K8_TF32
    check_fragment(atom.a, 16, 8, 4, ptx_m16n8k8_tf32_a)
    check_fragment(atom.b, 8, 8, 2, lambda lane, i: ptx_m16n8k8_tf32_b(lane, i)[::-1])
    check_fragment(atom.c, 16, 8, 4, ptx_m16n8_c)
    assert "m16n8k8" in atom.name and "tf32" in atom.name


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("transpose", [False, True])
def test_ldmatrix(count, transpose):
    atom = mma.ldmatrix(count, transpose)
    rows, cols = atom.tile
    assert (rows, cols) == {1: (8, 8), 2: (16, 8), 4: (16, 16)}[count]
    assert atom.instruction == f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if transpose else ''}.shared.b16"

    def block(j):  # matrix j's top-left corner in the tile
        return 8 * (j % 2), 8 * (j // 2)

    # Lanes 8j..8j+7 give the addresses of rows 0..7 of matrix j.
    assert atom.source.size == 8 * count
    for lane in range(8 * count):
        j, r = divmod(lane, 8)
        r0, c0 = block(j)
        assert atom.source(lane) == (r0 + r) + rows * c0
    # Register j of lane l holds two 16-bit elements of matrix j.
    seen = set()
    for lane in range(32):
        for j in range(count):
            for half in range(2):
                r, c = lane // 4, 2 * (lane % 4) + half
                if transpose:
                    r, c = c, r
                r0, c0 = block(j)
                index = atom.destination(lane, half + 2 * j)
                assert index == (r0 + r) + rows * (c0 + c), (lane, j, half)
                seen.add(index)
    assert seen == set(range(rows * cols))
    if count == 4 and not transpose:
        assert atom.destination == mma.M16N8K16_F16.a


def test_ldmatrix_count():
    with pytest.raises(ValueError):
        mma.ldmatrix(3)


# -- wgmma shared-memory descriptors -------------------------------------------------


def test_descriptor_of_the_128_byte_swizzled_k_major_tile():
    tile = wgmma.tile_layout((64, 64), element_bytes=2, swizzle="128B")
    assert isinstance(tile, ComposedLayout) and tile.outer == Swizzle(3, 3, 3)
    d = wgmma.descriptor(tile, element_bytes=2)
    # 8 rows of 128 bytes between 8-row groups; LBO unused (1, i.e. 16 bytes).
    assert (d.swizzle, d.major, d.layout_type) == ("128B", "K", 1)
    assert (d.leading_byte_offset, d.stride_byte_offset) == (16, 1024)
    assert d.k_offsets == (0, 32, 64, 96)  # four k16 instructions along the 128-byte rows
    value = d.encode(start_address=0)
    assert value == (1 << 16) | (64 << 32) | (1 << 62)
    assert wgmma.decode(d.encode(0x2400, base_offset=3)) == {
        "start_address": 0x2400,
        "leading_byte_offset": 16,
        "stride_byte_offset": 1024,
        "base_offset": 3,
        "layout_type": 1,
    }


@pytest.mark.parametrize(
    "swizzle, sbo, layout_type, k_offsets",
    [("64B", 512, 2, (0, 32, 4096, 4128)), ("32B", 256, 3, (0, 2048, 4096, 6144))],
)
def test_descriptors_of_narrower_swizzles(swizzle, sbo, layout_type, k_offsets):
    d = wgmma.descriptor(wgmma.tile_layout((64, 64), 2, swizzle), 2)
    assert (d.leading_byte_offset, d.stride_byte_offset, d.layout_type) == (16, sbo, layout_type)
    assert d.k_offsets == k_offsets


def test_descriptor_of_an_interleaved_k_major_tile():
    # Core matrices of 8 rows x 16 bytes: the next 8 rows 128 bytes on, the next
    # 8 columns (16 bytes of K) after all 64 rows, 64*16 = 1024 bytes on.
    d = wgmma.descriptor(wgmma.tile_layout((64, 16), 2, "interleave"), 2)
    assert (d.swizzle, d.layout_type, d.leading_byte_offset, d.stride_byte_offset) == ("interleave", 0, 1024, 128)
    d = wgmma.descriptor(Layout(((8, 16), (8, 2)), ((8, 64), (1, 1024))), 2)  # two groups of K apart
    assert (d.leading_byte_offset, d.stride_byte_offset) == (2048, 128)


def test_descriptors_of_mn_major_tiles():
    d = wgmma.descriptor(wgmma.tile_layout((64, 16), 2, "128B", major="MN"), 2, major="MN")
    assert (d.swizzle, d.major, d.leading_byte_offset, d.stride_byte_offset) == ("128B", "MN", 16, 1024)
    d = wgmma.descriptor(wgmma.tile_layout((128, 32), 2, "128B", major="MN"), 2, major="MN")
    # Swizzle atoms (64 elements of MN x 8 of K, 1 KiB) stack along MN first.
    assert (d.leading_byte_offset, d.stride_byte_offset, d.k_offsets) == (1024, 2048, (0, 4096))
    d = wgmma.descriptor(wgmma.tile_layout((64, 16), 2, "interleave", major="MN"), 2, major="MN")
    assert (d.leading_byte_offset, d.stride_byte_offset) == (1024, 128)


def test_descriptor_for_tf32_and_8_bit():
    d = wgmma.descriptor(wgmma.tile_layout((64, 32), 4, "128B"), 4)
    assert (d.stride_byte_offset, d.k_offsets) == (1024, (0, 32, 64, 96))
    assert wgmma.tile_layout((64, 32), 4, "128B").outer == Swizzle(3, 2, 3)
    d = wgmma.descriptor(wgmma.tile_layout((64, 128), 1, "128B"), 1)
    assert (d.stride_byte_offset, d.k_offsets) == (1024, (0, 32, 64, 96))


def test_descriptor_rejects_what_wgmma_cannot_read():
    tile = wgmma.tile_layout((64, 64), 2, "128B")
    with pytest.raises(ValueError, match="not a swizzle wgmma reads"):
        wgmma.descriptor(ComposedLayout(Swizzle(3, 4, 3), 0, tile.inner), 2)  # byte swizzle on element offsets
    with pytest.raises(ValueError, match="not a K-major interleave"):
        wgmma.descriptor(row_major((64, 64)), 2)  # plain row-major: 128-byte rows, unswizzled
    with pytest.raises(ValueError, match="not a K-major 128B"):
        wgmma.descriptor(ComposedLayout(Swizzle(3, 3, 3), 0, column_major((64, 64))), 2)
    with pytest.raises(ValueError, match="MN-major operands only"):
        wgmma.descriptor(wgmma.tile_layout((64, 32), 4, "128B"), 4, major="MN")
    with pytest.raises(ValueError, match="1-, 2- or 4-byte"):
        wgmma.descriptor(tile, 3)
    with pytest.raises(ValueError, match="multiple of 8"):
        wgmma.descriptor(ComposedLayout(Swizzle(3, 3, 3), 0, row_major((4, 64))), 2)
    with pytest.raises(ValueError, match="two modes"):
        wgmma.descriptor(Layout((8, 8, 8)), 2)
    with pytest.raises(ValueError, match="offset 0"):
        wgmma.descriptor(ComposedLayout(Swizzle(3, 3, 3), 64, tile.inner), 2)
    with pytest.raises(ValueError, match="major"):
        wgmma.descriptor(tile, 2, major="row")
    with pytest.raises(TypeError):
        wgmma.descriptor("tile", 2)
    with pytest.raises(ValueError, match="swizzle must be"):
        wgmma.tile_layout((64, 64), 2, "256B")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start_address": 8},
        {"start_address": 1 << 18},
        {"leading_byte_offset": -16},
        {"layout_type": 4},
        {"base_offset": 8},
    ],
)
def test_encode_rejects_bad_fields(kwargs):
    fields = {"start_address": 0, "leading_byte_offset": 16, "stride_byte_offset": 1024, "layout_type": 1}
    fields.update(kwargs)
    with pytest.raises(ValueError):
        wgmma.encode(**fields)


# -- the package ----------------------------------------------------------------------


def test_every_public_name_is_exported_and_documented():
    for name in layout_pkg.__all__:
        obj = getattr(layout_pkg, name)
        assert obj.__doc__, name
    for module in (mma, wgmma):
        for name in module.__all__:
            assert getattr(module, name) is not None


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_docstring_examples(path):
    module = __import__(f"mlirgpu.layout.{path.stem}" if path.stem != "__init__" else "mlirgpu.layout", fromlist=["x"])
    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_package_imports_nothing_else_from_mlirgpu(path):
    # The layout algebra sits below every other layer: only the standard
    # library, its own modules and (lazily) matplotlib.
    allowed = set(sys.stdlib_module_names) | {"matplotlib"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            assert node.module.split(".")[0] in allowed, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in allowed, alias.name


# -- the user guide ---------------------------------------------------------------------


def guide_blocks():
    """(code, expected output or None) for each python block of docs/layouts.md;
    a ```text block right after a python block is what that block prints."""
    text = (ROOT / "docs" / "layouts.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", text, flags=re.S)
    pairs = []
    for k, (lang, body) in enumerate(blocks):
        if lang != "python":
            continue
        following = blocks[k + 1] if k + 1 < len(blocks) else None
        pairs.append((body, following[1] if following and following[0] == "text" else None))
    return pairs


def test_the_user_guide_runs_and_prints_what_it_shows():
    namespace = {}
    pairs = guide_blocks()
    assert len(pairs) >= 10
    for code, expected in pairs:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/layouts.md", "exec"), namespace)
        if expected is not None:
            assert out.getvalue() == expected, code
