"""Parsing the course's einsum-tree strings.

Grammar (spaces are ignored)::

    tree     := subtree
    subtree  := operand [ "," operand ] "->" ids  |  ids
    operand  := ids | "[" subtree "]"
    ids      := "[" [ id { "," id } ] "]"          id := decimal digits

``left,right->[out]`` is a contraction (left is in0), ``[child]->[out]`` a permutation,
``[ids]`` a leaf (an input tensor). Every error names the position where it was found.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

from teir.errors import TeirError
from teir.tree.nodes import Node, NodeKind


class TreeError(TeirError, ValueError):
    """An einsum tree (string, sizes or tensors) that cannot be evaluated."""


# Ids name internal labels (one character each, above Latin-1) and subtrees nest by
# recursion, in the parser and in every pass over the tree: both are bounded, far beyond any
# real tree, so that a string cannot exhaust Python's recursion or Unicode.
MAX_ID = 50_000
MAX_DEPTH = 200
DIGITS = "0123456789"


def _pointed(text: str, position: int, message: str) -> TreeError:
    position = max(0, min(position, len(text)))
    return TreeError(f"{message} at position {position}:\n  {text}\n  {' ' * position}^")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.leaf_count = 0
        self.depth = 0

    def error(self, message: str, position: int | None = None) -> TreeError:
        return _pointed(self.text, self.pos if position is None else position, message)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, token: str, what: str) -> None:
        self.skip()
        if not self.text.startswith(token, self.pos):
            found = repr(self.text[self.pos]) if self.pos < len(self.text) else "the end"
            raise self.error(f"expected {what} ({token!r}), found {found}")
        self.pos += len(token)

    def ids(self) -> tuple[tuple[int, ...], int]:
        start = self.pos
        self.expect("[", "'[' opening a list of ids")
        ids: list[int] = []
        if self.peek() == "]":
            self.pos += 1
            return (), start
        while True:
            self.skip()
            digits_start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] in DIGITS:
                self.pos += 1
            if self.pos == digits_start:
                found = repr(self.text[self.pos]) if self.pos < len(self.text) else "the end"
                raise self.error(f"expected an id (a non-negative integer), found {found}")
            if self.pos - digits_start > len(str(MAX_ID)):
                raise self.error(f"an id is at most {MAX_ID}", digits_start)
            value = int(self.text[digits_start : self.pos])
            if value > MAX_ID:
                raise self.error(f"id {value} is larger than {MAX_ID}", digits_start)
            if value in ids:
                raise self.error(f"id {value} appears twice in one node", digits_start)
            ids.append(value)
            if self.peek() == ",":
                self.pos += 1
                continue
            self.expect("]", "',' or ']' in a list of ids")
            return tuple(ids), start

    def operand(self) -> Node:
        self.skip()
        if self.peek() == "[" and self._after_bracket() == "[":
            start = self.pos
            self.expect("[", "'['")
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.error(f"subtrees nest more than {MAX_DEPTH} deep", start)
            node = self.subtree()
            self.depth -= 1
            if node.kind is NodeKind.LEAF:
                raise self.error("a bracketed subtree must contain '->'", start)
            self.expect("]", "']' closing a subtree")
            return node
        ids, _ = self.ids()
        node = Node(ids, leaf=self.leaf_count)
        self.leaf_count += 1
        return node

    def _after_bracket(self) -> str:
        """The first non-space character after the '[' at the current position."""
        index = self.pos + 1
        while index < len(self.text) and self.text[index].isspace():
            index += 1
        return self.text[index] if index < len(self.text) else ""

    def subtree(self) -> Node:
        start = self.pos
        first = self.operand()
        operands = [first]
        if self.peek() == ",":
            self.pos += 1
            operands.append(self.operand())
        self.skip()
        if not self.text.startswith("->", self.pos):
            if len(operands) == 2:
                raise self.error("expected '->' and the output ids after two operands")
            return first
        self.pos += 2
        out, out_start = self.ids()
        node = Node(out, tuple(operands))
        self.check(node, out_start, start)
        return node

    def check(self, node: Node, out_start: int, start: int) -> None:
        child_ids = {i for child in node.children for i in child.ids}
        if node.kind is NodeKind.PERMUTATION:
            (child,) = node.children
            if sorted(child.ids) != sorted(node.ids):
                missing = sorted(set(child.ids) - set(node.ids))
                extra = sorted(set(node.ids) - set(child.ids))
                detail = f"missing {missing}" if missing else f"not in its child {extra}"
                raise self.error(
                    f"a permutation must list exactly its child's ids {list(child.ids)} ({detail})",
                    out_start,
                )
        else:
            extra = [i for i in node.ids if i not in child_ids]
            if extra:
                raise self.error(
                    f"output ids {extra} appear in neither operand of the contraction", out_start
                )


def parse_tree(text: str) -> Node:
    """The tree a string describes (see the module's grammar); leaves numbered in order."""
    if not isinstance(text, str):
        raise TreeError(f"an einsum tree is a string, got {type(text).__name__}")
    if not text.strip():
        raise TreeError("the einsum tree string is empty")
    parser = _Parser(text)
    node = parser.subtree()
    parser.skip()
    if parser.pos != len(text):
        raise parser.error(f"unexpected {text[parser.pos]!r} after the end of the tree")
    return node


def check_sizes(node: Node, sizes: object) -> tuple[int, ...]:
    """``sizes`` (a sequence indexed by id, or a mapping id -> size) as a tuple of ints, one
    per id (index = id), every used id covered."""
    if isinstance(sizes, Mapping):
        return _mapped_sizes(node, sizes)
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise TreeError(f"sizes must be a sequence of integers (one per id), got {sizes!r}")
    values = [_size(index, size) for index, size in enumerate(sizes)]
    missing = [i for i in _used_ids(node) if i >= len(values)]
    if missing:
        raise TreeError(
            f"the tree uses ids {missing} but only {len(values)} sizes were given (ids 0.."
            f"{len(values) - 1}); give one size per id, in id order"
        )
    return _within_reach(node, tuple(values))


def _mapped_sizes(node: Node, sizes: Mapping[object, object]) -> tuple[int, ...]:
    """``check_sizes`` for a mapping id -> size; ids the tree does not use may be absent."""
    found: dict[int, int] = {}
    for key, size in sizes.items():
        if isinstance(key, bool) or not hasattr(key, "__index__") or key.__index__() < 0:
            raise TreeError(f"sizes has the key {key!r}: ids are integers from 0")
        found[key.__index__()] = _size(key, size)
    used = _used_ids(node)
    missing = [i for i in used if i not in found]
    if missing:
        raise TreeError(f"the tree uses ids {missing}, which sizes does not give; add them")
    count = max([*found, *used], default=-1) + 1
    return _within_reach(node, tuple(found.get(i, 1) for i in range(count)))


def _within_reach(node: Node, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """``sizes``, if every node's tensor has fewer elements than a 64-bit index reaches."""
    for n in _all(node):
        elements = prod(sizes[i] for i in n.ids)
        if elements >= 1 << 63:
            ids = ",".join(map(str, n.ids))
            raise TreeError(
                f"the node [{ids}] would hold {elements:.3g} elements, beyond what a 64-bit "
                "index reaches: reduce the sizes of its ids"
            )
    return sizes


def _size(key: object, size: object) -> int:
    """``sizes[key]`` as an int of at least 1."""
    if isinstance(size, bool) or not hasattr(size, "__index__"):
        raise TreeError(f"sizes[{key!r}] = {size!r} is not an integer")
    value: int = size.__index__()
    if value < 1:
        raise TreeError(f"sizes[{key!r}] = {size} must be at least 1 (the size of id {key})")
    return value


def _used_ids(node: Node) -> list[int]:
    return sorted({i for n in _all(node) for i in n.ids})


def _all(node: Node) -> list[Node]:
    return [node, *(n for child in node.children for n in _all(child))]


__all__ = ["TreeError", "check_sizes", "parse_tree"]
