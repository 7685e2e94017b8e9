"""mg.mma: the warp-level tensor-core operations of sm_80 and later.

    atom = mg.mma.M16N8K16_F16                  # mma.sync m16n8k16, f16 inputs, f32 accumulators
    acc = mg.mma.zeros(atom)                    # this lane's 4 accumulators (f32)
    a = mg.mma.ldmatrix(As, (row, col), 4)      # ldmatrix .x4: an A fragment (8 f16 values)
    b = mg.mma.ldmatrix(Bs, (k, n), 4, transpose=True).select(0, 1, 4, 5)
    acc = mg.mma.sync(atom, a, b, acc)          # acc += A (16x16) @ B (16x8)
    mg.mma.cp_async(As, (r, c), A, (i, j), 16)  # 16 bytes global -> shared, asynchronously
    mg.mma.commit_group(); mg.mma.wait_group(0)

The instructions are warp collectives: all 32 lanes of a warp execute each
one together, every lane holding a *fragment*, its share of the operand
tile. Which element of the tile each value of each lane holds is the
instruction's thread-value layout (mlirgpu.layout.mma: `atom.a`, `atom.b`,
`atom.c` map (lane, value) to the element's index in the tile). A
`Fragment` is a list of traced values that knows that layout; it is carried
through traced loops and branches like any list of traced values, and
`mg.mma.sync` checks that each operand's layout is the atom's.

Atoms (mlirgpu.layout.mma's, whose `name` is the PTX instruction):

    M16N8K16_F16   A 16x16 and B 16x8 of f16, C and D 16x8 of f32
    M16N8K16_BF16  the same with bf16 inputs
    M16N8K8_TF32   A 16x8 and B 8x8 of tf32 (f32 values; the tensor core reads
                   their top 19 bits), C and D 16x8 of f32

Tiles follow the PTX ISA's row.col form: A is M x K, B is given by its
columns (an N x K tile, K fastest in each of its rows), C is M x N.

ldmatrix loads 1, 2 or 4 8x8 matrices of 16-bit elements from shared
memory. Lanes 8j .. 8j+7 give the addresses of the 8 rows of matrix j (each
row 16 contiguous bytes, 16-byte aligned); with `transpose` the registers
receive the matrices transposed. The fragment's layout treats the matrices
as blocks of one tile, matrix j at block (j % 2, j // 2): .x4 gives exactly
an A fragment of m16n8k16, and `.select` picks B fragments out of it. With
order="row", matrix j sits at block (j // 2, j % 2): an .x4.trans whose
matrices 0, 1 are the first 8 columns of B (rows k and k + 8) holds a B
fragment in each half of its registers, which mma.sync then reads where
ldmatrix left them.

cp.async copies 4, 8 or 16 bytes from global to shared memory without
passing through registers; `commit_group` closes the group of copies issued
since the last one and `wait_group(n)` waits until at most n groups are
still in flight. A copy with `valid` false reads nothing and fills its
destination with zeros (the predication of a tile's edges).

`tile(memref, layout)` (layout_index.py) indexes a 1-d shared array through a layout
(mlirgpu.layout: a Layout, or a swizzled ComposedLayout): `t[r, c]` is
memref[layout(r, c)], computed at trace time for Python ints and emitted as
index arithmetic (multiplications, divisions, xors) for traced coordinates.

They need sm_80 or later: compiling a kernel that uses one for an older
chip raises CompileError at its line. On the CPU
backend they run with the hardware's fragment semantics (the warp's lanes
meet at a warp barrier, as for shuffles); cp.async copies there at once, so
commit_group and wait_group have nothing left to wait for.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from .. import ir
from .._mlirgpu import CompileError
from ..layout.mma import M16N8K16_BF16, M16N8K16_F16, M16N8K8_TF32, MMAAtom
from . import core as lang
from .layout_index import Tile, layout_index, tile
from .shared import SharedMemRef

__all__ = ["M16N8K16_F16", "M16N8K16_BF16", "M16N8K8_TF32", "Fragment", "zeros", "fragment", "coordinate",
           "sync", "ldmatrix", "cp_async", "commit_group", "wait_group", "tile", "Tile", "layout_index",
           "MIN_CHIP"]

#: The oldest chip each operation mg.mma emits compiles for; compiler.nvvm
#: checks it. (PTX has ldmatrix from sm_75, but only from PTX 6.5, newer than
#: the PTX 6.3 that mlirgpu targets on sm_75.)
MIN_CHIP = {"nvvm.mma.sync": "sm_80", "nvgpu.ldmatrix": "sm_80", "nvgpu.device_async_copy": "sm_80",
            "nvvm.cp.async.commit.group": "sm_80", "nvvm.cp.async.wait.group": "sm_80"}

_WARP = 32
_DTYPES = {"f16": lang.f16, "bf16": lang.bf16, "tf32": lang.f32, "f32": lang.f32}
_OPERANDS = ("a", "b", "c")
# name -> the kind the lowering's hook takes
_KINDS = {M16N8K16_F16.name: "f16", M16N8K16_BF16.name: "bf16", M16N8K8_TF32.name: "tf32"}


# ---------------------------------------------------------------------------
# Fragments

@functools.lru_cache(maxsize=64)
def _table(layout, rows):
    """(lane, value) -> (row, col) of a thread-value layout over a column-major tile of `rows` rows.
    Made once per layout: every mma.sync, fragment and zeros of a trace asks for its atom's."""
    values = layout.size // _WARP
    return tuple(tuple((layout(lane, v) % rows, layout(lane, v) // rows) for v in range(values))
                 for lane in range(_WARP))


def _normalized(table):
    """The table moved to start at (0, 0): a fragment's layout does not depend on where its tile sits."""
    row0 = min(r for lane in table for r, _ in lane)
    col0 = min(c for lane in table for _, c in lane)
    return tuple(tuple((r - row0, c - col0) for r, c in lane) for lane in table)


class Fragment(list):
    """A lane's share of a tile: a list of traced values whose thread-value
    layout (`coordinates[lane][value]` is the (row, col) of the tile that
    value of that lane holds) is a property of its class. Indexing,
    assignment and iteration are a list's; `select` picks values."""

    coordinates = None  # per lane, per value: (row, col)
    dtype = None
    description = "a fragment"

    def select(self, *values: int) -> Fragment:
        """The fragment of the values at positions `values`, in that order,
        with their layout (moved so its tile starts at (0, 0))."""
        if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < len(self) for v in values):
            raise CompileError(f"Fragment.select takes positions 0..{len(self) - 1} (Python ints), got {values}")
        table = tuple(tuple(lane[v] for v in values) for lane in self.coordinates)
        kind = fragment_type(_normalized(table), self.dtype, f"values {list(values)} of {self.description}")
        return kind(self[v] for v in values)

    def __repr__(self):
        return f"<{self.description}: {len(self)} traced {self.dtype.name} values>"


_TYPES = {}


def fragment_type(table, dtype, description):
    """The Fragment class of a layout table and dtype (one class per layout,
    so a fragment carried through a traced loop keeps it)."""
    key = (table, dtype)
    kind = _TYPES.get(key)
    if kind is None:
        kind = _TYPES[key] = type("Fragment", (Fragment,), {
            "coordinates": table, "dtype": dtype, "description": description, "__slots__": ()})
    return kind


def _atom_table(atom, operand):
    rows = {"a": atom.a_tile, "b": atom.b_tile, "c": atom.c_tile}[operand][0]
    return _normalized(_table(getattr(atom, operand), rows))


def _atom_fragment_type(atom, operand):
    dtype = _DTYPES[{"a": atom.a_type, "b": atom.b_type, "c": atom.c_type}[operand]]
    return fragment_type(_atom_table(atom, operand), dtype, f"the {operand.upper()} fragment of {atom.name}")


def _check_atom(atom):
    if not isinstance(atom, MMAAtom) or atom.name not in _KINDS:
        raise CompileError(f"not an mma.sync atom: {atom!r}; use mg.mma.M16N8K16_F16, M16N8K16_BF16 or "
                           f"M16N8K8_TF32")
    return atom


def zeros(atom: MMAAtom) -> Fragment:
    """This lane's accumulators of `atom`, all 0.0 (a C fragment)."""
    kind = _atom_fragment_type(_check_atom(atom), "c")
    return kind(lang.constant(0.0, kind.dtype) for _ in range(len(kind.coordinates[0])))


def fragment(atom: MMAAtom, operand: str, values: Iterable[lang.Number]) -> Fragment:
    """The `operand` ("a", "b" or "c") fragment of `atom` made of `values`
    (traced values or Python numbers, in the atom's register order)."""
    _check_atom(atom)
    if operand not in _OPERANDS:
        raise CompileError(f"an mma operand is 'a', 'b' or 'c', not {operand!r}")
    kind = _atom_fragment_type(atom, operand)
    values = list(values)
    count = len(kind.coordinates[0])
    if len(values) != count:
        raise CompileError(f"the {operand.upper()} fragment of {atom.name} holds {count} values a lane, "
                           f"got {len(values)}")
    return kind(lang.coerce(v, kind.dtype, f"the {operand.upper()} fragment of {atom.name}") for v in values)


def coordinate(atom: MMAAtom, operand: str, value: int) -> tuple[lang.Scalar, lang.Scalar]:
    """(row, col) of the element of `operand`'s tile ("a": M x K, "b": N x K,
    "c": M x N) that `value` of this lane holds, as traced indices."""
    _check_atom(atom)
    if operand not in _OPERANDS:
        raise CompileError(f"an mma operand is 'a', 'b' or 'c', not {operand!r}")
    layout = getattr(atom, operand)
    rows = {"a": atom.a_tile, "b": atom.b_tile, "c": atom.c_tile}[operand][0]
    if not isinstance(value, int) or not 0 <= value < layout.size // _WARP:
        raise CompileError(f"value must be a Python int in 0..{layout.size // _WARP - 1}, got {value!r}")
    lane = lang.target().lane_id()
    index = layout_index(layout, lane, value)
    return index % rows, index // rows


# ---------------------------------------------------------------------------
# mma.sync

def _operand(atom, operand, value):
    """`value` as a list of the atom's `operand` scalars, its layout checked."""
    kind = _atom_fragment_type(atom, operand)
    name = f"mma.sync's {operand.upper()} operand"
    if not isinstance(value, (list, tuple)):
        raise CompileError(f"{name} is a fragment (a list of traced values), not {type(value).__name__}")
    if isinstance(value, Fragment) and type(value).coordinates != kind.coordinates:
        # kind.description may be another fragment's of the same layout, traced first: the atom is named here
        raise CompileError(f"{name} has the layout of {value.description}, which does not match "
                           f"the {operand.upper()} fragment of {atom.name}: lane 0 holds "
                           f"{_show(type(value).coordinates)} where the atom wants {_show(kind.coordinates)} "
                           f"(row, col)")
    count = len(kind.coordinates[0])
    if len(value) != count:
        raise CompileError(f"{name} of {atom.name} holds {count} values a lane, got {len(value)}")
    out = []
    for v in value:
        if isinstance(v, lang.Scalar) and v.dtype != kind.dtype:
            raise CompileError(f"{name} of {atom.name} takes {kind.dtype.name} values, not {v.dtype.name}")
        out.append(lang.coerce(v, kind.dtype, name))
    return out


def _show(table):
    return " ".join(f"({r},{c})" for r, c in table[0])


def sync(atom: MMAAtom, a: Sequence[lang.Number], b: Sequence[lang.Number], c: Sequence[lang.Number]) -> Fragment:
    """D = A @ B + C over the warp's fragments (PTX mma.sync.aligned): returns
    this lane's D, a C fragment of `atom`. Every lane of the warp must call it."""
    _check_atom(atom)
    a, b, c = _operand(atom, "a", a), _operand(atom, "b", b), _operand(atom, "c", c)
    kind = _atom_fragment_type(atom, "c")
    return kind(lang.target().mma_sync(_KINDS[atom.name], a, b, c))


# ---------------------------------------------------------------------------
# Where ldmatrix and cp.async read and write

def _place(where, index, what):
    """(memref, indices) of `where` (a memref or a Tile) at `index`."""
    if isinstance(where, Tile):
        index = index if isinstance(index, tuple) else (index,)
        return where.memref, [lang.as_index(where.index(*index))]
    if isinstance(where, lang.MemRef):
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != len(where.shape):
            raise CompileError(f"{what}: a {len(where.shape)}-d memref takes {len(where.shape)} indices, "
                               f"got {len(index)}")
        return where, [lang.as_index(i) for i in index]
    raise CompileError(f"{what} is a memref or an mg.mma.tile, not {type(where).__name__}")


def _is_shared(memref):
    return isinstance(memref, SharedMemRef)


# ---------------------------------------------------------------------------
# ldmatrix

def ldmatrix(source: lang.MemRef | Tile, index: lang.Indices, count: int = 4, transpose: bool = False,
             blocks: tuple[int, int] | None = None, order: str = "column") -> Fragment:
    """ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16: lanes 8j .. 8j+7
    give, at `index` of `source` (a shared memref or tile of 16-bit
    elements), the rows of matrix j. Returns this lane's 2 * count values
    as a Fragment whose tile holds the matrices as `blocks` (rows, columns)
    of 8x8 blocks, in `order` "column" (matrix j at block (j % rows,
    j // rows)) or "row" (at (j // columns, j % columns)): (1, 1) for .x1,
    (2, 1) (default) or (1, 2) for .x2, (2, 2) for .x4. Lane l holds row
    l // 4, columns 2 * (l % 4) and +1 of each matrix (of the transposed
    matrix with `transpose`)."""
    if count not in (1, 2, 4):
        raise CompileError(f"ldmatrix loads 1, 2 or 4 matrices, not {count!r}")
    if not isinstance(transpose, bool):
        raise CompileError(f"ldmatrix's transpose is True or False, not {transpose!r}")
    if blocks is None:
        blocks = {1: (1, 1), 2: (2, 1), 4: (2, 2)}[count]
    if blocks not in {1: [(1, 1)], 2: [(2, 1), (1, 2)], 4: [(2, 2)]}[count]:
        raise CompileError(f"ldmatrix .x{count} arranges its matrices as blocks "
                           f"{' or '.join(map(str, {1: [(1, 1)], 2: [(2, 1), (1, 2)], 4: [(2, 2)]}[count]))}, "
                           f"not {blocks!r}")
    if order not in ("column", "row"):
        raise CompileError(f"ldmatrix's order is \"column\" or \"row\", not {order!r}")
    memref, indices = _place(source, index, "ldmatrix's source")
    if not _is_shared(memref):
        raise CompileError("ldmatrix reads shared memory (mg.shared.array / mg.shared.dynamic)")
    if memref.dtype not in (lang.f16, lang.bf16):
        raise CompileError(f"ldmatrix loads 16-bit elements (f16, bf16), not {memref.dtype.name}")
    lang.target().check_access(memref, indices, lang.VECTOR_LOAD, 8)
    rows, columns = blocks
    place = {"column": lambda j: (j % rows, j // rows), "row": lambda j: (j // columns, j % columns)}[order]
    table = tuple(tuple((8 * place(j)[0] + lane // 4, 8 * place(j)[1] + 2 * (lane % 4) + p)
                        for j in range(count) for p in range(2)) for lane in range(_WARP))
    kind = fragment_type(table, memref.dtype, f"ldmatrix .x{count}{'.trans' if transpose else ''} "
                                              f"as {blocks[0]}x{blocks[1]} blocks by {order}s")
    return kind(lang.target().ldmatrix(memref, indices, count, transpose))


# ---------------------------------------------------------------------------
# cp.async

def cp_async(destination: lang.MemRef | Tile, destination_index: lang.Indices, source: lang.MemRef | Tile,
             source_index: lang.Indices, nbytes: int = 16, valid: lang.Scalar | bool | None = None) -> None:
    """Copies `nbytes` (4, 8 or 16) from global `source` at `source_index`
    to shared `destination` at `destination_index` (each a memref or a
    tile; both addresses aligned to nbytes), asynchronously: it lands by the
    wait_group that retires its group. With `valid` (a traced bool) false,
    nothing is read and the destination is zero-filled. 16-byte copies
    bypass L1 (cp.async.cg), smaller ones go through it (cp.async.ca)."""
    if nbytes not in (4, 8, 16):
        raise CompileError(f"cp.async copies 4, 8 or 16 bytes, not {nbytes!r}")
    dst, dst_indices = _place(destination, destination_index, "cp.async's destination")
    src, src_indices = _place(source, source_index, "cp.async's source")
    if not _is_shared(dst):
        raise CompileError("cp.async's destination is shared memory (mg.shared.array / mg.shared.dynamic)")
    if _is_shared(src):
        raise CompileError("cp.async's source is global memory (a kernel's array), not shared memory")
    if dst.dtype != src.dtype:
        raise CompileError(f"cp.async copies between arrays of one dtype, not {src.dtype.name} to "
                           f"{dst.dtype.name}")
    if nbytes % dst.dtype.itemsize:
        raise CompileError(f"{nbytes} bytes are not a whole number of {dst.dtype.name} elements")
    if valid is not None and (not isinstance(valid, lang.Scalar) or valid.dtype != lang.bool_):
        if isinstance(valid, bool):
            valid = lang.constant(valid, lang.bool_)
        else:
            raise CompileError("cp.async's valid is a traced bool (a comparison) or a Python bool")
    elements = nbytes // dst.dtype.itemsize
    lang.target().async_copy(dst, dst_indices, src, src_indices, elements, valid)


def commit_group() -> None:
    """Closes the group of the cp.async copies this thread issued since the last commit_group."""
    lang.target().async_commit()


def wait_group(n: int = 0) -> None:
    """Waits until at most `n` (a Python int) of this thread's committed groups are still in flight."""
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 256:
        raise CompileError(f"wait_group takes a Python int 0..255, not {n!r}")
    lang.target().async_wait(n)


# ---------------------------------------------------------------------------
# What the Targets share: packing 16-bit pairs into 32-bit registers

def pack_pair(low, high):
    """Two 16-bit (or one 32-bit, high None) floats as the bits of one i32 register."""
    if high is None:
        return lang.Scalar(lang.emit("arith.bitcast", [low], [ir.Type.integer(32)]).result, lang.i32)
    halves = []
    for v in (low, high):
        bits = lang.emit("arith.bitcast", [v], [ir.Type.integer(16)]).result
        halves.append(lang.cast(lang.Scalar(bits, lang.u16), lang.u32))
    return lang.cast(halves[0] | (halves[1] << 16), lang.i32)


def unpack_pair(register, dtype):
    """The inverse of pack_pair for a 16-bit dtype: (low, high)."""
    bits = lang.cast(register, lang.u32)
    out = []
    for half in (bits & 0xFFFF, bits >> 16):
        raw = lang.emit("arith.trunci", [half], [ir.Type.integer(16)]).result
        out.append(lang.Scalar(lang.emit("arith.bitcast", [raw], [lang.ir_type(dtype)]).result, dtype))
    return out


def registers(values, dtype):
    """A fragment's values as i32 registers (pairs for 16-bit dtypes)."""
    if dtype.itemsize == 2:
        return [pack_pair(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    return [pack_pair(v, None) for v in values]

