"""The per-call path of a cached einsum plan that cuts a reduction between threads.

A split plan (:mod:`split_reduction`) runs the rewritten einsum, one part per thread, on
views of the operands into a scratch temporary, then NumPy sums the parts into the result.
Which views, at which byte offsets from the operands, is fixed by the plan's cache key, so
the first call records the direct call of each part's einsum (the cut, and the rest left
out of it) and later calls replay them on addresses: ``gh,gh->`` FP32 400 x 512 on two
threads took 32.5 us through the full path, of which the parts' einsum took 7.9 (one
thread, no split: 15.9 us).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from teir.frontend.fallback_call import ReplayFrame, replay_result
from teir.kernels.arrays import data_address
from teir.runtime.scratch import scratch

# A part's run: (run on addresses, in0's and in1's byte offsets from the operands' data
# addresses, the byte offset of its parts in the temporary).
PartRun = tuple[Callable[[int, int, int], None], int, int, int]


@dataclass(frozen=True)
class SplitCall:
    """The recorded runs of a split plan's parts, replayed on a call's addresses."""

    frame: ReplayFrame
    parts_shape: tuple[int, ...]  # the temporary: (parts, *out_shape)
    parts_bytes: int
    runs: tuple[PartRun, ...]
    accumulate: bool
    relu: bool

    def _run(self, addresses: list[int], parts: np.ndarray, result: np.ndarray) -> None:
        base = data_address(parts)
        for run, in0, in1, at in self.runs:
            run(addresses[0] + in0, addresses[1] + in1 if addresses[1] else 0, base + at)
        add_parts(parts, result, self.accumulate)

    def __call__(self, operands: tuple[np.ndarray, ...], out: np.ndarray | None) -> Any:
        """The result (a new array, or ``out``), or None where the full path must run (an
        operand of another dtype, out read-only or overlapping an operand)."""
        begun = self.frame.begin(operands, out)
        if begun is None:
            return None
        addresses, result = begun
        if len(addresses) == 1:
            addresses.append(0)
        dtype = self.frame.dtype
        if self.parts_bytes <= SMALL_PARTS_BYTES:  # cheaper than the scratch buffer's lock
            self._run(addresses, np.empty(self.parts_shape, dtype), result)
        else:
            with scratch([self.parts_shape], dtype) as (parts,):
                self._run(addresses, parts, result)
        if self.relu:
            np.maximum(result, 0, out=result)
        return replay_result(result, out)


# Temporaries up to this size are allocated for each call (about 0.2 us; the scratch
# buffer's context takes 2.4).
SMALL_PARTS_BYTES = 64 << 10


def add_parts(parts: np.ndarray, result: np.ndarray, accumulate: bool) -> None:
    """The parts (the leading axis of ``parts``) summed into ``result``, or added to it."""
    if not accumulate and len(parts) >= 2:
        np.add(parts[0], parts[1], out=result)
        rest = parts[2:]
    else:
        rest = parts
        if not accumulate:
            result[...] = 0
    for part in rest:
        result += part


def split_call(
    dtype: np.dtype[Any],
    out_shape: tuple[int, ...],
    operands: Sequence[np.ndarray],
    out: np.ndarray | None,
    parts: np.ndarray,
    steps: Sequence[tuple[Any, Sequence[np.ndarray], np.ndarray]],
    accumulate: bool,
    relu: bool,
    memory_order: tuple[int, ...] | None = None,
) -> SplitCall | None:
    """The replay of a split run whose ``steps`` (each: a part's direct call, its operand
    views, its view of the temporary ``parts``) ran on views of ``operands`` into ``out``
    (None: a new result); None where a step had no direct call."""
    if any(call is None or call.reduced or call.numpy_sum for call, _, _ in steps):
        return None  # a step that needs more than its run on addresses
    origins = [data_address(array) for array in operands]
    base = data_address(parts)
    runs: list[PartRun] = []
    for call, views, target in steps:
        offsets = [data_address(view) - origin for view, origin in zip(views, origins)]
        offsets += [0] * (2 - len(offsets))
        runs.append((call.run, offsets[0], offsets[1], data_address(target) - base))
    return SplitCall(
        ReplayFrame.recorded(dtype, out_shape, operands, out, memory_order),
        parts.shape,
        parts.nbytes,
        tuple(runs),
        accumulate,
        relu,
    )


__all__ = ["SMALL_PARTS_BYTES", "SplitCall", "add_parts", "split_call"]
