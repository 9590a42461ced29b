"""From tree nodes to einsum operands: labels, element strides and the unscheduled TEIR
fields of one node, for the planner and the cost model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from teir.frontend.einsum_parse import Subscripts
from teir.frontend.einsum_plan import Operand, build_config
from teir.tree.nodes import Node


def label(id_: int) -> str:
    """One character per id, never an ASCII letter or digit (so it cannot clash with the
    einsum front end's labels or read as an ellipsis dimension)."""
    return chr(0x100 + id_)


def row_major_strides(ids: Sequence[int], sizes: Sequence[int]) -> dict[int, int]:
    """Element strides of a tensor stored row-major in ``ids`` (the last id has unit stride)."""
    strides: dict[int, int] = {}
    step = 1
    for id_ in reversed(ids):
        strides[id_] = step if sizes[id_] > 1 else 0
        step *= sizes[id_]
    return strides


LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def einsum_text(node: Node) -> str:
    """The node (its children's ids ``->`` its ids) as einsum subscripts in ASCII letters,
    for teir.einsum and NumPy: ids named by letters in order of appearance."""
    names: dict[int, str] = {}

    def text(ids: Sequence[int]) -> str:
        for i in ids:
            if i not in names:
                if len(names) == len(LETTERS):
                    raise ValueError(f"more than {len(LETTERS)} distinct ids in one einsum")
                names[i] = LETTERS[len(names)]
        return "".join(names[i] for i in ids)

    inputs = ",".join(text(c.ids) for c in node.children)
    return f"{inputs}->{text(node.ids)}"


def subscripts(node: Node) -> Subscripts:
    return Subscripts(
        tuple(tuple(label(i) for i in child.ids) for child in node.children),
        tuple(label(i) for i in node.ids),
    )


def _operand(ids: Sequence[int], sizes: Sequence[int], dtype: np.dtype[Any]) -> Operand:
    strides = row_major_strides(ids, sizes)
    return Operand(
        np.empty(0, dtype),
        [label(i) for i in ids],
        {label(i): sizes[i] for i in ids},
        {label(i): strides[i] for i in ids},
    )


def node_fields(
    node: Node,
    child_ids: Sequence[Sequence[int]],
    sizes: Sequence[int],
    dtype: np.dtype[Any],
) -> dict[str, Any]:
    """Unscheduled TEIR fields of ``node`` with its children laid out row-major in
    ``child_ids`` and its own result row-major in ``node.ids`` (ids of one child only that the
    node sums away are left out: they are reduced before the contraction runs)."""
    lonely = set(lonely_ids(node))
    inputs = [_operand([i for i in ids if i not in lonely], sizes, dtype) for ids in child_ids]
    out_strides = row_major_strides(node.ids, sizes)
    return build_config(
        dtype,
        inputs,
        tuple(label(i) for i in node.ids),
        {label(i): s for i, s in out_strides.items()},
        {label(i): sizes[i] for ids in child_ids for i in ids if i not in lonely},
        False,
        False,
    )


def lonely_ids(node: Node) -> list[int]:
    """Ids of one child only that the node sums away (einsum semantics)."""
    if len(node.children) == 1:
        return sorted(set(node.children[0].ids) - set(node.ids))
    if len(node.children) != 2:
        return []
    left, right = (set(child.ids) for child in node.children)
    return sorted((left ^ right) - set(node.ids))


def roles(node: Node) -> dict[str, list[int]]:
    """The contraction's ids by role: C (both children and out), M (left and out), N (right
    and out), K (both children, not out); C/M/N in the output's order, K in the left's."""
    lonely = set(lonely_ids(node))
    left, right = ([i for i in child.ids if i not in lonely] for child in node.children)
    out = node.ids
    return {
        "C": [i for i in out if i in left and i in right],
        "M": [i for i in out if i in left and i not in right],
        "N": [i for i in out if i in right and i not in left],
        "K": [i for i in left if i in right and i not in out],
    }


__all__ = [
    "einsum_text",
    "label",
    "lonely_ids",
    "node_fields",
    "roles",
    "row_major_strides",
    "subscripts",
]
