"""The one way the benchmarks time a function: best of repeated runs within a time budget."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_seconds(run: Callable[..., object], budget: float, minimum: int = 3) -> float:
    """The shortest of at least ``minimum`` timed runs of ``run`` (after one warm-up run),
    repeated until ``budget`` seconds have passed."""
    run()
    best = float("inf")
    deadline = time.perf_counter() + budget
    count = 0
    while count < minimum or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        count += 1
    return best


def best_of_rounds(
    kept: list[float | None] | None, measured: list[float | None]
) -> list[float | None]:
    """Each case's shorter time of the rounds so far (``kept``, None before the first) and
    this round's ``measured``; None where neither round has one (the library failed)."""
    if kept is None:
        return list(measured)
    return [min((t for t in (a, b) if t is not None), default=None) for a, b in zip(kept, measured)]
