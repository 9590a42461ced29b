"""Einsums of three or more operands as einsum trees: opt_einsum chooses the contraction
path, each pairwise step becomes a contraction node, and the tree is optimized and compiled.

Operands are prepared as the two-operand einsum prepares them (diagonals become strided
views, size-1 dimensions broadcast by being dropped, negative strides copied), then put in
descending stride order, a free transposed view, so that every leaf's last id has the smallest
stride and the tree's cost model sees its layout.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import opt_einsum  # type: ignore[import-untyped]

from teir.frontend.einsum_parse import EinsumError, Subscripts
from teir.frontend.einsum_plan import label_sizes, operand
from teir.tree.compiled import CompiledTree
from teir.tree.nodes import Node
from teir.tree.rewrite import optimize_tree


@dataclass
class Prepared:
    """The operands as leaves: a view per operand, its ids (outermost first), and where the
    view is just the operand with its axes permuted, that permutation (None otherwise: a
    diagonal, a dropped size-1 dimension, a copy)."""

    views: list[np.ndarray]
    leaf_ids: list[tuple[int, ...]]
    sizes: list[int]
    output: tuple[int, ...]
    axes: list[tuple[int, ...] | None]


def permuted_views(
    arrays: Sequence[np.ndarray], axes: Sequence[tuple[int, ...] | None]
) -> list[np.ndarray] | None:
    """The leaves' views of operands laid out as those ``prepare`` saw (same shapes and
    strides), made again as transposes: a call then skips preparing them (microseconds per
    operand); None where some view is not a transpose."""
    if any(order is None for order in axes):
        return None
    return [array.transpose(order) for array, order in zip(arrays, axes)]


def prepare(
    parsed: Subscripts,
    arrays: Sequence[np.ndarray],
    orders: Sequence[Sequence[int]] | None = None,
) -> Prepared:
    """The operands as leaves; ``orders`` (ids per operand, from an earlier call) fixes the
    order of each leaf's ids instead of sorting them by stride."""
    operands = [operand(a, labels, i) for i, (a, labels) in enumerate(zip(arrays, parsed.inputs))]
    label_size = label_sizes(operands, parsed.output)
    ids: dict[str, int] = {}
    for op in operands:
        for lab in op.labels:
            ids.setdefault(lab, len(ids))
    for lab in parsed.output:
        ids.setdefault(lab, len(ids))
    sizes = [label_size[lab] for lab in ids]
    views: list[np.ndarray] = []
    leaf_ids: list[tuple[int, ...]] = []
    axes: list[tuple[int, ...] | None] = []
    for array, op in zip(arrays, operands):
        # a size-1 dimension of a larger label broadcasts: the operand does not vary along it
        kept = [lab for lab in op.labels if op.sizes[lab] == label_size[lab]]
        if orders is None:
            kept.sort(key=lambda lab: -op.strides[lab] if op.sizes[lab] > 1 else 0)
        else:
            position = {i: n for n, i in enumerate(orders[len(views)])}
            kept.sort(key=lambda lab: position.get(ids[lab], -1))
        itemsize = op.array.itemsize
        view = np.lib.stride_tricks.as_strided(
            op.array,
            shape=[op.sizes[lab] for lab in kept],
            strides=[op.strides[lab] * itemsize for lab in kept],
            writeable=False,
        )
        views.append(view)
        leaf_ids.append(tuple(ids[lab] for lab in kept))
        plain = op.array is array and len(op.labels) == len(kept) == array.ndim
        axes.append(tuple(op.labels.index(lab) for lab in kept) if plain else None)
    return Prepared(views, leaf_ids, sizes, tuple(ids[lab] for lab in parsed.output), axes)


def _path(prepared: Prepared, optimize: Any) -> list[tuple[int, ...]]:
    count = len(prepared.leaf_ids)
    if optimize is False:
        return [(0, 1)] * (count - 1)  # left to right, as NumPy without optimization
    if optimize is None or optimize is True:
        optimize = "auto"
    if isinstance(optimize, (list, tuple)) and optimize and optimize[0] == "einsum_path":
        optimize = list(optimize[1:])  # the form numpy.einsum_path returns
    if isinstance(optimize, (list, tuple)):
        return checked_path(optimize, count)
    terms = ",".join("".join(opt_einsum.get_symbol(i) for i in t) for t in prepared.leaf_ids)
    equation = f"{terms}->{''.join(opt_einsum.get_symbol(i) for i in prepared.output)}"
    shapes = [tuple(prepared.sizes[i] for i in t) for t in prepared.leaf_ids]
    try:
        path, _ = opt_einsum.contract_path(equation, *shapes, shapes=True, optimize=optimize)
    except (TypeError, ValueError, KeyError, IndexError) as error:
        raise EinsumError(f"optimize={optimize!r} is not a contraction path: {error}") from None
    return [tuple(step) for step in path]


def checked_path(path: Sequence[Any], count: int) -> list[tuple[int, ...]]:
    """An explicit contraction path for ``count`` operands (opt_einsum's convention: each
    step's operands, by their positions among those left, are removed and its result
    appended) as tuples of ints, or an EinsumError saying which step is wrong and why."""
    steps: list[tuple[int, ...]] = []
    left = count
    for number, step in enumerate(path):
        where = f"step {number} of the contraction path ({step!r})"
        if not isinstance(step, (tuple, list)) or not step:
            raise EinsumError(
                f"{where} is not a tuple of operand positions: a path is a list of steps like "
                "(0, 1), each naming the operands it contracts"
            )
        if any(not isinstance(i, numbers.Integral) or isinstance(i, bool) for i in step):
            raise EinsumError(f"{where} names operands by something other than integers")
        positions = tuple(int(i) for i in step)
        if len(set(positions)) != len(positions):
            raise EinsumError(f"{where} names an operand more than once")
        wrong = [i for i in positions if not 0 <= i < left]
        if wrong:
            raise EinsumError(
                f"{where} names operand {wrong[0]}, but {left} operands are left at that step "
                f"(positions 0 to {left - 1}: each step removes its operands and appends its "
                "result)"
            )
        left -= len(positions) - 1
        steps.append(positions)
    if left != 1:
        raise EinsumError(
            f"the contraction path leaves {left} operands uncontracted: its steps must "
            f"contract all {count} operands into one"
        )
    return steps


def build_tree(prepared: Prepared, path: Sequence[tuple[int, ...]]) -> Node:
    """The contraction nodes along ``path`` (opt_einsum's convention: the operands of a step
    are removed and its result appended); the last one writes the output's order."""
    nodes = [Node(ids, leaf=i) for i, ids in enumerate(prepared.leaf_ids)]
    for step in checked_path(path, len(nodes)):
        if len(step) == 1:  # a one-operand step sums ids (the next contraction does that)
            nodes.append(nodes.pop(step[0]))  # and moves the operand last
            continue
        chosen = [nodes[i] for i in step]
        for i in sorted(step, reverse=True):
            del nodes[i]
        node = chosen[0]
        for other in chosen[1:]:
            node = _contract(node, other, nodes + chosen[chosen.index(other) + 1 :], prepared)
        nodes.append(node)
    while len(nodes) > 1:  # whatever the path left
        node = _contract(nodes[0], nodes[1], nodes[2:], prepared)
        nodes = [*nodes[2:], node]
    root = nodes[0]
    if root.ids != prepared.output:
        root = Node(prepared.output, (root,))  # a permutation, or the sum of what is left
    return root


def _contract(left: Node, right: Node, rest: Sequence[Node], prepared: Prepared) -> Node:
    needed = set(prepared.output) | {i for n in rest for i in n.ids}
    if not rest:
        return Node(prepared.output, (left, right))
    ids = [i for i in dict.fromkeys(left.ids + right.ids) if i in needed]
    return Node(tuple(ids), (left, right))


def compile_einsum(
    parsed: Subscripts,
    arrays: Sequence[np.ndarray],
    optimize: Any,
    threads: int,
    accumulate: bool,
    relu: bool,
) -> tuple[CompiledTree, Prepared]:
    """The compiled tree for these operands, the views it is called with and how to make
    them again (``Prepared.axes``)."""
    prepared = prepare(parsed, arrays)
    dtype = arrays[0].dtype
    root = build_tree(prepared, _path(prepared, optimize))
    if all(size > 0 for size in prepared.sizes):  # (empty nodes run through teir.einsum)
        root = optimize_tree(root, prepared.sizes, dtype, threads)
    strides = [[s // view.itemsize for s in view.strides] for view in prepared.views]
    tree = CompiledTree(root, prepared.sizes, dtype, threads, strides, accumulate, relu)
    return tree, prepared


__all__ = ["Prepared", "build_tree", "compile_einsum", "permuted_views", "prepare"]
