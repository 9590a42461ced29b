"""A short batch label on the result's unit stride, next to a summed label in both inputs,
folded into one vector-long batch: ``out[c] = sum_k x[k, c] * y[k, c]`` with ``c`` of 2 and
``k`` of stride 2 in both inputs is computed as ``t[w] = sum_q x2[q, w] * y2[q, w]``, where
``x2`` and ``y2`` are the same memory seen as ``k / m`` rows of ``w = m * c`` elements, then
``out[c] = sum_g t[g * c_size + c]``.

Why: such a contraction (dot products of complex pairs or small vectors stored
interleaved, ``ic,ic->c``, ``ijc,ijc->ic``) has operands alike in size, so no operand is
small enough to expand (:mod:`teir.frontend.batch_diagonal`); as they lie, the plan
multiplies one element per K step in loops whose innermost runs along the batch, scalar
code (FP32 ``ic,ic->c`` 10^6 x 2: 1.5 ms, NumPy 0.57). Folded, the batch fills the vectors
of the loops the plan runs (the folded contraction is planned as any einsum), and the
result's ``m`` partial sums are added by a second, small einsum that also applies the
call's ``out``, accumulation and ReLU.

``m`` divides the summed label's size where a divisor keeps the folded batch within
``MOST_LANES`` vectors (it must fill one); a size with none (a prime) is folded as far as
whole rows of the longest fold go, and its last indices are contracted as the operands
lie and added with the call's ReLU (see ``_groups``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import gcd, prod
from typing import Any

import numpy as np

from teir.codegen.target import Target
from teir.frontend.einsum_parse import LETTERS, letter_map
from teir.frontend.einsum_plan import Operand, Plan, label_sizes, label_view, one_element

# The folded batch is at most this many vectors long: its independent sums hide the FMA
# latency, and the temporary grows with it. FP32 on 2 threads, 1, 2, 4, 8 vectors:
# ic,ic->c 10^6 x 2 726, 443, 258, 172 us (NumPy 580); ijc,ijc->c 1000^2 x 2 703, 572,
# 296, 219; ijc,ijc->ic 1000^2 x 3 580, 282, 255, 278 (NumPy 2370).
MOST_LANES = 8
# Contractions below this many FLOPs keep their plan: two calls and a temporary cost more
# than the scalar loops they replace.
MIN_FLOPS = 100_000
# ... and so do those whose temporary (the result times the fold) would exceed this
# fraction of the inputs' elements: the second call would move more than the fold saves.
TEMPORARY_SHARE = 0.25


@dataclass(frozen=True)
class Fold:
    """The fold of a binary einsum: the batch label (``size`` elements, unit stride in both
    inputs) and the summed label stepping over it (``summed``, stride ``size``) become a
    summed label of ``rows`` and a batch of ``width`` = ``size`` x ``groups``;
    ``subscripts`` is the folded contraction (and the rest's, on its own views) and
    ``reduce`` the sum of the groups, in letters."""

    label: str
    summed: str
    size: int
    groups: int
    rows: int
    subscripts: str
    reduce: str
    rest: int = 0  # the summed label's last indices, not folded: contracted as they lie

    @property
    def width(self) -> int:
        return self.size * self.groups

    def explain(self) -> str:
        return (
            f"# the batch label {self.label!r} ({self.size}) is the result's unit stride, "
            f"shorter than a vector, and {self.summed!r} steps over it in both inputs: the "
            f"two are folded into {self.rows} rows of {self.width} ({self.groups} groups of "
            f"the batch), contracted as {self.subscripts} into a temporary, whose groups "
            f"{self.reduce} adds"
            + (
                f"; its last {self.rest} indices of {self.summed!r} are contracted as they lie "
                "and added"
                if self.rest
                else ""
            )
        )


def _groups(summed_size: int, size: int, lanes: int) -> tuple[int, int]:
    """(m, rest): the fold of the summed label's first ``summed_size - rest`` indices into
    rows of ``m`` groups of the batch. A divisor of its size (no rest) where one makes the
    folded batch at least one vector and at most ``MOST_LANES`` long: the largest, or the
    largest that makes it a whole number of vectors if that is at least half as long (FP64
    ``ijc,ijc->c`` 1000^2 x 2: 50 elements 720 us, 40 268 us). Else the longest whole number
    of vectors, the rest (fewer indices than ``m``) contracted as the operands lie; (1, 0)
    where the label has fewer than two such rows."""
    within = [m for m in range(2, summed_size + 1) if summed_size % m == 0]
    within = [m for m in within if lanes <= size * m <= MOST_LANES * lanes]
    whole = [m for m in within if size * m % lanes == 0]  # no vector partly filled
    if whole and 2 * whole[-1] >= (within or whole)[-1]:
        return whole[-1], 0
    step = lanes // gcd(size, lanes)  # groups per whole number of vectors
    longest = MOST_LANES * lanes // (size * step) * step
    if within and 2 * within[-1] >= longest:
        return within[-1], 0
    if summed_size < 2 * longest:
        return 1, 0
    return longest, summed_size % longest


def choose(plan: Plan, inputs: list[Operand]) -> Fold | None:
    """The fold for ``plan`` (as the operands lie), or None: a binary contraction of
    ``MIN_FLOPS`` or more whose plan has the one-element kernel with the result's unit
    stride on a batch label shorter than a vector, unit stride in both inputs, and a
    summed label of that stride in both, whose size has a divisor that folds it into a
    batch that fills more of a vector, with a temporary within ``TEMPORARY_SHARE`` of the
    inputs."""
    if len(inputs) != 2 or plan.empty or plan.lanes is not None or plan.operation is None:
        return None
    if any(plan.reductions) or not one_element(plan):
        return None
    if plan.operation.config.flops < MIN_FLOPS:
        return None
    output = plan.subscripts.output
    sizes = label_sizes(inputs, output)
    inner = [label for label in plan.out_memory if sizes[label] > 1]
    if not inner:
        return None
    label = inner[-1]
    size = sizes[label]
    lanes = Target.host().lanes(plan.dtype.itemsize)
    if not 2 <= size < lanes:
        return None
    if any(op.strides.get(label) != 1 or op.sizes[label] != size for op in inputs):
        return None
    summed = [
        x
        for x in inputs[0].labels
        if x not in output
        and x in inputs[1].labels
        and all(op.strides[x] == size and op.sizes[x] == sizes[x] for op in inputs)
    ]
    if not summed:
        return None
    groups, rest = _groups(sizes[summed[0]], size, lanes)
    if groups < 2:
        return None
    result = prod(sizes[x] for x in output)
    if result * groups > TEMPORARY_SHARE * sum(prod(op.sizes.values()) for op in inputs):
        return None
    letters = letter_map([x for term in (*(op.labels for op in inputs), output) for x in term], 2)
    if letters is None:
        return None
    group = LETTERS[len(letters)]
    folded = [
        "".join(letters[x] for x in op.labels) for op in inputs
    ]  # the same letters: the summed label now has rows, the batch is the wide one
    out_term = "".join(letters[x] for x in output)
    wide = out_term.replace(letters[label], group + letters[label])
    contraction = f"{folded[0]},{folded[1]}->{out_term}"
    return Fold(
        label,
        summed[0],
        size,
        groups,
        (sizes[summed[0]] - rest) // groups,
        contraction,
        f"{wide}->{out_term}",
        rest,
    )


def operands(fold: Fold, inputs: list[Operand]) -> list[np.ndarray]:
    """The folded contraction's operands (one axis per label, the summed label ``rows``
    long, the batch ``width``): views of the same memory."""
    views = []
    for op in inputs:
        itemsize = op.array.itemsize
        shape = [op.sizes[x] for x in op.labels]
        strides = [op.strides[x] * itemsize for x in op.labels]
        shape[op.labels.index(fold.summed)] = fold.rows
        strides[op.labels.index(fold.summed)] = fold.width * itemsize
        shape[op.labels.index(fold.label)] = fold.width
        views.append(
            np.lib.stride_tricks.as_strided(op.array, shape=shape, strides=strides, writeable=False)
        )
    return views


def rest_operands(fold: Fold, inputs: list[Operand]) -> list[np.ndarray]:
    """The operands over the summed label's last ``fold.rest`` indices (one axis per label,
    as ``fold.subscripts`` lists them): views."""
    views = []
    for op in inputs:
        at = [slice(None)] * len(op.labels)
        at[op.labels.index(fold.summed)] = slice(op.sizes[fold.summed] - fold.rest, None)
        views.append(label_view(op)[tuple(at)])
    return views


def grouped(fold: Fold, partial: np.ndarray, axis: int) -> np.ndarray:
    """The temporary ``partial`` (the batch ``width`` long on ``axis``) seen with the
    batch as (group, batch): a view."""
    shape = list(partial.shape)
    strides = list(partial.strides)
    shape[axis : axis + 1] = [fold.groups, fold.size]
    strides[axis : axis + 1] = [strides[axis] * fold.size, strides[axis]]
    return np.lib.stride_tricks.as_strided(partial, shape=shape, strides=strides, writeable=False)


@dataclass(frozen=True)
class FoldCall:
    """The per-call path of a cached plan folded by ``choose``: ``run`` (einsum's) does the
    folded contraction and then the sum of its groups into the result."""

    run: Callable[[tuple[np.ndarray, ...], np.ndarray | None], Any]

    def __call__(self, arrays: tuple[np.ndarray, ...], out: np.ndarray | None) -> Any:
        return self.run(arrays, out)


__all__ = ["Fold", "FoldCall", "choose", "grouped", "operands"]
