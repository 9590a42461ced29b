"""What a binary contraction's configuration is expected to cost before anything is compiled:
the schedule teir.optimize writes for it, lowered (no code generated), and its kernel's
expected efficiency. The einsum tree optimizer prices node layouts with it, and ``einsum``
the layouts it may give a new result.

Costs are in FLOP-equivalents of one core at peak: a contraction costs its FLOPs over the
kernel's expected efficiency plus a fixed overhead per kernel call. A contraction that no
GEMM layout fits but whose batch has unit stride everywhere runs as a lane-batched
contraction (:mod:`teir.frontend.lane_plan`), not on the scalar fallback.
"""

from __future__ import annotations

from itertools import combinations
from math import prod
from typing import Any, NamedTuple

from teir.codegen.brgemm import lane_fill, mirrors_plain_a
from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target
from teir.frontend.copy_choice import (
    COPY_FLOPS_PER_BYTE,
    KernelShape,
    as_good,
    costs_no_more,
    kernel_shape,
)
from teir.frontend.lane_plan import lane_spec
from teir.lower.nest import lower
from teir.optimizer import optimize_with_log

# Measured on this kind of machine: a kernel call with its loop costs ~20 ns.
CALL_FLOPS = 2000.0
GENERIC_EFFICIENCY = 0.03
# A lane-batched contraction (a batch of unit stride everywhere as the vector lanes) runs at
# about this fraction of peak, times the fraction of its lanes the batch fills (96^3 x 32:
# 0.80-0.85 on 2 threads, packing included).
LANE_EFFICIENCY = 0.8
# A single chain of dependent FMAs runs at this fraction of their throughput (a latency of
# 4 cycles on 2 ports): a one-by-one tile's kernel. Priced at 1/4 (a thin N's), results laid
# out for one-lane kernels kept them (FP32 2 threads: echg,echg->ge 3.2 -> 0.27 ms laid out
# eg, kab,kab->ba 18 -> 0.92 ms; no plan of 2950 random einsums changes).
ONE_CHAIN = 1 / 8
# An elementwise product that writes its input transposed (its tile on the transposing
# kernel) moves its bytes this much slower than one whose tensors share their order: FP32
# dge,d->egd 800 x 512 x 24 on 2 threads, 2.2 ms transposed against 1.44 ms laid out dge.
TRANSPOSED_COST = 1.5


def kernel_efficiency(spec: BrgemmSpec, lanes: int) -> float:
    """Expected fraction of peak of a BRGEMM kernel: vector lanes filled along the vectorized
    extent (M; N in the mirror form, where B is stored transposed and A too or M is short; K in dot
    products), register blocking limited by a thin N (a one-by-one tile to one chain of FMAs),
    and C traffic amortized over K."""
    if (spec.trans_a and spec.trans_b) or mirrors_plain_a(spec, lanes):
        vectorized = spec.n
    elif spec.trans_a and spec.n < 16:
        vectorized = spec.k
    else:
        vectorized = spec.m
    k = spec.k * spec.batch
    # a one-by-one tile sums into one accumulator: each step waits for the last FMA
    blocking = ONE_CHAIN if spec.m == spec.n == 1 else min(1.0, spec.n / 4)
    return lane_fill(vectorized, lanes) * blocking * (k / (k + 2))


def _elements(fields: dict[str, Any], strides: str) -> int:
    """Elements of one tensor of the configuration: its axes are those of nonzero stride."""
    return prod(size for size, s in zip(fields["dim_sizes"], fields[strides]) if s)


def dense_strides(sizes: list[int], order: list[int]) -> list[int]:
    """Element strides of a dense copy of the configuration axes ``order`` (outermost first)
    of a tensor: the other axes, and those of size 1, get stride 0."""
    strides, step = [0] * len(sizes), 1
    for axis in reversed(order):
        strides[axis] = step if sizes[axis] > 1 else 0
        step *= sizes[axis]
    return strides


def contraction_cost(fields: dict[str, Any], threads: int) -> float:
    """Estimated cost of the binary contraction ``fields`` (an unscheduled configuration:
    one axis per label), as teir.optimize would schedule it."""
    return _priced(fields, threads).cost


def einsum_cost(fields: dict[str, Any], threads: int) -> tuple[float, bool]:
    """(estimated cost, whether a kernel runs it on the tensors as they lie) of the binary
    contraction ``fields`` as ``teir.einsum`` runs it: where no kernel fits the operands as
    they lie, on the copies its copying fallback would make (``copied_cost``) if that is
    cheaper than the generic primitive."""
    estimate = _priced(fields, threads)
    if estimate.fits:
        return estimate.cost, True
    copied = copied_cost(fields, threads)
    if copied is None:
        return estimate.cost, False
    return min(estimate.cost, copied), False


def copied_cost(fields: dict[str, Any], threads: int) -> float | None:
    """Cost of the contraction ``fields`` on the copies einsum's copying fallback chooses
    (:func:`teir.frontend.copy_fallback.choose`, by the same rule): the fewest bytes copied
    among one or two of its tensors, in the plain kernel's label orders or the transposed
    product's, whose kernel does as well as the one after copying all three; the copies'
    bytes included. None where no kernel fits even then."""
    sizes = fields["dim_sizes"]
    axes = range(len(sizes))
    by_out = sorted(axes, key=lambda a: -abs(fields["strides_out"][a]))
    by_in0 = sorted(axes, key=lambda a: -abs(fields["strides_in0"][a]))

    def typed(kind: str) -> list[int]:
        order = by_in0 if kind == "K" else by_out
        return [a for a in order if fields["dim_types"][a] == kind]

    c, m, n, k = (typed(kind) for kind in "CMNK")
    plain = (c + k + m, c + n + k, c + n + m)
    mirrored = (c + m + k, c + k + n, c + m + n)
    names = ("strides_in0", "strides_in1", "strides_out")
    itemsize = 4 if fields["data_type"] == "FP32" else 8
    elements = [_elements(fields, name) for name in names]

    def on_copies(orders: tuple[list[int], ...], copied: tuple[int, ...]) -> _Estimate:
        relaid = dict(fields)
        for index in copied:
            relaid[names[index]] = dense_strides(sizes, orders[index])
        return _priced(relaid, threads)

    def with_copies(estimate: _Estimate, copied: tuple[int, ...]) -> float:
        moved = sum(elements[index] for index in copied)
        return estimate.cost + 2.0 * moved * itemsize * COPY_FLOPS_PER_BYTE

    everything = on_copies(plain, (0, 1, 2))
    if everything.shape is None:
        return None
    subsets = sorted(
        [*combinations(range(3), 1), *combinations(range(3), 2)],
        key=lambda subset: sum(elements[index] for index in subset),
    )
    flops = 2.0 * float(prod(sizes))
    all_bytes = sum(elements) * itemsize
    for subset in subsets:
        copied = sum(elements[index] for index in subset) * itemsize
        for orders in (plain, mirrored):
            estimate = on_copies(orders, subset)
            if (
                estimate.shape is not None
                and as_good(estimate.shape, everything.shape)
                and costs_no_more(flops, estimate.shape, copied, everything.shape, all_bytes)
            ):
                return with_copies(estimate, subset)
    return with_copies(everything, (0, 1, 2))


class _Estimate(NamedTuple):
    cost: float
    fits: bool  # a kernel runs it (not the generic primitive)
    shape: KernelShape | None  # its BRGEMM kernel's tile (None: no BRGEMM kernel)


def _priced(fields: dict[str, Any], threads: int) -> _Estimate:
    """``contraction_cost``, whether a kernel runs it and the kernel's tile."""
    itemsize = 4 if fields["data_type"] == "FP32" else 8
    flops = 2.0 * float(prod(fields["dim_sizes"]))
    try:
        config, _ = optimize_with_log(fields, threads, partial_tiles=False)
    except Exception:  # a contraction the optimizer cannot schedule runs on the generic one
        return _Estimate(flops / GENERIC_EFFICIENCY, False, None)
    nest = lower(config)
    main = nest.main
    if main is None or not isinstance(main.spec, BrgemmSpec):
        lanes_spec = lane_spec(fields, threads, Target.host()) if main is not None else None
        if lanes_spec is not None:  # teir.einsum's plan runs it as a lane-batched contraction
            fill = lane_fill(lanes_spec.batch, lanes_spec.lanes)
            return _Estimate(flops / (LANE_EFFICIENCY * fill), True, None)
        return _Estimate(flops / GENERIC_EFFICIENCY, False, None)
    spec = main.spec
    if spec.one_element:
        # one element in loops, the output's unit-stride C axis innermost, where the nest is
        # vectorized: bound by moving its operands and result once
        moved = sum(_elements(fields, s) for s in ("strides_in0", "strides_in1", "strides_out"))
        transposed = TRANSPOSED_COST if nest.transposed is not None else 1.0
        cost = float(moved * itemsize * COPY_FLOPS_PER_BYTE * transposed)
        return _Estimate(cost, True, kernel_shape(config, main))
    lanes = Target.host().lanes(itemsize)
    calls = nest.iterations * max(1, prod(loop.size for loop in main.loops))
    cost = flops / kernel_efficiency(spec, lanes) + calls * CALL_FLOPS / max(1, threads)
    return _Estimate(cost, True, kernel_shape(config, main))


__all__ = [
    "COPY_FLOPS_PER_BYTE",
    "contraction_cost",
    "copied_cost",
    "dense_strides",
    "einsum_cost",
    "kernel_efficiency",
]
