"""mg.TileScheduler: the work units of a persistent kernel (a grid of about one
block or cluster per multiprocessor, each looping over tiles).

    sched = mg.TileScheduler(tiles_m, tiles_n, k_tiles, mode="stream_k")
    for work in sched:                                  # an scf.for over this unit's work
        acc = ...                                       # K-tiles work.k_begin .. work.k_end of tile
        for kt in range(work.k_begin, work.k_end):      # (work.m, work.n)
            ...
        acc, done = sched.fixup(work, partials, counters, acc)
        if done:                                        # this block completes the tile
            C[...] = acc

A work unit is one tile (work.m, work.n) and a range of its K-tiles
[work.k_begin, work.k_end); work.first and work.last say whether it holds the
tile's first and last K-tile. The modes:

- "data_parallel": every unit a whole tile, the units taking tiles in turn.
- "split_k": every tile cut into `split` K slices of (nearly) equal size,
  each slice a work unit.
- "stream_k": the tiles' K-iterations (tiles * k_tiles), laid end to end,
  cut into one contiguous range per persistent unit; a range may begin and
  end inside a tile.
- "hybrid": data-parallel for the full waves of tiles (a multiple of the
  units), stream-K for the tiles left over, which would leave units idle.

Tiles are numbered in grouped order, for L2 reuse: `group` tile rows at a
time, column after column inside the group (Triton's GROUP_SIZE_M). With
`cluster=(cm, cn)` the unit is a cluster of cm * cn blocks along x, which
takes a cm x cn patch of adjacent tiles: block rank r of the cluster the
tile (r % cm, r // cm) of the patch. tiles_m and tiles_n count one block's
tiles and are rounded up to whole patches, so a block's tile may lie past
the edge, where its bounds checks (or TMA's) apply.

The partial sums of a split tile go through a workspace: every unit that
holds part of the tile stores its values (sched.fixup), and the last of them
to arrive, told by an acq_rel atomic counter per tile, adds all the parts in
K order and completes the tile. No unit waits for another, so the order the
blocks run in does not matter (the CPU backend runs them one after another).
The counter is back at zero after each tile, ready for the next launch.
TileScheduler.plan(...) gives, on the host, the grid and the sizes of the
workspace (`partials`, a 2-d array of the values' dtype) and the counters
(an i32 array, zero before the first launch).

GroupedTiles is the schedule of a grouped GEMM (mixture-of-experts): groups
of rows laid end to end, each multiplied by its own B, their row ends read
from device memory by the kernel, so no host ever sees the group sizes. A
unit's linear tile index is mapped to (group, rows, tile column) by walking
the groups' tile counts.
"""
import builtins
from collections import namedtuple

from .. import ir
from .._mlirgpu import CompileError
from . import atomic
from . import core as lang
from . import shared
from .block import _when
from .intrinsics import syncthreads, threadfence

__all__ = ["TileScheduler", "WorkUnit", "Plan", "MODES", "GroupedTiles", "GroupedTile"]

MODES = ("data_parallel", "split_k", "stream_k", "hybrid")

#: The host's view of a schedule: the grid to launch (blocks), the number of
#: persistent units, the shape of the partial-sum workspace and the number of
#: tile counters.
Plan = namedtuple("Plan", "grid units partials counters")


class WorkUnit:
    """One work unit: tile (m, n), K-tiles [k_begin, k_end) of it (index
    values), and first / last: whether it holds the tile's first / last
    K-tile (Python bools where the mode makes them so, else traced)."""

    __slots__ = ("m", "n", "k_begin", "k_end", "first", "last", "_tile", "_slot", "_parts")

    def __init__(self, m, n, k_begin, k_end, first, last, tile=None, slot=None, parts=None):
        self.m, self.n, self.k_begin, self.k_end, self.first, self.last = m, n, k_begin, k_end, first, last
        # The counter of the tile, the workspace row of this part, and
        # (count, row of part c) of the tile's parts, for the fix-up.
        self._tile, self._slot, self._parts = tile, slot, parts

    def __repr__(self):
        return f"<work unit: tile ({self.m}, {self.n}), K-tiles {self.k_begin}..{self.k_end}>"


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _check_size(what, value):
    if _is_int(value):
        if value <= 0:
            raise CompileError(f"mg.TileScheduler: {what} must be positive, not {value}")
    elif not (isinstance(value, lang.Scalar) and lang.is_integer(value.dtype)):
        raise CompileError(f"mg.TileScheduler: {what} must be an int or a traced integer, not "
                           f"{type(value).__name__}")


def _check_options(mode, split, group, cluster, k_tiles):
    """The options every use shares (in kernels and on the host); (cm, cn)."""
    if mode not in MODES:
        raise CompileError(f"mg.TileScheduler: mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}")
    if not _is_int(group) or group <= 0:
        raise CompileError(f"mg.TileScheduler: group must be a positive int, not {group!r}")
    if mode == "split_k":
        if not _is_int(split) or split <= 0:
            raise CompileError(f"mg.TileScheduler: split must be a positive int, not {split!r}")
        if _is_int(k_tiles) and split > k_tiles:
            raise CompileError(f"mg.TileScheduler: split={split} is larger than k_tiles={k_tiles}: "
                               f"some slices would be empty")
    elif split is not None:
        raise CompileError(f"mg.TileScheduler: split= is for mode='split_k', not {mode!r}")
    cluster = (cluster, 1) if _is_int(cluster) else cluster
    if not (isinstance(cluster, tuple) and len(cluster) == 2 and all(_is_int(c) and c > 0 for c in cluster)):
        raise CompileError(f"mg.TileScheduler: cluster must be a positive int or a pair of them, not {cluster!r}")
    return cluster


def _ceil_div(a, b):
    return (a + (b - 1)) // b


def _min(a, b):
    if _is_int(a) and _is_int(b):
        return builtins.min(a, b)
    a, b = lang.unify(lang.as_index(a), lang.as_index(b), "min")
    return lang.select(a < b, a, b)


def _max(a, b):
    a, b = lang.unify(lang.as_index(a), lang.as_index(b), "max")
    return lang.select(a > b, a, b)


def _loop(count, inits, body):
    """scf.for j in [0, count) carrying `inits` (Scalars); body(j, values) ->
    new values; returns the results."""
    types = [v.value.type for v in inits]
    zero, one = lang.constant(0, lang.index), lang.constant(1, lang.index)
    op = lang.emit("scf.for", [zero, lang.as_index(count), one, *inits], types, regions=1)
    block = op.regions[0].append_block([ir.Type.index(), *types], [lang.location()] * (1 + len(types)))
    j, *args = block.arguments
    with ir.InsertionPoint(block):
        new = body(lang.Scalar(j, lang.index), [lang.Scalar(a, v.dtype) for a, v in zip(args, inits)])
        lang.emit("scf.yield", new)
    return [lang.Scalar(r, v.dtype) for r, v in zip(op.results, inits)]


class TileScheduler:
    """The work units of a persistent kernel (see the module's text).

    For example::

        sched = mg.TileScheduler(tiles_m, tiles_n, k_tiles, mode="stream_k")
        for work in sched:
            acc = ...                  # K-tiles work.k_begin .. work.k_end of tile (work.m, work.n)
            acc, done = sched.fixup(work, partials, counters, acc)
            if done:
                C[...] = acc

    tiles_m, tiles_n, k_tiles: the output's tiles and the K-tiles of each
    (Python ints or traced integers). mode: one of MODES. split: the K
    slices per tile of "split_k". group: tile rows per group of the grouped
    order. cluster: the blocks of a unit, an int (along m) or (cm, cn).
    units: the number of persistent units, by default the grid's
    (grid_dim.x // blocks per cluster).
    """

    def __init__(self, tiles_m, tiles_n, k_tiles, *, mode="data_parallel", split=None, group=8, cluster=1,
                 units=None):
        for what, value in (("tiles_m", tiles_m), ("tiles_n", tiles_n), ("k_tiles", k_tiles)):
            _check_size(what, value)
        self.cm, self.cn = _check_options(mode, split, group, cluster, k_tiles)
        blocks = self.cm * self.cn
        if units is None:
            units = lang.grid_dim.x // blocks
        else:
            _check_size("units", units)
        self.mode, self.split, self.group = mode, split, group
        self.k_tiles = lang.as_index(k_tiles)
        self.patches_m, self.patches_n = (lang.as_index(_ceil_div(tiles_m, self.cm)),
                                          lang.as_index(_ceil_div(tiles_n, self.cn)))
        self.tiles = self.patches_m * self.patches_n
        self.units = lang.as_index(units)
        self.unit = lang.block_idx.x // blocks
        self.rank = lang.block_idx.x % blocks
        # The tiles taken whole, in turn: all of them, none, or a hybrid's full waves.
        if mode == "data_parallel":
            self.whole = self.tiles
        elif mode == "hybrid":
            self.whole = self.tiles // self.units * self.units
        else:
            self.whole = lang.constant(0, lang.index)
        if mode in ("stream_k", "hybrid"):
            self.iterations = (self.tiles - self.whole) * self.k_tiles
            # Units past the iterations would have empty ranges: none takes part.
            self.streamers = _min(self.units, _max(self.iterations, 1))

    # -- the loop ---------------------------------------------------------

    def _traced_items(self):
        """What `for work in sched:` in a kernel loops over: the number of this
        unit's work units and the function from an index to its WorkUnit. The
        tracer makes the loop an scf.for over the indices, carrying values
        updated in the body from one work unit to the next, as in any loop."""
        return self.count, self.work

    def _whole_tiles_of_unit(self):
        """The data-parallel share of this unit: whole tiles unit, unit + units, ..."""
        return _ceil_div(_max(self.whole - self.unit, 0), self.units)

    @property
    def count(self):
        """How many work units this unit runs (a traced index)."""
        if self.mode == "split_k":
            total = self.tiles * self.split
            return _ceil_div(_max(total - self.unit, 0), self.units)
        count = self._whole_tiles_of_unit()
        if self.mode == "data_parallel":
            return count
        first, end = self._stream_tiles(self.unit)
        return count + end - first

    def work(self, i):
        """The i-th work unit of this unit (i in [0, count))."""
        i = lang.as_index(i)
        if self.mode == "data_parallel":
            return self._whole_tile(self.unit + i * self.units)
        if self.mode == "split_k":
            return self._slice(self.unit + i * self.units)
        whole = self._whole_tiles_of_unit()
        if self.mode == "hybrid":
            # Both kinds behind one index: a whole tile while i < whole, then stream-K.
            streamed = self._streamed(_max(i - whole, 0))
            tile = self._whole_tile(self.unit + i * self.units)
            is_whole = i < whole
            return WorkUnit(*(lang.select(is_whole, a, b) for a, b in
                              ((tile.m, streamed.m), (tile.n, streamed.n), (tile.k_begin, streamed.k_begin),
                               (tile.k_end, streamed.k_end))),
                            is_whole | streamed.first, is_whole | streamed.last, streamed._tile, streamed._slot,
                            streamed._parts)
        return self._streamed(i)

    # -- each mode's units ------------------------------------------------

    def _coordinates(self, tile):
        """(m, n) of this block for linear tile `tile`, in grouped order."""
        # A hybrid's unit computes both kinds of tile and selects one: the other
        # may lie past the end, where a group would have no rows to divide by.
        tile = _min(tile, self.tiles - 1)
        per_group = self.group * self.patches_n
        first_row = tile // per_group * self.group
        rows = _min(self.patches_m - first_row, self.group)
        within = tile % per_group
        m, n = first_row + within % rows, within // rows
        if self.cm * self.cn == 1:
            return m, n
        return m * self.cm + self.rank % self.cm, n * self.cn + self.rank // self.cm

    def _whole_tile(self, tile):
        m, n = self._coordinates(tile)
        return WorkUnit(m, n, lang.constant(0, lang.index), self.k_tiles, True, True)

    def _of_block(self, i):
        """This block's own of the cluster's i-th workspace row or tile counter."""
        return i * (self.cm * self.cn) + self.rank

    def _slice(self, w):
        tile, s = w // self.split, w % self.split
        m, n = self._coordinates(tile)
        k_begin, k_end = s * self.k_tiles // self.split, (s + 1) * self.k_tiles // self.split
        parts = (lang.constant(self.split, lang.index), lambda c: self._of_block(tile * self.split + c))
        return WorkUnit(m, n, k_begin, k_end, s == 0, s == self.split - 1, self._of_block(tile),
                        self._of_block(w), parts)

    def _range(self, u):
        """[begin, end) of stream-K unit u's K-iterations."""
        return u * self.iterations // self.streamers, (u + 1) * self.iterations // self.streamers

    def _owner(self, iteration):
        """The stream-K unit whose range holds `iteration`."""
        # (hybrid: no iterations when the tiles are whole waves, and then no owners asked for)
        return ((iteration + 1) * self.streamers - 1) // _max(self.iterations, 1)

    def _stream_tiles(self, u):
        """[first, end) of the stream-K tiles (counted after the whole ones) unit u has a part of."""
        begin, end = self._range(u)
        taking = (u < self.streamers) & (begin < end)
        first = begin // self.k_tiles
        return first, lang.select(taking, (end - 1) // self.k_tiles + 1, first)

    def _part_row(self, u, tile):
        """Workspace row of unit u's part of stream-K tile `tile`: two rows per
        unit, one for the tile it begins in and one for the tile it ends in."""
        _, end = self._range(u)
        ends_here = (end - 1) // self.k_tiles == tile
        return self._of_block(u * 2 + lang.cast(ends_here, lang.index))

    def _streamed(self, i):
        first, _ = self._stream_tiles(self.unit)
        tile = first + i
        begin, end = self._range(self.unit)
        base = tile * self.k_tiles
        k_begin = _max(begin, base) - base
        k_end = _min(end, base + self.k_tiles) - base
        owner = self._owner(base)
        parts = (self._owner(base + self.k_tiles - 1) - owner + 1, lambda c: self._part_row(owner + c, tile))
        m, n = self._coordinates(self.whole + tile)
        return WorkUnit(m, n, k_begin, k_end, k_begin == 0, k_end == self.k_tiles,
                        self._of_block(self.whole + tile), self._part_row(self.unit, tile), parts)

    # -- the fix-up -------------------------------------------------------

    def fixup(self, work, partials, counters, values):
        """The fix-up of a split tile: every thread of the block calls it with
        its values of the tile (a list of traced scalars of one dtype, or one
        scalar). Returns (values, done): done is whether this block completes
        the tile, and then values are the sums of every part's, in K order.
        For a whole tile it returns the values as they are and True.

        partials: a 2-d memref (plan().partials) of the values' dtype; thread t
        of a block of T threads puts its j-th value in column j * T + t.
        counters: an i32 memref of plan().counters elements, zero at the first
        launch (each tile's is back at zero when it is done)."""
        single = isinstance(values, lang.Scalar)
        values = [values] if single else list(values)
        if not values or not all(isinstance(v, lang.Scalar) for v in values) or \
                len({v.dtype for v in values}) != 1:
            raise CompileError("sched.fixup takes a traced scalar or a list of traced scalars of one dtype")
        for name, memref, rank in (("partials", partials, 2), ("counters", counters, 1)):
            if not isinstance(memref, lang.MemRef) or memref.ndim != rank:
                raise CompileError(f"sched.fixup: {name} must be a {rank}-d memref")
        if partials.dtype != values[0].dtype:
            raise CompileError(f"sched.fixup: partials holds {partials.dtype.name}, the values are "
                               f"{values[0].dtype.name}")
        if counters.dtype != lang.i32:
            raise CompileError(f"sched.fixup: counters must be i32, not {counters.dtype.name}")
        if work.first is True and work.last is True:
            return (values[0] if single else values), True
        x, y, z = lang.thread_idx.x, lang.thread_idx.y, lang.thread_idx.z
        dx, dy, dz = lang.block_dim.x, lang.block_dim.y, lang.block_dim.z
        thread, threads = (z * dy + y) * dx + x, dx * dy * dz
        split = ~(work.first & work.last)
        with _when(split):
            for j, v in enumerate(values):
                partials[work._slot, thread + j * threads] = v
            threadfence()  # the part is visible at device scope before the counter says so
        syncthreads()
        count, row = work._parts
        # Thread 0 takes a ticket for the block; the last part's ticket completes the tile.
        verdict = shared.array((1,), lang.i32)
        with _when(thread == 0):
            verdict[0] = 1
            with _when(split):
                ticket = atomic.add(counters, work._tile, 1, order="acq_rel")
                last = ticket == lang.cast(count, lang.i32) - 1
                verdict[0] = lang.cast(last, lang.i32)
                with _when(last):
                    atomic.store(counters, work._tile, 0, order="relaxed")
        syncthreads()
        done = verdict[0] != 0
        gather = split & done
        with _when(gather):
            threadfence()  # the other parts, released before their tickets, are read after ours

        def add_part(c, sums):
            return [s + partials[row(c), thread + j * threads] for j, s in enumerate(sums)]

        zero = lang.constant(0, values[0].dtype)
        sums = _loop(lang.select(gather, count, lang.constant(0, lang.index)), [zero] * len(values), add_part)
        values = [lang.select(gather, s, v) for s, v in zip(sums, values)]
        return (values[0] if single else values), done

    # -- the host's side --------------------------------------------------

    @staticmethod
    def plan(tiles_m, tiles_n, k_tiles, *, mode="data_parallel", split=None, group=8, cluster=1, units=None,
             device=0, values=1):
        """The launch of a persistent kernel with this schedule, on the host:
        a Plan of the grid (blocks), the units, the shape of the partials
        workspace (rows, values) and the number of counters. `units` defaults
        to one per multiprocessor of `device` (mode "data_parallel" and
        "split_k" never more than their work units); `values` is the number
        of values one block puts in the workspace (threads * values per thread).
        The workspace and counters have at least one element, so they can
        always be passed."""
        for what, value in (("tiles_m", tiles_m), ("tiles_n", tiles_n), ("k_tiles", k_tiles), ("values", values)):
            if not _is_int(value) or value <= 0:
                raise ValueError(f"TileScheduler.plan: {what} must be a positive int, not {value!r}")
        try:
            cm, cn = _check_options(mode, split, group, cluster, k_tiles)
        except CompileError as error:
            raise ValueError(str(error).replace("mg.TileScheduler", "TileScheduler.plan")) from None
        tiles = _ceil_div(tiles_m, cm) * _ceil_div(tiles_n, cn)
        if units is None:
            from .. import cuda
            units = cuda.Device(device).multiprocessor_count // (cm * cn)
            work = {"data_parallel": tiles, "split_k": tiles * (split or 1)}.get(mode)
            units = builtins.max(1, units if work is None else builtins.min(units, work))
        elif not _is_int(units) or units <= 0:
            raise ValueError(f"TileScheduler.plan: units must be a positive int, not {units!r}")
        blocks = cm * cn
        rows = {"data_parallel": 0, "split_k": tiles * (split or 1), "stream_k": 2 * units,
                "hybrid": 2 * units}[mode] * blocks
        counters = 0 if mode == "data_parallel" else tiles * blocks
        return Plan(units * blocks, units, (builtins.max(rows, 1), values), builtins.max(counters, 1))


#: One tile of a grouped GEMM: its group, its rows [row, row_end) (row_end
#: the group's end: the tile's rows past it belong to the next group), its
#: tile column n, and its K-tiles [k_begin, k_end) (all of them).
GroupedTile = namedtuple("GroupedTile", "group row row_end n k_begin k_end")


class GroupedTiles:
    """The whole tiles of a grouped GEMM, taken in turn by persistent units:
    `offsets` (a 1-d i32 memref) holds the groups' cumulative row ends, group
    g owning rows offsets[g - 1] .. offsets[g] (from 0 for g = 0); each group
    is cut into tiles of `block_m` rows (the last one of a group partial) by
    `tiles_n` columns, row after row, the groups one after another.

        tiles = GroupedTiles(offsets, block_m, tiles_n, k_tiles)
        for tile in tiles:          # tile.group, tile.row .. tile.row_end, tile.n
            ...                     # K-tiles tile.k_begin .. tile.k_end

    units: the persistent units, by default grid_dim.x. `total` is the
    number of tiles and `locate(tile)` the GroupedTile of a linear index,
    for kernels that walk the tiles themselves. Offsets that decrease make
    no sense (the caller's contract): their groups get no tiles or too many."""

    def __init__(self, offsets, block_m, tiles_n, k_tiles, *, units=None):
        if not isinstance(offsets, lang.MemRef) or offsets.ndim != 1 or offsets.dtype != lang.i32:
            raise CompileError("GroupedTiles takes the groups' row ends as a 1-d i32 memref")
        self.offsets, self.block_m, self.tiles_n = offsets, block_m, lang.as_index(tiles_n)
        self.k_tiles = lang.as_index(k_tiles)
        self.units = lang.as_index(lang.grid_dim.x if units is None else units)
        self.unit = lang.block_idx.x
        zero = lang.constant(0, lang.index)
        self.total = self._walk(zero)[0]

    def _walk(self, tile):
        """One pass over the groups: [all their tiles, the last row end, and
        for linear tile `tile` its group, the group's first tile and its
        first row]."""
        zero = lang.constant(0, lang.index)

        def group(g, carried):
            seen, begin, found, first, row = carried
            end = lang.as_index(self.offsets[g])
            count = _ceil_div(_max(end - begin, 0), self.block_m) * self.tiles_n
            hit = (tile >= seen) & (tile < seen + count)
            return [seen + count, end, lang.select(hit, g, found), lang.select(hit, seen, first),
                    lang.select(hit, begin, row)]
        return _loop(self.offsets.shape[0], [zero] * 5, group)

    @property
    def count(self):
        """How many tiles this unit takes (a traced index)."""
        return _ceil_div(_max(self.total - self.unit, 0), self.units)

    def tile(self, i):
        """This unit's i-th tile (a GroupedTile of index values)."""
        return self.locate(self.unit + lang.as_index(i) * self.units)

    def locate(self, tile):
        """Linear tile `tile` (of [0, total)), as a GroupedTile of index values."""
        tile = lang.as_index(tile)
        _, _, group, first, begin = self._walk(tile)
        within = tile - first
        return GroupedTile(group, begin + within // self.tiles_n * self.block_m,
                           lang.as_index(self.offsets[group]), within % self.tiles_n,
                           lang.constant(0, lang.index), self.k_tiles)

    def fixup(self, work, partials, counters, values):
        """TileScheduler.fixup's interface: whole tiles are done as they are."""
        return values, True

    def _traced_items(self):
        """`for tile in tiles:` in a kernel: an scf.for over this unit's tiles."""
        return self.count, self.tile
