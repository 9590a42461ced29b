"""Facts about strided layouts that later stages rely on (aliasing, injectivity)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from teir.ir.enums import DimType, Tensor
from teir.ir.records import Schedule

# Beyond this many index combinations, injectivity is not decided by enumeration.
ENUMERATION_LIMIT = 1 << 22


def is_injective(sizes: Sequence[int], strides: Sequence[int]) -> bool | None:
    """Whether distinct index tuples give distinct offsets ``sum(index * stride)``.

    Decided exactly: by the mixed-radix argument (sorted by stride, each stride exceeds the
    largest offset the smaller ones reach) when it applies, else by enumerating the offsets when
    there are at most ``ENUMERATION_LIMIT`` of them. Returns ``None`` when it cannot decide.
    """
    axes = sorted((s, n) for n, s in zip(sizes, strides) if n > 1)
    reach = 0
    for stride, size in axes:
        if stride <= reach:
            break
        reach += (size - 1) * stride
    else:
        return True
    if any(stride == 0 for stride, _ in axes):
        return False
    count = 1
    for _, size in axes:
        count *= size
    if count > ENUMERATION_LIMIT:
        return None
    offsets = np.zeros(1, dtype=np.int64)
    for stride, size in axes:
        offsets = (offsets[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
    return all_distinct(offsets)


def all_distinct(values: np.ndarray) -> bool:
    """Whether no value occurs twice (sorting beats np.unique's hashing here)."""
    ordered = np.sort(values, axis=None)
    return bool(not np.any(ordered[1:] == ordered[:-1]))


def out_tiles_distinct(schedule: Schedule) -> bool | None:
    """Whether distinct C/M/N loop indices address distinct output tile positions.

    When true, an output tile is touched exactly by the iterations that share its C/M/N loop
    indices, so its first (last) access is where all K loop indices are 0 (maximal).
    """
    axes = [a for a in schedule.loop_axes if schedule.dim_types[a] is not DimType.K]
    return is_injective(
        [schedule.dim_sizes[a] for a in axes], [schedule.strides_out[a] for a in axes]
    )


def tensor_axes(schedule: Schedule, tensor: Tensor) -> tuple[int, ...]:
    """The axes ``tensor`` takes part in, in listed order."""
    return tuple(i for i, t in enumerate(schedule.dim_types) if t.roles[tensor.value])
