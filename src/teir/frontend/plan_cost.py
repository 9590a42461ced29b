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

from math import prod
from typing import Any

from teir.codegen.brgemm import lane_fill, mirrors_plain_a
from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target
from teir.frontend.lane_plan import lane_spec
from teir.lower.nest import lower
from teir.optimizer import optimize_with_log

# Measured on this kind of machine: a core does ~8 FLOPs in the time it copies one byte of a
# tensor that does not fit its caches, and a kernel call with its loop costs ~20 ns.
COPY_FLOPS_PER_BYTE = 8.0
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


def contraction_cost(fields: dict[str, Any], threads: int) -> float:
    """Estimated cost of the binary contraction ``fields`` (an unscheduled configuration:
    one axis per label), as teir.optimize would schedule it."""
    itemsize = 4 if fields["data_type"] == "FP32" else 8
    flops = 2.0 * float(prod(fields["dim_sizes"]))
    try:
        config, _ = optimize_with_log(fields, threads)
    except Exception:  # a contraction the optimizer cannot schedule runs on the generic one
        return flops / GENERIC_EFFICIENCY
    nest = lower(config)
    main = nest.main
    if main is None or not isinstance(main.spec, BrgemmSpec):
        lanes_spec = lane_spec(fields, threads, Target.host()) if main is not None else None
        if lanes_spec is not None:  # teir.einsum's plan runs it as a lane-batched contraction
            fill = lane_fill(lanes_spec.batch, lanes_spec.lanes)
            return flops / (LANE_EFFICIENCY * fill)
        return flops / GENERIC_EFFICIENCY
    spec = main.spec
    if spec.m == spec.n == spec.k == spec.batch == 1:
        # one element in loops, the output's unit-stride C axis innermost, where the nest is
        # vectorized: bound by moving its operands and result once
        moved = sum(_elements(fields, s) for s in ("strides_in0", "strides_in1", "strides_out"))
        transposed = TRANSPOSED_COST if nest.transposed is not None else 1.0
        return float(moved * itemsize * COPY_FLOPS_PER_BYTE * transposed)
    lanes = Target.host().lanes(itemsize)
    calls = nest.iterations * max(1, prod(loop.size for loop in main.loops))
    return flops / kernel_efficiency(spec, lanes) + calls * CALL_FLOPS / max(1, threads)


__all__ = ["COPY_FLOPS_PER_BYTE", "contraction_cost", "kernel_efficiency"]
