"""A short batch label on the result's unit stride, rewritten as a contraction and a free
label: ``out[i, c] = sum_j x[i, j, c] * y[j, c]`` is computed as ``out[i, c] = sum_{j, z}
x[i, j, z] * y2[j, z, c]``, where ``y2`` is the smaller operand with a diagonal added along
the batch label (``y2[j, z, c] = y[j, z]`` where ``z == c``, zero elsewhere).

Why: a batch label that is the result's unit stride (the NumPy layout of complex pairs,
RGB channels, small trailing vectors) fits no GEMM kernel, so the plan multiplies one
element per K step in loops whose innermost one runs along the batch; shorter than a
vector, that loop runs scalar code (2.5 GFLOP/s on 2 threads, FP32 ``ijc,jc->ic`` 2000 x
2000 x 2: 6.1 ms, NumPy 3.9). Rewritten, the batch is a summed label of the larger operand
(often continuing its K run in memory) and a free one of the smaller, and a kernel runs it
(0.23 ms). The rewrite multiplies the FLOPs by the batch size and the smaller operand's
elements too, so it is taken only for batches shorter than a vector, only where the plan
as the operands lie has the one-element kernel and sums something, and only when the
smaller operand, expanded, stays within a fraction of the larger (see ``choose``).

The expanded operand is made on each call (zeros, then the operand copied onto the
diagonal); its batch axis goes innermost, next to the new summed label, which measured
better than outermost on 6 of 9 random shapes (and alike on the rest).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from teir.codegen.target import Target
from teir.frontend.einsum_parse import LETTERS, letter_map
from teir.frontend.einsum_plan import (
    Operand,
    Plan,
    label_sizes,
    label_view,
    one_element,
    operand,
    runs_kernels,
)
from teir.ir import DimType

# The expanded operand holds at most this fraction of the larger operand's elements: it is
# made on each call, and its product FLOPs grow with it.
EXPANDED_SHARE = 0.5
# Contractions below this many FLOPs, or this many per squared batch size (the rewrite
# multiplies the FLOPs by the batch; a longer batch fills more of the vectors the plan's
# loops run on), keep their plan: the expansion and the second call cost more than the
# loops they replace.
MIN_FLOPS = 20_000
MIN_FLOPS_PER_SQUARE = 5_000
# ... and so do those whose rewritten contraction would do more FLOPs than this per element
# it moves (the expanded operand's included): the rewrite pays where it moves bytes.
MOST_FLOPS_PER_ELEMENT = 32


@dataclass(frozen=True)
class Diagonal:
    """The rewrite of a binary einsum: operand ``expanded`` gets a last axis of ``size`` on
    which only its diagonal with the batch label's axis (``axis``, among its labels) is
    nonzero; ``subscripts`` is the rewritten contraction in letters."""

    label: str  # the batch label (as the einsum's subscripts name it)
    size: int
    expanded: int  # operand index
    axis: int  # the batch label's position among the expanded operand's labels
    subscripts: str
    where: str  # whose unit stride the batch is, and why that costs

    def explain(self) -> str:
        name = f"'...' dimension {self.label}" if self.label.isdigit() else repr(self.label)
        return (
            f"# the batch label {name} ({self.size}) is {self.where}, and shorter than a "
            f"vector: operand {self.expanded} is expanded along a diagonal (a summed label "
            f"in place of the batch, the batch a free label of its own) and the contraction "
            f"runs as {self.subscripts}"
        )


def _innermost_batch(plan: Plan) -> int:
    """The size of the scheduled configuration's batch axis of unit output stride (batch
    labels that lie one after the other fused into it), 0 where there is none."""
    config = plan.config
    if config is None:
        return 0
    sizes = [
        size
        for size, kind, stride in zip(config.dim_sizes, config.dim_types, config.strides_out)
        if kind is DimType.C and stride == 1 and size > 1
    ]
    return max(sizes, default=0)


def _elements(op: Operand, sizes: dict[str, int]) -> int:
    return prod(sizes[label] for label in op.labels)


def choose(plan: Plan, inputs: list[Operand]) -> Diagonal | None:
    """The rewrite for ``plan`` (as the operands lie), or None. Taken for a binary
    contraction that sums something, with a batch label shorter than a vector that either
    is the result's unit stride where the plan has the one-element kernel, or is the larger
    operand's unit stride where no kernel fits as the operands lie (their copies planned);
    large enough (``MIN_FLOPS``, ``MIN_FLOPS_PER_SQUARE``) and bound by moving its operands
    once rewritten (``MOST_FLOPS_PER_ELEMENT``), whose smaller operand expanded by the batch
    holds at most ``EXPANDED_SHARE`` of the larger's elements."""
    if len(inputs) != 2 or plan.empty or plan.lanes is not None or plan.operation is None:
        return None
    if any(plan.reductions):
        return None
    output = plan.subscripts.output
    sizes = label_sizes(inputs, output)
    if not any(label not in output for label in inputs[0].labels if label in inputs[1].labels):
        return None  # nothing summed: the elementwise loops write whole lines as they are
    counts = [_elements(op, sizes) for op in inputs]
    small = 0 if counts[0] <= counts[1] else 1
    lanes = Target.host().lanes(plan.dtype.itemsize)
    if one_element(plan):
        if _innermost_batch(plan) >= lanes:
            return None  # fused with further batch labels into a run that fills vectors
        inner = [label for label in plan.out_memory if sizes[label] > 1]
        label = inner[-1] if inner else ""
        where = "the result's unit stride (scalar loops as the operands lie)"
    elif not runs_kernels(plan):
        big = inputs[1 - small]
        units = [x for x in big.labels if big.strides[x] == 1 and sizes[x] > 1]
        label = units[0] if units else ""
        where = f"operand {1 - small}'s unit stride (no kernel fits it as it lies)"
    else:
        return None
    if label not in output or any(label not in op.labels for op in inputs):
        return None
    size = sizes[label]
    if not 2 <= size < lanes or any(op.sizes[label] != size for op in inputs):
        return None  # (a size-1 batch broadcast in one operand has no diagonal to spread)
    flops = plan.operation.config.flops
    if flops < max(MIN_FLOPS, MIN_FLOPS_PER_SQUARE * size * size):
        return None
    if size * counts[small] > EXPANDED_SHARE * counts[1 - small]:
        return None
    moved = size * counts[small] + counts[1 - small] + prod(sizes[x] for x in output)
    if size * flops > MOST_FLOPS_PER_ELEMENT * moved:
        return None
    letters = letter_map([x for term in (*(op.labels for op in inputs), output) for x in term], 1)
    if letters is None:
        return None
    summed = LETTERS[len(letters)]
    terms = ["".join(summed if x == label else letters[x] for x in op.labels) for op in inputs]
    terms[small] += letters[label]
    rewritten = f"{terms[0]},{terms[1]}->{''.join(letters[x] for x in output)}"
    return Diagonal(label, size, small, inputs[small].labels.index(label), rewritten, where)


def operands(
    diagonal: Diagonal, subscripts: tuple[tuple[str, ...], ...], arrays: list[np.ndarray]
) -> list[np.ndarray]:
    """The rewritten contraction's operands for a call's ``arrays`` (one axis per label, as
    ``diagonal.subscripts`` lists them): the expanded one made now."""
    views = [
        array if _plain(array, labels) else label_view(operand(array, labels, index))
        for index, (array, labels) in enumerate(zip(arrays, subscripts))
    ]
    views[diagonal.expanded] = _expand(views[diagonal.expanded], diagonal.axis, diagonal.size)
    return views


def _plain(array: np.ndarray, labels: tuple[str, ...]) -> bool:
    """Whether ``array`` is its operand as is: no label repeated, every stride a
    nonnegative whole number of elements."""
    itemsize = array.itemsize
    return len(set(labels)) == len(labels) and all(
        s >= 0 and s % itemsize == 0 for s in array.strides
    )


def _expand(view: np.ndarray, axis: int, size: int) -> np.ndarray:
    """A new array of ``view``'s shape plus a last axis of ``size``, zero except where that
    index equals the one along ``axis``, which holds ``view``."""
    expanded = np.zeros((*view.shape, size), view.dtype)
    strides = list(expanded.strides[:-1])
    strides[axis] += expanded.strides[-1]
    diagonal = np.ndarray(view.shape, view.dtype, buffer=expanded, strides=tuple(strides))
    np.copyto(diagonal, view)
    return expanded


@dataclass(frozen=True)
class DiagonalCall:
    """The per-call path of a cached plan rewritten by ``choose``: the operands rewritten,
    then the rewritten contraction run by ``run`` (einsum's, for the same options)."""

    diagonal: Diagonal
    subscripts: tuple[tuple[str, ...], ...]  # the call's input labels
    run: Callable[[list[np.ndarray], np.ndarray | None], Any]

    def __call__(self, arrays: tuple[np.ndarray, ...], out: np.ndarray | None) -> Any:
        return self.run(operands(self.diagonal, self.subscripts, list(arrays)), out)


__all__ = ["Diagonal", "DiagonalCall", "choose", "operands"]
