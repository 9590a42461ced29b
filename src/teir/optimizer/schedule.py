"""Passes on the loops around the primitive: their order, and which of them run in parallel."""

from __future__ import annotations

from math import prod

from teir.ir import DimType, ExecType, Tensor
from teir.ir.layout import is_injective
from teir.optimizer.problem import Problem


def reorder(problem: Problem) -> tuple[Problem, str]:
    """Loops: C/M/N loops outside (largest output stride first, so consecutive iterations
    touch neighbouring output tiles and reuse the input block the inner loop shares), K loops
    innermost (an output tile stays in cache while it is accumulated)."""
    loops = [a for a in problem.axes if a.exec_type is not ExecType.PRIM]
    prims = [a for a in problem.axes if a.exec_type is ExecType.PRIM]
    outer = sorted(
        (a for a in loops if a.dim_type is not DimType.K), key=lambda a: -a.stride(Tensor.OUT)
    )
    inner = [a for a in loops if a.dim_type is DimType.K]
    ordered = outer + inner
    text = "loops " + (", ".join(f"{a.dim_type.value}{a.size}" for a in ordered) or "none")
    return problem.with_axes(ordered + prims), text


def parallelize(problem: Problem, threads: int) -> tuple[Problem, str]:
    """Mark leading C/M/N loops shared until they give every thread balanced work. Never a K
    loop, and nothing when the output aliases (parallel iterations would race)."""
    axes = list(problem.axes)
    if threads <= 1:
        return problem, "one thread: no shared loops"
    out_axes = [a for a in axes if a.dim_type is not DimType.K]
    if not is_injective([a.size for a in out_axes], [a.stride(Tensor.OUT) for a in out_axes]):
        return problem, "the output aliases (or is not proven free of it): no shared loops"
    chosen: list[int] = []
    for index, axis in enumerate(axes):
        if axis.exec_type is ExecType.PRIM or axis.dim_type is DimType.K:
            break
        chosen.append(index)
        count = prod(axes[i].size for i in chosen)
        imbalance = (-(-count // threads) * threads - count) / count
        if count >= 4 * threads or (count >= threads and imbalance <= 0.05):
            break
    if not chosen:
        return problem, "no C/M/N loop to share between threads"
    for index in chosen:
        axes[index] = axes[index].with_exec(ExecType.SHARED)
    count = prod(axes[i].size for i in chosen)
    return problem.with_axes(axes), (
        f"shared {len(chosen)} loop(s), {count} parallel iterations for {threads} threads"
    )
