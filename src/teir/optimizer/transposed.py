"""Elementwise products that write an input transposed: the tile a transposing kernel runs."""

from __future__ import annotations

from math import prod

from teir.ir import DimType, PrimFirst, Primitives, Tensor
from teir.lower.products import fills_vectors
from teir.optimizer.problem import Axis


def _elements(loops: list[Axis], tensor: Tensor) -> int:
    return prod(a.size for a in loops if a.stride(tensor) != 0)


def transposed_tile(
    loops: list[Axis], prims: list[Axis], primitives: Primitives
) -> tuple[Axis, Axis, Tensor] | None:
    """(rows, columns, A) of an elementwise product (a one-element kernel, no K) that writes
    an input A transposed: the loop along the output's unit stride, which steps A by more
    than one element, and the one along A's unit stride, where the other input steps 0 or 1
    along the rows; A has every label of the output (an output label it lacks makes an outer
    product, whose kernel writes the output better). Such products run their tile of the
    two in one transposing kernel (``teir.lower.products``); None where they have none or
    where it would not fill the kernel's vectors (``fills_vectors``). The larger input is
    tried first. The kernel overwrites its tile: only a first Zero (fused into it) lets it
    run, not an accumulation into the output."""
    if primitives.prim_first is not PrimFirst.ZERO:
        return None
    if len(loops) < 2 or any(a.size > 1 for a in prims):
        return None
    itemsize = primitives.data_type.itemsize
    if any(a.dim_type is DimType.K and a.size > 1 for a in loops):
        return None
    rows = [a for a in loops if a.stride(Tensor.OUT) == 1 and a.size > 1]
    if len(rows) != 1:
        return None
    row = rows[0]
    inputs = [Tensor.IN0, Tensor.IN1]
    if _elements(loops, Tensor.IN1) > _elements(loops, Tensor.IN0):
        inputs.reverse()
    for read, other in (inputs, inputs[::-1]):
        if any(a.stride(read) == 0 for a in loops if a.size > 1):
            continue  # an output label A lacks: an outer product's kernel writes it better
        columns = [a for a in loops if a.stride(read) == 1 and a.size > 1 and a is not row]
        if columns and row.stride(read) > 1 and row.stride(other) in (0, 1):
            if not fills_vectors(row.size, columns[0].size, itemsize):
                return None
            return row, columns[0], read
    return None
