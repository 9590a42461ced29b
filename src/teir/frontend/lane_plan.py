"""Whether a binary einsum runs as a lane-batched contraction (:mod:`teir.codegen.lanes`), and
its parameters: a C axis with unit stride in in0, in1 and the output becomes the vector lanes.

``ijb,jkb->ikb`` is the case: a GEMM kernel needs a unit stride on M, N or K in each operand,
but all three tensors have theirs on the batch. Without this, such einsums ran through the
copying fallback (three transposing copies around a batched GEMM: 96^3 x 32 FP32 382-455 us,
53-62 % of peak, the copies a third of it).
"""

from __future__ import annotations

from dataclasses import replace
from math import ceil, prod
from typing import Any

from teir.codegen.lanes import MR, LaneSpec
from teir.codegen.target import Target
from teir.ir import DimType, PrimFirst, PrimLast, Tensor
from teir.optimizer.problem import Axis, problem_from
from teir.optimizer.simplify import drop_size_one, fuse_coherent

# The least fraction of the vector lanes the batch must fill. A partial last vector costs as
# much as a full one; 96^3 x batch, two threads, full-width lanes against the copying
# fallback: FP32 batch 8 147 vs 119 us, 12 150 vs 156, 20 302 vs 237, 24 305 vs 280; FP64
# batch 5 149 vs 169, 6 157 vs 160, 12 327 vs 276 (and 32: 82 % of peak against 53-62 %).
MIN_FILL = 0.8
# Rows of in0 whose cost equals packing in1 once more (each job packs all of in1's block
# for its batch vector): a job of ``mc`` rows costs about ``mc + JOB_ROWS``.
JOB_ROWS = 8
# Threads whose slices of the jobs (batch vectors fastest) split one block of rows between
# them both read all of its lines of in0 and write the out lines the vectors share (NumPy
# arrays lie 16 bytes off a line): 96^3 x 32 FP32 on 2 threads, one block of 96 rows
# (a batch vector per thread) 374-385 us, two blocks of 48 (each thread its rows' two
# vectors) 309-311 us; alone, one thread runs both in 625-641 us. A job's cost grows by this
# times the fraction of blocks split (3 x 64^3 x 32 FP32 `aijb,ajkb->aikb`, one block of three
# split: 291-312 -> 248-250 us unsplit in blocks of 32 rows; FP64, 4 vectors, 664 -> 703-708,
# the one loss measured on this Xeon; on Zen 4, 96^3 x 32 in blocks of 48 rows had measured
# 3-5 % slower than in one block, see teir.codegen.lanes.A_BLOCK_BYTES).
SPLIT_ROWS_COST = 0.5


def lane_spec(fields: dict[str, Any], threads: int, target: Target) -> LaneSpec | None:
    """The lane-batched contraction computing the binary configuration ``fields`` (one axis
    per label, as the einsum planner builds it), or None where it does not fit: no C axis
    of unit stride in all three tensors filling ``MIN_FILL`` of its vectors, or more than one
    M, N or K axis once coherent axes are fused (a missing one has size 1)."""
    problem = problem_from(fields)
    if not problem.primitives.prim_main.is_contraction:
        return None
    if problem.primitives.prim_first not in (PrimFirst.NONE, PrimFirst.ZERO):
        return None
    problem, _ = drop_size_one(problem)
    problem, _ = fuse_coherent(problem)
    itemsize = problem.primitives.data_type.itemsize
    lanes = target.lanes(itemsize)
    by_type: dict[DimType, list[Axis]] = {t: [] for t in DimType}
    for axis in problem.axes:
        by_type[axis.dim_type].append(axis)
    unit = [a for a in by_type[DimType.C] if a.strides == (1, 1, 1)]
    if len(unit) != 1 or any(len(by_type[t]) > 1 for t in (DimType.M, DimType.N, DimType.K)):
        return None
    for dim_type in (DimType.M, DimType.N, DimType.K):
        # a missing one is an axis of size 1 (a batched matrix-vector or outer product):
        # the copying fallback would copy the large operand or the result for it
        by_type[dim_type] = by_type[dim_type] or [Axis(dim_type, 1, (0, 0, 0))]
    batch = unit[0].size
    if target.half_width_is_free and _fill(batch, lanes // 2) > _fill(batch, lanes):
        # as fast per FMA where half-width vectors are free, and filled: 96^3 x batch on 2
        # threads against the copying fallback, FP32 batch 8 155 vs 190 us, 24 243 vs 281,
        # 40 424 vs 442; FP64 batch 4 86 vs 219, 12 268 vs 580
        lanes //= 2
    if _fill(batch, lanes) < MIN_FILL:
        return None  # lanes would idle: the copying fallback fills them
    (m,), (n,), (k,) = by_type[DimType.M], by_type[DimType.N], by_type[DimType.K]
    first, second = Tensor.IN0, Tensor.IN1
    # The kernel's rows (M) are the output axis further apart in memory: its register block
    # then stores a few runs of neighbouring vectors rather than many short ones (64^3 x 32
    # FP32, 2 threads: 63 -> 71 % of peak with the operands' roles exchanged).
    swapped = m.stride(Tensor.OUT) < n.stride(Tensor.OUT)
    if swapped:
        m, n, first, second = n, m, second, first
    outer = tuple(
        (a.size, a.stride(first), a.stride(second), a.stride(Tensor.OUT))
        for a in by_type[DimType.C]
        if a is not unit[0]
    )
    prims = problem.primitives
    spec = LaneSpec(
        itemsize=itemsize,
        lanes=lanes,
        batch=batch,
        m=m.size,
        n=n.size,
        k=k.size,
        m_in0=m.stride(first),
        m_out=m.stride(Tensor.OUT),
        n_in1=n.stride(second),
        n_out=n.stride(Tensor.OUT),
        k_in0=k.stride(first),
        k_in1=k.stride(second),
        outer=outer,
        beta=0 if prims.prim_first is PrimFirst.ZERO else 1,
        relu=prims.prim_last is PrimLast.RELU,
        swapped=swapped,
    )
    return _balanced(spec, threads)


def _fill(batch: int, lanes: int) -> float:
    """The fraction of ``lanes``-wide vectors that ``batch`` elements fill."""
    return batch / (ceil(batch / lanes) * lanes)


def _balanced(spec: LaneSpec, threads: int) -> LaneSpec:
    """``spec`` with the rows per job that balance the jobs over ``threads``: the busiest
    thread's rows (plus a packing cost per job, and ``SPLIT_ROWS_COST`` where threads share
    a block of rows) are the fewest."""
    others = prod(size for size, *_ in spec.outer) * spec.groups
    most_rows = spec.mc  # as many as the stack budget allows
    best: tuple[float, int] | None = None
    first = ceil(spec.m / most_rows)
    for blocks in range(first, min(first + threads, ceil(spec.m / MR)) + 1):
        mc = min(spec.m, ceil(ceil(spec.m / blocks) / MR) * MR)
        jobs = others * ceil(spec.m / mc)
        cost = float(ceil(jobs / threads) * (mc + JOB_ROWS))
        # slices that begin inside a block of rows (between its batch vectors) share it
        count = min(threads, jobs)
        splits = sum(1 for i in range(1, count) if i * jobs // count % spec.groups)
        cost *= 1 + SPLIT_ROWS_COST * splits * spec.groups / jobs
        if best is None or cost < best[0]:
            best = (cost, mc)
    assert best is not None
    if best[1] == spec.mc:
        return spec
    return replace(spec, mc=best[1])
