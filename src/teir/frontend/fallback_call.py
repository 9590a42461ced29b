"""The per-call path of a cached einsum plan that runs through the copying fallback.

The fallback (:mod:`copy_fallback`) runs as a few einsum steps (copies, the contraction,
the copy back) on views of the operands, the result and scratch buffers. Which steps, on
which views, is fixed by the plan's cache key (every shape and stride), so the first call
records each step's direct call and where each of its arrays lies: which root (an operand,
the result, a scratch buffer) and how many bytes from the root's data address. Later calls
with the same key replay those steps on addresses alone: ``ijb,jkb->ikb`` on 8x8x4 took
60 us through the full path and about 7 through the replay (NumPy: 5.5).

A step that needs more than addresses (a reduction first, a temporary, a split reduction)
leaves the plan without a replay, and every call takes the full path as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from teir.buffers import new_result
from teir.frontend.direct_call import DirectCall
from teir.kernels.arrays import data_address, overlaps
from teir.runtime.checked_call import ArrayLayout
from teir.runtime.scratch import ScratchBytes, layout

# A step's array: (root index, byte offset from the root's data address); root -1: none.
Source = tuple[int, int]
NONE: Source = (-1, 0)


# One recorded step: its direct call's run, and where its in0, in1 and out lie.
ReplayStep = tuple[Callable[[int, int, int], None], Source, Source, Source]


@dataclass(frozen=True)
class RecordedStep:
    """A step as the fallback ran it: its arrays, and the direct call its plan has."""

    call: DirectCall | None
    operands: tuple[np.ndarray, ...]
    target: np.ndarray


@dataclass(frozen=True)
class FallbackCall:
    """The recorded steps of a fallback plan, replayed on the addresses of a call's arrays.

    Roots are numbered: the operands first, then the result, then the scratch buffers."""

    frame: ReplayFrame
    scratch_offsets: tuple[int, ...]  # each scratch buffer's byte offset in the scratch
    scratch_bytes: int
    steps: tuple[ReplayStep, ...]

    def __call__(self, operands: tuple[np.ndarray, ...], out: np.ndarray | None) -> Any:
        """The result (a new array, or ``out``), or None where the full path must run (an
        operand of another dtype, out read-only or overlapping an operand)."""
        begun = self.frame.begin(operands, out)
        if begun is None:
            return None
        addresses, result = begun
        addresses.append(data_address(result))
        with ScratchBytes(self.scratch_bytes) as base:
            addresses.extend(base + offset for offset in self.scratch_offsets)
            addresses.append(0)  # root -1: no array
            for run, (r0, o0), (r1, o1), (r2, o2) in self.steps:
                run(addresses[r0] + o0, addresses[r1] + o1, addresses[r2] + o2)
        return replay_result(result, out)


@dataclass(frozen=True)
class ReplayFrame:
    """What a replay (the fallback's, a split's) checks a call against and how it makes the
    call's result: the operands' dtype and spans as recorded, out's span (None: recorded
    without out), a new result's shape and layout."""

    dtype: np.dtype[Any]
    out_shape: tuple[int, ...]
    operand_count: int
    spans: tuple[tuple[int, int], ...]  # each operand's (offset, bytes) from its address
    out_span: tuple[int, int] | None  # None: calls without out get a new result
    memory_order: tuple[int, ...] | None = None  # a new result's layout (None: C order)

    @classmethod
    def recorded(
        cls,
        dtype: np.dtype[Any],
        out_shape: tuple[int, ...],
        operands: Sequence[np.ndarray],
        out: np.ndarray | None,
        memory_order: tuple[int, ...] | None,
    ) -> ReplayFrame:
        """The frame of a run recorded on ``operands`` and ``out``."""
        return cls(
            dtype,
            out_shape,
            len(operands),
            tuple(ArrayLayout(a.shape, a.strides).span(a.itemsize) for a in operands),
            None if out is None else ArrayLayout(out.shape, out.strides).span(out.itemsize),
            memory_order,
        )

    def begin(
        self, operands: Sequence[np.ndarray], out: np.ndarray | None
    ) -> tuple[list[int], np.ndarray] | None:
        """(the operands' data addresses, the result: ``out`` or a new array), or None
        where the call needs the full path: another operand count, dtype or alignment, out
        given or not unlike the recording, out read-only or overlapping an operand."""
        dtype, out_span = self.dtype, self.out_span
        if len(operands) != self.operand_count or (out is None) != (out_span is None):
            return None
        for array in operands if out is None else (*operands, out):
            if (array.dtype is not dtype and array.dtype != dtype) or not array.flags.aligned:
                return None
        addresses = [data_address(array) for array in operands]
        if out is None:
            return addresses, new_result(self.out_shape, dtype, self.memory_order)
        assert out_span is not None
        if not out.flags.writeable:
            return None
        start = data_address(out) + out_span[0]
        for address, (offset, count) in zip(addresses, self.spans):
            if overlaps(start, out_span[1], address + offset, count):
                return None
        return addresses, out


def replay_result(result: np.ndarray, out: np.ndarray | None) -> Any:
    """What einsum returns for a replay's ``result``: a scalar for a new 0-d one."""
    return result[()] if out is None and result.ndim == 0 else result


def _span(array: np.ndarray) -> tuple[int, int]:
    """(lowest byte, bytes) that ``array`` reaches, as addresses."""
    offset, count = ArrayLayout(array.shape, array.strides).span(array.itemsize)
    return data_address(array) + offset, count


def fallback_call(
    dtype: np.dtype[Any],
    out_shape: tuple[int, ...],
    operands: Sequence[np.ndarray],
    out: np.ndarray | None,
    result: np.ndarray,
    buffers: Sequence[np.ndarray],
    steps: Sequence[RecordedStep],
    memory_order: tuple[int, ...] | None = None,
) -> FallbackCall | None:
    """The replay of the fallback run that took ``steps`` on views of ``operands`` (as the
    call passed them), ``result`` and the scratch ``buffers``; None where a step had no
    direct call, or an array's root is not unique (roots overlapping)."""
    if any(step.call is None or len(step.operands) not in (1, 2) for step in steps):
        return None
    roots = [*operands, result, *buffers]
    spans = [_span(root) for root in roots]
    for i, (low, count) in enumerate(spans):
        for other_low, other_count in spans[i + 1 :]:
            if overlaps(low, count, other_low, other_count):
                return None  # which root a step's array came from would be ambiguous

    def source(array: np.ndarray) -> Source | None:
        low, count = _span(array)
        for index, ((root_low, root_count), root) in enumerate(zip(spans, roots)):
            if root_low <= low and low + count <= root_low + root_count:
                return index, data_address(array) - data_address(root)
        return None

    replayed: list[ReplayStep] = []
    for step in steps:
        assert step.call is not None
        in0, in1 = [source(array) for array in step.operands] + [NONE] * (2 - len(step.operands))
        target = source(step.target)
        if in0 is None or in1 is None or target is None:
            return None
        replayed.append((step.call.run, in0, in1, target))
    offsets, total = layout([buffer.shape for buffer in buffers], dtype)
    return FallbackCall(
        ReplayFrame.recorded(dtype, out_shape, operands, out, memory_order),
        tuple(offsets),
        total,
        tuple(replayed),
    )
