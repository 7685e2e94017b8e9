"""Thread-value layouts of the warp-level tensor-core instructions (sm_80 and later).

Each layout maps (thread, value) to the column-major index of the element a
thread's register holds in the instruction's tile, as the PTX ISA's fragment
tables say: for a tile of R rows, element (row, col) has index row + R*col.
The thread mode is the lane (0..31), split as (lane % 4, lane // 4), i.e.
(threadID_in_group, groupID) in the PTX ISA's words; the value mode counts a
thread's elements in register order (a0, a1, ...).

Tiles follow CuTe's convention: A is M x K, B is N x K (B's columns as rows,
so both operands are K-fastest in the "row.col" form of mma.sync) and C/D is
M x N.

>>> from mlirgpu.layout import mma
>>> atom = mma.M16N8K16_F16
>>> print(atom.a)
((4,8),(2,2,2)):((32,1),(16,8,128))
>>> atom.a_coordinate(lane=5, value=2)   # a2 of lane 5: groupID 1 + 8, col 2*1
(9, 2)
"""
from .core import Layout

__all__ = ["MMAAtom", "M16N8K16_F16", "M16N8K16_BF16", "M16N8K8_TF32", "LdmatrixAtom", "ldmatrix"]


def _coordinate(layout, rows, lane, value):
    index = layout(lane, value)
    return index % rows, index // rows


class MMAAtom:
    """One mma.sync instruction: `name` (the PTX mnemonic), `shape` (M, N, K),
    the element types `a_type`, `b_type`, `c_type`, and the thread-value
    layouts `a` (M x K tile), `b` (N x K) and `c` (M x N, also D's).

    >>> atom = M16N8K8_TF32
    >>> atom.shape, atom.a_tile, atom.b_tile, atom.c_tile
    ((16, 8, 8), (16, 8), (8, 8), (16, 8))
    >>> print(atom.b)
    ((4,8),2):((8,1),32)
    """

    __slots__ = ("name", "shape", "a_type", "b_type", "c_type", "a", "b", "c")

    def __init__(self, name: str, shape: tuple[int, int, int], a_type: str, b_type: str, c_type: str, a: Layout,
                 b: Layout, c: Layout) -> None:
        self.name = name
        self.shape = shape
        self.a_type, self.b_type, self.c_type = a_type, b_type, c_type
        self.a, self.b, self.c = a, b, c

    @property
    def a_tile(self) -> tuple[int, int]:
        """(rows, columns) of A's tile: (M, K), (16, 16) for m16n8k16."""
        return (self.shape[0], self.shape[2])

    @property
    def b_tile(self) -> tuple[int, int]:
        """(rows, columns) of B's tile: (N, K), (8, 16) for m16n8k16."""
        return (self.shape[1], self.shape[2])

    @property
    def c_tile(self) -> tuple[int, int]:
        """(rows, columns) of C's and D's tile: (M, N), (16, 8) for m16n8k16."""
        return (self.shape[0], self.shape[1])

    def a_coordinate(self, lane: int, value: int) -> tuple[int, int]:
        """(row, k) of A that register value `value` of `lane` holds:
        `M16N8K16_F16.a_coordinate(5, 2)` is (9, 2)."""
        return _coordinate(self.a, self.shape[0], lane, value)

    def b_coordinate(self, lane: int, value: int) -> tuple[int, int]:
        """(n, k) of B (row n of the N x K tile, i.e. column n of the
        K x N matrix) that register value `value` of `lane` holds:
        `M16N8K16_F16.b_coordinate(5, 3)` is (1, 11)."""
        return _coordinate(self.b, self.shape[1], lane, value)

    def c_coordinate(self, lane: int, value: int) -> tuple[int, int]:
        """(row, column) of C/D that accumulator `value` of `lane` holds:
        `M16N8K16_F16.c_coordinate(31, 3)` is (15, 7)."""
        return _coordinate(self.c, self.shape[0], lane, value)

    def __repr__(self):
        return f"<MMAAtom {self.name}>"


# Lane = threadID_in_group + 4 * groupID; groupID picks the row (stride 1 in
# a column-major tile), threadID_in_group a pair of columns.
_C_16x8 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))

M16N8K16_F16 = MMAAtom(
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    (16, 8, 16),
    "f16",
    "f16",
    "f32",
    # a0..a7: col +1 (i & 1), row +8 (i & 2), col +8 (i & 4).
    a=Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128))),
    # b0..b3 in the 8 x 16 (N x K) tile: k +1 (i & 1), k +8 (i & 2).
    b=Layout(((4, 8), (2, 2)), ((16, 1), (8, 64))),
    c=_C_16x8,
)
"""mma.sync m16n8k16 with f16 inputs and f32 (or f16) accumulators:
`M16N8K16_F16.a(lane, i)` is the index of a_i of `lane` in the 16x16 A tile."""

M16N8K16_BF16 = MMAAtom(
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    (16, 8, 16),
    "bf16",
    "bf16",
    "f32",
    a=M16N8K16_F16.a,
    b=M16N8K16_F16.b,
    c=_C_16x8,
)
"""mma.sync m16n8k16 with bf16 inputs and f32 accumulators (the f16 layouts):
`M16N8K16_BF16.a == M16N8K16_F16.a`."""

M16N8K8_TF32 = MMAAtom(
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    (16, 8, 8),
    "tf32",
    "tf32",
    "f32",
    # a0..a3: row +8 (i & 1), col +4 (i & 2); one column per thread.
    a=Layout(((4, 8), (2, 2)), ((16, 1), (8, 64))),
    # b0, b1 in the 8 x 8 (N x K) tile: k +4.
    b=Layout(((4, 8), 2), ((8, 1), 32)),
    c=_C_16x8,
)
"""mma.sync m16n8k8 with tf32 inputs and f32 accumulators:
`M16N8K8_TF32.a_coordinate(0, 1)` is (8, 0)."""


class LdmatrixAtom:
    """One ldmatrix.sync.aligned.m8n8.x{count}{.trans}.b16 instruction
    (attributes `count`, `transpose`, `tile`, `source`, `destination`).

    The 8x8 matrices it loads are laid out in a tile, matrix j at block
    (j % 2, j // 2) of 8x8 blocks: 8x8 for x1, 16x8 for x2, 16x16 for x4
    (so x4 loads exactly the A fragment of m16n8k16).

    - `source` maps a lane to the index (in the tile) of the first element
      of the 8-element row whose address that lane supplies (lanes 0-7 for
      matrix 0, 8-15 for matrix 1, ...).
    - `destination` maps (lane, value) to the index of the element that
      register value `value` of `lane` receives; without .trans lane l gets
      row l // 4, columns 2*(l % 4) and +1 of each matrix, with .trans the
      transposed element (column l // 4, rows 2*(l % 4) and +1).
    """

    __slots__ = ("count", "transpose", "tile", "source", "destination")

    def __init__(self, count: int, transpose: bool, tile: tuple[int, int], source: Layout, destination: Layout) -> None:
        self.count = count
        self.transpose = transpose
        self.tile = tile
        self.source = source
        self.destination = destination

    @property
    def instruction(self) -> str:
        """The PTX mnemonic: `ldmatrix(4, transpose=True).instruction` is
        'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16'."""
        trans = ".trans" if self.transpose else ""
        return f"ldmatrix.sync.aligned.m8n8.x{self.count}{trans}.shared.b16"

    def __repr__(self):
        return f"<LdmatrixAtom {self.instruction}>"


def ldmatrix(count: int, transpose: bool = False) -> LdmatrixAtom:
    """The layouts of ldmatrix .x1, .x2 or .x4 (`count` matrices), optionally .trans.

    >>> atom = ldmatrix(4)
    >>> atom.tile
    (16, 16)
    >>> print(atom.source)
    (8,2,2):(1,8,128)
    >>> atom.destination == M16N8K16_F16.a
    True
    """
    if count not in (1, 2, 4):
        raise ValueError(f"ldmatrix loads 1, 2 or 4 matrices, not {count!r}")
    rows = 8 if count == 1 else 16
    tile = (rows, 8 if count < 4 else 16)
    matrices = {1: (), 2: (2,), 4: (2, 2)}[count]
    # Matrix j sits at row block j % 2 (offset 8) and column block j // 2
    # (offset 8 * rows); a thread's row address starts a row of the matrix.
    block_strides = (8, 8 * rows)[: len(matrices)]
    source = Layout((8, *matrices), (1, *block_strides)) if matrices else Layout(8, 1)
    if transpose:
        # Lane l: column l // 4, rows 2*(l % 4) and +1.
        thread = ((4, 8), (2, rows))
        pair = 1
    else:
        # Lane l: row l // 4, columns 2*(l % 4) and +1.
        thread = ((4, 8), (2 * rows, 1))
        pair = rows
    value_shape = (2, *matrices)
    value_stride = (pair, *block_strides)
    destination = Layout((thread[0], value_shape), (thread[1], value_stride))
    if not matrices:
        destination = Layout((thread[0], 2), (thread[1], pair))
    return LdmatrixAtom(count, transpose, tile, source, destination)
