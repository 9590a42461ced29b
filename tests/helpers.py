"""Shared test helpers: paths, operand allocation, forked children."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import teir

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def operands(config: teir.Config, seed: int = 0) -> tuple:
    """Random in0, in1, out of exactly the needed sizes (None for unused inputs)."""
    rng = np.random.default_rng(seed)
    result = []
    for tensor in teir.Tensor:
        if config.uses(tensor):
            result.append(rng.uniform(-1, 1, config.extent(tensor)).astype(config.dtype))
        else:
            result.append(None)
    return tuple(result)


def uniform_arrays(shapes: list[tuple[int, ...]], dtype: Any, seed: int = 0) -> list[np.ndarray]:
    """Arrays of these shapes, uniform in [-1, 1), of ``dtype``."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype(dtype) for shape in shapes]


def out_array(start: np.ndarray, layout: str) -> np.ndarray:
    """A copy of ``start`` laid out as ``layout``: "C", "F", "strided" (every other element
    of a larger array) or "reversed" (a negative stride)."""
    shape = start.shape
    if layout == "F" and shape:
        return np.asfortranarray(start.copy())
    if layout == "strided" and shape:
        big = np.zeros([2 * n for n in shape], start.dtype)
        out = big[tuple(slice(None, None, 2) for _ in shape)]
        out[...] = start
        return out
    if layout == "reversed" and shape:
        out = start.copy()[::-1]
        out[...] = start
        return out
    return start.copy()


def forked_child_result(target: Callable[[Any], None]) -> Any:
    """What ``target(queue)`` puts on its queue, run in a forked child that must exit cleanly
    (the parent's thread pool and caches exist before the fork)."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=target, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    return queue.get(timeout=5)
