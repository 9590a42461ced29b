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
from typing import Any

import numpy as np

from teir.codegen.target import Target
from teir.frontend.lane_plan import lane_spec
from teir.frontend.plan_cost import COPY_FLOPS_PER_BYTE, contraction_cost, kernel_efficiency
from teir.ir import Config
from teir.lower.nest import lower
from teir.optimizer import optimize_with_log
from teir.tree.layout import lonely_ids, node_fields
from teir.tree.nodes import Node, NodeKind


@lru_cache(maxsize=4096)
def _contraction_cost(
    node: Node,
    child_ids: tuple[tuple[int, ...], ...],
    sizes: tuple[int, ...],
    dtype: str,
    threads: int,
) -> float:
    fields = node_fields(node, child_ids, sizes, np.dtype(dtype))
    return contraction_cost(fields, threads)


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
    main = lower(optimize_with_log(fields, threads, partial_tiles=False)[0]).main
    if main is None or main.kind != "generic":
        return False
    return lane_spec(fields, threads, Target.host()) is None


def node_config(node: Node, sizes: Sequence[int], dtype: Any, threads: int) -> Config:
    """The configuration teir.optimize writes for the node (children as they are laid out)."""
    fields = node_fields(node, [c.ids for c in node.children], sizes, np.dtype(dtype))
    return optimize_with_log(fields, threads, partial_tiles=False)[0]


def tree_cost(node: Node, sizes: Sequence[int], dtype: Any, threads: int) -> float:
    own = node_cost(node, [c.ids for c in node.children], sizes, dtype, threads)
    return own + sum(tree_cost(c, sizes, dtype, threads) for c in node.children)


__all__ = ["is_generic", "kernel_efficiency", "node_config", "node_cost", "tree_cost"]
