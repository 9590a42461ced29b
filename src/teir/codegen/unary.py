"""LLVM IR for the unary kernels: ``B := 0``, ``B := A``, ``B := max(A, 0)``, the transposed
``B := op(A^T)`` (scaled elementwise by a third operand S for elementwise products, an
internal form) and the in-place ``B := max(B, 0)``.

Columns are swept with unrolled vector loads and stores and a masked tail; when the leading
dimensions equal the column height the matrix is one long column. The transposed form
(``transpose.py``) moves square blocks of one vector register's width through registers.
"""

from __future__ import annotations

from collections.abc import Callable

from teir.codegen.irtext import (
    NONTEMPORAL,
    FunctionBuilder,
    Module,
    Vectors,
    scalar_type,
    type_suffix,
    vector_type,
)
from teir.codegen.shuffles import transpose_vectors
from teir.codegen.specs import UnaryOp, UnarySpec
from teir.codegen.target import Target
from teir.codegen.transpose import emit_transposed, transpose_lanes

COLUMN_UNROLL = 4


class _UnaryEmitter:
    def __init__(
        self,
        spec: UnarySpec,
        target: Target,
        module: Module,
        name: str,
        linkage: str,
        attributes: str,
        lanes: int | None = None,
    ) -> None:
        self.spec = spec
        self.lanes = lanes or target.lanes(spec.itemsize)
        self.t = scalar_type(spec.itemsize)
        self.vt = vector_type(self.lanes, spec.itemsize)
        self.suffix = f"v{self.lanes}{type_suffix(spec.itemsize)}"
        self.module = module
        self.vectors = Vectors(self.lanes, spec.itemsize)
        self.vectors.declare(module)
        if spec.stream_b:
            module.declare("nontemporal", f"!{NONTEMPORAL} = !{{i32 1}}")
        reads = "readonly " if spec.reads_a else ""
        scale = ", ptr noalias readonly %S" if spec.scale is not None else ""
        joined = ", ptr readonly %nextA, i64 %joins" if spec.joined else ""
        self.f = FunctionBuilder(
            module,
            f"define {linkage} void @{name}(ptr noalias {reads}%A, ptr noalias %B{scale}{joined}) "
            f"nounwind {attributes}",
        )

    def load(self, base: str, offset: str | int, active: int) -> str:
        return self.vectors.load(self.f, base, offset, active, self.spec.itemsize)

    @property
    def vector_bytes(self) -> int:
        return self.lanes * self.spec.itemsize

    def store(
        self, value: str, base: str, offset: str | int, active: int, streamed: bool = False
    ) -> None:
        """Store ``active`` lanes; ``streamed`` full vectors must lie on vector boundaries."""
        if not (active == self.lanes and streamed):
            self.vectors.store(self.f, value, base, offset, active, self.spec.itemsize)
            return
        pointer = self.f.gep(self.t, base, offset)
        self.f.emit(
            f"store {self.vt} {value}, ptr {pointer}, align {self.vector_bytes}, "
            f"!nontemporal !{NONTEMPORAL}"
        )

    def apply(
        self,
        value: str,
        i0: str | int = 0,
        j: str | int = 0,
        rows: int | None = None,
        mask: str | None = None,
    ) -> str:
        """op of the vector holding B's rows ``i0 ..`` of column ``j`` (``rows`` of them, or
        the lanes ``mask`` selects), times S's there where A is scaled."""
        if self.spec.scale is not None:
            value = self.scaled(value, i0, j, self.lanes if rows is None else rows, mask)
        if self.spec.op is not UnaryOp.RELU:
            return value
        # max(x, 0) that keeps NaN (like np.maximum): x < 0 (ordered) ? 0 : x
        negative = self.f.assign(f"fcmp olt {self.vt} {value}, zeroinitializer", "c")
        return self.f.assign(
            f"select <{self.lanes} x i1> {negative}, {self.vt} zeroinitializer, {self.vt} {value}",
            "v",
        )

    def scaled(self, value: str, i0: str | int, j: str | int, rows: int, mask: str | None) -> str:
        """``value`` times S's vector for B's rows ``i0 ..`` of column ``j``: one value
        broadcast (S constant along the rows), or S's ``rows`` elements there (only the
        lanes of ``mask`` where given: a masked block may reach before row 0 or past m)."""
        f, lanes = self.f, self.lanes
        assert self.spec.scale is not None
        along_rows, along_columns = self.spec.scale
        column = f.mul_i64(j, along_columns)
        if not along_rows:  # one value per column of B
            pointer = f.gep(self.t, "%S", column)
            scalar = f.assign(f"load {self.t}, ptr {pointer}, align {self.spec.itemsize}", "s")
            one = f.assign(f"insertelement {self.vt} poison, {self.t} {scalar}, i64 0", "s")
            factor = f.assign(
                f"shufflevector {self.vt} {one}, {self.vt} poison, <{lanes} x i32> zeroinitializer",
                "s",
            )
        elif mask is not None:  # lanes outside the mask may lie outside S: not read
            pointer = f.assign(f"getelementptr {self.t}, ptr %S, i64 {f.add_i64(i0, column)}", "p")
            factor = f.assign(
                f"call {self.vt} @llvm.masked.load.{self.suffix}.p0(ptr {pointer}, "
                f"i32 {self.spec.itemsize}, <{lanes} x i1> {mask}, {self.vt} zeroinitializer)",
                "s",
            )
        else:
            factor = self.load("%S", f.add_i64(i0, column), rows)
        return f.assign(f"fmul {self.vt} {value}, {factor}", "v")

    # ---- column sweeps --------------------------------------------------------------------
    def emit_columns(self) -> None:
        spec, f = self.spec, self.f
        rows, cols = column_shape(spec)
        source = "%B" if spec.in_place else "%A"
        lda = spec.ldb if spec.in_place else spec.lda

        def element(
            index: str | int, column: str | int, active: int, streamed: bool = False
        ) -> None:
            if spec.op is UnaryOp.ZERO:
                value = "zeroinitializer"
            else:
                value = self.apply(
                    self.load(source, f.add_i64(index, f.mul_i64(column, lda)), active)
                )
            offset = f.add_i64(index, f.mul_i64(column, spec.ldb))
            self.store(value, "%B", offset, active, streamed)

        def column_body(j: str, _: list[str]) -> list[str]:
            group = COLUMN_UNROLL * self.lanes
            groups, rest = divmod(rows, group)
            if groups:

                def group_body(g: str, _: list[str]) -> list[str]:
                    base = f.mul_i64(g, group)
                    for u in range(COLUMN_UNROLL):
                        element(f.add_i64(base, u * self.lanes), j, self.lanes)
                    return []

                f.loop(groups, [], group_body, "g")
            start = groups * group
            while rest > 0:
                active = min(rest, self.lanes)
                element(start, j, active)
                start += active
                rest -= active
            return []

        if cols == 1 and rows >= 2 * COLUMN_UNROLL * self.lanes:
            self.emit_aligned_column(rows, element)
        else:
            f.loop(cols, [], column_body, "col")
        f.finish()

    def emit_aligned_column(
        self, rows: int, element: Callable[[str | int, str | int, int, bool], None]
    ) -> None:
        """One long column with B's stores on vector boundaries: misaligned stores split cache
        lines and cost 20-30 % in cache (64² FP32 copy: 78-89 % of the copy bandwidth with B
        16 bytes off a line, 93-100 % aligned). The unaligned head and tail are single full
        vectors overlapping the aligned part: every op here gives the same value when applied
        twice (A and B never overlap, and an in-place ReLU is idempotent)."""
        f, lanes, size = self.f, self.lanes, self.spec.itemsize
        streamed = self.spec.stream_b
        group = COLUMN_UNROLL * lanes
        misaligned = f.misaligned_bytes("%B", lanes * size)
        to_boundary = f.assign(f"sub i64 {lanes * size}, {misaligned}", "a")
        to_boundary = f.assign(f"and i64 {to_boundary}, {lanes * size - 1}", "a")
        head = f.assign(f"lshr i64 {to_boundary}, {size.bit_length() - 1}", "h")
        f.when(f.assign(f"icmp ne i64 {head}, 0", "c"), lambda: element(0, 0, lanes, False))
        groups = f.assign(f"sub i64 {rows}, {head}", "h")
        groups = f.assign(f"lshr i64 {groups}, {group.bit_length() - 1}", "h")

        def group_body(g: str) -> None:
            base = f.add_i64(head, f.mul_i64(g, group))
            for u in range(COLUMN_UNROLL):
                element(f.add_i64(base, u * lanes), 0, lanes, streamed)

        f.range_loop(0, groups, group_body, "g")
        done = f.add_i64(head, f.mul_i64(groups, group))
        rest = f.assign(f"sub i64 {rows}, {done}", "h")

        def tail() -> None:
            for u in range(COLUMN_UNROLL):
                element(rows - (COLUMN_UNROLL - u) * lanes, 0, lanes, False)

        f.when(f.assign(f"icmp ne i64 {rest}, 0", "c"), tail)

    # ---- transposed blocks ----------------------------------------------------------------
    def a_row(self, row: str | int) -> str | int:
        """The element offset of a transposed A's ``row`` (``row >= 0``), in runs or not."""
        spec, f = self.spec, self.f
        if isinstance(row, int):
            return spec.a_row(row)
        if not spec.m_inner:
            return f.mul_i64(row, spec.lda)
        run = f.assign(f"udiv i64 {row}, {spec.m_inner}", "i")
        within = f.assign(f"urem i64 {row}, {spec.m_inner}", "i")
        return f.add_i64(f.mul_i64(run, spec.lda_outer), f.mul_i64(within, spec.lda))

    def transpose(self, rows: list[str]) -> list[str]:
        return transpose_vectors(self.f, rows, self.lanes, self.spec.itemsize)

    def constant_edge_block(self, i0: str | int, j0: str | int, rows_i: int, cols_j: int) -> None:
        """B[i0 : i0+rows_i, j0 : j0+cols_j] := op(A^T) of it, with compile-time extents."""
        spec, f, lanes = self.spec, self.f, self.lanes
        vectors = []
        for ii in range(lanes):
            if ii < rows_i:
                offset = f.add_i64(j0, self.a_row(f.add_i64(i0, ii)))
                vectors.append(self.load("%A", offset, cols_j))
            else:
                vectors.append("zeroinitializer")
        columns = self.transpose(vectors)
        for jj in range(cols_j):
            value = self.apply(columns[jj], i0, f.add_i64(j0, jj), rows_i)
            self.store(value, "%B", f.add_i64(i0, f.mul_i64(f.add_i64(j0, jj), spec.ldb)), rows_i)


def column_shape(spec: UnarySpec) -> tuple[int, int]:
    """(rows, columns) an untransposed kernel sweeps: a contiguous tile as one long column."""
    lda = spec.ldb if spec.in_place else spec.lda
    if spec.n > 1 and spec.ldb == spec.m and (not spec.reads_a or lda == spec.m):
        return spec.m * spec.n, 1
    return spec.m, spec.n


def column_lanes(rows: int, full: int, itemsize: int) -> int:
    """The vector width for columns of ``rows`` elements: the full width, or for columns of
    a power of two elements shorter than it (16 bytes at least) exactly that many, so that
    a column of 8 FP32 moves as one plain 32-byte vector rather than as a 512-bit one under
    a mask. (Narrower vectors under a mask measured no better: FP64 columns of 3 in 32-byte
    vectors 0.87x, FP32 columns of 6 0.86-1.05x, of 3, 5 and 7 1.14-1.39x.)"""
    if rows < full and rows & (rows - 1) == 0 and rows * itemsize >= 16:
        return rows
    return full


def unary_function(
    spec: UnarySpec,
    target: Target,
    module: Module,
    name: str,
    linkage: str = "",
    lanes: int | None = None,
    attributes: str = "",
    streamed: bool = False,
) -> None:
    """Add the kernel ``void name(ptr A, ptr B)`` for ``spec`` to ``module`` (A is ignored by
    Zero and the in-place ReLU). ``streamed`` marks a tile of a loop nest whose data comes
    from memory rather than being hot in cache: transposes then skip their in-cache tuning
    and cross the tile in rows of blocks."""
    if spec.trans_a and lanes is None:
        full = target.lanes(spec.itemsize)
        lanes = full if streamed else transpose_lanes(spec, full)
    elif lanes is None:
        lanes = column_lanes(column_shape(spec)[0], target.lanes(spec.itemsize), spec.itemsize)
    emitter = _UnaryEmitter(spec, target, module, name, linkage, attributes, lanes)
    if spec.trans_a:
        emit_transposed(emitter, streamed)
        emitter.f.finish()
    else:
        emitter.emit_columns()
