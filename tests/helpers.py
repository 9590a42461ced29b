"""Shared test helpers: paths, operand allocation."""

from __future__ import annotations

from pathlib import Path

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
