"""Primitive identification: which axes the kernel consumes, with which layout, on which block
sizes. The choice is checked with the same kernel selection the backend uses, so the chosen
tile always maps to a kernel when any choice does."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import product
from math import prod

from teir.codegen.brgemm import choose_blocking, pack_leading_bytes
from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target, cache_sizes
from teir.codegen.transpose import LINE_BYTES
from teir.ir import DimType, ExecType, PrimFirst, Primitives, PrimLast, PrimMain, Tensor
from teir.lower.panels import A_SPREAD_BYTES, panel_leading_bytes, panel_limit_bytes
from teir.lower.tiles import (
    contraction_op,
    copy_outgrows_cache,
    crowded_beyond_l2,
    output_outgrows_cache,
    output_outgrows_share,
)
from teir.optimizer.problem import Axis, Problem
from teir.optimizer.schedule import splits_evenly
from teir.optimizer.simplify import block_size, divisors, lane_block, split
from teir.optimizer.transposed import transposed_tile

PRIM = ExecType.PRIM
# Target block sizes (rows of C, columns of C, K) per element size, measured on Zen 4.
BLOCK_TARGETS = {4: (80, 160, 64), 8: (80, 160, 64)}
# ... and on cores with two full-width FMA pipes (a Xeon, Zen 5), where FP32 rows of 128 (eight
# vectors) beat 64 where the sizes offer those two (one thread, same process: 1024^3
# ki,kj->ij 53 -> 61 % of peak, ki,jk->ij 53 -> 61 %, ik,kj->ij 77 -> 80 %, ik,jk->ij 79 ->
# 81 %; 768^3 ki,kj->ij 62 -> 65 %; 512^3 and 2048^3 alike or better; two threads: 1024^3
# ki,kj->ij 57 -> 64 %, ki,jk->ij 58 -> 65 %, abcd,dbef->acef 32^6 73 -> 79 %; batched and
# 3-D ones alike). FP64 keeps 80: its rows of 128 need a panel of twice the bytes (1024^3
# ik,kj->ij 75 -> 69 %).
TWO_PIPE_BLOCK_TARGETS = {4: (128, 160, 64), 8: (80, 160, 64)}
# A contraction whose K sizes multiply to at most this is bound by writing C: its tiles are
# long runs of C's unit-stride dimension times a few columns, because C written as a few
# streams goes at the store bandwidth while many short columns a power of two apart compete
# for the same cache sets (outer product i,j->ij at 2048: 84 GB/s against 33 GB/s).
MEMORY_BOUND_K = 8
STREAM_TARGETS = (2048, 8)
# The row block target's multiple for outputs stored around the caches.
STREAMED_ROWS = 4
# A matrix-vector product whose matrix has unit stride along the output (x @ A with A
# row-major) reads each K step of the matrix as one run along the rows: long row blocks and
# few K steps per block keep few runs streaming at once (4096² FP64, 2 threads: N 16 x K 64
# 9.2 ms -> N 1024 x K 8 3.4-4.0 ms, NumPy 3.8), one block per thread (runs of at least a
# page: FP32 in blocks of 1024, 2.2 ms; of 4096, 1.7 ms, NumPy 1.5). Rows longer than that
# run in blocks of an eighth of L2 (the block of the output stays there while the runs
# stream past): one thread, FP32 k,kn->n 64 x 262144 3.0 -> 2.0 ms, 2000 x 20000 8.1 -> 5.1,
# a,acb->cb 124 x 256 x 496 4.5 -> 2.5; FP64 512 x 65536 11.4 -> 8.3 (blocks of 16 KiB before).
MATVEC_K = 8
MATVEC_L2_PART = 8
# The output's block (the unit-stride C axis) that a summed elementwise product keeps in L1.
REDUCTION_RUN_BYTES = 8 * 1024
# A transposed tile's row (out's unit stride) shorter than this takes the axis continuing it
# into the tile (``unary``'s runs). Longer ones gain more as tiles of their own, whose
# columns the kernel joins to the next tile's where they share a line: 2 threads, NumPy's
# arrays, alternating processes, best of 3: ijkl->ljki 48^4 FP64 (384-byte rows) 30 -> 39
# GB/s; twelve random 4-D permutations of 256- to 511-byte rows, geometric mean 1.19x
# (0.88-1.99x: 24 -> 35, 28 -> 38, 35 -> 44 GB/s; 54 -> 47 at worst). Shorter rows gain
# from the runs: ijklm->ikmjl 24^5 FP64 (192 bytes) 27-29 -> 38-40, abcd->dacb 43x19x77x75
# FP32 (76 bytes) 27-31 -> 54 (twelve random ones of 64-255 bytes: mixed, 0.6-2x either way).
RUNS_ROW_BYTES = 256
# ... and only runs blocks of at least this many rows: FP64 transposes whose runs came in
# blocks of 2 (crowded strides: CROWDED_ROW_BYTES cuts the tile's columns) ran faster as tiles
# of their own in 6 of 7 random 4-5-D ones on Zen 5 (2 threads, geometric mean over 16
# offsets of both arrays from a line, alternating processes: abcd->dacb 200x16x24x128
# 36 -> 58 GB/s, abcd->dbac 32x48x20x200 54 -> 87, 64x128x16x48 34 -> 48, abcde->cebad
# 8x64x24x16x32 35 -> 45, abcd->dbca 24x16x64x128 58 -> 74; abcd->bdac 128x8x24x100 152 ->
# 144). FP32's went either way (0.5-1.5x: dacb 48x32x48x40 99 -> 68, adcb 200x32x64x40 32 ->
# 47), so they keep blocks of 2.
LEAST_RUNS_BLOCK = {4: 2, 8: 3}
# A contraction of at least SHARED_FLOPS gets a tile per thread, of more than BALANCED_FLOPS
# two, so that a thread finishing early finds another. A parallel call costs about a
# microsecond: 64^3 FP32 on 2 threads 5.6 -> 4.9 us, 80^3 9.9 -> 7.1 (48^3 would lose,
# 2.9 -> 3.7); the run time's estimate (MIN_SECONDS_PER_THREAD) decides the same way.
SHARED_FLOPS = 400_000
BALANCED_FLOPS = 4_000_000


def _dummy(dim_type: DimType) -> Axis:
    return Axis(dim_type, 1, (0, 0, 0))


# B's rows (the mirror form's vectors) at most this far apart count as near.
MIRROR_NEAR_BYTES = 4096


def _tile_quality(problem: Problem, m: Axis, n: Axis, k: Axis) -> tuple[int, int] | None:
    """How well a GEMM on (m, n, k) maps to a kernel: (form rank, layout rank), or None."""
    axes = [m.with_exec(PRIM), n.with_exec(PRIM), k.with_exec(PRIM)]
    primitives = problem.primitives
    try:
        config = Problem(_gemm(primitives), tuple(axes)).to_config()
    except ValueError:
        return None
    op = contraction_op(config, 1)
    if not isinstance(op.spec, BrgemmSpec):
        return None
    form = choose_blocking(op.spec, Target.host()).form
    form_rank = {"outer": 0, "mirror": 1, "dot": 2}[form]
    spec = op.spec
    layout_rank = int(spec.trans_a) + int(spec.trans_b)
    if form == "mirror":
        # vectors from B's rows, its K steps ldb apart: rows within a page first, on a
        # transposed A or a plain one (FP32 on 2 threads: bdg,bdgh->hd, b 1024, K of g 64
        # apart 0.50 ms, K of b 6144 apart 0.82; ge,ega->a K 43456 apart 8.0 ms, 112 apart
        # 1.9; eacfh,haefcb->b 6804000 apart 1.8, 189 apart 1.1)
        layout_rank = 1 if spec.ldb * spec.itemsize <= MIRROR_NEAR_BYTES else 3
    if {"outer": spec.m, "mirror": spec.n, "dot": spec.k}[form] == 1 < spec.m * spec.n * spec.k:
        # one lane of each vector: a K apart in memory with M and N of 1 (a part of ij,ij->
        # cut in two, i 1001 x j 999: 3.1 ms on i, 0.3 ms as dot products along j), or the
        # output's columns ldc apart with a kernel M of 1 (dhcfbg,bcf->hbdgfc laid out like
        # in0, FP32 29 MB: a kernel along d and h, 38400 apart, 13.9 ms; along the unit g)
        form_rank = 3
    return form_rank, layout_rank


def _spread(m: Axis, n: Axis, k: Axis) -> float:
    """Sum of log2 of the strides along which the kernel steps through its three tiles."""
    strides = (
        m.stride(Tensor.IN0),
        m.stride(Tensor.OUT),
        n.stride(Tensor.IN1),
        n.stride(Tensor.OUT),
        k.stride(Tensor.IN0),
        k.stride(Tensor.IN1),
    )
    return sum(math.log2(abs(s)) for s in strides if s)


def _gemm(primitives: Primitives) -> Primitives:
    return Primitives(primitives.data_type, PrimFirst.NONE, PrimMain.GEMM, PrimLast.NONE)


def _elementwise(problem: Problem) -> tuple[Problem, str] | None:
    """A product whose output has its unit stride on a C axis (``ij,j->ij``, ``bij,bj->bij``),
    summed or not: no kernel tile can run along that axis, so the kernel shrinks to one
    element and every axis becomes a loop, the unit-stride C axis innermost, where the
    compiled nest vectorizes it (ij,j->ij at 1024^2: 3.6 -> 0.1 ms).

    Summed (``ij,ij->j``) only where the inputs run along that axis too, and with an M or an N
    axis at most (a batched matrix-vector product at most, bound by memory): the K loops go
    just outside it, so that each K step reads a run of both inputs into a block of the output
    that stays in L1 (ij,ij->j at 2048^2 FP64, 2 threads: 32 -> 2.5 ms, NumPy's einsum 61;
    ijk,ijk->k at 128^3: 7.9 -> 0.64 ms; kib,kb->ib 500 x 30 x 64: 371 -> 98 us against the
    lane-batched contraction, whose register block a missing N leaves one column wide).

    A product without K that writes an input transposed (``acb,a->abc``: the output's unit
    stride on an M axis that steps in0 by a row) runs the same way, on one transposing
    kernel per tile (``transposed_tile``) rather than a GEMM kernel writing the output a
    row apart per element (FP64 30 x 300 x 300 on one thread: 3.1-3.8 -> 1.7 ms)."""
    axes = problem.axes
    unit = [a for a in axes if a.stride(Tensor.OUT) == 1 and a.size > 1]
    if not unit:
        return None
    if (
        unit[0].dim_type is not DimType.C
        and transposed_tile(list(axes), [], problem.primitives) is None
    ):
        return None
    column = unit[0]
    sums = [a.with_exec(ExecType.SEQ) for a in axes if a.dim_type is DimType.K and a.size > 1]
    if sums and any(abs(column.stride(t)) > 1 for t in (Tensor.IN0, Tensor.IN1)):
        return None  # summed along an axis the inputs do not run along
    present = {a.dim_type for a in axes if a.size > 1}
    if sums and {DimType.M, DimType.N} <= present:
        return None  # a batched matrix product: FLOPs for kernels (or the lane-batched one)
    others = [
        a.with_exec(ExecType.SEQ)
        for a in axes
        if a.size > 1 and a.dim_type is not DimType.K and not (sums and a is column)
    ]
    if sums:
        run = REDUCTION_RUN_BYTES // problem.primitives.data_type.itemsize
        block = block_size(column.size, run, run // 2, run, 16)
        if block < column.size:
            blocks, column = split(column, block)
            others.append(blocks.with_exec(ExecType.SEQ))
        others.sort(key=lambda a: -a.stride(Tensor.OUT))
        others += [*sums, column.with_exec(ExecType.SEQ)]
    prims = [_dummy(t).with_exec(PRIM) for t in (DimType.M, DimType.N, DimType.K)]
    primitives = replace(problem.primitives, prim_main=PrimMain.GEMM)
    if column.dim_type is not DimType.C:
        return Problem(primitives, tuple(others + prims)), (
            "GEMM on one element: an elementwise product that writes its input transposed,"
            " whose tile a transposing kernel runs"
        )
    return Problem(primitives, tuple(others + prims)), (
        "GEMM on one element: the output's unit stride is on a C axis, which loops innermost"
        + (" (inside the K loops)" if sums else "")
    )


def _packs_rows(row: Axis, row_block: int, k: Axis, itemsize: int) -> bool:
    """Whether the kernel or the nest packs its vector operand (the one along ``row``): its
    columns far apart (:func:`teir.lower.panels.panel_leading_bytes`), or stored transposed."""
    a_tensor = Tensor.IN0 if row.dim_type is DimType.M else Tensor.IN1
    leading = abs(k.stride(a_tensor))
    target = Target.host()
    # (a tile whose columns follow one another without a gap is a panel as it lies)
    far = leading * itemsize >= pack_leading_bytes(target) or (
        leading * itemsize >= panel_leading_bytes(target)
        and leading > row_block >= 2 * target.lanes(itemsize)
    )
    return far or row.stride(a_tensor) != 1


def _outgrows_kernel(row: Axis, row_block: int, k: Axis, k_total: int, itemsize: int) -> bool:
    """Whether the kernel's vector operand over all of K (``k_total`` steps) in rows of
    ``row_block`` outgrows what holds it for the loops that reuse it: a packed panel where
    the kernel packs it (:func:`_packs_rows`), else L2 (as :func:`_panel_steps` cuts K)."""
    return row_block * k_total * itemsize > _kept_bytes(_packs_rows(row, row_block, k, itemsize))


def _kept_bytes(packed: bool) -> int:
    """How much of the kernel's vector operand the loops that reuse it keep: a packed panel
    (``packed``), else L2."""
    return panel_limit_bytes() if packed else cache_sizes()["L2"]


def _spread_rows(row: Axis, row_block: int, gemm_k: Axis, batch: Axis, itemsize: int) -> bool:
    """Whether the kernel's vector operand lies in blocks far apart along the batch-reduce
    axis, which the nest packs into a panel (:func:`teir.lower.panels.a_spread`)."""
    a_tensor = Tensor.IN0 if row.dim_type is DimType.M else Tensor.IN1
    stride = abs(batch.stride(a_tensor))
    block = (gemm_k.size - 1) * abs(gemm_k.stride(a_tensor)) + row_block
    return batch.size > 1 and stride > block and stride * itemsize >= A_SPREAD_BYTES


def _panel_rows(row: Axis, block: int, k: Axis, k_total: int, itemsize: int, lanes: int) -> int:
    """The row block, smaller if need be so that the kernel's vector operand for all of K
    fits a packed panel (:mod:`teir.lower.panels`) where the kernel would pack it: its columns
    pages apart, or stored transposed. 1600^3 FP64: rows 80 -> 40, 85 -> 92 % of peak. Not
    below half the block: fewer rows read the other operand again for every row block, and
    K cut into steps (:func:`_panel_steps`) serves better (ijk,jkl->il 256 x 64 x 64 x 256
    FP64, 2 threads: rows 16 over all of K 55 %, rows 64 in 4 K steps 69-79 %)."""
    if not _packs_rows(row, block, k, itemsize):
        return block
    limit = panel_limit_bytes() // (k_total * itemsize)
    if block <= limit:
        return block
    least = max(2 * lanes, block // 2)
    fitting = [d for d in divisors(row.size) if least <= d <= limit and d % lanes == 0]
    return fitting[-1] if fitting else block


def _panel_steps(
    row: Axis, row_block: int, k: Axis, gemm_k: Axis, batch: Axis, itemsize: int
) -> tuple[Axis, Axis | None]:
    """(batch-reduce axis, K steps loop or None): where the kernel packs its vector operand
    but no row block of the row's size lets the operand's tile over all of K fit a panel,
    the batch-reduce axis is cut into the fewest outer K steps whose tiles fit one, and the
    loops are ordered so that each step's panel is packed once for the column loop inside
    (GETD's last step computed as a GEMM of 15625 x 625 x 1600, rows of 125, FP32 on 2
    threads: 61 -> 66 % of peak in 5 steps; FP64 1500^3 58 -> 70 %). An operand that is not
    packed is cut alike where its tile over all of K outgrows L2, so that one step's tile stays
    there for the loops that reuse it instead of coming from memory again on every one of
    their iterations (the contraction of the copies of FP32 ``hdgfe,dgec->cfh``, a tile of
    255 rows over 16256 steps of K, 16 MiB, reused by 4 M tiles per thread: 6.0 -> 2.9 ms in
    32 steps, FP64 13.8 -> 8.6 ms; ``ceabf,hefbc->hab`` 0.64-0.67x). Tiles of up to all of
    L2 stay whole: cut at the panel's size instead, 762 KiB in 2 steps in the copies'
    contraction of FP64 ``abchg,dhca->gbad`` lost 14 %."""
    packed = _packs_rows(row, row_block, k, itemsize) or _spread_rows(
        row, row_block, gemm_k, batch, itemsize
    )
    step_bytes = row_block * gemm_k.size * itemsize
    limit = panel_limit_bytes()
    if step_bytes * batch.size <= _kept_bytes(packed):
        return batch, None
    for steps in divisors(batch.size)[1:]:
        inner = batch.size // steps
        if inner < MIN_PANEL_BATCH:
            break
        if step_bytes * inner <= limit:
            outer, batch = split(batch, inner)
            a_tensor = Tensor.IN0 if row.dim_type is DimType.M else Tensor.IN1
            return batch, replace(outer, panel_of=a_tensor)
    return batch, None


# A batch-reduce cut into K steps keeps at least this many GEMMs per kernel call.
MIN_PANEL_BATCH = 4

# A batch-reduce axis shorter than this keeps too few GEMMs per kernel call to be chosen for
# its memory order over a longer one.
MIN_BATCH = 8


def _span(axes: list[Axis], tensor: Tensor) -> int:
    """Elements between the first and the last one of ``tensor`` that ``axes`` reach."""
    return sum((a.size - 1) * abs(a.stride(tensor)) for a in axes)


def _batch_axis(k_axes: list[Axis], tile: list[Axis]) -> Axis:
    """The K axis a BRGEMM call reduces over besides its tile's K: the one whose batch keeps
    the call's reads of in0 and in1 closest together (rows far apart each cost a TLB entry and
    a prefetch stream of their own), among those long enough to fill a call."""
    long_enough = [a for a in k_axes if a.size >= MIN_BATCH] or [max(k_axes, key=lambda a: a.size)]
    return min(
        long_enough,
        key=lambda a: (sum(_span([*tile, a], t) for t in (Tensor.IN0, Tensor.IN1)), -a.size),
    )


def _shared_blocks(
    row: tuple[int, int, int],
    column: tuple[int, int, int],
    others: int,
    wanted: int,
    threads: int,
) -> tuple[int, int]:
    """(row block, column block) that give at least ``wanted`` output tiles (with ``others``
    tiles from the other axes) where the chosen blocks give fewer, each shrunk only to one of
    its size's divisors no smaller than its floor; ``row`` and ``column`` are (size, block,
    floor), the row's floor its vector lanes. Of those, the blocks that read the least: every
    column tile rereads the row operand, every row tile the column one (`abc,bcd->ad`, a GEMM
    of 200 x 3000 x 300, on 2 threads: M in 4 tiles of 50 read all of B four times; M and N
    in 2 x 2 tiles read each operand twice: FP32 90 -> 119 GFLOP/s, FP64 29 -> 34). Failing
    that, the most tiles. Where those tiles split unevenly between the ``threads`` (see
    ``splits_evenly``), blocks no less than half as large, whose rows fill their vectors as
    well, that split evenly and read the least of those (FP64 ik,kj->ij 97 x 1601 x 1000's
    1600 columns: 25 tiles of 64, 13 and 12 per thread, against 40 of 40: 1404-1420 ->
    1343-1385 us on 2 threads)."""

    def options(size: int, block: int, floor: int) -> list[int]:
        return [block] + [d for d in divisors(size) if floor <= d < block]

    def tiles(blocks: tuple[int, int]) -> int:
        return others * (row[0] // blocks[0]) * (column[0] // blocks[1])

    def traffic(blocks: tuple[int, int]) -> int:
        return (column[0] // blocks[1]) * row[0] + (row[0] // blocks[0]) * column[0]

    def fill(block: int) -> float:
        return block / (-(-block // row[2]) * row[2])

    # the blocks as chosen read the least of all pairs: kept whenever they give enough tiles
    pairs = [(r, c) for r in options(*row) for c in options(*column)]
    enough = [p for p in pairs if tiles(p) >= wanted]
    if not enough:
        return max(pairs, key=lambda p: (tiles(p), -traffic(p)))
    best = min(enough, key=lambda p: (traffic(p), tiles(p), -p[0]))
    if splits_evenly(tiles(best), threads):
        return best
    even = [
        p
        for p in enough
        if splits_evenly(tiles(p), threads)
        and fill(p[0]) >= fill(best[0])
        and 2 * p[0] >= best[0]
        and 2 * p[1] >= best[1]
    ]
    return min(even, key=lambda p: (traffic(p), tiles(p), -p[0])) if even else best


def contraction(
    problem: Problem, threads: int = 1, resident_output: bool = False
) -> tuple[Problem, str]:
    """Choose the kernel's M, N, K (and batch-reduce) axes and block sizes for a contraction
    (``resident_output``: its output is memory reused call after call, see ``optimize``)."""
    elementwise = _elementwise(problem)
    if elementwise is not None:
        return elementwise
    axes = list(problem.axes)
    for needed in (DimType.M, DimType.N, DimType.K):
        if not any(a.dim_type is needed for a in axes):
            axes.append(_dummy(needed))  # a size-1 axis gives the kernel its missing dimension
    by_type = {t: [a for a in axes if a.dim_type is t] for t in DimType}
    candidates = []
    for m, n, k in product(by_type[DimType.M], by_type[DimType.N], by_type[DimType.K]):
        quality = _tile_quality(problem, m, n, k)
        if quality is not None:
            candidates.append((quality, m.size * n.size * k.size, _spread(m, n, k), m, n, k))
    best = None
    if candidates:
        # Prefer kernel layouts, then big tiles, then compact ones among tiles within half the
        # biggest: the smaller the strides between a tile's rows, the fewer of them share a
        # cache set (rows a multiple of 4 KiB apart all land in one set), and a K along the
        # unit stride streams where one 1999 elements apart (i 1001 x j 999, a part of
        # ij,ij-> cut in two) reads a line per element.
        quality = min(c[0] for c in candidates)
        fitting = [c for c in candidates if c[0] == quality]
        biggest = max(c[1] for c in fitting)
        chosen = min((c for c in fitting if 2 * c[1] > biggest), key=lambda c: (c[2], -c[1]))
        best = chosen[3:]
    if best is None:
        m = min(by_type[DimType.M], key=lambda a: (a.stride(Tensor.OUT), -a.size))
        n = min(by_type[DimType.N], key=lambda a: (a.stride(Tensor.OUT), -a.size))
        k = max(by_type[DimType.K], key=lambda a: a.size)
        note = (
            "no kernel layout fits any axis choice: teir.compile runs it as teir.einsum on "
            "views of the tensors (a batch of unit stride everywhere as the vector lanes, "
            "other layouts copied into ones that fit), or on the generic primitive where the "
            "work is small or first/last primitives an einsum lacks"
        )
    else:
        m, n, k = best
        note = ""
    itemsize = problem.primitives.data_type.itemsize
    host = Target.host()
    lanes = host.lanes(itemsize)
    # Block sizes: kernel tiles that keep a batch element's A and B blocks in L2.
    out_unit = m.stride(Tensor.OUT) == 1 or n.stride(Tensor.OUT) != 1
    row, column = (m, n) if out_unit else (n, m)
    targets = (BLOCK_TARGETS if host.half_width_is_free else TWO_PIPE_BLOCK_TARGETS)[itemsize]
    rest = [a for a in axes if a is not m and a is not n and a is not k]
    k_block = block_size(k.size, targets[2], 16, 4 * targets[2], 4)
    vector_operand = Tensor.IN0 if row.dim_type is DimType.M else Tensor.IN1
    matvec = False
    if prod(a.size for a in axes if a.dim_type is DimType.K) <= MEMORY_BOUND_K:
        row_block = block_size(row.size, STREAM_TARGETS[0], 16, 2 * STREAM_TARGETS[0], lanes)
        column_block = block_size(column.size, STREAM_TARGETS[1], 4, STREAM_TARGETS[1], 4)
    elif (
        column.size == 1
        and row.stride(vector_operand) == 1
        and row.stride(Tensor.OUT) == 1
        and abs(k.stride(vector_operand)) > 1
    ):
        k_block = block_size(k.size, MATVEC_K, MATVEC_K // 2, 2 * MATVEC_K, 4)
        rows = cache_sizes()["L2"] // MATVEC_L2_PART // itemsize
        row_block = lane_block(row.size, rows, 16, 2 * rows, lanes)
        column_block = 1
        matvec = True
    else:
        # An output too large for the caches is stored around them, whole lines at a time:
        # longer column runs per tile leave fewer lines split between tiles, which must be
        # stored normally when the output is not vector-aligned (TT tree's last step, out 16
        # bytes past a boundary: M 96 -> 192 of 384, 77 -> 88 % of peak; aligned 95 % both).
        # A resident output beyond the L3 share gains alike, streamed or not: each line split
        # between tiles is read back from memory to be completed (GETD's 95 MiB intermediate,
        # FP32, columns 125 elements of 100 KB apart, not vector-aligned: 38 -> 7 ms; into a
        # new array, whose zeroed pages come through the caches, 47 -> 18 ms, but
        # ik,kj->ij 4096 x 128 x 4096 FP32 20 -> 35 ms there: only resident outputs).
        out_elements = prod(a.size for a in axes if a.dim_type is not DimType.K)
        streamed = output_outgrows_cache(out_elements, itemsize) or (
            resident_output and output_outgrows_share(out_elements, itemsize)
        )
        column_block = block_size(column.size, targets[1], 8, 2 * targets[1], 4)
        other_k = [a.size for a in rest if a.dim_type is DimType.K]
        k_total = k.size if k_block < k.size else k.size * max(other_k, default=1)

        def rows_for(target: int) -> int:
            block = lane_block(row.size, target, 16, 4 * target, lanes)
            return _panel_rows(row, block, k, k_total, itemsize, lanes)

        row_block = rows_for(STREAMED_ROWS * targets[0] if streamed else targets[0])
        # ... but not where the longer rows' tile over all of K outgrows what the kernel
        # keeps (a panel, or L2) and the usual rows' does not: K would be cut into steps
        # outside the output's tile loops, and the whole output read and written again at
        # every step (2 threads, alternating processes, into an out: ik,kj->ij 4096² x 2048
        # FP64 435 -> 352 ms, x 1024 FP32 105 -> 96 ms, ki,kj->ij 104 -> 98 ms).
        if streamed:
            usual = rows_for(targets[0])
            if _outgrows_kernel(row, row_block, k, k_total, itemsize) and not _outgrows_kernel(
                row, usual, k, k_total, itemsize
            ):
                row_block = usual
    # Enough output tiles for every thread: smaller blocks when the whole output is one tile.
    others = prod(a.size for a in rest if a.dim_type is not DimType.K)
    work = 2 * prod(a.size for a in axes)
    # (a matrix-vector product's blocks do equal work: one per thread)
    wanted = 2 * threads if work > BALANCED_FLOPS and not matvec else threads
    if threads > 1 and work >= SHARED_FLOPS:
        row_block, column_block = _shared_blocks(
            (row.size, row_block, lanes), (column.size, column_block, 8), others, wanted, threads
        )
    loops: list[Axis] = []
    prims: list[Axis] = []
    parts = {}
    for axis, block in ((row, row_block), (column, column_block)):
        if block < axis.size:
            outer, inner = split(axis, block)
            loops.append(outer)
            parts[id(axis)] = inner
        else:
            parts[id(axis)] = axis
    # K: the block is the GEMM K; the blocks (or else another K axis) the batch-reduce axis.
    batch: Axis | None = None
    gemm_k = k
    if k_block < k.size:
        batch, gemm_k = split(k, k_block)
    else:
        k_rest = [a for a in rest if a.dim_type is DimType.K]
        if k_rest:
            tile = [parts[id(m)], parts[id(n)], gemm_k]
            batch = _batch_axis(k_rest, tile)
            rest = [a for a in rest if a is not batch]
    k_steps = None
    if batch is not None and not matvec:
        a_tensor = Tensor.IN0 if row.dim_type is DimType.M else Tensor.IN1
        reused = column_block < column.size or any(
            a.dim_type is not DimType.K and a.stride(a_tensor) == 0 and a.size > 1 for a in rest
        )
        if reused:  # by a loop that does not move the panel
            batch, k_steps = _panel_steps(row, row_block, k, gemm_k, batch, itemsize)
        if k_steps is not None:
            rest.append(k_steps)
    prims = [parts[id(m)].with_exec(PRIM), parts[id(n)].with_exec(PRIM)]
    if batch is not None:
        prims.append(batch.with_exec(PRIM))
    prims.append(gemm_k.with_exec(PRIM))
    main = PrimMain.BRGEMM if batch is not None else PrimMain.GEMM
    primitives = replace(problem.primitives, prim_main=main)
    result = Problem(primitives, tuple(loops + [a.with_exec(ExecType.SEQ) for a in rest] + prims))
    text = (
        f"{main.value} on M {parts[id(m)].size} (of {m.size}), N {parts[id(n)].size} "
        f"(of {n.size}), K {gemm_k.size} (of {k.size})"
        + (f", batch-reduce {batch.size}" if batch is not None else "")
        + (
            f" in {k_steps.size} K steps, so that one step's tile of "
            f"{k_steps.panel_of.name.lower() if k_steps.panel_of else 'A'} fits a panel"
            if k_steps is not None
            else ""
        )
        + (f"; {note}" if note else "")
    )
    return result, text


def unary(problem: Problem) -> tuple[Problem, str]:
    """Copy/ReLU (or only first/last primitives): the output's unit-stride axis and, for a
    transpose, in0's unit-stride axis become the tile; other axes loop around it."""
    axes = list(problem.axes)
    reads = problem.primitives.prim_main.is_unary
    tile_types = (DimType.C, DimType.M, DimType.N)
    candidates = [a for a in axes if a.dim_type in tile_types]
    if not candidates:
        axes.append(_dummy(DimType.C))
        candidates = [axes[-1]]
    row = min(candidates, key=lambda a: (a.stride(Tensor.OUT), -a.size))
    column = None
    source_unit = [a for a in candidates if a is not row and a.stride(Tensor.IN0) == 1]
    transposed = reads and row.stride(Tensor.IN0) != 1 and bool(source_unit)
    if transposed:
        column = source_unit[0]
    else:
        others = [a for a in candidates if a is not row]
        if others:
            column = min(others, key=lambda a: a.stride(Tensor.OUT))
    itemsize = problem.primitives.data_type.itemsize
    loops: list[Axis] = []
    prims: list[Axis] = []
    l2 = cache_sizes()["L2"]
    # A transpose between DRAM buffers moves tiles long along the output's unit stride and
    # a few lines wide along in0's: the kernel crosses them in rows of blocks, so in0 is
    # read a few lines at a time from one vector's width of rows, and a misaligned output
    # gets whole-line streaming stores with only each row's two end vectors masked. Against
    # 16 x 16 tiles (2 threads, NumPy's 16-byte offsets on both arrays): ij->ji 2048^2 FP32
    # 32 -> 42 GB/s, FP64 30 -> 46, ijk->kji 256x256x64 FP64 28 -> 50, ij->ji 4000x3000
    # FP32 22 -> 37. Within the caches, 64 x 64 (ij->ji 1000^2 FP32: 84 GB/s against 54
    # with 16 x 16).
    elements = prod(a.size for a in axes)
    in_memory = copy_outgrows_cache(elements, itemsize)
    # (target, least, most, preferred multiple) elements along the output's unit stride (the
    # row) and in0's
    transpose_tiles = {True: (256, 128, 512, 16), False: (128, 64, 256, 16)}
    if not in_memory:
        transpose_tiles = {True: (64, 16, 256, 16), False: (64, 16, 256, 16)}
    if column is not None and crowded_beyond_l2(
        column.stride(Tensor.OUT), transposed, elements, itemsize
    ):
        rows = CROWDED_ROW_BYTES // itemsize
        lanes = Target.host().lanes(itemsize)
        transpose_tiles = {True: (rows, lanes, rows, lanes), False: CROWDED_COLUMNS}
    # A short row (out's unit stride) continued in out by an axis that in0 lays elsewhere:
    # both go into the tile, so that the kernel stores long columns, reading in0 in runs.
    # With NumPy's 16-byte offsets on both arrays (2 threads): ijkl->ljki 48^4 FP32 22 -> 31
    # GB/s, ijklm->ikmjl 24^5 29 -> 34, abcd->dacb 40x30x20x300 37 -> 81; onto an aligned
    # output, whose short rows already filled whole lines, ikmjl FP64 loses (50 -> 43).
    # Rows of RUNS_ROW_BYTES or more are left to tiles of their own, joined to the next
    # (UnarySpec.joined) where they share a line.
    runs = None
    if transposed and in_memory and row.size * itemsize < RUNS_ROW_BYTES:
        assert column is not None
        # rows of half a line or less, whose tiles of their own store a few bytes per line
        # each, take runs from anywhere, where in0's rows still come in whole lines
        tiny = row.size * itemsize <= SCATTERED_RUNS_ROW_BYTES
        runs = _continuing(candidates, row, column, tiny and column.size * itemsize >= LINE_BYTES)
    sized: list[tuple[Axis | None, tuple[int, int, int, int] | None]] = [
        (row, transpose_tiles[True] if transposed else None),
        (column, transpose_tiles[False] if transposed else None),
    ]
    if runs is not None:
        assert column is not None
        # as many rows as make the row's tile length, in any multiple
        target, low, high, _ = (-(-length // row.size) for length in transpose_tiles[True])
        if not _in_sequence(row, column, runs):  # each row from a place of its own
            target = high = -(-SCATTERED_RUNS_ROWS // row.size)
            low = min(low, target)
        runs_block = block_size(runs.size, target, low, high, 1)
        if runs_block < LEAST_RUNS_BLOCK[itemsize]:
            runs = None
        elif runs_block <= high:
            sized.append((runs, (runs_block, runs_block, runs_block, 1)))
        else:  # no block of a useful length
            runs = None
    for axis, tile_range in sized:
        if axis is None:
            continue
        is_row = axis is row
        if tile_range is not None:
            block = block_size(axis.size, *tile_range)
        elif is_row:
            block = axis.size
            run = ROW_BLOCK_BYTES // itemsize
            if column is None and axis.size > 2 * run:  # one run: blocks give threads a loop
                block = block_size(axis.size, run, run // 4, 4 * run, LINE_BYTES // itemsize)
        else:  # keep the tile within half of L2 so threads get loops to share
            limit = max(1, l2 // 2 // (row.size * itemsize))
            block = (
                block_size(axis.size, limit, 1, max(limit, 1), 1)
                if axis.size > limit
                else axis.size
            )
        if block < axis.size:
            outer, inner = split(axis, block)
            loops.append(outer)
            prims.append(inner.with_exec(PRIM))
        else:
            prims.append(axis.with_exec(PRIM))
    rest = [
        a.with_exec(ExecType.SEQ)
        for a in axes
        if a is not row and a is not column and a is not runs and a.dim_type in tile_types
    ]
    k_axes = [a.with_exec(PRIM) for a in axes if a.dim_type is DimType.K]
    result = problem.with_axes(loops + rest + prims + k_axes)
    shape = " x ".join(str(a.size) for a in prims)
    kind = "transposed" if transposed else "direct"
    note = ""
    if runs is not None:
        note = "; out's columns span two axes, read from in0 in runs"
    return result, f"{kind} tile {shape} ({'reads in0' if reads else 'output only'}{note})"


# A copy that is one run (ij->ij, or any whose tensors agree on every stride) moves blocks
# of this many bytes, so that the threads share the blocks' loop. FP32 copies, 2 threads
# against one (GB/s, in one process): 1 MB 124 -> 268, 4 MB 131 -> 210, 16 MB 83 -> 163,
# 64 MB 57 -> 118 (the copy probe's 289, 203, 147, 108); into every other element of a
# twice longer output, 30 -> 58 at 1 MB, 8 -> 16-20 from 16 MB.
ROW_BLOCK_BYTES = 256 * 1024
# A transpose whose output columns crowd an L1 set (a multiple of 2-4 KiB apart:
# ``teir.codegen.transpose.crowded_columns``) and that outgrows a core's L2 moves tiles of
# four blocks down those columns (256 bytes) and long along in0's unit stride, which the
# kernel goes down and stores around the caches. Hand-written ij->ji tiles on Zen 5, one
# thread (GB/s; rows x columns): 1024^2 FP32 64 x 64 41, 64 x 256 57, 64 x 1024 71, 32 x 1024
# 42, 128 x 1024 61-64, 256 x 256 50; 2048^2 FP32 64 x 512 58-60, 256 x 128 (the tile for
# memory) 42; FP64 1024^2 32 x 256-512 79, 64 x 64 52, 128 x 256 57. Einsum, alternating
# processes, NumPy's arrays (16 bytes past a line), best of 3 (us, one thread / two):
# ij->ji FP32 512^2 95 -> 25 / 49 -> 18, 1024^2 606 -> 111 / 309 -> 74, 2048^2 1018 -> 554
# / 558 -> 276; FP64 512^2 194 -> 51, 1024^2 556 -> 217, 2048^2 2246 -> 1684 / 1098 -> 594;
# ijk->kji 256x256x64 FP32 866 -> 544 / 429 -> 256; 24 random 2-5-D permutations of
# power-of-two-heavy sizes 1.21x by geometric mean, none slower beyond the noise.
CROWDED_ROW_BYTES = 256
CROWDED_COLUMNS = (512, 128, 1024, 16)
# A row of at most this many bytes (out's unit stride: 3-8 FP32, 3-4 FP64) whose tile of its
# own stores that little per line, from tiles far apart, takes runs even where in0's rows
# lie scattered along both axes, if in0's rows (the column) fill a line: a tile of about
# SCATTERED_RUNS_ROWS rows (fewer places to read per tile than the runs' usual 256
# elements). 2 threads, alternating processes, 40 random 3-6-D permutations of 24-80 MB
# with such rows, whose plans this changes: none slower beyond the noise (0.96x at worst),
# 1.09-15.7x faster (abcdef->efdbac 16x64x3x8x64x12 FP32 37.6 -> 2.4 ms, abcde->ebdca
# 3x32x24x64x100 FP32 23.2 -> 3.6 ms, abcd->dcba 8x64x100x128 FP32 3.6 -> 0.79 ms). Longer
# rows (33-63 bytes) gained as much on some (abcd->dcba 12x128x128x32 FP32 2.6x) and lost on
# others (abcdef->afecbd 24x32x12x7x8x12 FP64 0.26-0.44x); shorter in0 rows (32-48 bytes)
# lost (0.5x).
SCATTERED_RUNS_ROW_BYTES = 32
SCATTERED_RUNS_ROWS = 64


def _in_sequence(row: Axis, column: Axis, runs: Axis) -> bool:
    """Whether in0's rows (``column`` long) follow each other in memory along ``row`` or
    along ``runs``."""
    return column.size in (row.stride(Tensor.IN0), runs.stride(Tensor.IN0))


def _continuing(
    candidates: list[Axis], row: Axis, column: Axis | None, scattered: bool = False
) -> Axis | None:
    """The axis that continues ``row`` in the output (stride = the row's size) but lies
    elsewhere in in0 (a stride other than 0 and 1), if any, where in0's rows along it or
    along ``row`` follow each other in memory: the kernel then reads in0 in whole runs of
    rows. Rows scattered along both (ijkl->lkji, ijklm->mlkji) would come from hundreds of
    places per tile, which cost more than the long columns gain (lkji 48^4 FP32 with
    aligned arrays: 53 -> 32 GB/s); ``scattered`` accepts them (see
    ``SCATTERED_RUNS_ROW_BYTES``)."""
    if column is None or row.stride(Tensor.OUT) != 1 or row.stride(Tensor.IN0) <= 1:
        return None
    for axis in candidates:
        if axis is row or axis is column:
            continue
        if axis.stride(Tensor.OUT) == row.size and axis.stride(Tensor.IN0) > 1:
            return axis if scattered or _in_sequence(row, column, axis) else None
    return None
