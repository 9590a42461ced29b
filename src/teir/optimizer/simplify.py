"""Passes that simplify the axes without changing what is computed: drop size-1 axes, fuse
stride-coherent axes of the same type, split an axis into blocks."""

from __future__ import annotations

import math
from collections.abc import Callable

from teir.optimizer.problem import Axis, Problem


def drop_size_one(problem: Problem) -> tuple[Problem, str]:
    """Axes of size 1 index nothing: drop them."""
    kept = [a for a in problem.axes if a.size > 1]
    dropped = len(problem.axes) - len(kept)
    return problem.with_axes(kept), f"dropped {dropped} axes of size 1" if dropped else (
        "no axis of size 1"
    )


def fuse_coherent(problem: Problem) -> tuple[Problem, str]:
    """Fuse pairs of axes of the same type where, for every tensor, the outer axis's stride is
    the inner axis's size times its stride: together they index memory like one axis."""
    axes = list(problem.axes)
    fused = []
    changed = True
    while changed:
        changed = False
        for i, outer in enumerate(axes):
            for j, inner in enumerate(axes):
                if i == j or outer.dim_type is not inner.dim_type:
                    continue
                if all(o == inner.size * s for o, s in zip(outer.strides, inner.strides)):
                    merged = Axis(inner.dim_type, outer.size * inner.size, inner.strides)
                    fused.append(f"{outer.dim_type.value}{outer.size}*{inner.size}")
                    axes = [a for k, a in enumerate(axes) if k not in (i, j)]
                    axes.insert(min(i, j), merged)
                    changed = True
                    break
            if changed:
                break
    text = f"fused {', '.join(fused)}" if fused else "no stride-coherent axes to fuse"
    return problem.with_axes(axes), text


def split(axis: Axis, inner: int) -> tuple[Axis, Axis]:
    """(outer, inner) axes of blocks of ``inner`` elements; ``inner`` divides the size."""
    assert axis.size % inner == 0
    a, b, c = axis.strides
    outer = Axis(axis.dim_type, axis.size // inner, (a * inner, b * inner, c * inner))
    return outer, Axis(axis.dim_type, inner, axis.strides)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def block_size(size: int, target: int, low: int, high: int, multiple: int) -> int:
    """The divisor of ``size`` in [low, high] closest to ``target`` (ratio-wise), preferring
    multiples of ``multiple``; ``size`` itself when it is at most ``high`` or nothing fits."""
    return _best_divisor(
        size,
        low,
        high,
        lambda d: (0.0 if d % multiple == 0 else 1.0) + abs(math.log(d / target)),
    )


def _best_divisor(size: int, low: int, high: int, score: Callable[[int], float]) -> int:
    """The divisor of ``size`` in [low, high] of lowest score (the larger on ties); ``size``
    itself when it is at most ``high`` or no divisor is in range."""
    if size <= high:
        return size
    candidates = [d for d in divisors(size) if low <= d <= high]
    if not candidates:
        return size
    return min(candidates, key=lambda d: (score(d), -d))


# How much a padded lane costs against a block size off its target (log scale): rows of 1000
# FP32 elements in blocks of 125 (8 vectors, 98 % of lanes used) rather than of 100 (7
# vectors, 89 %): 1000^3 GEMM 84 -> 92 % of peak.
LANE_WASTE_WEIGHT = 4.0


def lane_block(size: int, target: int, low: int, high: int, lanes: int) -> int:
    """Like :func:`block_size` for a dimension that runs along vectors of ``lanes`` elements:
    a divisor in [low, high] near ``target`` that leaves few lanes of its last vector empty."""

    def score(d: int) -> float:
        padded = -(-d // lanes) * lanes
        return abs(math.log(d / target)) + LANE_WASTE_WEIGHT * math.log(padded / d)

    return _best_divisor(size, low, high, score)
