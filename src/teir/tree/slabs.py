"""A contraction node computed in another order of its ids, a slab at a time, through arena
bytes that are free while it runs, each slab permuted into the node's tensor.

A node's order is fixed by its consumer (the root's by the caller), and the kernel that fits
the operands in that order may not be the outer-product one on untransposed operands
(:func:`teir.frontend.einsum_plan.outer_untransposed`): GETD's root ``[4,9,5,6,2] x
[4,2,7,8] -> [5,6,7,8,9]`` has M's unit stride in the result but K's in in0. Computed in the
order of the transposed product (``[5,6,9,7,8]``) it runs the plain kernel; whole, that
order would need a second tensor as large as the result, beyond the arena that equals
opt_einsum's memory. A slab of it (here one index of id 5: 1.5 MiB FP32) fits the arena
bytes the tree's dead intermediates leave free, and is permuted into place while it is still
in the caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from math import prod
from typing import Any

import numpy as np

from teir.codegen.target import l3_share
from teir.frontend.einsum_parse import Subscripts
from teir.frontend.einsum_plan import (
    RELAYOUT_FLOPS_PER_ELEMENT,
    Plan,
    make_plan,
    other_kernel,
    outer_untransposed,
    placeholder,
)
from teir.ir import DimType, Tensor
from teir.tree.layout import label, roles, row_major_strides, subscripts
from teir.tree.nodes import Node, NodeKind

# A slab is written and read back within the caches: at most half this process's share of
# the last level (``l3_share``), and at least this many elements, so that its two calls (a
# contraction and a permutation, each dispatched to the threads) stay few (a bound chosen,
# not measured: GETD's slabs hold 390625).
SLAB_LEAST_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class Slabs:
    """The node as ``len(offsets)`` slabs: each computed by ``contraction`` into the arena's
    free bytes at ``scratch`` (in ``order[depth:]``), then permuted into place by
    ``permutation``."""

    order: tuple[int, ...]  # the node's ids in the order the slabs are computed in
    depth: int  # order[:depth] is iterated over; order[depth] in chunks of ``chunk`` (0: whole)
    chunk: int
    contraction: Plan
    permutation: Plan
    offsets: tuple[tuple[int, int, int], ...]  # bytes into (in0, in1, the node's tensor)
    scratch: int  # the slab's byte offset in the arena
    nbytes: int  # the slab's bytes

    def run(self, in0: int, in1: int, out: int, arena: int) -> None:
        slab = arena + self.scratch
        for o0, o1, oo in self.offsets:
            self.contraction.run(in0 + o0, in1 + o1, slab)
            self.permutation.run(slab, 0, out + oo)

    def explain(self) -> str:
        what = f"each index of ids {list(self.order[: self.depth])}" if self.depth else ""
        if self.chunk:
            part = f"chunks of {self.chunk} along id {self.order[self.depth]}"
            what = f"{what} and {part}" if what else part
        what = what or "the whole node"
        lines = [
            f"# computed in the order {list(self.order)} (the outer-product kernel) in "
            f"{len(self.offsets)} slabs of {self.nbytes / 2**20:.2f} MiB ({what}) at arena @ "
            f"{self.scratch} B, bytes free during this step, each permuted into place",
            "# the contraction of one slab:",
            *self.contraction.explain().splitlines()[1:],
            "# the permutation of one slab:",
            *self.permutation.explain().splitlines()[1:],
        ]
        return "\n".join(lines)


def worth_slabs(node: Node, plan: Plan, sizes: Sequence[int]) -> bool:
    """Whether the two-operand ``node``, planned as ``plan`` in its own order, is worth
    computing in slabs of another: its kernel fills its lanes but is neither the plain
    outer-product one nor the one that packs its A tile, and the node does enough arithmetic
    per element to pay for permuting its result."""
    return (
        len(node.children) == 2
        and other_kernel(plan)
        and not outer_untransposed(plan)
        and node.flops(sizes) >= RELAYOUT_FLOPS_PER_ELEMENT * node.elements(sizes)
    )


def slab_ids(
    node: Node, sizes: Sequence[int], dtype: Any, threads: int, root: bool
) -> tuple[int, ...]:
    """The ids whose indices the slabs of ``node`` iterate over, outermost first, where
    compiling it with its operands and itself row-major in their ids (as a tree's
    intermediates lie) runs it in slabs, given all the room slabs may take; () where it
    would not. ``root``: the node is the tree's result (allocated per call)."""
    if node.kind is not NodeKind.CONTRACTION:
        return ()
    dtype = np.dtype(dtype)
    tensors = [*(c.ids for c in node.children), node.ids]
    views = [placeholder([sizes[i] for i in ids], None, dtype) for ids in tensors]
    plan, _ = make_plan(
        subscripts(node),
        views[:2],
        views[2],
        False,
        False,
        threads,
        relayout=False,
        resident_output=not root,
    )
    if not _runs_whole(plan) or not worth_slabs(node, plan, sizes):
        return ()
    strides = [row_major_strides(ids, sizes) for ids in tensors]
    slabs = plan_slabs(node, sizes, strides, dtype, threads, False, (0, l3_share() // 2))
    if slabs is None:
        return ()
    return slabs.order[: slabs.depth + (1 if slabs.chunk else 0)]


def _orders(node: Node) -> list[tuple[int, ...]]:
    """The orders that give the GEMM kernel unit strides on the result: the product's (N
    then M, innermost last) and the transposed product's (M then N), batch ids outermost."""
    by_role = roles(node)
    c, m, n = by_role["C"], by_role["M"], by_role["N"]
    found = []
    for order in (tuple(c + n + m), tuple(c + m + n)):
        if order != node.ids and order not in found:
            found.append(order)
    return found


def _cut(
    order: tuple[int, ...], sizes: Sequence[int], itemsize: int, room: int
) -> tuple[int, int] | None:
    """(depth, chunk): the largest slab of ``order`` within ``room`` bytes, iterating over
    ``order[:depth]`` and cutting ``order[depth]`` into chunks that divide it (0: whole)."""
    for depth in range(len(order)):
        rest = prod(sizes[i] for i in order[depth + 1 :]) * itemsize
        size = sizes[order[depth]]
        chunks = [d for d in range(size, 0, -1) if size % d == 0 and d * rest <= room]
        if chunks:
            return depth, 0 if chunks[0] == size else chunks[0]
    return None


def plan_slabs(
    node: Node,
    sizes: Sequence[int],
    strides: Sequence[dict[int, int]],
    dtype: Any,
    threads: int,
    relu: bool,
    room: tuple[int, int],
) -> Slabs | None:
    """Slabs for the contraction ``node`` whose operands and tensor have these element
    ``strides`` (in0, in1, out; per id), within ``room`` (arena offset, bytes), each running
    the outer-product kernel on untransposed operands; None if no order gives it one
    within the room."""
    dtype = np.dtype(dtype)
    for order in _orders(node):
        cut = _cut(order, sizes, dtype.itemsize, min(room[1], l3_share() // 2))
        if cut is not None:
            found = _slabs(node, order, cut, sizes, strides, dtype, threads, relu, room[0])
            if found is not None:
                return found
    return None


def _slabs(
    node: Node,
    order: tuple[int, ...],
    cut: tuple[int, int],
    sizes: Sequence[int],
    strides: Sequence[dict[int, int]],
    dtype: np.dtype[Any],
    threads: int,
    relu: bool,
    scratch: int,
) -> Slabs | None:
    """The node computed in ``order`` in the slabs ``cut`` gives (see ``_cut``), if each
    runs the outer-product kernel on untransposed operands (``outer_untransposed``: the
    root of ``[[[0,1],[1,2]->[0,2]],[2,3]->[0,3]],[3,4]->[4,0]``, ik,kj->ji, whose kernel
    packs B a column block at a time as it lies, in slabs of the order [0,4], its kernel
    packing A once per call, on 2 threads: 1024^3 FP32 64-66 -> 68-71 % of peak, FP64
    59-60 -> 69-73 %; 512^3 FP64 53-55 -> 68 %, FP32 70-72 % either way)."""
    depth, chunk = cut
    itemsize = dtype.itemsize
    fixed = order[:depth]
    slab_ids = order[depth:]
    slab_sizes = {i: sizes[i] for i in slab_ids}
    if chunk:
        slab_sizes[order[depth]] = chunk
    elements = prod(slab_sizes.values())
    if elements < SLAB_LEAST_ELEMENTS:
        return None
    tensors = [*(c.ids for c in node.children), node.ids]
    kept = [[i for i in ids if i not in fixed] for ids in tensors]
    views = [
        placeholder([slab_sizes.get(i, sizes[i]) for i in ids], [where[i] for i in ids], dtype)
        for ids, where in zip(kept, strides)
    ]
    slab = placeholder([slab_sizes[i] for i in slab_ids], None, dtype)
    names = [tuple(label(i) for i in ids) for ids in (*kept, slab_ids)]
    contraction, _ = make_plan(
        Subscripts((names[0], names[1]), names[3]),
        views[:2],
        slab,
        False,
        relu,
        threads,
        relayout=False,
        resident_output=True,
    )
    if not _runs_whole(contraction) or not outer_untransposed(contraction):
        return None
    if not _rows_close(contraction):
        return None
    permutation, _ = make_plan(
        Subscripts((names[3],), names[2]), [slab], views[2], False, False, threads, relayout=False
    )
    if not _runs_whole(permutation):
        return None
    steps = [range(sizes[i]) for i in fixed]
    if chunk:
        steps.append(range(0, sizes[order[depth]], chunk))
    moved = [*fixed, order[depth]] if chunk else list(fixed)
    offsets = tuple(
        tuple(
            itemsize * sum(at * where[i] for i, at in zip(moved, start) if i in ids)
            for ids, where in zip(tensors, strides)
        )
        for start in product(*steps)
    )
    return Slabs(
        order,
        depth,
        chunk,
        contraction,
        permutation,
        offsets,  # type: ignore[arg-type]  # three per slab
        scratch,
        elements * itemsize,
    )


# A slab's input tiles read where they lie keep their rows this close together (see
# _rows_close).
ROW_GAP_LIMIT_BYTES = 64 << 10


def _rows_close(plan: Plan) -> bool:
    """Whether the kernel tiles of both inputs, read where they lie, keep their rows within
    ``ROW_GAP_LIMIT_BYTES`` of each other (batch-reduce elements may lie further apart: each
    is a block of its own). opt2_fctn's FP32 root in the order [0,2,3,1] reads rows of 8
    elements 800 KB apart: 7.2 ms as it lies, 10.4 ms in slabs."""
    assert plan.config is not None
    schedule, itemsize = plan.config.schedule, plan.dtype.itemsize
    k_axes = [a for a in schedule.prim_axes if schedule.dim_types[a] is DimType.K]
    batch = k_axes[0] if len(k_axes) > 1 else None
    return all(
        abs(schedule.strides(tensor)[a]) * itemsize <= ROW_GAP_LIMIT_BYTES
        for tensor in (Tensor.IN0, Tensor.IN1)
        for a in schedule.prim_axes
        if a != batch and schedule.dim_sizes[a] > 1
    )


def _runs_whole(plan: Plan) -> bool:
    """Whether the plan runs as planned on the operands given (no copies, no NumPy sums)."""
    return not (plan.canonical is not None or plan.empty or any(plan.reductions))


__all__ = ["SLAB_LEAST_ELEMENTS", "Slabs", "plan_slabs", "slab_ids", "worth_slabs"]
