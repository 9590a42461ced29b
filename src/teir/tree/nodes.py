"""Einsum-tree nodes: leaves (input tensors), permutations (one child) and binary
contractions (two children), each naming its dimensions by integer ids.

Ids are listed outermost to innermost: a node's tensor is row-major in its ids, so the last
id has unit stride. The left child of a contraction is in0, the right child in1.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from math import prod


class NodeKind(Enum):
    LEAF = "leaf"
    PERMUTATION = "permutation"
    CONTRACTION = "contraction"


@dataclass(frozen=True)
class Node:
    """One node of an einsum tree: its ids (outermost first) and 0, 1 or 2 children.

    A leaf's ``leaf`` is its position among the leaves of the tree as parsed (the order in
    which a compiled tree takes its input tensors); rewrites keep it.
    """

    ids: tuple[int, ...]
    children: tuple[Node, ...] = ()
    leaf: int = -1

    @property
    def kind(self) -> NodeKind:
        return (NodeKind.LEAF, NodeKind.PERMUTATION, NodeKind.CONTRACTION)[len(self.children)]

    def with_ids(self, ids: Sequence[int]) -> Node:
        return Node(tuple(ids), self.children, self.leaf)

    def with_children(self, children: Sequence[Node]) -> Node:
        return Node(self.ids, tuple(children), self.leaf)

    def shape(self, sizes: Sequence[int]) -> tuple[int, ...]:
        return tuple(sizes[i] for i in self.ids)

    def elements(self, sizes: Sequence[int]) -> int:
        return prod(self.shape(sizes))

    def flops(self, sizes: Sequence[int]) -> int:
        """Floating-point operations of this node alone: 2 per multiply-add of a contraction
        (output elements times the contracted extent), none for leaves and permutations."""
        if self.kind is not NodeKind.CONTRACTION:
            return 0
        left, right = self.children
        contracted = set(left.ids) & set(right.ids) - set(self.ids)
        return 2 * self.elements(sizes) * prod(sizes[i] for i in contracted)


def post_order(node: Node) -> Iterator[Node]:
    """Children before parents, left before right (the order a tree is evaluated in)."""
    for child in node.children:
        yield from post_order(child)
    yield node


def leaves(node: Node) -> list[Node]:
    """The leaves in the order of their ``leaf`` index."""
    return sorted((n for n in post_order(node) if n.kind is NodeKind.LEAF), key=lambda n: n.leaf)


def total_flops(node: Node, sizes: Sequence[int]) -> int:
    return sum(n.flops(sizes) for n in post_order(node))


def to_string(node: Node) -> str:
    """The course's string form: ``[ids]`` for a node, ``left,right->[out]`` for a
    contraction, ``[child]->[out]`` for a permutation; inner nodes in brackets."""

    def ids(node: Node) -> str:
        return "[" + ",".join(str(i) for i in node.ids) + "]"

    def inner(node: Node) -> str:
        return ids(node) if node.kind is NodeKind.LEAF else "[" + to_string(node) + "]"

    if node.kind is NodeKind.LEAF:
        return ids(node)
    return ",".join(inner(child) for child in node.children) + "->" + ids(node)


__all__ = ["Node", "NodeKind", "leaves", "post_order", "to_string", "total_flops"]
