"""Passes on the loops around the primitive: their order, and which of them run in parallel."""

from __future__ import annotations

from math import prod

from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target, cache_sizes
from teir.ir import DimType, ExecType, Tensor
from teir.ir.layout import is_injective
from teir.lower.panels import packs_b_panel
from teir.lower.tiles import copy_outgrows_cache, main_op
from teir.optimizer.problem import Axis, Problem
from teir.optimizer.simplify import block_size, divisors, split
from teir.optimizer.transposed import transposed_tile

# the tiles per block of each of a copy's two innermost loops (see _copy_order)
COPY_BLOCK = 8
# the same for elementwise products (one-element kernels), the input's and the output's:
# 8 x 32 against 16 x 16 on 8 einsums, 0.85x time by geometric mean (2 cores)
READ_ELEMENTS = 8
WRITE_ELEMENTS = 32
# the bytes a cache line holds, for counting the lines a loop nest touches between reuses
LINE_BYTES = 64
# the same for the tiles of products without K whose input rows lie pages apart (see
# _scattered_reads): 4, 8 and 16 on d,dga->gda FP32 11.6, 10.3 and 10.7 ms
TILE_BLOCK = 8
# a page, and how many times smaller than the other the scaling input of such a product is
PAGE_BYTES = 4096
SMALL_INPUT_SHARE = 16
# the tile of an elementwise product that writes its input transposed (see _tile_order):
# (target, least, most, preferred multiple) elements along the output's unit stride and
# along the input's, those of a transposing Copy's tile (primitive.unary), between buffers
# in memory and within the caches (a multiple of 16 keeps threads off each other's lines)
TRANSPOSED_TILES = {
    True: ((256, 128, 512, 16), (128, 64, 256, 16)),
    False: ((64, 16, 256, 16), (64, 16, 256, 16)),
}


def reorder(problem: Problem) -> tuple[Problem, str]:
    """Loops: C/M/N loops outside (largest output stride first, so consecutive iterations
    touch neighbouring output tiles and reuse the input block the inner loop shares; one
    that steps a large input within its cache lines innermost of them), K loops innermost
    (an output tile stays in cache while it is accumulated). Copies and ReLUs
    that read in0 follow both tensors' memory order instead (``_copy_order``), and so do
    products without K loops where the first order would lose a tensor's cache lines or
    pages before their next elements are used (``_product_order``)."""
    loops = [a for a in problem.axes if a.exec_type is not ExecType.PRIM]
    prims = [a for a in problem.axes if a.exec_type is ExecType.PRIM]
    if _summed_along_the_output(loops, prims):
        text = ", ".join(f"{a.dim_type.value}{a.size}" for a in loops)
        return problem, f"loops {text} (as chosen: the output's unit-stride C axis innermost)"
    outer = sorted(
        (a for a in loops if a.dim_type is not DimType.K), key=lambda a: -a.stride(Tensor.OUT)
    )
    inner = [a for a in loops if a.dim_type is DimType.K and a.panel_of is None]
    stepping = [a for a in loops if a.dim_type is DimType.K and a.panel_of is not None]
    if not stepping:
        outer = _line_sharing_innermost(outer, problem)
    ordered = outer + stepping + inner
    if stepping:
        # each K step's packed panel is reused by the loop that does not move it, innermost
        panel_of = stepping[0].panel_of
        assert panel_of is not None
        reusing = [a for a in outer if a.stride(panel_of) == 0]
        if reusing:
            last = reusing[-1]
            ordered = [a for a in outer if a is not last] + stepping + [last] + inner
    note = ""
    if problem.primitives.prim_main.is_unary and not inner:
        ordered = _copy_order(outer, Tensor.IN0, COPY_BLOCK, COPY_BLOCK)
        if len(ordered) > 1:
            note = " (copy: in0's next rows innermost, the output's next columns outside them)"
    elif not inner and not stepping:
        ordered, note = _product_order(outer, prims, problem)
    text = "loops " + (", ".join(f"{a.dim_type.value}{a.size}" for a in ordered) or "none") + note
    return problem.with_axes(ordered + prims), text


def _product_order(
    loops: list[Axis], prims: list[Axis], problem: Problem
) -> tuple[list[Axis], str]:
    """The loops of a product without K loops, and a note on why they moved: one-element
    kernels whose loops would pass more than L1 of a tensor's lines between uses of one in
    ``_element_order``, kernels reading the large input's rows pages apart in
    ``_copy_order``'s blocks (``_scattered_reads``), others as they are."""
    read, _ = _larger_input(loops)
    one_element = all(a.size == 1 for a in prims)
    tile = transposed_tile(loops, prims, problem.primitives) if one_element else None
    if tile is not None:
        return _tile_order(loops, tile, problem)
    if one_element and _bytes_between_reuse(loops, problem) > cache_sizes()["L1"]:
        if _unit_loop(loops, read).size >= READ_ELEMENTS // 2:
            return _element_order(loops, read)
        return loops, ""
    scattered = _scattered_reads(loops, prims, problem)
    if scattered is None:
        return loops, ""
    return _copy_order(loops, scattered, TILE_BLOCK, TILE_BLOCK), (
        f" (scattered rows: {scattered.name.lower()}'s next tiles innermost, the output's"
        " next outside them)"
    )


def _tile_order(
    loops: list[Axis], tile: tuple[Axis, Axis, Tensor], problem: Problem
) -> tuple[list[Axis], str]:
    """The loops of an elementwise product that writes its input transposed (``tile``: the
    rows, columns and input of ``transposed_tile``): the tile of the output's and the
    input's unit-stride loops innermost, cut as a transposing Copy's tile, the other loops
    around it in the copy's order (the input's next tiles innermost)."""
    row, column, read = tile
    itemsize = problem.primitives.data_type.itemsize
    in_memory = copy_outgrows_cache(_elements(loops, Tensor.OUT), itemsize)
    outer = [a for a in loops if a is not row and a is not column]
    tile_loops: list[Axis] = []
    for axis, tile_range in zip((row, column), TRANSPOSED_TILES[in_memory]):
        elements = block_size(axis.size, *tile_range)
        if elements < axis.size:
            blocks, axis = split(axis, elements)
            outer.append(blocks)
        tile_loops.append(axis)
    ordered = _copy_order(outer, read, COPY_BLOCK, COPY_BLOCK)
    rows, columns = tile_loops
    return ordered + tile_loops, (
        f" (transposed tile {rows.size} x {columns.size} of {read.name.lower()} innermost,"
        f" its next tiles inside the output's)"
    )


def _larger_input(loops: list[Axis]) -> tuple[Tensor, Tensor]:
    """The input the loops reach more elements of, then the other (in0 first on ties)."""
    if _elements(loops, Tensor.IN1) > _elements(loops, Tensor.IN0):
        return Tensor.IN1, Tensor.IN0
    return Tensor.IN0, Tensor.IN1


def _line_sharing_innermost(loops: list[Axis], problem: Problem) -> list[Axis]:
    """The loops with the one that steps an input by less than a cache line moved innermost,
    where each call of the kernel reads more of that input than L1 holds: consecutive
    iterations then read the same lines while they are still in L2, instead of once per
    pass of the loops inside it (echg,gceh->ge c 256 e 112 g 16 h 64, in0's unit stride on
    the C axis g outermost: in0 read 16 times from memory, FP32 61 -> 31 ms, FP64 138 ->
    72; 4 of 1662 random einsums change, 0.75x time by geometric mean, none slower)."""
    itemsize = problem.primitives.data_type.itemsize
    l1 = cache_sizes()["L1"]

    def steps_within_a_line(axis: Axis) -> int | None:
        distances = [
            abs(axis.stride(t))
            for t in (Tensor.IN0, Tensor.IN1)
            if 0 < abs(axis.stride(t)) * itemsize < LINE_BYTES
            and _operand_tile_bytes(problem, t) > l1
        ]
        return min(distances, default=None)

    sharing = [(d, i) for i, a in enumerate(loops) if (d := steps_within_a_line(a)) is not None]
    if not sharing:
        return loops
    _, index = min(sharing)
    return [*loops[:index], *loops[index + 1 :], loops[index]]


def _summed_along_the_output(loops: list[Axis], prims: list[Axis]) -> bool:
    """Whether the primitive is one element summed over K loops that lie outside an innermost
    C loop (primitive identification's order for ``ij,ij->j``: the K loops must not move
    inside it)."""
    return (
        all(a.size == 1 for a in prims)
        and bool(loops)
        and loops[-1].dim_type is DimType.C
        and any(a.dim_type is DimType.K for a in loops)
    )


def _scattered_reads(loops: list[Axis], prims: list[Axis], problem: Problem) -> Tensor | None:
    """The input an elementwise-like product (no K: a large input scaled by a small one into
    a permuted output) reads one tile a page or more apart from the last in every innermost
    iteration, while its own next tiles lie along an outer loop; None where that is not so.
    Such inputs beyond L2 read faster in ``_copy_order``'s blocks (FP32 on 2 cores:
    da,gbadc->cdgab 13.1 -> 1.3 ms, ba,b->ab 4.7 -> 1.8, d,dga->gda 15 -> 10; below L2 the
    blocks' loop overhead lost up to 1.5x), where the output's next tiles run in blocks too
    (a prime count of them: gacb,b->cabg FP64 0.77 -> 0.94 ms)."""
    if len(loops) < 2 or any(a.size > 1 for a in prims if a.dim_type is DimType.K):
        return None
    read, other = _larger_input(loops)
    itemsize = problem.primitives.data_type.itemsize
    large = _elements(loops, read) * _tile_elements(prims, read) * itemsize
    if (
        _elements(loops, other) * SMALL_INPUT_SHARE > _elements(loops, read)
        or large <= cache_sizes()["L2"]
        or abs(loops[-1].stride(read)) * itemsize < PAGE_BYTES
        or _unit_loop(loops, read) is loops[-1]
        or not _blocks(_unit_loop(loops, Tensor.OUT).size, TILE_BLOCK)
    ):
        return None
    return read


def _tile_elements(prims: list[Axis], tensor: Tensor) -> int:
    """Elements of ``tensor`` in one kernel tile."""
    return prod(a.size for a in prims if a.stride(tensor) != 0)


def _blocks(size: int, block: int) -> bool:
    """Whether a loop of ``size`` runs in blocks of about ``block`` (``_copy_order``)."""
    return block_size(size, block, block // 2, 2 * block, 1) <= 2 * block


def _element_order(loops: list[Axis], read: Tensor) -> tuple[list[Axis], str]:
    """The loops of an elementwise product in ``_copy_order`` with the ``read`` input's blocks
    of READ_ELEMENTS, and a note saying so; where its unit-stride extent has no such block (a
    prime), the output's run innermost instead: every step across the whole extent would
    write another page of the output, more pages than the TLB holds (dc,bcda->abcd FP32 a 97
    d 48 c 20 b 192: 26 -> 9 ms; copies keep their order, 0.9-1.8x the time with this one)."""
    reads = _unit_loop(loops, read)
    writes = _unit_loop(loops, Tensor.OUT)
    name = read.name.lower()
    if reads is not writes and not _blocks(reads.size, READ_ELEMENTS):
        others = [a for a in loops if a is not reads and a is not writes]
        return [*others, reads, writes], (
            f" (elementwise: the output's next elements innermost, {name}'s next outside"
            f" them, {reads.size} of them in no blocks)"
        )
    return _copy_order(loops, read, READ_ELEMENTS, WRITE_ELEMENTS), (
        f" (elementwise: {name}'s next elements innermost, the output's next outside them)"
    )


def _unit_loop(loops: list[Axis], tensor: Tensor) -> Axis:
    """The loop that steps ``tensor`` the shortest distance in memory (the longer on ties)."""
    return min(loops, key=lambda a: (abs(a.stride(tensor)) or float("inf"), -a.size))


def _elements(loops: list[Axis], tensor: Tensor) -> int:
    """How many elements of ``tensor`` the loops reach."""
    return prod(a.size for a in loops if a.stride(tensor) != 0)


def _bytes_between_reuse(loops: list[Axis], problem: Problem) -> int:
    """The most cache-line bytes any tensor's accesses pass through between two uses of one
    of its lines, in this loop order: the line is used again by the next iteration of the
    tensor's shortest-stride loop, after every loop inside that one has run (a tensor whose
    shortest stride spans a line or more never reuses its lines)."""
    itemsize = problem.primitives.data_type.itemsize
    worst = 0
    for tensor in (Tensor.IN0, Tensor.IN1, Tensor.OUT):
        moving = [i for i, a in enumerate(loops) if a.stride(tensor) != 0]
        if not moving:
            continue
        unit = min(moving, key=lambda i: abs(loops[i].stride(tensor)))
        if abs(loops[unit].stride(tensor)) * itemsize >= LINE_BYTES:
            continue
        lines = prod(loops[i].size for i in moving if i > unit)
        worst = max(worst, lines * LINE_BYTES)
    return worst


def _copy_order(loops: list[Axis], read: Tensor, read_block: int, write_block: int) -> list[Axis]:
    """The loops of a copy (largest output stride outermost) with the one that continues
    the ``read`` tensor's tiles in memory innermost and the one that continues the output's
    tiles next to it, both cut into blocks of about ``read_block`` and ``write_block`` tiles
    when they are longer.

    Consecutive tiles then extend the same rows of the input, and every block of them the
    same columns of the output, so both tensors are read and written in runs of a few
    hundred bytes to kilobytes from a few pages at a time rather than one cache line from
    each of many pages (the TLB's reach and DRAM's open rows): ijkl->lkji 48^4 FP32 on one
    core, 11 -> 17 GB/s, and with streaming stores 19 -> 28 GB/s.
    """
    if len(loops) < 2:
        return loops
    reads = _unit_loop(loops, read)
    writes = _unit_loop(loops, Tensor.OUT)
    others = [a for a in loops if a is not reads and a is not writes]
    if reads is writes:
        return [*others, reads]
    outer: list[Axis] = []
    inner: list[Axis] = []
    for axis, block in ((reads, read_block), (writes, write_block)):
        tiles = block_size(axis.size, block, block // 2, 2 * block, 1)
        if tiles < axis.size:
            blocks, axis = split(axis, tiles)
            outer.append(blocks)
        inner.insert(0, axis)
    return others + outer + inner


def _operand_tile_bytes(problem: Problem, tensor: Tensor) -> int:
    """Bytes of ``tensor`` that one output tile reads: its prim axes and every K loop."""
    elements = prod(
        a.size
        for a in problem.axes
        if (a.exec_type is ExecType.PRIM and a.stride(tensor) != 0)
        or (a.exec_type is not ExecType.PRIM and a.dim_type is DimType.K)
    )
    return elements * problem.primitives.data_type.itemsize


# The share of the last-level cache that the threads' panels may fill together. Half had kept
# 1600^3 FP64 (B tiles of 2 MB) on 2 threads at panels of 2 tiles, whose A tiles are then
# packed again for every 2 N tiles; three quarters gives panels of 5 (10 MB per thread of 32
# MB): 85.3-88.1 -> 90.2-91.4 % of the probe (alternating processes, 5 pairs of 6), the 64/25
# contraction alike 86.5-88.0 -> 90.0-91.1; FP32's inputs the same (93 %, now M shared under
# one panel of 10); trus,pqtu->pqrs 32x64^3 x 48^2 FP32 (panels of 8 tiles instead of 4)
# 77.4-78.7 -> 76.1-76.9 ms; no other of the suite and 150 random contractions per dtype
# changes its plan but one FP64 (bca,ced->edba 24x128x97 x 83x100, the same 21.6 ms); square
# GEMMs of 1024-4096 keep theirs but 1536^3 FP32 (panels of 8, 93-95 -> 95-96 %) and 3072^3
# FP64 (panels of 2, the same 217-223 GFLOP/s). All of L3 had taken 2048^3 FP64 from 242 to
# 203-232 GFLOP/s; three quarters leaves it as it was.
PANEL_L3_SHARE = 0.75


def panel(problem: Problem, threads: int) -> tuple[Problem, str]:
    """Panels of the outer of the two innermost tile loops (Goto's order) when the inner one
    sweeps more of its operand than L2 holds.

    With loops ``P, Q`` around the kernel, every P iteration re-reads all of Q's operand
    (A for an M loop, B for an N loop) and each P tile's operand is reused only within it.
    Splitting P into panels of ``p`` tiles, ordered ``P_panels, Q, P_tiles``, reuses each Q
    tile ``p`` times while it is hot, with the panel's ``p`` tiles of the other operand kept
    in the last-level cache (``PANEL_L3_SHARE`` of it, shared by the threads): 1600^3 GEMM
    FP64 98 -> 102, FP32 196 -> 207 GFLOP/s on 2 cores.
    """
    if not problem.primitives.prim_main.is_contraction:
        return problem, "no contraction: no panels"
    axes = list(problem.axes)
    tiles = [
        i
        for i, a in enumerate(axes)
        if a.exec_type is not ExecType.PRIM and a.dim_type is not DimType.K
    ]
    if len(tiles) < 2:
        return problem, "fewer than two tile loops: no panels"
    p_at, q_at = tiles[-2], tiles[-1]
    outer_loop, inner_loop = axes[p_at], axes[q_at]
    if q_at - p_at > 1:
        return problem, "K steps lie between the two innermost tile loops: no panels"
    b_tensor = _packed_b(problem)
    if b_tensor is not None and (inner_loop.stride(b_tensor) == 0) != (
        outer_loop.stride(b_tensor) == 0
    ):
        if inner_loop.stride(b_tensor) != 0:
            axes[p_at], axes[q_at] = inner_loop, outer_loop
            inner_loop = outer_loop
        return problem.with_axes(axes), (
            f"the kernel's transposed B is packed once per tile of the loops outside the "
            f"{inner_loop.dim_type.value} loop, which runs innermost"
        )
    operand_of = {DimType.M: Tensor.IN0, DimType.N: Tensor.IN1}
    if {outer_loop.dim_type, inner_loop.dim_type} != {DimType.M, DimType.N}:
        return problem, "the two innermost tile loops are not an M and an N loop: no panels"
    caches = cache_sizes()
    swept = inner_loop.size * _operand_tile_bytes(problem, operand_of[inner_loop.dim_type])
    if swept <= caches["L2"]:
        return problem, f"the inner loop reads {swept >> 10} KiB, within L2: no panels"
    tile = _operand_tile_bytes(problem, operand_of[outer_loop.dim_type])
    budget = int(caches["L3"] * PANEL_L3_SHARE) // max(threads, 1)
    fitting = [d for d in divisors(outer_loop.size) if d * tile <= budget]
    depth = max(fitting, default=1)
    if depth < 2:
        return problem, "one tile of the outer loop's operand fills the cache share: no panels"
    order: list[Axis]
    if depth == outer_loop.size:
        order = [inner_loop, outer_loop]
    else:
        panels, within = split(outer_loop, depth)
        order = [panels, inner_loop, within]
    axes[p_at : q_at + 1] = order
    return problem.with_axes(axes), (
        f"{outer_loop.dim_type.value} loop in panels of {depth} tiles around the "
        f"{inner_loop.dim_type.value} loop ({swept >> 20} MiB swept per iteration)"
    )


def _packed_b(problem: Problem) -> Tensor | None:
    """The tensor of the kernel's B where B is stored transposed with its K steps so far
    apart that the kernel would copy it a column block at a time on every call, and its tile
    fits a packed panel (:func:`teir.lower.panels.packs_b_panel`): the loop order then keeps
    B still in the innermost loop, so that the nest packs it once for that loop (1024^3
    ``ki,kj->ij`` FP32 kernels with A streamed instead: 60 -> 67 % of peak)."""
    main, _ = main_op(problem.to_config(), False)
    if main is None or not isinstance(main.spec, BrgemmSpec) or main.loops:
        return None
    return main.operands[1] if packs_b_panel(main.spec, Target.host()) else None


# Shared loops are added until their iterations split within 2 % between the threads, or
# until there are this many per thread.
BALANCED_ITERATIONS = 32
BALANCE_LIMIT = 0.02


def splits_evenly(count: int, threads: int) -> bool:
    """Whether ``count`` parallel iterations give the ``threads`` balanced work: within
    ``BALANCE_LIMIT``, or so many per thread that none waits long."""
    if count >= BALANCED_ITERATIONS * threads:
        return True
    return count >= threads and (-(-count // threads) * threads - count) / count <= BALANCE_LIMIT


def parallelize(problem: Problem, threads: int) -> tuple[Problem, str]:
    """Mark leading C/M/N loops shared until they give every thread balanced work, passing
    over the K steps of a packed panel (not marked). Never a K loop, and nothing when the
    output aliases (parallel iterations would race)."""
    axes = list(problem.axes)
    if threads <= 1:
        return problem, "one thread: no shared loops"
    out_axes = [a for a in axes if a.dim_type is not DimType.K]
    if not is_injective([a.size for a in out_axes], [a.stride(Tensor.OUT) for a in out_axes]):
        return problem, "the output aliases (or is not proven free of it): no shared loops"
    loops = [a for a in axes if a.exec_type is not ExecType.PRIM]
    prims = [a for a in axes if a.exec_type is ExecType.PRIM]
    tile = transposed_tile(loops, prims, problem.primitives)
    # the tile of a transposing kernel (its rows, then its columns, innermost) stays whole
    # in one thread's calls
    tiled = tile is not None and tile[:2] == tuple(loops[-2:])
    chosen: list[int] = []
    for index, axis in enumerate(axes):
        if axis.exec_type is ExecType.PRIM or (tiled and index >= len(loops) - 2):
            break
        if axis.dim_type is DimType.K:
            # The K steps of a packed panel run around the column loop that reuses it; that
            # loop is shared too where the row loop alone splits unevenly (the threads keep
            # their own output tiles through every step). FP32 ki,jk->ij 2000 x 700 x 1300
            # relaid, M loop of 5: 47-55 -> 63-65 % of peak on 2 threads.
            if axis.panel_of is not None:
                continue
            break
        chosen.append(index)
        # GETD's last step shared 25 iterations 12/13 (4 % idle) before the N loop joined
        if splits_evenly(prod(axes[i].size for i in chosen), threads):
            break
    if not chosen:
        return problem, "no C/M/N loop to share between threads"
    for index in chosen:
        axes[index] = axes[index].with_exec(ExecType.SHARED)
    count = prod(axes[i].size for i in chosen)
    return problem.with_axes(axes), (
        f"shared {len(chosen)} loop(s), {count} parallel iterations for {threads} threads"
    )
