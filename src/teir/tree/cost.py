"""A cost model for tree nodes: the schedule teir.optimize writes for a node with given
layouts, lowered (no code generated), and its kernel's expected efficiency.

Costs are in FLOP-equivalents of one core at peak: a contraction costs its FLOPs over the
kernel's expected efficiency plus a fixed overhead per kernel call; a permutation costs its
bytes at the rate a core copies them relative to its FMA peak. A contraction that no GEMM
layout fits but whose batch has unit stride everywhere runs as a lane-batched contraction
(:mod:`teir.frontend.lane_plan`): neither a scalar fallback nor a node to legalize.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from math import prod
from typing import Any

import numpy as np

from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target
from teir.frontend.lane_plan import lane_spec
from teir.ir import Config
from teir.lower.nest import lower
from teir.optimizer import optimize_with_log
from teir.tree.layout import lonely_ids, node_fields
from teir.tree.nodes import Node, NodeKind

# Measured on this kind of machine: a core does ~8 FLOPs in the time it copies one byte of a
# tensor that does not fit its caches, and a kernel call with its loop costs ~20 ns.
COPY_FLOPS_PER_BYTE = 8.0
CALL_FLOPS = 2000.0
GENERIC_EFFICIENCY = 0.03
# A lane-batched contraction (a batch of unit stride everywhere as the vector lanes) runs at
# about this fraction of peak, times the fraction of its lanes the batch fills (96^3 x 32:
# 0.80-0.85 on 2 threads, packing included).
LANE_EFFICIENCY = 0.8


def _fill(extent: int, lanes: int) -> float:
    return extent / (-(-extent // lanes) * lanes)


def kernel_efficiency(spec: BrgemmSpec, lanes: int) -> float:
    """Expected fraction of peak of a BRGEMM kernel: vector lanes filled along the vectorized
    extent (M; N in the mirror form, where A and B are both stored transposed; K in dot
    products), register blocking limited by a thin N, and C traffic amortized over K."""
    if spec.trans_a and spec.trans_b:
        vectorized = spec.n
    elif spec.trans_a and spec.n < 16:
        vectorized = spec.k
    else:
        vectorized = spec.m
    k = spec.k * spec.batch
    return _fill(vectorized, lanes) * min(1.0, spec.n / 4) * (k / (k + 2))


@lru_cache(maxsize=4096)
def _contraction_cost(
    node: Node,
    child_ids: tuple[tuple[int, ...], ...],
    sizes: tuple[int, ...],
    dtype: str,
    threads: int,
) -> float:
    dt = np.dtype(dtype)
    fields = node_fields(node, child_ids, sizes, dt)
    try:
        config, _ = optimize_with_log(fields, threads)
    except Exception:  # a node the optimizer cannot schedule runs on the generic fallback
        return node.flops(sizes) / GENERIC_EFFICIENCY
    nest = lower(config)
    main = nest.main
    flops = float(node.flops(sizes))
    if main is None or not isinstance(main.spec, BrgemmSpec):
        lanes_spec = lane_spec(fields, threads, Target.host()) if main is not None else None
        if lanes_spec is not None:  # teir.einsum's plan runs it as a lane-batched contraction
            fill = _fill(lanes_spec.batch, lanes_spec.lanes)
            return flops / (LANE_EFFICIENCY * fill)
        return flops / GENERIC_EFFICIENCY
    spec = main.spec
    if spec.m == spec.n == spec.k == spec.batch == 1:
        # one element in loops, the output's unit-stride C axis innermost, where the nest is
        # vectorized: bound by moving its operands and result once
        moved = node.elements(sizes) + sum(c.elements(sizes) for c in node.children)
        return moved * dt.itemsize * COPY_FLOPS_PER_BYTE
    lanes = Target.host().lanes(dt.itemsize)
    calls = nest.iterations * max(1, prod(loop.size for loop in main.loops))
    return flops / kernel_efficiency(spec, lanes) + calls * CALL_FLOPS / max(1, threads)


def node_cost(
    node: Node,
    child_ids: Sequence[Sequence[int]],
    sizes: Sequence[int],
    dtype: Any,
    threads: int,
) -> float:
    """Estimated cost of ``node`` alone, with its children laid out in ``child_ids``."""
    if node.kind is NodeKind.LEAF:
        return 0.0
    if node.kind is NodeKind.PERMUTATION:
        (ids,) = child_ids
        if tuple(ids) == node.ids or lonely_ids(node):  # a reduction runs through NumPy
            return 0.0
        itemsize = int(np.dtype(dtype).itemsize)
        return 2.0 * node.elements(sizes) * itemsize * COPY_FLOPS_PER_BYTE
    return _contraction_cost(
        node, tuple(tuple(c) for c in child_ids), tuple(sizes), np.dtype(dtype).str, threads
    )


def is_generic(node: Node, sizes: Sequence[int], dtype: Any, threads: int) -> bool:
    """Whether the node's kernel is the scalar fallback (no layout fits a GEMM kernel, and
    no batch of unit stride everywhere lets it run as a lane-batched contraction)."""
    if node.kind is not NodeKind.CONTRACTION:
        return False
    return _is_generic(node, tuple(sizes), np.dtype(dtype).str, threads)


@lru_cache(maxsize=4096)  # the tree optimizer asks for every candidate layout of every node
def _is_generic(node: Node, sizes: tuple[int, ...], dtype: str, threads: int) -> bool:
    fields = node_fields(node, [c.ids for c in node.children], sizes, np.dtype(dtype))
    main = lower(optimize_with_log(fields, threads)[0]).main
    if main is None or main.kind != "generic":
        return False
    return lane_spec(fields, threads, Target.host()) is None


def node_config(node: Node, sizes: Sequence[int], dtype: Any, threads: int) -> Config:
    """The configuration teir.optimize writes for the node (children as they are laid out)."""
    fields = node_fields(node, [c.ids for c in node.children], sizes, np.dtype(dtype))
    return optimize_with_log(fields, threads)[0]


def tree_cost(node: Node, sizes: Sequence[int], dtype: Any, threads: int) -> float:
    own = node_cost(node, [c.ids for c in node.children], sizes, dtype, threads)
    return own + sum(tree_cost(c, sizes, dtype, threads) for c in node.children)


__all__ = ["is_generic", "kernel_efficiency", "node_config", "node_cost", "tree_cost"]
