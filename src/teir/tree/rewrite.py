"""Tree rewrites and the tree optimizer.

The course's three rewrites — swap the operands of a contraction, reorder the ids of an
interior node, insert a permutation node — are plain functions here. ``optimize_tree`` uses
them top-down: the root's layout is fixed (it is the result); for every node it tries the
layouts of each child that give the node's kernel unit strides (and keeping the child as it
is), costs the node and the child together with :mod:`teir.tree.cost`, and keeps the cheapest.
``legalize`` then makes sure no node is left on the scalar fallback kernel, by copying its
operands into layouts that fit (explicit permutation nodes, so their memory is planned).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

import numpy as np

from teir.tree.cost import is_generic, node_cost
from teir.tree.layout import roles
from teir.tree.memory import path_peak, plan_arena, tree_lifetimes
from teir.tree.nodes import Node, NodeKind, post_order
from teir.tree.slabs import slab_ids


def swap_operands(node: Node) -> Node:
    """``left,right->out`` becomes ``right,left->out`` (the same result)."""
    if node.kind is not NodeKind.CONTRACTION:
        raise ValueError("only a contraction has two operands to swap")
    return node.with_children(node.children[::-1])


def reorder(node: Node, ids: Sequence[int]) -> Node:
    """An interior node computing the same tensor with its ids in another order."""
    if sorted(ids) != sorted(node.ids):
        raise ValueError(f"{list(ids)} is not a reordering of {list(node.ids)}")
    if node.kind is NodeKind.LEAF:
        raise ValueError("a leaf's layout is its input's: insert a permutation instead")
    return node.with_ids(ids)


def insert_permutation(node: Node, ids: Sequence[int]) -> Node:
    """A permutation node above ``node`` producing its tensor with ids in the order ``ids``."""
    if sorted(ids) != sorted(node.ids):
        raise ValueError(f"{list(ids)} is not a reordering of {list(node.ids)}")
    return Node(tuple(ids), (node,))


def _conditional_swap(node: Node) -> Node:
    """Children first; then put the operand holding the output's unit-stride id on the left
    (in0), the course's convention for column-major kernels."""
    if node.kind is NodeKind.LEAF:
        return node
    node = node.with_children([_conditional_swap(c) for c in node.children])
    if node.kind is NodeKind.CONTRACTION and node.ids:
        left, right = node.children
        unit = node.ids[-1]
        if unit in right.ids and unit not in left.ids:
            return swap_operands(node)
    return node


def _complete(order: list[int], ids: Sequence[int]) -> tuple[int, ...]:
    """``order`` restricted to ``ids``, with ids it misses (summed ones) outermost."""
    chosen = [i for i in order if i in ids]
    return tuple([i for i in ids if i not in chosen] + chosen)


def _wanted_orders(parent: Node, position: int, child: Node) -> list[tuple[int, ...]]:
    """Layouts of the child that give the parent's kernel unit strides (for a permutation
    parent: its own layout, which makes the copy unnecessary)."""
    if parent.kind is NodeKind.PERMUTATION:
        return [parent.ids]
    r = roles(parent)
    sibling = parent.children[1 - position]
    k = [i for i in sibling.ids if i in r["K"]]  # K in the sibling's order: batch-reducible
    own = r["M"] if position == 0 else r["N"]
    orders = [
        _complete(r["C"] + k + own, child.ids),  # column-major A / row-major-transposed B
        _complete(r["C"] + own + k, child.ids),  # unit stride on K
    ]
    if child.kind is NodeKind.CONTRACTION:
        cr = roles(child)
        orders.append(_complete(cr["C"] + cr["N"] + cr["M"], child.ids))
    batch = parent.ids[-1] if parent.ids else None
    if batch in r["C"]:
        # the parent's innermost label is a batch: with it innermost in the child too, the
        # parent can run as a lane-batched contraction on the layouts as they are
        others = [x for x in r["C"] if x != batch]
        orders.append(_complete(others + own + k + [batch], child.ids))
    return orders


def _cost(node: Node, sizes: Sequence[int], dtype: Any, threads: int) -> float:
    return node_cost(node, [c.ids for c in node.children], sizes, dtype, threads)


def _option_cost(option: Node, sizes: Sequence[int], dtype: Any, threads: int) -> float:
    """The cost an option adds: its own node, and for a permutation inserted above a
    contraction, that contraction too."""
    cost = _cost(option, sizes, dtype, threads)
    if option.kind is NodeKind.PERMUTATION and option.children[0].kind is NodeKind.CONTRACTION:
        cost += _cost(option.children[0], sizes, dtype, threads)
    return cost


def _candidates(
    parent: Node,
    position: int,
    child: Node,
    sizes: Sequence[int],
    dtype: Any,
    threads: int,
    as_they_lie: frozenset[int] = frozenset(),
) -> list[Node]:
    options = [child]
    orders = _wanted_orders(parent, position, child)
    if child.kind is NodeKind.PERMUTATION:
        options.append(child.children[0])  # no copy: the parent reads the child's layout
        options += [child.with_ids(o) for o in orders]
    elif child.kind is NodeKind.CONTRACTION:
        for order in orders:
            reordered = reorder(child, order)
            if parent.kind is NodeKind.CONTRACTION and is_generic(reordered, sizes, dtype, threads):
                # its own kernel cannot write this layout: compute it in the layout it can,
                # then permute (GETD's last operand: 158 -> 199 GFLOP/s)
                inner = reorder(child, canonical_children(child)[2])
                options.append(insert_permutation(inner, order))
            else:
                options.append(reordered)
    elif child.leaf not in as_they_lie:
        options += [insert_permutation(child, o) for o in orders if o != child.ids]
    unique: list[Node] = []
    for option in options:
        if option not in unique:
            unique.append(option)
    return unique


def _place(
    node: Node,
    sizes: Sequence[int],
    dtype: Any,
    threads: int,
    as_they_lie: frozenset[int] = frozenset(),
) -> Node:
    """Choose the layouts below ``node`` (whose own layout is fixed): the operands' layouts
    jointly (one operand's best layout depends on the other's: GETD's last contraction
    needs both changed for the mirror form), then recursively. The leaves numbered in
    ``as_they_lie`` are read as they lie, never copied."""
    if node.kind is NodeKind.LEAF:
        return node
    children = list(node.children)
    options = [
        _candidates(node, position, child, sizes, dtype, threads, as_they_lie)
        for position, child in enumerate(children)
    ]
    best: tuple[float, list[Node]] | None = None
    for choice in product(*options):
        trial = list(choice)
        total = _cost(node.with_children(trial), sizes, dtype, threads) + sum(
            _option_cost(option, sizes, dtype, threads) for option in trial
        )
        if best is None or total < best[0] * 0.97:  # keep the simpler tree on near-ties
            best = (total, trial)
    assert best is not None
    return node.with_children([_place(c, sizes, dtype, threads, as_they_lie) for c in best[1]])


def canonical_children(node: Node) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Layouts (left, right, out) in which a contraction runs on GEMM kernels with unit
    strides: left (C, K, M), right (C, N, K), out (C, N, M), innermost last."""
    r = roles(node)
    left, right = node.children
    return (
        _complete(r["C"] + r["K"] + r["M"], left.ids),
        _complete(r["C"] + r["N"] + r["K"], right.ids),
        tuple(r["C"] + r["N"] + r["M"]),
    )


def legalize(node: Node, sizes: Sequence[int], dtype: Any, threads: int, root: bool = True) -> Node:
    """``node`` with no contraction left on the scalar fallback kernel: such a contraction's
    operands (and, if needed, its result) are permuted into layouts that fit."""
    if node.kind is NodeKind.LEAF:
        return node
    node = node.with_children([legalize(c, sizes, dtype, threads, False) for c in node.children])
    if not is_generic(node, sizes, dtype, threads):
        return node
    left_ids, right_ids, out_ids = canonical_children(node)
    left, right = node.children
    children = []
    for child, ids in ((left, left_ids), (right, right_ids)):
        if child.ids == ids:
            children.append(child)
        elif child.kind is NodeKind.LEAF:
            children.append(insert_permutation(child, ids))
        else:
            children.append(reorder(child, ids))
    if node.ids == out_ids:
        return node.with_children(children)
    inner = Node(out_ids, tuple(children))
    if root:
        return insert_permutation(inner, node.ids)
    return inner  # the parent reads this layout (and is legalized after)


def drop_identities(node: Node, root: bool = True) -> Node:
    """Permutation nodes that do not permute (their child already has their layout) removed,
    except one that copies a leaf into the result."""
    if node.kind is NodeKind.LEAF:
        return node
    children = [drop_identities(c, False) for c in node.children]
    node = node.with_children(children)
    identity = node.kind is NodeKind.PERMUTATION and children[0].ids == node.ids
    if identity and not (root and children[0].kind is NodeKind.LEAF):
        return children[0]
    return node


def _arena_bytes(node: Node, sizes: Sequence[int], itemsize: int) -> int:
    return plan_arena(tree_lifetimes(node, sizes, itemsize)[2]).nbytes


def _leaf_copies(node: Node) -> list[Node]:
    """The permutation nodes below the root that copy a leaf."""
    return [
        n
        for n in post_order(node)
        if n is not node and n.kind is NodeKind.PERMUTATION and n.children[0].kind is NodeKind.LEAF
    ]


def _layouts(
    node: Node, sizes: Sequence[int], dtype: Any, threads: int, as_they_lie: frozenset[int]
) -> Node:
    node = drop_identities(_place(node, sizes, dtype, threads, as_they_lie))
    return drop_identities(legalize(node, sizes, dtype, threads))


# A child re-laid for its parent's slabs may cost this much more, by the model, than before.
SLAB_LAYOUT_SLACK = 1.03


def _slab_friendly(
    node: Node, sizes: Sequence[int], dtype: Any, threads: int, root: bool = True
) -> Node:
    """The tree with each intermediate that a node computed in slabs reads laid out with the
    ids those slabs iterate over outermost (:func:`teir.tree.slabs.slab_ids`), so that each
    slab reads one contiguous block of it, streamed from memory, instead of pieces scattered
    over all of it; where the cost model rates child and parent within ``SLAB_LAYOUT_SLACK``
    of before and the slabs stay the same. GETD's root, in slabs of one index of id 5,
    reading ``[4,9,5,6,2]`` (190 MiB) laid out ``[5,4,9,6,2]``: FP64, 2 threads, alternating
    runs, 176.6-184.5 -> 171.7-181.1 ms per call (median 182 -> 175), FP32 79.7-82.2 ->
    78.6 ms."""
    if node.kind is NodeKind.LEAF:
        return node
    children = list(node.children)
    lead = slab_ids(node, sizes, dtype, threads, root)
    cost = _cost(node, sizes, dtype, threads) if lead else 0.0  # of the children kept so far
    for child in children if lead else []:
        front = [i for i in lead if i in child.ids]
        if child.kind is not NodeKind.CONTRACTION or not front:
            continue
        if list(child.ids[: len(front)]) == front:
            continue
        moved = reorder(child, front + [i for i in child.ids if i not in front])
        trial = [moved if c is child else c for c in children]
        after = node.with_children(trial)
        after_cost = _cost(after, sizes, dtype, threads)
        if (
            _cost(moved, sizes, dtype, threads)
            <= SLAB_LAYOUT_SLACK * _cost(child, sizes, dtype, threads)
            and after_cost <= SLAB_LAYOUT_SLACK * cost
            and slab_ids(after, sizes, dtype, threads, root) == lead
        ):
            children, cost = trial, after_cost
    return node.with_children(
        [_slab_friendly(c, sizes, dtype, threads, root=False) for c in children]
    )


def optimize_tree(node: Node, sizes: Sequence[int], dtype: Any, threads: int) -> Node:
    """The tree rewritten for speed: operands swapped by the course's convention, interior
    layouts and permutation nodes chosen by the cost model, no scalar-fallback kernels, and
    no more intermediate memory than the path's own where leaf copies are what adds it."""
    itemsize = np.dtype(dtype).itemsize
    limit = path_peak(node, sizes, itemsize)
    swapped = _conditional_swap(node)
    # a leaf's copy is an intermediate the path's own peak (opt_einsum's) does not hold:
    # where the arena outgrows that peak, the leaf whose copy left out shrinks it most is
    # read as it lies, and the layouts chosen again around it, until the arena fits or no
    # leaf left out shrinks it (the course's opt2_fctn, FP32: arena 53.2 MiB against 53.1
    # with its two leaves copied)
    as_they_lie: frozenset[int] = frozenset()
    node = _layouts(swapped, sizes, dtype, threads, as_they_lie)
    arena = _arena_bytes(node, sizes, itemsize)
    while arena > limit:
        trials = []
        for copy in _leaf_copies(node):
            kept = as_they_lie | {copy.children[0].leaf}
            if kept != as_they_lie:
                trial = _layouts(swapped, sizes, dtype, threads, kept)
                trials.append((_arena_bytes(trial, sizes, itemsize), kept, trial))
        smallest = min(trials, key=lambda t: t[0], default=None)
        if smallest is None or smallest[0] >= arena:
            break
        arena, as_they_lie, node = smallest
    return _slab_friendly(node, sizes, dtype, threads)


__all__ = [
    "canonical_children",
    "drop_identities",
    "insert_permutation",
    "legalize",
    "optimize_tree",
    "reorder",
    "swap_operands",
]
