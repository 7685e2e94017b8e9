"""Shared-memory matrix descriptors of Hopper's wgmma.mma_async, computed from layouts.

wgmma reads its A and B operands from shared memory through a 64-bit
descriptor: the start address, a leading-dimension byte offset (LBO), a
stride-dimension byte offset (SBO), a base offset and one of four swizzle
modes. The hardware only reads tiles built from its canonical pieces (8-row
groups of 16-byte "core matrices", or rows of a 32/64/128-byte swizzle); this
module checks that a layout is such a tile and computes the integers.

Layouts here are in elements, over the operand's (MN, K) coordinates (M x K
for A, N x K for B), with a `Swizzle` composed on top for the swizzled modes
(in element units: `Swizzle(3, 3, 3)` is the 128-byte swizzle of 2-byte
elements). `tile_layout` builds such layouts.

>>> from mlirgpu.layout import wgmma
>>> tile = wgmma.tile_layout((64, 64), element_bytes=2, swizzle="128B")
>>> print(tile)
Sw<3,3,3> o 0 o ((8,8),(64,1)):((64,512),(1,4096))
>>> d = wgmma.descriptor(tile, element_bytes=2)
>>> d.swizzle, d.leading_byte_offset, d.stride_byte_offset
('128B', 16, 1024)
>>> hex(d.encode(start_address=0x400))
'0x4000004000010040'
"""
from .core import ComposedLayout, Layout
from .inttuple import product
from .swizzle import Swizzle

__all__ = ["SWIZZLES", "Descriptor", "descriptor", "tile_layout", "encode", "decode", "swizzle_for"]

# name: (swizzle bits, layout-type field, row width in bytes)
SWIZZLES = {
    "interleave": (0, 0, 16),
    "32B": (1, 3, 32),
    "64B": (2, 2, 64),
    "128B": (3, 1, 128),
}
"""The swizzle modes: the swizzle's bits, the layout-type field (bits 62-63)
and the width of a swizzled row in bytes (16 for interleave, the core
matrix's row): `SWIZZLES["128B"]` is (3, 1, 128)."""

_FIELD_LIMIT = 1 << 14  # addresses and offsets are stored >> 4 in 14-bit fields


def _log2_element(element_bytes):
    if element_bytes not in (1, 2, 4):
        raise ValueError(f"wgmma operands have 1-, 2- or 4-byte elements, not {element_bytes!r}")
    return {1: 0, 2: 1, 4: 2}[element_bytes]


def _mode(swizzle):
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle must be one of {', '.join(SWIZZLES)}, not {swizzle!r}")
    return SWIZZLES[swizzle]


def swizzle_for(swizzle: str, element_bytes: int) -> Swizzle | None:
    """The `Swizzle` (in element units) of a swizzle mode, None for interleave.

    >>> print(swizzle_for("128B", 2), swizzle_for("64B", 4))
    Sw<3,3,3> Sw<2,2,3>
    """
    bits = _mode(swizzle)[0]
    if bits == 0:
        return None
    return Swizzle(bits, 4 - _log2_element(element_bytes), 3)


def tile_layout(shape: tuple[int, int], element_bytes: int, swizzle: str = "128B",
                major: str = "K") -> Layout | ComposedLayout:
    """The canonical shared-memory layout of an (MN, K) operand tile.

    K-major: rows of `width` bytes (the swizzle's, 16 for interleave) along
    K, 8 rows to a group, groups stacked along MN, then the next `width`
    bytes of K. MN-major: the same with MN and K exchanged (`width` bytes
    along MN, 8 K-rows to a group). With a swizzle the result is a
    `ComposedLayout` of the swizzle over the layout.

    >>> print(tile_layout((64, 16), 2, "interleave"))
    ((8,8),(8,2)):((8,64),(1,512))
    >>> print(tile_layout((64, 16), 2, "128B", major="MN"))
    Sw<3,3,3> o 0 o ((64,1),(8,2)):((1,512),(64,512))
    """
    if major not in ("K", "MN"):
        raise ValueError(f"major must be 'K' or 'MN', not {major!r}")
    mn, k = shape
    width = _mode(swizzle)[2] // (1 << _log2_element(element_bytes))
    if major == "K":
        if mn % 8 or k % width:
            raise ValueError(f"a K-major {swizzle} tile needs MN a multiple of 8 and K of {width}, not {shape}")
        inner = Layout(((8, mn // 8), (width, k // width)), ((width, 8 * width), (1, mn * width)))
    else:
        if mn % width or k % 8:
            raise ValueError(f"an MN-major {swizzle} tile needs MN a multiple of {width} and K of 8, not {shape}")
        inner = Layout(((width, mn // width), (8, k // 8)), ((1, 8 * width), (width, 8 * mn)))
    sw = swizzle_for(swizzle, element_bytes)
    return inner if sw is None else ComposedLayout(sw, 0, inner)


class Descriptor:
    """The integers of a wgmma shared-memory descriptor for one operand tile.

    `leading_byte_offset` and `stride_byte_offset` are in bytes (16 where
    the hardware ignores the field, as CuTe sets it); `layout_type` is the
    2-bit field of bits 62-63; `k_offsets` are the byte offsets, from the
    tile's start, of each K-block one wgmma reads (32 bytes of K each): add
    one to the tile's address for the k-th instruction.

    >>> d = descriptor(tile_layout((64, 32), 2, "64B"), 2)
    >>> d.swizzle, d.layout_type, d.leading_byte_offset, d.stride_byte_offset, d.k_offsets
    ('64B', 2, 16, 512, (0, 32))
    """

    __slots__ = ("swizzle", "major", "leading_byte_offset", "stride_byte_offset", "k_offsets")

    def __init__(self, swizzle: str, major: str, leading_byte_offset: int, stride_byte_offset: int,
                 k_offsets: tuple[int, ...]) -> None:
        self.swizzle = swizzle
        self.major = major
        self.leading_byte_offset = leading_byte_offset
        self.stride_byte_offset = stride_byte_offset
        self.k_offsets = k_offsets

    @property
    def layout_type(self) -> int:
        """Bits 62-63: 0 interleave, 1 128B, 2 64B, 3 32B swizzle (`SWIZZLES[name][1]`)."""
        return SWIZZLES[self.swizzle][1]

    def encode(self, start_address: int, base_offset: int = 0) -> int:
        """The 64-bit descriptor for a tile at shared-memory byte address
        `start_address` (a multiple of 16): see `encode`."""
        return encode(start_address, self.leading_byte_offset, self.stride_byte_offset, self.layout_type, base_offset)

    def __repr__(self):
        return (
            f"Descriptor(swizzle={self.swizzle!r}, major={self.major!r}, "
            f"leading_byte_offset={self.leading_byte_offset}, stride_byte_offset={self.stride_byte_offset})"
        )


def encode(start_address: int, leading_byte_offset: int, stride_byte_offset: int, layout_type: int,
           base_offset: int = 0) -> int:
    """Pack the fields: start address >> 4 in bits 0-13, LBO >> 4 in 16-29,
    SBO >> 4 in 32-45, base offset in 49-51, layout type in 62-63.

    >>> hex(encode(0, 16, 1024, 1))
    '0x4000004000010000'

    Raises ValueError for a field that is not a multiple of 16 or does not
    fit.
    """
    fields = {"start_address": start_address, "leading_byte_offset": leading_byte_offset, "stride_byte_offset": stride_byte_offset}
    for name, v in fields.items():
        if v < 0 or v % 16 or (v >> 4) >= _FIELD_LIMIT:
            raise ValueError(f"{name} {v} must be a multiple of 16 below {_FIELD_LIMIT * 16}")
    if layout_type not in (0, 1, 2, 3):
        raise ValueError(f"layout_type must be 0-3, not {layout_type!r}")
    if base_offset not in range(8):
        raise ValueError(f"base_offset must be 0-7, not {base_offset!r}")
    return (
        (start_address >> 4)
        | (leading_byte_offset >> 4) << 16
        | (stride_byte_offset >> 4) << 32
        | base_offset << 49
        | layout_type << 62
    )


def decode(value: int) -> dict[str, int]:
    """The fields of a 64-bit descriptor, in bytes (the inverse of `encode`).

    >>> decode(0x4000004000010040)
    {'start_address': 1024, 'leading_byte_offset': 16, 'stride_byte_offset': 1024, 'base_offset': 0, 'layout_type': 1}
    """
    mask = _FIELD_LIMIT - 1
    return {
        "start_address": (value & mask) << 4,
        "leading_byte_offset": ((value >> 16) & mask) << 4,
        "stride_byte_offset": ((value >> 32) & mask) << 4,
        "base_offset": (value >> 49) & 7,
        "layout_type": (value >> 62) & 3,
    }


def _split(layout, element_bytes):
    """(swizzle name, inner layout) of a tile layout."""
    if isinstance(layout, ComposedLayout):
        sw, inner = layout.outer, layout.inner
        if not isinstance(sw, Swizzle) or layout.offset != 0:
            raise ValueError(f"{layout}: a wgmma tile is a layout, or a Swizzle over a layout at offset 0")
    elif isinstance(layout, Layout):
        sw, inner = None, layout
    else:
        raise TypeError(f"a wgmma tile is a Layout or a swizzled ComposedLayout, not {type(layout).__name__}")
    if sw is None or sw.bits == 0:
        return "interleave", inner
    for name in ("32B", "64B", "128B"):
        if sw == swizzle_for(name, element_bytes):
            return name, inner
    raise ValueError(
        f"{sw} is not a swizzle wgmma reads for {element_bytes}-byte elements "
        f"(those are {', '.join(str(swizzle_for(n, element_bytes)) for n in ('32B', '64B', '128B'))})"
    )


def descriptor(layout: Layout | ComposedLayout, element_bytes: int, major: str = "K") -> Descriptor:
    """The descriptor fields of a shared-memory operand tile.

    `layout` maps (MN, K) coordinates of the tile to element offsets, with
    the swizzle composed on top (see `tile_layout`); `element_bytes` is 2
    for f16/bf16, 4 for tf32, 1 for 8-bit types; `major` says which
    coordinate is contiguous ("K" or "MN"; MN-major needs 2-byte elements).

    >>> d = descriptor(tile_layout((64, 16), 2, "interleave"), element_bytes=2)
    >>> d.swizzle, d.leading_byte_offset, d.stride_byte_offset
    ('interleave', 1024, 128)

    Raises ValueError when wgmma cannot read the layout: a swizzle it does
    not have, rows of the wrong width, K not contiguous, offsets that are
    not multiples of 16 bytes or do not fit the fields.
    """
    if major not in ("K", "MN"):
        raise ValueError(f"major must be 'K' or 'MN', not {major!r}")
    e = element_bytes
    log2e = _log2_element(e)
    if major == "MN" and e != 2:
        raise ValueError("wgmma reads MN-major operands only for 2-byte elements (f16, bf16)")
    swizzle, L = _split(layout, e)
    if L.rank != 2:
        raise ValueError(f"{L}: a wgmma operand tile has two modes, (MN, K)")
    mn, k = product(L.shape[0]), product(L.shape[1])
    core = 16 >> log2e  # elements in a 16-byte row of a core matrix
    width = SWIZZLES[swizzle][2] >> log2e  # elements in a swizzled row
    kblock = 32 >> log2e  # K of one wgmma: 32 bytes
    mn_unit = 8 if major == "K" else width
    if mn % mn_unit or k % kblock:
        raise ValueError(f"{L}: a {major}-major {swizzle} tile needs MN a multiple of {mn_unit} and K of {kblock}")

    def rel(i, j):
        return L(i, j) - L(0, 0)

    unused = 16 >> log2e  # in elements: 16 bytes, the value CuTe puts in an ignored field
    if major == "K":
        row = width
        sbo = rel(8, 0) if mn > 8 else unused
        lbo = rel(0, core) if swizzle == "interleave" else unused

        def canonical(i, j):
            chunk = lbo if swizzle == "interleave" else core
            return (i % 8) * row + (i // 8) * sbo + j % core + (j // core) * chunk
    elif swizzle == "interleave":
        sbo = rel(core, 0) if mn > core else unused
        lbo = rel(0, 8)

        def canonical(i, j):
            return i % core + (i // core) * sbo + (j % 8) * core + (j // 8) * lbo
    else:
        lbo = rel(width, 0) if mn > width else unused
        sbo = rel(0, 8)

        def canonical(i, j):
            return i % width + (i // width) * lbo + (j % 8) * width + (j // 8) * sbo

    k_offsets = []
    for k0 in range(0, k, kblock):
        start = L(0, k0)
        for j in range(kblock):
            for i in range(mn):
                if L(i, k0 + j) - start != canonical(i, j):
                    raise ValueError(
                        f"{layout} is not a {major}-major {swizzle} wgmma tile: element (MN={i}, K={k0 + j}) "
                        f"is at offset {L(i, k0 + j) - start} from its K-block's start, "
                        f"the descriptor would read offset {canonical(i, j)}"
                    )
        k_offsets.append(start * e)
    lbo_bytes, sbo_bytes = lbo * e, sbo * e
    for name, v in (("leading byte offset", lbo_bytes), ("stride byte offset", sbo_bytes)):
        if v < 0 or v % 16 or (v >> 4) >= _FIELD_LIMIT:
            raise ValueError(f"{layout}: the {name} {v} is not a multiple of 16 bytes below {_FIELD_LIMIT * 16}")
    for off in k_offsets:
        if off % 16:
            raise ValueError(f"{layout}: a K-block starts at byte {off}, not a multiple of 16")
    return Descriptor(swizzle, major, lbo_bytes, sbo_bytes, tuple(k_offsets))
