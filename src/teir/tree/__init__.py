"""Einsum trees: parsing the course's tree strings, rewriting trees for speed, compiling
them with planned intermediate memory."""

from teir.tree.compiled import CompiledTree
from teir.tree.einsum_tree import EinsumTree
from teir.tree.nodes import Node, NodeKind
from teir.tree.parse import TreeError, parse_tree

__all__ = ["CompiledTree", "EinsumTree", "Node", "NodeKind", "TreeError", "parse_tree"]
