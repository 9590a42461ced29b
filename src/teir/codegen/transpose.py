"""The transposed unary kernel ``B := op(A^T)``: square register blocks of one vector's width,
transposed by a butterfly of shuffles, placed and ordered for the memory system.

Two things decide its speed more than the shuffles do (measured on Zen 4, 512² FP64 in L3):

- **Cache-line splits.** A block's rows are vectors of A, its columns vectors of B. When the
  arrays are not vector-aligned (NumPy gives 16-byte alignment), every vector straddles two
  lines and the other half is needed again only a whole strip later, long evicted: 128² FP64
  ran at 56 % of the copy bandwidth misaligned and 97 % aligned. The block grid is therefore
  shifted at run time so that A's rows start on a vector boundary in j and B's columns in i
  (where the leading dimensions keep that alignment for every row and column).
- **L1 set conflicts.** When a block's rows lie a multiple of 2-4 KiB apart, all of them, and
  those of the next blocks down the strip, map to one 8-way L1 set, and the hardware stride
  prefetcher evicts lines before they are read (512² FP64: 47 % of the copy bandwidth). Then
  the blocks are visited in tiles of T x T blocks along diagonals, so that consecutive blocks
  differ in both their A and their B lines' sets (512² FP64: 81 %). Without conflicts the plain
  order (down B's columns, A read as one strided stream) is faster, so it stays the default.
  A tile of a loop nest (``streamed``: the nest, not the kernel, orders the memory traffic) is
  crossed in rows of blocks instead, each along A's rows, with A's grid left unshifted: A is
  then read a few whole lines at a time from `lanes` rows, its split lines used at once.
  Except where B's columns lie a multiple of 2-4 KiB apart (``crowded_columns``): then every
  block stores all its lines into one L1 set, and along A's rows so does every block of the
  row, each line read for ownership and evicted again before the next is stored (1024^2
  FP32, 64 x 64 tiles, one thread: 14 GB/s against 90 at 1000^2; in a C model of the same
  kernel, 22 GB/s along A's rows, 40 down B's columns, 53 and 69 with streaming stores).
  Such a tile goes down B's columns, consecutive blocks storing into consecutive sets, with
  A's grid shifted onto its lines (clamped overlapping edge blocks) so that no line of A is
  needed again a column of blocks later; the lowering streams B and gives the tile short
  columns and long rows of A (``teir.optimizer.primitive.CROWDED_ROW_BYTES``).

Columns of B that lie no whole number of lines apart cannot share one shifted grid; a tile of
a loop nest that goes around the caches then shifts each column on its own (one two-source
permute per vector: :meth:`_Transpose.shifted_columns`).

Joined tiles (``UnarySpec.joined``, a loop nest's tiles whose short columns the next tile
continues): the line two such tiles share is stored whole, around the caches, by the tile
before it, completed from the next tile's first rows of A, and skipped by the tile after it,
rather than in two masked halves by regular stores that read it for ownership.

Edges: along A's columns, the first and last blocks of a shifted grid are full blocks moved
inwards to the bounds (``clamp(offset + k * lanes, 0, extent - lanes)``), overlapping their
neighbours. Writing an element of B twice with the same value is harmless (A and B never
overlap), and those blocks run the same unmasked code: a masked access with an empty mask past
the arrays' end costs a microcode assist (512² FP32: 67 % -> 27 % of the copy bandwidth).
Along B's rows, clamped blocks would store lines that their neighbours stream (non-temporal
and regular stores to one line collapsed a 2048² FP32 transpose in 128 x 16 tiles from 38 to
14 GB/s), so the first and last blocks of a shifted grid reach outside the rows instead, with
those lanes masked off. Their vectors stay within the aligned vectors that hold B's first and
last elements, never empty: no other page is touched and no assist is taken. Only a dimension
shorter than a vector uses compile-time masks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from teir.codegen.specs import UnarySpec
    from teir.codegen.unary import _UnaryEmitter

LINE_BYTES = 64
L1_SETS = 64
L1_WAYS = 8
# a streamed tile whose blocks store this many of their lines into one L1 set goes down B's
# columns: FP32 rows 2 KiB apart (8 per set) ran at a third of the rate of 3 KiB (4 per set)
# in the C model, on Zen 5's 12-way L1 as well
CROWDED_STORES = 8
# tile edge (in blocks) of the diagonal order; 4-8 measured alike, 2 too small to spread sets
DIAGONAL_TILE = 8
# the least blocks along a dimension for which the grid is shifted to the arrays' alignment:
# each shift adds a block per row or column of blocks (FP32 64²: 51 % unshifted, 35 % shifted;
# 128²: 64 % -> 78 %)
SHIFT_BLOCKS = 8

# ... and in a tile gone down crowded columns (``crowded_columns``), A's columns from this
# many blocks on: its lines then serve one block each instead of two a column of blocks apart
DOWN_SHIFT_BLOCKS = 2

# shifted columns at least this long, from rows of A at least this long, are crossed in rows of
# blocks (_Transpose.shifted_columns)
ACROSS_BYTES = 256
# the most stack that buffer of one vector per column may take (well within what runs
# unchecked: teir.runtime.stack.UNCHECKED_BYTES); wider tiles go down the columns
ACROSS_BUFFER_BYTES = 32 * 1024

# transposes whose A and B together take at most this many bytes use half-width blocks
# where vectors are 512 bits: in cache they are bound by the core, not by memory, and
# 256-bit shuffles and stores cost half as much where 512-bit ones are double-pumped (Zen 4).
# Measured (fraction of the copy bandwidth, 16- vs 8-lane FP32 blocks): 64² 48 % -> 70 %,
# 96² 86 -> 94 %, 128 x 64 59 -> 75 %; FP64 32² 57 -> 79 %, 64² 78 -> 84 %; but 128² FP32
# 69 -> 62 % and FP64 78 -> 55 %, where the half-line blocks cost more in the memory system.
HALF_WIDTH_BYTES = 64 * 1024

Size = str | int


def transpose_lanes(spec: UnarySpec, lanes: int) -> int:
    """The block width (in elements) for ``spec`` on a target with ``lanes``-wide vectors."""
    footprint = spec.itemsize * (spec.extent_a() + spec.extent_b())
    if lanes * spec.itemsize == 64 and footprint <= HALF_WIDTH_BYTES:
        return lanes // 2
    return lanes


def set_crowding(stride_bytes: int, count: int) -> int:
    """The most of ``count`` cache lines ``stride_bytes`` apart that share one L1 set."""
    sets = Counter((r * stride_bytes // LINE_BYTES) % L1_SETS for r in range(count))
    return max(sets.values())


def crowded_columns(ldb_bytes: int, lanes: int) -> bool:
    """Whether the ``lanes`` columns of B a block stores, ``ldb_bytes`` apart, crowd one L1
    set (CROWDED_STORES of their lines or more)."""
    return set_crowding(ldb_bytes, lanes) >= CROWDED_STORES


def diagonal_tile(lda_bytes: int, blocks_i: int, blocks_j: int, lanes: int) -> int:
    """Tile edge of the diagonal order, or 0 for the plain order: diagonals only pay when the
    rows of two consecutive blocks of A crowd an L1 set (>= its ways)."""
    if set_crowding(lda_bytes, 2 * lanes) < L1_WAYS:
        return 0
    tile = DIAGONAL_TILE
    while tile > 1 and (blocks_i < tile or blocks_j < tile):
        tile //= 2
    return tile if tile >= 4 else 0


@dataclass(frozen=True)
class _Axis:
    """The blocks of one dimension: ``count`` full blocks, block k starting at
    ``clamp(offset + k * lanes, 0, extent - lanes)``, then a compile-time ``tail`` (a partial
    block at ``count * lanes``) where the grid is not shifted."""

    extent: int
    offset: Size  # in (-lanes, 0]: minus the elements before the first aligned block
    count: Size
    tail: int
    least_count: int  # the fewest full blocks any alignment gives (for compile-time choices)
    # a shifted grid's first and last blocks reach outside the extent, masked, rather than
    # being clamped inside it
    masked_edges: bool = False

    @property
    def tail_start(self) -> int:
        return self.extent - self.tail  # a tail exists only where the grid is not shifted


class _Transpose:
    def __init__(self, emitter: _UnaryEmitter, streamed: bool) -> None:
        self.streamed = streamed
        self.e = emitter
        self.f = emitter.f
        self.lanes = emitter.lanes
        self.spec = emitter.spec
        self.vector_bytes = self.lanes * self.spec.itemsize
        self.masked_rows = False
        self.joined = False  # lines shared with the neighbouring tiles stored whole, once
        self.before = self.after = ""  # the joined kernel's flags (nonzero: a tile there)

    # ---- loops and integers that fold compile-time values ------------------------------------
    def for_range(self, count: Size, body: Callable[[str], None], hint: str) -> None:
        """``for index in range(count)`` for a compile-time or run-time count."""
        if isinstance(count, int):
            if count >= 1:

                def counted(index: str, _: list[str]) -> list[str]:
                    body(index)
                    return []

                self.f.loop(count, [], counted, hint)
            return
        self.f.range_loop(0, count, body, hint)

    def axis(
        self,
        extent: int,
        pointer: str,
        ld: int,
        shift: bool = True,
        masked_edges: bool = False,
        least: int = SHIFT_BLOCKS,
    ) -> _Axis:
        """The blocks along one dimension, aligned to ``pointer``'s vector boundaries where that
        pays and the leading dimension keeps every row (column) equally aligned."""
        lanes, f, size = self.lanes, self.f, self.spec.itemsize
        whole, tail = divmod(extent, lanes)
        # B's streamed rows in a tile between buffers in memory are shifted however short:
        # unshifted, every store into a misaligned B is a regular one, its line read for
        # ownership first
        if masked_edges and self.streamed and self.spec.stream_b:
            least = 1
        if not shift or whole < least or (ld * size) % self.vector_bytes:
            # a compile-time tail: overlapping it with the last block measured slower here
            # (FP32 33 x 40: 44 % -> 28 % of the copy bandwidth)
            return _Axis(extent, 0, whole, tail, whole)
        misaligned = f.misaligned_bytes(pointer, self.vector_bytes)
        # the block after the first boundary starts at lanes - misaligned / size: one before it
        offset = f.assign(f"lshr i64 {misaligned}, {size.bit_length() - 1}", "a")
        offset = f.assign(f"sub i64 0, {offset}", "a")
        count = f.assign(f"sub i64 {extent + lanes - 1}, {offset}", "a")
        count = f.assign(f"lshr i64 {count}, {lanes.bit_length() - 1}", "a")
        return _Axis(extent, offset, count, 0, whole, masked_edges)

    def tiles(self, count: Size, tile: int) -> Size:
        """``ceil(count / tile)`` for a power-of-two tile."""
        if isinstance(count, int):
            return -(-count // tile)
        summed = self.f.assign(f"add i64 {count}, {tile - 1}", "i")
        return self.f.assign(f"lshr i64 {summed}, {tile.bit_length() - 1}", "i")

    def start(self, axis: _Axis, k: Size) -> Size:
        f = self.f
        position = f.add_i64(axis.offset, f.mul_i64(k, self.lanes))
        if isinstance(axis.offset, int) or axis.masked_edges:
            return position  # not shifted (full blocks only up to the tail), or masked
        position = f.assign(f"call i64 @llvm.smax.i64(i64 {position}, i64 0)", "i")
        return f.assign(
            f"call i64 @llvm.smin.i64(i64 {position}, i64 {axis.extent - self.lanes})", "i"
        )

    # ---- blocks ---------------------------------------------------------------------------------
    def block(self, i0: Size, j0: Size, rows: int, cols: int) -> None:
        """B[i0 : i0+rows, j0 : j0+cols] := op(A^T) of it (``rows``, ``cols`` <= lanes); on a
        shifted row grid ``i0`` may start before 0 or end past ``m``, and such a block is masked."""
        if self.masked_rows and rows == self.lanes:
            f = self.f
            # unsigned: a block starting before 0 compares as huge
            edge = f.assign(f"icmp ugt i64 {i0}, {self.spec.m - self.lanes}", "c")
            f.when(
                edge,
                lambda: self.masked_row_block(i0, j0, cols),
                lambda: self.inner_block(i0, j0, rows, cols, aligned=True),
            )
            return
        self.inner_block(i0, j0, rows, cols, aligned=False)

    def masked_row_block(self, i0: Size, j0: Size, cols: int) -> None:
        """The first or last block of a shifted row grid: B's vectors lie on vector boundaries
        but reach before row 0 or past row m - 1; those lanes are masked off the stores and
        their rows of A are not read (a valid row is read again instead, its lanes unused).
        A masked vector stays within the aligned vector holding B's first or last element,
        so it never touches another page."""
        if self.joined:
            self.joined_row_block(i0, j0, cols)
            return
        self.masked_row_edge(i0, j0, cols)

    def joined_row_block(self, i0: Size, j0: Size, cols: int) -> None:
        """The first or last block of a shifted row grid in a joined tile (``UnarySpec.joined``):
        the line B shares with the tile before it (bit 0 of ``%joins``) is that tile's to
        store, and the line it shares with the tile after it (bit 1) is stored whole here,
        around the caches, its last rows read from the next tile's A (``%nextA``). A side
        without a neighbour is masked as in an unjoined tile. In two masked halves, each
        regular store reads its line for ownership and holds up the streaming stores behind
        it: ijkl->lkji 48^4 FP64, 48-element columns 16 bytes past a line, one thread 14.5
        -> 20 GB/s joined (64-byte-aligned arrays, with no shared lines: 21-23)."""
        f = self.f
        first = f.assign(f"icmp slt i64 {i0}, 0", "c")
        flag = f.assign(f"select i1 {first}, i64 {self.before}, i64 {self.after}", "i")
        neighbour = f.assign(f"icmp ne i64 {flag}, 0", "c")

        def shared() -> None:  # the first block's line is the tile before's to store
            last = f.assign(f"xor i1 {first}, true", "c")
            f.when(last, lambda: self.completed_block(i0, j0, cols))

        f.when(neighbour, shared, lambda: self.masked_row_edge(i0, j0, cols))

    def completed_block(self, i0: Size, j0: Size, cols: int) -> None:
        """The last block of the row grid, its rows past m taken from the next tile's A
        (rows ``m ..`` of B are the next tile's rows ``0 ..``), stored whole and streamed."""
        e, f, spec, lanes = self.e, self.f, self.spec, self.lanes
        vectors = []
        for ii in range(lanes):
            row = f.assign(f"add i64 {i0}, {ii}", "i")
            inside = f.assign(f"icmp slt i64 {row}, {spec.m}", "c")
            wrapped = f.assign(f"sub i64 {row}, {spec.m}", "i")
            row = f.assign(f"select i1 {inside}, i64 {row}, i64 {wrapped}", "i")
            base = f.assign(f"select i1 {inside}, ptr %A, ptr %nextA", "p")
            vectors.append(e.load(base, f.add_i64(j0, e.a_row(row)), cols))
        columns = e.transpose(vectors)
        for jj in range(cols):
            offset = f.add_i64(i0, f.mul_i64(f.add_i64(j0, jj), spec.ldb))
            value = e.apply(columns[jj], i0, f.add_i64(j0, jj))
            e.store(value, "%B", offset, lanes, streamed=True)

    def masked_row_edge(self, i0: Size, j0: Size, cols: int) -> None:
        """``masked_row_block`` without neighbours."""
        e, f, spec, lanes = self.e, self.f, self.spec, self.lanes
        before = f.assign(f"sub i64 0, {i0}", "i")
        before = f.assign(f"call i64 @llvm.smax.i64(i64 {before}, i64 0)", "i")
        within = f.assign(f"sub i64 {spec.m}, {i0}", "i")
        within = f.assign(f"call i64 @llvm.smin.i64(i64 {within}, i64 {lanes})", "i")
        high = f.assign(f"shl i64 1, {within}", "i")
        low = f.assign(f"shl i64 1, {before}", "i")
        bits = f.assign(f"sub i64 {high}, {low}", "i")  # lanes [before, within)
        mask = self.lane_mask(bits)
        vectors = []
        for ii in range(lanes):
            row = f.assign(f"add i64 {i0}, {ii}", "i")
            row = f.assign(f"call i64 @llvm.smax.i64(i64 {row}, i64 0)", "i")
            row = f.assign(f"call i64 @llvm.smin.i64(i64 {row}, i64 {spec.m - 1})", "i")
            vectors.append(e.load("%A", f.add_i64(j0, e.a_row(row)), cols))
        columns = e.transpose(vectors)
        for jj in range(cols):
            offset = f.add_i64(i0, f.mul_i64(f.add_i64(j0, jj), spec.ldb))
            value = e.apply(columns[jj], i0, f.add_i64(j0, jj), mask=mask)
            self.masked_store(value, offset, mask)

    def lane_mask(self, bits: str) -> str:
        """The lane mask whose lane t is bit t of the i64 ``bits``."""
        f, lanes = self.f, self.lanes
        narrow = f.assign(f"trunc i64 {bits} to i{lanes}", "m")
        return f.assign(f"bitcast i{lanes} {narrow} to <{lanes} x i1>", "m")

    def masked_store(self, value: str, offset: Size, mask: str) -> None:
        """Store the lanes of ``value`` that ``mask`` (a run-time mask) selects at B plus
        ``offset`` elements, a vector that may start before B (so the address is not
        inbounds) but stays within the aligned vector holding one of B's elements."""
        e, f = self.e, self.f
        pointer = f.assign(f"getelementptr {e.t}, ptr %B, i64 {offset}", "p")
        f.emit(
            f"call void @llvm.masked.store.{e.suffix}.p0({e.vt} {value}, ptr {pointer}, "
            f"i32 {self.spec.itemsize}, <{self.lanes} x i1> {mask})"
        )

    def inner_block(self, i0: Size, j0: Size, rows: int, cols: int, aligned: bool) -> None:
        """A block within the bounds; ``aligned``: B's vectors are known to lie on vector
        boundaries."""
        e, f, spec, lanes = self.e, self.f, self.spec, self.lanes
        if rows < lanes or cols < lanes:
            e.constant_edge_block(i0, j0, rows, cols)
            return
        vectors = [
            e.load("%A", f.add_i64(j0, e.a_row(f.add_i64(i0, ii))), lanes) for ii in range(lanes)
        ]
        columns = [
            e.apply(column, i0, f.add_i64(j0, jj)) for jj, column in enumerate(e.transpose(vectors))
        ]

        def store(streamed: bool) -> None:
            for jj, column in enumerate(columns):
                offset = f.add_i64(i0, f.mul_i64(f.add_i64(j0, jj), spec.ldb))
                e.store(column, "%B", offset, lanes, streamed)

        if spec.stream_b and aligned:
            store(True)
        elif spec.stream_b and (spec.ldb * spec.itemsize) % self.vector_bytes == 0:
            # around the caches where the block's columns start on vector boundaries
            misaligned = f.misaligned_bytes(f.gep(e.t, "%B", i0), self.vector_bytes)
            on_boundary = f.assign(f"icmp eq i64 {misaligned}, 0", "c")
            f.when(on_boundary, lambda: store(True), lambda: store(False))
        else:
            store(False)

    def run_by_run(self, cols: _Axis) -> None:
        """A transposed A in runs onto a vector-aligned B, one run after the other."""
        f, spec, lanes = self.f, self.spec, self.lanes

        def one_run(q: str) -> None:
            def row_of_blocks(ib: str) -> None:
                i0 = f.add_i64(f.mul_i64(q, spec.m_inner), f.mul_i64(ib, lanes))
                self.for_range(
                    cols.count,
                    lambda jb: self.inner_block(i0, self.start(cols, jb), lanes, lanes, True),
                    "jb",
                )
                if cols.tail:
                    self.inner_block(i0, cols.tail_start, lanes, cols.tail, True)

            self.for_range(spec.m_inner // lanes, row_of_blocks, "ib")

        f.range_loop(0, spec.m // spec.m_inner, one_run, "run")

    # ---- columns stored in whole lines, each on its own boundaries ------------------------------
    def shifts_columns(self) -> bool:
        """Whether B's columns start at different offsets within a line (a leading dimension
        that is no whole number of lines) and still go around the caches: each column is
        then stored in line-aligned vectors of its own, shifted across two blocks."""
        spec = self.spec
        return (
            self.streamed
            and spec.stream_b
            and self.vector_bytes == LINE_BYTES
            and (spec.ldb * spec.itemsize) % LINE_BYTES != 0
            and spec.m >= 2 * self.lanes
            and spec.n >= self.lanes
        )

    def shifted_columns(self) -> None:
        """B's columns stored in line-aligned vectors of their own: column j's vectors start
        where its first line boundary falls (``s_j`` elements before its start), each made
        of the last ``s_j`` rows of one transposed block and the first rows of the next (one
        two-source permute), and are stored around the caches; only the partial lines at a
        column's two ends are stored normally (masked), and no line gets both kinds of
        store. ``s_j`` steps by ``ldb mod lanes`` from column to column, so every block of
        columns has the same shifts.

        Long columns from long rows of A are crossed in rows of blocks, each along A's rows
        (A read as `lanes` streams), the block above's columns waiting in a buffer of one
        vector per column; otherwise (either under ACROSS_BYTES) the tile goes down one
        block of columns at a time, its columns carried in registers (FP32, 2 threads, in
        one process: ij->ji 4001 x 2999 in 400 x 176 tiles 1.23x across, 3000^2 1.34x,
        ijk->kji 150^3 1.33x, 97x301x257 in 97 x 257 tiles 1.36x; ijkl->ljki 37x41x43x47,
        37 x 47 tiles, 0.2-0.6x across, 45^4 in runs, 225 x 45 tiles, 0.8x; with 128 bytes
        as the bound, ljki and lkji at 37x41x43x47 0.63-0.67x).

        Without it a misaligned transpose between buffers in memory stored every line
        normally, each read for ownership first, scattered across the output (ij->ji
        1500 x 2250 FP32, one thread: 1.2 GB/s, NumPy 3.4)."""
        columns = _ShiftedColumns(self)
        spec = self.spec
        wide = min(spec.m, spec.n) * spec.itemsize >= ACROSS_BYTES
        if wide and spec.n * self.vector_bytes <= ACROSS_BUFFER_BYTES:
            columns.across()
        else:
            columns.down()

    # ---- traversal ------------------------------------------------------------------------------
    def emit(self) -> None:
        spec, f = self.spec, self.f
        self.e.module.declare("smax.i64", "declare i64 @llvm.smax.i64(i64, i64)")
        self.e.module.declare("smin.i64", "declare i64 @llvm.smin.i64(i64, i64)")
        if spec.joined:
            self.before = f.assign("and i64 %joins, 1", "i")
            self.after = f.assign("and i64 %joins, 2", "i")
        if self.shifts_columns():
            self.joined = spec.joined
            self.shifted_columns()
            return
        # B's rows are shifted with masked first and last blocks, A's columns with clamped
        # overlapping ones: a clamped block of B mixes regular and streaming stores on the
        # lines it shares with its neighbour, which collapsed 128 x 16 FP32 tiles of a
        # 2048^2 transpose into a NumPy-allocated output to 14 GB/s against 38 aligned
        rows = self.axis(spec.m, "%B", spec.ldb, masked_edges=True)
        # A's rows keep their alignment where both of its leading dimensions do
        lda = math.gcd(spec.lda, spec.lda_outer) if spec.m_inner else spec.lda
        # B's columns crowding an L1 set are gone down, A's grid shifted
        down = self.streamed and crowded_columns(spec.ldb * spec.itemsize, self.lanes)
        cols = self.axis(
            spec.n,
            "%A",
            lda,
            shift=down or not self.streamed,
            least=DOWN_SHIFT_BLOCKS if down else SHIFT_BLOCKS,
        )
        self.masked_rows = rows.masked_edges
        self.joined = spec.joined and self.masked_rows and spec.m >= self.lanes

        lanes = self.lanes

        def at(ib: Size, jb: Size) -> None:
            self.block(self.start(rows, ib), self.start(cols, jb), lanes, lanes)

        # the compile-time tails: below the full blocks, right of them, and in the corner
        def tails() -> None:
            if rows.tail:
                self.for_range(
                    cols.count,
                    lambda jb: self.block(rows.tail_start, self.start(cols, jb), rows.tail, lanes),
                    "tj",
                )
            if cols.tail:
                self.for_range(
                    rows.count,
                    lambda ib: self.block(self.start(rows, ib), cols.tail_start, lanes, cols.tail),
                    "ti",
                )
            if rows.tail and cols.tail:
                self.block(rows.tail_start, cols.tail_start, rows.tail, cols.tail)

        # down B's columns: B written as `lanes` streams, A read as one strided stream
        def down_columns() -> None:
            self.for_range(
                cols.count,
                lambda jb: self.for_range(rows.count, lambda ib: at(ib, jb), "ib"),
                "jb",
            )
            tails()

        if down:  # consecutive blocks store into consecutive sets (see the module's docstring)
            down_columns()
            return
        if self.streamed:
            # across B's rows of blocks, each along A's rows: A read as runs of a few lines
            # from `lanes` rows at a time, B's shifted rows streamed in whole lines
            def shifted() -> None:
                self.for_range(
                    rows.count,
                    lambda ib: self.for_range(cols.count, lambda jb: at(ib, jb), "jb"),
                    "ib",
                )
                tails()

            if (
                self.masked_rows
                and spec.m_inner
                and spec.stream_b
                and not (spec.m_inner * spec.itemsize % self.vector_bytes)
            ):
                # B on a vector boundary: every run of A's rows fills whole vectors of B, so
                # the runs go one after the other, A read from one run's rows at a time
                # (ijkl->ljki 48^4 FP64 aligned: 40 GB/s across runs, 47 run by run)
                misaligned = f.misaligned_bytes("%B", self.vector_bytes)
                aligned = f.assign(f"icmp eq i64 {misaligned}, 0", "c")
                f.when(aligned, lambda: self.run_by_run(cols), shifted)
            else:
                shifted()
            return
        tile = diagonal_tile(
            spec.lda * spec.itemsize, rows.least_count, cols.least_count, self.lanes
        )
        if not tile:
            down_columns()
            return

        # Tiles of up to tile x tile blocks (partial at the far edges), each visited along its
        # wrapped diagonals: step t of diagonal s is block (t, (t + s) mod width). One loop
        # nest for full and partial tiles keeps a single copy of the block's code.
        def extent(blocks: Size, index: str) -> str:
            left = f.assign(f"sub i64 {blocks}, {f.mul_i64(index, tile)}", "i")
            return str(f.umin_i64(left, tile))

        def tile_column(tj: str) -> None:
            width = extent(cols.count, tj)

            def one_tile(ti: str) -> None:
                height = extent(rows.count, ti)

                def diagonal(s: str) -> None:
                    def step(t: str) -> None:
                        skewed = f.assign(f"add i64 {t}, {s}", "i")
                        skewed = f.assign(f"urem i64 {skewed}, {width}", "i")
                        at(
                            f.add_i64(f.mul_i64(ti, tile), t),
                            f.add_i64(f.mul_i64(tj, tile), skewed),
                        )

                    f.range_loop(0, height, step, "dt")

                f.range_loop(0, width, diagonal, "ds")

            self.for_range(self.tiles(rows.count, tile), one_tile, "ti")

        self.for_range(self.tiles(cols.count, tile), tile_column, "tj")
        tails()


class _ShiftedColumns:
    """The traversals of :meth:`_Transpose.shifted_columns` and what they share."""

    def __init__(self, transpose: _Transpose) -> None:
        self.t = transpose
        e, f, spec, lanes = transpose.e, transpose.f, transpose.spec, transpose.lanes
        self.e, self.f, self.spec, self.lanes = e, f, spec, lanes
        size = spec.itemsize
        kind = "ps" if size == 4 else "pd"
        self.index_type = f"<{lanes} x i{8 * size}>"
        # 64-byte vectors are AVX-512's, whose two-source permute takes run-time indices
        self.permute = f"@llvm.x86.avx512.vpermi2var.{kind}.512"
        e.module.declare(
            f"vpermi2var.{kind}",
            f"declare {e.vt} {self.permute}({e.vt}, {self.index_type}, {e.vt})",
        )
        self.blocks, self.tail = divmod(spec.m, lanes)
        self.shifts: list[str] = []
        self.indices: list[str] = []

    def column_shifts(self, j0: Size) -> None:
        """The shifts (and permute indices) of columns ``j0 .. j0 + lanes - 1``, from
        column ``j0``'s: the same for every ``j0`` that is a multiple of ``lanes``."""
        f, spec, lanes = self.f, self.spec, self.lanes
        size = spec.itemsize
        step = spec.ldb % lanes  # lanes * size is a line
        start = f.gep(self.e.t, "%B", f.mul_i64(j0, spec.ldb))
        misaligned = f.misaligned_bytes(start, LINE_BYTES)
        first = f.assign(f"lshr i64 {misaligned}, {size.bit_length() - 1}", "s")
        self.shifts, self.indices = [], []
        iota = "<" + ", ".join(f"i{8 * size} {t}" for t in range(lanes)) + ">"
        for jj in range(lanes):
            shift = f.assign(f"add i64 {first}, {jj * step}", "s")
            shift = f.assign(f"and i64 {shift}, {lanes - 1}", "s")
            self.shifts.append(shift)
            # lane t of the joined vector is lane lanes - shift + t of (above, below)
            index = f.assign(f"sub i64 {lanes}, {shift}", "s")
            if size == 4:
                index = f.assign(f"trunc i64 {index} to i32", "s")
            one = f.assign(
                f"insertelement {self.index_type} undef, i{8 * size} {index}, i64 0", "x"
            )
            splat = f.assign(
                f"shufflevector {self.index_type} {one}, {self.index_type} undef, "
                f"<{lanes} x i32> zeroinitializer",
                "x",
            )
            self.indices.append(f.assign(f"add {self.index_type} {splat}, {iota}", "x"))

    # ---- pieces ---------------------------------------------------------------------------------
    def joined(self, above: str, below: str, jj: int) -> str:
        e = self.e
        return self.f.assign(
            f"call {e.vt} {self.permute}({e.vt} {above}, {self.index_type} "
            f"{self.indices[jj]}, {e.vt} {below})",
            "v",
        )

    def at(self, j0: Size, jj: int, row: Size) -> str:
        """The element offset of row ``row - shift`` of column ``j0 + jj``."""
        f = self.f
        column = f.add_i64(row, f.mul_i64(f.add_i64(j0, jj), self.spec.ldb))
        return f.assign(f"sub i64 {column}, {self.shifts[jj]}", "i")

    def masked_store(self, value: str, offset: str, bits: str) -> None:
        """Store the lanes of ``value`` that the i64 ``bits`` select (a line-aligned vector
        may start before B: its first column)."""
        self.t.masked_store(value, offset, self.t.lane_mask(bits))

    def prefix_bits(self, count: str) -> str:  # lanes [0, count), count in [1, lanes]
        high = self.f.assign(f"shl i64 1, {count}", "m")
        return self.f.assign(f"sub i64 {high}, 1", "m")

    def transposed(self, i0: Size, j0: Size, rows: int, cols: int, a: str = "%A") -> list[str]:
        e, f = self.e, self.f
        vectors = [
            e.load(a, f.add_i64(j0, e.a_row(f.add_i64(i0, ii))), cols)
            if ii < rows
            else "zeroinitializer"
            for ii in range(self.lanes)
        ]
        return [
            e.apply(column, i0, f.add_i64(j0, jj), rows)
            for jj, column in enumerate(e.transpose(vectors))
        ]

    def each_block_of_columns(self, body: Callable[[Size, int], None]) -> None:
        """``body(j0, cols)`` for every block of columns, the last one partial."""
        whole, rest = divmod(self.spec.n, self.lanes)
        self.t.for_range(whole, lambda jb: body(self.f.mul_i64(jb, self.lanes), self.lanes), "jb")
        if rest:
            body(whole * self.lanes, rest)

    def head(self, below: str, j0: Size, jj: int) -> None:
        """A column's first vector (rows ``-shift`` to ``lanes - shift``)."""
        f, lanes = self.f, self.lanes
        on_line = f.assign(f"icmp eq i64 {self.shifts[jj]}, 0", "c")

        def whole() -> None:
            self.e.store(below, "%B", self.at(j0, jj, 0), lanes, streamed=True)

        def masked() -> None:
            # lanes [shift, lanes) of the line-aligned vector holding the column's start
            low = f.assign(f"shl i64 -1, {self.shifts[jj]}", "m")
            self.masked_store(self.joined("zeroinitializer", below, jj), self.at(j0, jj, 0), low)

        def part() -> None:
            if self.t.joined:  # a tile before this one stores the line the column starts in
                f.when(f.assign(f"icmp eq i64 {self.t.before}, 0", "c"), masked)
            else:
                masked()

        f.when(on_line, whole, part)

    def middle(self, above: str, below: str, j0: Size, jj: int, i0: Size) -> None:
        value = self.joined(above, below, jj)
        self.e.store(value, "%B", self.at(j0, jj, i0), self.lanes, streamed=True)

    def end(self, above: str, below: str, j0: Size, jj: int, following: str | None) -> None:
        """A column's last rows, from ``blocks * lanes - shift``: ``shift + tail`` of them
        (``below`` holds the tail's rows); in a joined tile with a tile after it, the lines
        they share with that tile's column, completed from its first rows (``following``)
        and stored whole."""
        if following is None:
            self.plain_end(above, below, j0, jj)
            return
        f = self.f
        after = f.assign(f"icmp ne i64 {self.t.after}, 0", "c")
        f.when(
            after,
            lambda: self.joined_end(above, below, following, j0, jj),
            lambda: self.plain_end(above, below, j0, jj),
        )

    def joined_end(self, above: str, below: str, following: str, j0: Size, jj: int) -> None:
        """``end`` into the next tile's column: the rows from ``blocks * lanes`` on are
        the tail's, then the next tile's (``following``), of which the lines shared with it
        take fewer than a vector."""
        e, f, lanes, tail = self.e, self.f, self.lanes, self.tail
        left = f.assign(f"add i64 {self.shifts[jj]}, {tail}", "i")
        offset = self.at(j0, jj, self.blocks * lanes)
        # the column's rows from blocks * lanes on, a vector and the next (as far as needed)
        rows = [t if t < tail else lanes + t - tail for t in range(lanes)]
        first = f.assign(
            f"shufflevector {e.vt} {below}, {e.vt} {following}, "
            f"<{lanes} x i32> <{', '.join(f'i32 {r}' for r in rows)}>",
            "v",
        )
        rest = [
            f"i32 {lanes - tail + t}" if lanes - tail + t < lanes else "i32 poison"
            for t in range(lanes)
        ]
        second = f.assign(
            f"shufflevector {e.vt} {following}, {e.vt} poison, <{lanes} x i32> <{', '.join(rest)}>",
            "v",
        )
        some = f.assign(f"icmp ne i64 {left}, 0", "c")
        f.when(some, lambda: e.store(self.joined(above, first, jj), "%B", offset, lanes, True))
        spill = f.assign(f"icmp ugt i64 {left}, {lanes}", "c")
        f.when(
            spill,
            lambda: e.store(
                self.joined(first, second, jj), "%B", f.add_i64(offset, lanes), lanes, True
            ),
        )

    def plain_end(self, above: str, below: str, j0: Size, jj: int) -> None:
        """``end`` with no tile after this one's columns."""
        f, lanes, tail = self.f, self.lanes, self.tail
        left = f.assign(f"add i64 {self.shifts[jj]}, {tail}", "i")
        offset = self.at(j0, jj, self.blocks * lanes)
        value = self.joined(above, below, jj)
        if not tail:  # fewer than lanes left, none at all without a shift
            some = f.assign(f"icmp ne i64 {left}, 0", "c")
            f.when(some, lambda: self.masked_store(value, offset, self.prefix_bits(left)))
            return
        count = f.assign(f"call i64 @llvm.smin.i64(i64 {left}, i64 {lanes})", "i")
        self.masked_store(value, offset, self.prefix_bits(count))
        spill = f.assign(f"icmp ugt i64 {left}, {lanes}", "c")

        def rest() -> None:
            count = f.assign(f"sub i64 {left}, {lanes}", "i")
            value = self.joined(below, "zeroinitializer", jj)
            self.masked_store(value, str(f.add_i64(offset, lanes)), self.prefix_bits(count))

        f.when(spill, rest)

    def following(self, j0: Size, cols: int) -> list[str] | None:
        """The next tile's first block of columns ``j0 ..`` in a joined tile (its A is this
        tile's where no tile follows: always within in0), else None."""
        if not self.t.joined:
            return None
        return self.transposed(0, j0, self.lanes, cols, "%nextA")

    def tail_rows(self, j0: Size, cols: int) -> list[str]:
        if self.tail:
            return self.transposed(self.blocks * self.lanes, j0, self.tail, cols)
        return ["zeroinitializer"] * self.lanes

    # ---- traversals ---------------------------------------------------------------------------
    def down(self) -> None:
        """One block of columns at a time, down the columns; the last block is clamped inside
        B (its overlapping columns get the same values again), which ran faster than a
        partial block (ijkl->ljki 45^4 FP32: 0.7-0.8x with a partial one)."""
        e, f, spec, lanes = self.e, self.f, self.spec, self.lanes

        def block_of_columns(jb: str) -> None:
            # the last block clamped, never partial
            j0 = f.umin_i64(f.mul_i64(jb, lanes), spec.n - lanes)
            self.column_shifts(j0)
            first = self.transposed(0, j0, lanes, lanes)
            for jj in range(lanes):
                self.head(first[jj], j0, jj)

            def steady(b: str, above: list[str]) -> list[str]:
                i0 = f.add_i64(f.mul_i64(b, lanes), lanes)
                below = self.transposed(i0, j0, lanes, lanes)
                for jj in range(lanes):
                    self.middle(above[jj], below[jj], j0, jj, i0)
                return below

            last = first
            if self.blocks > 1:
                last = f.loop(self.blocks - 1, [(e.vt, v) for v in first], steady, "down")
            below = self.tail_rows(j0, lanes)
            following = self.following(j0, lanes)
            for jj in range(lanes):
                self.end(last[jj], below[jj], j0, jj, following[jj] if following else None)

        f.range_loop(0, -(-spec.n // lanes), block_of_columns, "jb")

    def across(self) -> None:
        """Rows of blocks, each along A's rows; the block above's columns in a buffer."""
        e, f, spec, lanes = self.e, self.f, self.spec, self.lanes
        carry = f.tmp("carry")
        f.entry_alloca(f"{carry} = alloca [{spec.n} x {e.vt}], align {LINE_BYTES}")
        self.column_shifts(0)

        def slot(j0: Size, jj: int) -> str:
            return f.assign(
                f"getelementptr inbounds [{spec.n} x {e.vt}], ptr {carry}, i64 0, "
                f"i64 {f.add_i64(j0, jj)}",
                "p",
            )

        def keep(value: str, j0: Size, jj: int) -> None:
            f.emit(f"store {e.vt} {value}, ptr {slot(j0, jj)}, align {LINE_BYTES}")

        def kept(j0: Size, jj: int) -> str:
            return f.assign(f"load {e.vt}, ptr {slot(j0, jj)}, align {LINE_BYTES}", "v")

        def head(j0: Size, cols: int) -> None:
            below = self.transposed(0, j0, lanes, cols)
            for jj in range(cols):
                self.head(below[jj], j0, jj)
                keep(below[jj], j0, jj)

        def row_of_blocks(i0: Size) -> Callable[[Size, int], None]:
            def block(j0: Size, cols: int) -> None:
                below = self.transposed(i0, j0, lanes, cols)
                for jj in range(cols):
                    self.middle(kept(j0, jj), below[jj], j0, jj, i0)
                    keep(below[jj], j0, jj)

            return block

        def end(j0: Size, cols: int) -> None:
            below = self.tail_rows(j0, cols)
            following = self.following(j0, cols)
            for jj in range(cols):
                self.end(kept(j0, jj), below[jj], j0, jj, following[jj] if following else None)

        self.each_block_of_columns(head)
        if self.blocks > 1:
            self.t.for_range(
                self.blocks - 1,
                lambda b: self.each_block_of_columns(
                    row_of_blocks(f.add_i64(f.mul_i64(b, lanes), lanes))
                ),
                "down",
            )
        self.each_block_of_columns(end)


def emit_transposed(emitter: _UnaryEmitter, streamed: bool = False) -> None:
    """Emit the body of ``B := op(A^T)`` into the emitter's function (not finished);
    ``streamed``: a tile of a transpose between buffers in memory."""
    _Transpose(emitter, streamed).emit()
