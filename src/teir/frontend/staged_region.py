"""A thin rest region run on a dense copy of one small input.

An output axis with no good block size is split into a part that tiles well and a thin rest
(``einsum_plan.regions``). The rest can be as thin as one column, and then its input may lie
one stride per element: ``ik,kj->ij`` 97 x 1601 x 1000 leaves the column ``j = 1600`` of
in1, 1000 elements 1601 apart, which no kernel reads with its vector lanes filled (the rest
ran on one lane of 16, FP32). Copying that input into a dense buffer first (4 KB) lets the
dot form run: one thread, 13.7 -> 4.2 us FP32 and 14.6 -> 7.4 us FP64, the copy 1 us of it.

The main planner's copying fallback (``copy_fallback``) decides for the whole contraction;
this decides for one rest region alone, by its kernel's lane fill, and only for an input small
enough to copy on every call within the caches.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from teir.frontend.copy_choice import COPY_FLOPS_PER_BYTE, kernel_fill
from teir.frontend.plan_cost import CALL_FLOPS, dense_strides
from teir.ir import Config, DataType
from teir.kernels.arrays import data_address
from teir.lower.nest import lower
from teir.optimizer import optimize_with_log
from teir.runtime.operation import Operation
from teir.runtime.operation import compile as compile_config

# Inputs up to this size are copied: within a core's L2, a few microseconds at most.
STAGE_BYTES = 1 << 18
# ... when the region's kernel fills less than this fraction of its vector lanes as it lies,
# and the copy's would fill at least this fraction (einsum_plan.POOR_FILL's bound).
STAGE_FILL = 0.5

# What staging costs beyond moving the bytes, in FLOP-equivalents (plan_cost's units: a
# kernel call with its loop, ~20 ns, is CALL_FLOPS): a new buffer and a call of the copy from
# Python. Rests of M x 1 x K below M K ~ 20000 gain nothing or lose about 1 us (FP32, 2
# threads: bc,ca->ba 33 x 33 x 1009 10.7 -> 12.0 us, ik,kj->ij 64 x 64 x 401 12.7 -> 13.7
# us; 97 x 100, 97 x 200, 64 x 400 and 48 x 300 x 1601 the same either way).
STAGE_FLOPS = 400 * CALL_FLOPS

_STRIDES = ("strides_in0", "strides_in1")


@dataclass(frozen=True)
class Stage:
    """Input ``operand`` of a region copied densely into a new buffer before the region runs;
    the region's operation reads the buffer in its place."""

    operand: int
    copy: Operation
    elements: int
    dtype: np.dtype[Any]

    def run(self, source: int) -> np.ndarray:
        """The buffer, filled from the input at address ``source`` (kept alive by the caller
        until the region has read it)."""
        buffer = np.empty(self.elements, self.dtype)
        self.copy.run_addresses(source, 0, data_address(buffer))
        return buffer


def _orders(fields: dict[str, Any], operand: int) -> list[list[int]]:
    """Dense layouts of input ``operand`` that a kernel fits: its label order in the plain
    product (in0: C, K, M; in1: C, N, K, innermost last) and in the transposed one (in0:
    C, M, K; in1: C, K, N); within each type, the axes keep their order in the input."""
    strides = fields[_STRIDES[operand]]
    axes = sorted(
        (a for a in range(len(strides)) if strides[a] != 0),
        key=lambda a: -abs(strides[a]),
    )

    def typed(kind: str) -> list[int]:
        return [a for a in axes if fields["dim_types"][a] == kind]

    c, own, k = typed("C"), typed("M" if operand == 0 else "N"), typed("K")
    plain = c + k + own if operand == 0 else c + own + k
    mirrored = c + own + k if operand == 0 else c + k + own
    return [plain, mirrored]


def _scheduled(
    fields: dict[str, Any], threads: int, resident_output: bool
) -> tuple[float, Config | None]:
    """The lane fill of the BRGEMM kernel teir.optimize gives ``fields``, with the schedule
    (0 where it fails or gives another kernel: the generic one fills no lanes at all)."""
    try:
        config, _ = optimize_with_log(
            fields, threads, resident_output=resident_output, partial_tiles=False
        )
    except Exception:  # a layout the optimizer cannot schedule is no candidate
        return 0.0, None
    main = lower(config).main
    if main is None or main.kind != "brgemm":
        return 0.0, None
    return kernel_fill(main), config


def stage_region(
    fields: dict[str, Any], threads: int, fill: float, resident_output: bool
) -> tuple[Config, Stage, str] | None:
    """For a rest region's configuration ``fields`` whose kernel fills ``fill`` of its lanes:
    the region's schedule with one input read from a dense buffer, that input's copy into it
    and a line for ``explain``; None where no input is small enough or no copy fills the
    lanes better by more than it costs."""
    if fill >= STAGE_FILL:
        return None
    dtype = DataType(fields["data_type"])
    sizes = fields["dim_sizes"]
    flops = 2.0 * prod(sizes)
    best: tuple[float, int, list[int], list[int], Config] | None = None
    for operand, name in enumerate(_STRIDES):
        elements = prod(s for s, stride in zip(sizes, fields[name]) if stride != 0)
        copied = elements * dtype.itemsize
        if copied > STAGE_BYTES:
            continue
        for order in _orders(fields, operand):
            dense = dense_strides(sizes, order)
            if dense == fields[name]:
                continue  # already so
            new_fill, config = _scheduled(dict(fields, **{name: dense}), threads, resident_output)
            # the FLOP-equivalents saved must pay for the copy and its call
            saved = flops / max(fill, 1e-9) - flops / max(new_fill, 1e-9)
            cost = STAGE_FLOPS + 2 * copied * COPY_FLOPS_PER_BYTE
            pays = config is not None and new_fill >= STAGE_FILL and saved > cost
            if pays and (best is None or new_fill > best[0]):
                assert config is not None
                best = (new_fill, operand, order, dense, config)
    if best is None:
        return None
    new_fill, operand, order, dense, config = best
    name = _STRIDES[operand]
    axes = [a for a in order if sizes[a] > 1] or order[:1]
    copy_fields = {
        "data_type": fields["data_type"],
        "dim_types": ["C"] * len(axes),
        "exec_types": ["seq"] * len(axes),
        "dim_sizes": [sizes[a] for a in axes],
        "strides_in0": [fields[name][a] for a in axes],
        "strides_in1": [0] * len(axes),
        "strides_out": [dense[a] for a in axes],
        "prim_first": "None",
        "prim_main": "Copy",
        "prim_last": "None",
    }
    # one thread: a copy within the caches is over before a second would start
    copy_config, _ = optimize_with_log(copy_fields, 1, partial_tiles=False)
    elements = prod(sizes[a] for a in axes)
    stage = Stage(operand, compile_config(copy_config, 1), elements, np.dtype(dtype.numpy))
    line = (
        f"in{operand} ({elements} elements) copied densely first: its kernel fills "
        f"{new_fill:.0%} of the vector lanes instead of {fill:.0%}"
    )
    return config, stage, line
