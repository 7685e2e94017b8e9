"""The laws of the layout algebra, checked on random layouts (Hypothesis).

Each law is checked pointwise on every coordinate of the layouts drawn,
which are kept small (a few hundred elements) so a run stays short."""
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlirgpu.layout import (  # noqa: E402
    Layout,
    Swizzle,
    blocked_product,
    coalesce,
    column_major,
    complement,
    composition,
    crd2idx,
    idx2crd,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    raked_product,
    right_inverse,
    zipped_divide,
)
from mlirgpu.layout.inttuple import flatten, product  # noqa: E402

# No example database: runs leave no files behind.
LAWS = settings(max_examples=200, deadline=None, database=None)

extents = st.integers(1, 6)


@st.composite
def shapes(draw, max_size=256):
    """A nested shape: 1-3 modes, each an extent or a tuple of 1-3 extents."""
    mode = st.one_of(extents, st.lists(extents, min_size=1, max_size=3).map(tuple))
    shape = tuple(draw(st.lists(mode, min_size=1, max_size=3)))
    assume(product(shape) <= max_size)
    return shape


def _regroup(flat, structure):
    it = iter(flat)

    def build(t):
        return tuple(build(e) for e in t) if isinstance(t, tuple) else next(it)

    return build(structure)


@st.composite
def layouts(draw, max_size=256):
    """Any layout: strides drawn freely (zero, overlapping, gaps)."""
    shape = draw(shapes(max_size))
    strides = draw(st.lists(st.integers(0, 24), min_size=len(flatten(shape)), max_size=len(flatten(shape))))
    return Layout(shape, _regroup(strides, shape))


@st.composite
def injective_layouts(draw, max_size=256, gaps=True):
    """A one-to-one layout whose strides nest: the modes, visited in a random
    order, each start a multiple (1-3, or exactly 1 without gaps) of the
    extent the previous ones cover."""
    shape = draw(shapes(max_size))
    leaves = flatten(shape)
    order = draw(st.permutations(range(len(leaves))))
    strides = [0] * len(leaves)
    covered = 1
    for k in order:
        covered *= draw(st.integers(1, 3)) if gaps else 1
        strides[k] = covered
        covered *= leaves[k]
    return Layout(shape, _regroup(strides, shape))


@LAWS
@given(shapes(), st.data())
def test_idx2crd_and_crd2idx_round_trip(shape, data):
    layout = Layout(shape)
    for i in range(product(shape)):
        coord = idx2crd(i, shape)
        assert crd2idx(coord, shape) == i
        assert layout(coord) == layout(i) == i
    stride = _regroup(data.draw(st.lists(st.integers(0, 9), min_size=len(flatten(shape)), max_size=len(flatten(shape)))), shape)
    strided = Layout(shape, stride)
    for i in range(product(shape)):
        assert strided(idx2crd(i, shape)) == crd2idx(i, shape, stride)


@LAWS
@given(layouts())
def test_coalesce_preserves_the_function_and_size(layout):
    flat = coalesce(layout)
    assert flat.size == layout.size and flat.depth <= 1
    by_mode = coalesce(layout, (1,) * layout.rank)
    assert by_mode.rank == layout.rank and all(m.depth <= 1 for m in by_mode)
    for i in range(layout.size):
        assert flat(i) == by_mode(i) == layout(i)


@st.composite
def layouts_into(draw, size, max_size=96):
    """A layout whose indices all fall in [0, size): the part of another
    layout's domain on which that layout is defined."""
    shape = draw(shapes(max_size))
    budget = size - 1
    strides = []
    for s in flatten(shape):
        largest = budget // (s - 1) if s > 1 else 24
        d = draw(st.integers(0, min(24, largest)))
        budget -= d * (s - 1)
        strides.append(d)
    return Layout(shape, _regroup(strides, shape))


@LAWS
@given(layouts(max_size=96), st.data())
def test_composition_is_function_composition(a, data):
    b = data.draw(layouts_into(a.size))
    try:
        r = composition(a, b)
    except ValueError:
        # Not every pair composes into a layout; those that do must be exact.
        assume(False)
    assert r.size == b.size
    for i in range(b.size):
        assert r(i) == a(b(i))


@LAWS
@given(injective_layouts(max_size=128), st.data())
def test_composition_with_a_one_to_one_layout(a, data):
    # A one-to-one a composes with far more layouts; check those too, and
    # the compact column-major a, which composes with every b.
    compact = data.draw(st.booleans())
    a = column_major(a.shape) if compact else a
    b = data.draw(layouts_into(a.size, max_size=32))
    try:
        r = composition(a, b)
    except ValueError:
        assert not compact
        assume(False)
    for i in range(b.size):
        assert r(i) == a(b(i))


@LAWS
@given(injective_layouts(), st.integers(1, 4), st.integers(0, 7))
def test_a_layout_and_its_complement_tile_the_codomain(layout, times, extra):
    cotarget = layout.cosize * times + extra
    c = complement(layout, cotarget)
    both = make_layout(layout, c)
    image = [both(i) for i in range(both.size)]
    # Disjoint: only index 0 is shared (by the two origins), and together
    # they are one-to-one onto a whole range that covers [0, cotarget).
    assert sorted(image) == list(range(both.size))
    assert both.size >= cotarget
    assert set(layout.indices()) & set(c.indices()) == {0}
    strides = [d for s, d in zip(flatten(c.shape), flatten(c.stride)) if s > 1]
    assert strides == sorted(strides)


@LAWS
@given(layouts())
def test_right_inverse_composes_to_the_identity(layout):
    inverse = right_inverse(layout)
    for i in range(inverse.size):
        assert layout(inverse(i)) == i
    assert composition(layout, inverse).indices() == list(range(inverse.size))


@LAWS
@given(injective_layouts(gaps=False))
def test_a_bijection_has_a_full_right_inverse(layout):
    inverse = right_inverse(layout)
    assert inverse.size == layout.size
    assert [inverse(layout(i)) for i in range(layout.size)] == list(range(layout.size))


@LAWS
@given(injective_layouts())
def test_left_inverse_undoes_the_layout(layout):
    inverse = left_inverse(layout)
    for i in range(layout.size):
        assert inverse(layout(i)) == i


@LAWS
@given(layouts(max_size=128), injective_layouts(max_size=16))
def test_logical_divide_permutes_the_layout_into_tiles(a, tile):
    assume(a.size % tile.size == 0)
    try:
        divided = logical_divide(a, tile)
        zipped = zipped_divide(a, tile)
        first = composition(a, tile)
    except ValueError:
        assume(False)
    assert divided.rank == 2 and divided == zipped
    assert divided[0].indices() == first.indices()
    rest = complement(tile, a.size)
    if tile.size * rest.size == a.size:
        # (tile, rest) is then a permutation of a's coordinates.
        assert sorted(divided.indices()) == sorted(a.indices())


@LAWS
@given(injective_layouts(max_size=16), st.integers(1, 8))
def test_division_then_product_round_trips(tile, count):
    # Dividing the identity on [0, n) into tiles and multiplying the tile by
    # the number of tiles build the same function.
    n = complement(tile, tile.cosize).size * tile.size * count
    divided = logical_divide(Layout(n, 1), tile)
    rebuilt = logical_product(tile, Layout(divided[1].size, 1))
    assert divided.indices() == rebuilt.indices()


@LAWS
@given(shapes(max_size=32), shapes(max_size=16))
def test_blocked_and_raked_products_place_whole_blocks(block_shape, tiler_shape):
    # With a compact block, block element e of copy t lands at e + size(block) * t.
    block, tiler = Layout(block_shape), Layout(tiler_shape)
    assume(block.rank <= 2 and tiler.rank <= 2)
    blocked, raked = blocked_product(block, tiler), raked_product(block, tiler)
    assert blocked.size == raked.size == block.size * tiler.size
    images = sorted(block(i) + block.size * tiler(j) for i in range(block.size) for j in range(tiler.size))
    assert sorted(blocked.indices()) == sorted(raked.indices()) == images


@LAWS
@given(st.integers(0, 4), st.integers(0, 4), st.integers(-6, 6).filter(lambda s: s != 0))
def test_a_swizzle_is_its_own_inverse_and_a_permutation(bits, base, shift):
    assume(abs(shift) >= bits)
    sw = Swizzle(bits, base, shift)
    span = 1 << (base + bits + abs(shift))
    images = [sw(i) for i in range(span)]
    assert sorted(images) == list(range(span))
    assert all(sw(sw(i)) == i for i in range(span))
