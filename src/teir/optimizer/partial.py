"""Partial tiles: where an axis has no good tile size, the operation becomes regions.

An axis whose size has no divisor in the block range (a prime like 1601) cannot be tiled
exactly: kept whole in one kernel it gives the threads no loop to share and lets the kernel's
operand panels outgrow the caches. Its last tile is peeled instead, as a compiler peels the
partial last iteration of a tiled loop: the axis splits into a main part, a multiple of 16
that tiles well, and the thin rest, and every combination of parts is a region of its own,
scheduled and compiled on its own and run on the same tensors at its offsets. ``einsum``
plans its regions with :func:`split_regions`; ``teir.optimize`` turns a configuration's into
its ``rests`` (``Config.rests``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from math import prod

from teir.codegen.target import Target
from teir.ir import DimType, PrimFirst, Primitives, PrimLast, Tensor
from teir.lower.tiles import copy_outgrows_cache
from teir.optimizer.problem import Axis, Problem

# Output axes longer than this with no divisor in the block range are split.
SPLIT_ABOVE = 320
SPLIT_MULTIPLE = 16
# ... and K axes longer than this. A K with no good divisor keeps a GEMM from cutting it into
# batch-reduce steps, so the kernel's operand panels span all of K and outgrow the caches;
# its main part and the thin rest then run as two regions adding into the same output. One
# thread, regions against the whole K (FP32, FP64): ij,jk->ik 97 x 4099 x 1000 2.4x, 3.7x;
# 1601^3 1.2x; 256 x 2003 x 256 1.8x, 2.6x; ki,kj->ij 500 x 500 x 4099 2.0x; ik,jk->ij
# 1999 x 97 x 2003 1.6x, 1.7x, 500 x 500 x 4099 2.2x, 2.6x, 1000^2 x 1601 1.7x, 0.87x (the
# one loss: there a GEMM over all of K beats the batch-reduce of K 1600 itself). Below, the
# rest's extra pass over the output costs more than the panels gain (K 331 at 2000^2 FP32
# 0.89x; K 1009 at 1000^2 0.98x, at 2000^2 1.22x).
K_SPLIT_ABOVE = 1000


@dataclass(frozen=True)
class RegionShape:
    """One region: its size on every axis, its element offsets into (in0, in1, out), and
    whether it keeps the first and the last primitive (a summed axis's parts add into the
    same output: only its first part writes it, only its last applies the ReLU)."""

    sizes: tuple[int, ...]
    offsets: tuple[int, int, int]
    keeps_first: bool
    keeps_last: bool


def _pieces(dim_type: DimType, size: int) -> list[tuple[int, int]]:
    """(start, length) of the parts of one axis: itself, or a main part and its rest."""
    least = K_SPLIT_ABOVE if dim_type is DimType.K else SPLIT_ABOVE
    if size <= least or any(size % d == 0 for d in range(16, SPLIT_ABOVE + 1)):
        return [(0, size)]
    main = size - size % SPLIT_MULTIPLE
    return [(0, main), (main, size - main)]


def split_regions(
    dim_types: Sequence[DimType],
    sizes: Sequence[int],
    strides: Sequence[tuple[int, int, int]],
    binary: bool,
    itemsize: int,
    forced: int | None = None,
) -> list[RegionShape]:
    """The regions of an operation with these axes, in the order they must run (the main
    part of a summed axis before its rest); one region when no axis needs splitting.

    Regions along output axes write disjoint parts of the output; a K axis beyond
    K_SPLIT_ABOVE is split alike, its rest adding into what its main part wrote. Permutations
    are split only between buffers in memory: there tiles decide the traffic and give threads
    loops to share (ij->ji 4001 x 2999 FP32 ran as one tile on one thread), while a copy
    within the caches runs well as one tile and would pay a call per region.
    ``forced``: split that axis alone, into its largest multiple of 16 and the rest.
    """
    if forced is not None:
        pieces = [[(0, n)] for n in sizes]
        main = sizes[forced] - sizes[forced] % SPLIT_MULTIPLE
        pieces[forced] = [(0, main), (main, sizes[forced] - main)]
    else:
        splits = binary or copy_outgrows_cache(prod(sizes), itemsize)
        pieces = [_pieces(t, n) if splits else [(0, n)] for t, n in zip(dim_types, sizes)]
    split_k = [i for i, t in enumerate(dim_types) if t is DimType.K and len(pieces[i]) > 1]
    regions = []
    for choice in product(*pieces):
        offsets = tuple(
            sum(start * axis[tensor] for (start, _), axis in zip(choice, strides))
            for tensor in range(3)
        )
        regions.append(
            RegionShape(
                tuple(length for _, length in choice),
                (offsets[0], offsets[1], offsets[2]),
                all(choice[i] == pieces[i][0] for i in split_k),
                all(choice[i] == pieces[i][-1] for i in split_k),
            )
        )
    return regions


def problem_regions(
    problem: Problem, forced: int | None = None
) -> list[tuple[Problem, tuple[int, int, int]]]:
    """The regions of ``problem`` (see :func:`split_regions`; ``forced`` as there) as
    problems of their own, with their offsets."""
    p = problem.primitives
    axes = problem.axes
    shapes = split_regions(
        [a.dim_type for a in axes],
        [a.size for a in axes],
        [a.strides for a in axes],
        p.prim_main.is_contraction,
        p.data_type.itemsize,
        forced,
    )
    if len(shapes) == 1 or not (p.prim_main.is_contraction or p.prim_main.is_unary):
        return [(problem, (0, 0, 0))]
    result = []
    for shape in shapes:
        primitives = Primitives(
            p.data_type,
            p.prim_first if shape.keeps_first else PrimFirst.NONE,
            p.prim_main,
            p.prim_last if shape.keeps_last else PrimLast.NONE,
        )
        region_axes = tuple(
            Axis(a.dim_type, n, a.strides, a.exec_type) for a, n in zip(axes, shape.sizes)
        )
        result.append((Problem(primitives, region_axes), shape.offsets))
    return result


# A contraction whose output axes give the threads no loop to share (97 x 311: no divisor
# that tiles) runs on one thread; an output axis not a multiple of 16 (the one whose rest
# costs least, see thread_split_axes) is then split as an awkward one is, where that gives
# the main part a loop the threads share and the work is worth them. The rest (97 x 7 x 2000
# of 97 x 311 x 2000) runs after it. Two threads: FP64 97 x 311 x 2000 46 -> 85 % of peak.
THREAD_SPLIT_LEAST = 32  # an axis shorter than this stays whole
THREAD_SPLIT_FLOPS = 20_000_000
# ... likewise where the shared loops split so unevenly that this share of the threads' time
# goes idle (3 batch elements of 97 x 97 on 2 threads: a quarter), and the split's main part
# idles them at least this much less.
THREAD_SPLIT_IDLE = 0.1


def idle_share(iterations: int, threads: int) -> float:
    """The share of ``threads``' time idle when ``iterations`` equal ones are split between
    them (1 iteration on 2 threads: a half)."""
    busiest = -(-iterations // threads)
    return 1 - iterations / (threads * busiest)


def thread_split_axes(problem: Problem, threads: int) -> list[tuple[int, float]]:
    """Output axes to try splitting so that the threads get a loop to share, with what their
    rest costs (a share of the time), cheapest first: none for one thread, a copy, or too
    little work (THREAD_SPLIT_FLOPS). A split pays where the threads' idle share falls by
    more than its rest costs."""
    p = problem.primitives
    work = 2 * prod(a.size for a in problem.axes)
    if threads < 2 or not p.prim_main.is_contraction or work < THREAD_SPLIT_FLOPS:
        return []
    lanes = Target.host().lanes(p.data_type.itemsize)

    def rest_cost(index: int) -> float:
        """The rest's share of the work, on one thread while the others wait, and slower by
        the lanes its vectors leave empty where it is the output's unit-stride axis (97 x 97
        x 3000 FP32: the row M = 96 of a column-major A, 15 of 16 lanes empty, took a fifth
        of the time; 307 x 37 x 2000: the rest of N, 5 of 37 columns, cost 8 %)."""
        axis = problem.axes[index]
        rest = axis.size % SPLIT_MULTIPLE
        fill = rest / (-(-rest // lanes) * lanes) if axis.stride(Tensor.OUT) == 1 else 1.0
        return rest / axis.size * threads / fill

    candidates = [
        index
        for index, axis in enumerate(problem.axes)
        if axis.dim_type is not DimType.K
        and axis.size >= THREAD_SPLIT_LEAST
        and axis.size % SPLIT_MULTIPLE
    ]
    return sorted(((index, rest_cost(index)) for index in candidates), key=lambda c: c[1])


def describe(problem: Problem, regions: list[tuple[Problem, tuple[int, int, int]]]) -> str:
    """What the split did, for the optimizer's log."""
    if len(regions) == 1:
        return "every axis tiles whole"
    split = []
    for index, axis in enumerate(problem.axes):
        lengths = sorted({region.axes[index].size for region, _ in regions}, reverse=True)
        if len(lengths) > 1:
            split.append(f"{axis.dim_type.value}{axis.size} = {' + '.join(map(str, lengths))}")
    return (
        f"{', '.join(split)} (no tile size divides it): {len(regions)} regions, the main "
        "part and its rests, each scheduled on its own"
    )
