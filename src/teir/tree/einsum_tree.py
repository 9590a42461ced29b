"""``teir.EinsumTree``: an einsum tree parsed from the course's string format, optimized and
compiled.

>>> import numpy as np, teir
>>> tree = teir.EinsumTree.parse("[[0,2]->[2,0]],[1,2]->[1,0]", sizes=[30, 20, 40], dtype="float64")
>>> tree.to_string()
'[[0,2]->[2,0]],[1,2]->[1,0]'
>>> a, b = np.random.rand(30, 40), np.random.rand(20, 40)
>>> compiled = tree.optimize().compile()
>>> bool(np.allclose(compiled(a, b), b @ a.T))
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from teir.runtime.pool import default_threads
from teir.tree.compiled import CompiledTree
from teir.tree.cost import node_config
from teir.tree.nodes import Node, NodeKind, leaves, to_string, total_flops
from teir.tree.parse import TreeError, check_sizes, parse_tree
from teir.tree.rewrite import legalize, optimize_tree

_DTYPES = {
    "fp32": np.float32,
    "float32": np.float32,
    "f32": np.float32,
    "fp64": np.float64,
    "float64": np.float64,
    "f64": np.float64,
}


def _dtype(dtype: Any) -> np.dtype[Any]:
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return np.dtype(_DTYPES[dtype.lower()])
    try:
        value = np.dtype(dtype)
    except TypeError:
        value = None
    if value is None or value not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TreeError(f"dtype must be float32 or float64 (FP32/FP64), got {dtype!r}")
    checked: np.dtype[Any] = value
    return checked


def _threads(threads: int | None) -> int:
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise TreeError(f"threads must be a positive integer, got {threads!r}")
    return threads


class EinsumTree:
    """A tree of binary contractions and permutations over tensors named by integer ids.

    ``sizes[i]`` is the size of id ``i``. Build one with :meth:`parse`; :meth:`optimize`
    returns a rewritten tree computing the same result, :meth:`compile` a callable
    :class:`CompiledTree`. Leaves are always passed in the order they appear in the string
    that was parsed (rewrites keep that order), each row-major in its ids.
    """

    def __init__(
        self, root: Node, sizes: Sequence[int] | Mapping[int, int], dtype: Any = np.float32
    ) -> None:
        self.root = root
        self.sizes = check_sizes(root, sizes)
        self.dtype = _dtype(dtype)

    @classmethod
    def parse(
        cls, string: str, sizes: Sequence[int] | Mapping[int, int], dtype: Any = np.float32
    ) -> EinsumTree:
        """The tree a course-format string describes (``left,right->[out]``,
        ``[child]->[out]``, nested in brackets), with one size per id: a sequence indexed by
        id, or a mapping id -> size (``{0: 3, 1: 4, 2: 5}``)."""
        return cls(parse_tree(string), sizes, dtype)

    def to_string(self) -> str:
        return to_string(self.root)

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return f"EinsumTree({self.to_string()!r}, sizes={list(self.sizes)}, dtype={self.dtype})"

    @property
    def flops(self) -> int:
        """FLOPs per evaluation: 2 per multiply-add, summed over the contractions."""
        return total_flops(self.root, self.sizes)

    @property
    def leaf_shapes(self) -> list[tuple[int, ...]]:
        return [leaf.shape(self.sizes) for leaf in leaves(self.root)]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.root.shape(self.sizes)

    def optimize(self, threads: int | None = None) -> EinsumTree:
        """The tree rewritten for speed (operands swapped, interior ids reordered,
        permutation nodes inserted or removed) — the same result, the same leaves."""
        root = optimize_tree(self.root, self.sizes, self.dtype, _threads(threads))
        return EinsumTree(root, self.sizes, self.dtype)

    def compile(self, threads: int | None = None) -> CompiledTree:
        """Every node planned and compiled; intermediates get one arena. A contraction with
        no layout fitting a GEMM kernel gets permutation nodes first (see :meth:`explain`)."""
        count = _threads(threads)
        root = legalize(self.root, self.sizes, self.dtype, count)
        return CompiledTree(root, self.sizes, self.dtype, count)

    def __call__(self, *tensors: Any, out: Any = None, threads: int | None = None) -> Any:
        """Compile (cached per thread count) and evaluate."""
        count = _threads(threads)
        cache = self.__dict__.setdefault("_compiled", {})
        if count not in cache:
            cache[count] = self.compile(count)
        return cache[count](*tensors, out=out)

    def explain(self, threads: int | None = None) -> str:
        """The tree, one node per line (indented by depth) with its FLOPs, its tensor's size,
        and the TEIR configuration teir.optimize writes for it."""
        count = _threads(threads)
        lines = [
            f"# einsum tree {self.to_string()}",
            f"# sizes {list(self.sizes)}, {self.dtype.name}, {self.flops / 1e9:.4g} GFLOP",
        ]
        self._explain(self.root, 0, count, lines)
        return "\n".join(lines)

    def _explain(self, node: Node, depth: int, threads: int, lines: list[str]) -> None:
        pad = "  " * depth
        nbytes = node.elements(self.sizes) * self.dtype.itemsize
        what = "result" if depth == 0 else "intermediate" if node.children else "input"
        lines.append(
            f"{pad}{node.kind.value} {list(node.ids)}: {node.flops(self.sizes) / 1e9:.4g} "
            f"GFLOP, {what} {nbytes / 2**20:.2f} MiB"
        )
        if node.kind is NodeKind.CONTRACTION:
            config = node_config(node, self.sizes, self.dtype, threads)
            lines += [f"{pad}  | {line}" for line in config.to_json().splitlines()]
        for child in node.children:
            self._explain(child, depth + 1, threads, lines)


__all__ = ["EinsumTree"]
