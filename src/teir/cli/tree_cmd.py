"""``teir tree STRING --sizes ...``: evaluate an einsum tree on random tensors."""

from __future__ import annotations

import argparse
from math import prod
from typing import Any

from teir.buffers import check_memory
from teir.cli import arguments
from teir.errors import ExecutionError
from teir.tree.parse import TreeError


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "tree",
        help="optimize, compile and run an einsum tree in the course's string format",
        description="Parse an einsum tree ('[ids]' nodes, 'left,right->[out]' contractions, "
        "'[child]->[out]' permutations, the last id with unit stride), optimize it, compile "
        "it and run it on random tensors, checked against NumPy.",
    )
    parser.add_argument("tree", metavar="STRING", help="e.g. '[[0,2]->[2,0]],[1,2]->[1,0]'")
    parser.add_argument(
        "--sizes", required=True, metavar="N,N,...", help="the size of every id, in id order"
    )
    parser.add_argument("--dtype", type=arguments.dtype, choices=arguments.DTYPES, default="f32")
    parser.add_argument("--threads", type=arguments.positive_int, default=None, metavar="N")
    parser.add_argument(
        "--no-optimize", action="store_true", help="run the tree as written (no rewrites)"
    )
    parser.add_argument(
        "--explain", action="store_true", help="print each node's configuration and memory"
    )
    parser.add_argument(
        "--bench", action="store_true", help="time it (best of repeated runs) in GFLOP/s"
    )
    parser.add_argument(
        "--seconds",
        type=arguments.seconds,
        default=1.0,
        help="time budget for --bench (default: 1.0)",
    )
    parser.set_defaults(handler=run)


def _sizes(text: str) -> list[int]:
    sizes = []
    for index, part in enumerate(part.strip() for part in text.split(",")):
        try:
            sizes.append(int(part))
        except ValueError:
            what = "is empty" if not part else f"({part!r}) is not an integer"
            raise TreeError(
                f"--sizes {text!r}: entry {index} {what}; give one integer per id, in id "
                "order, separated by commas, e.g. 100,72,128"
            ) from None
    return sizes


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from teir.bench.timing import best_seconds
    from teir.tree.einsum_tree import EinsumTree

    dtype = np.float32 if args.dtype in ("f32", "fp32") else np.float64
    tree = EinsumTree.parse(args.tree, _sizes(args.sizes), dtype)
    if not args.no_optimize:
        tree = tree.optimize(args.threads)
    compiled = tree.compile(args.threads)
    print(f"tree: {tree.to_string()}")
    if args.explain:
        print(compiled.explain())
    _check_fits(tree, compiled, np.dtype(dtype).itemsize)
    rng = np.random.default_rng(0)
    try:
        arrays = [rng.uniform(-1, 1, shape).astype(dtype) for shape in tree.leaf_shapes]
        result = compiled(*arrays)
        expected = _evaluate(tree, [a.astype(np.float64) for a in arrays])
    except MemoryError:
        raise ExecutionError(
            "could not allocate the tree's random leaves, its result and NumPy's check of it: "
            "reduce --sizes"
        ) from None
    scale = max(float(np.max(np.abs(expected))) if expected.size else 1.0, 1.0)
    error = float(np.max(np.abs(result - expected))) if expected.size else 0.0
    ok = error <= (1e-3 if dtype == np.float32 else 1e-10) * scale
    print(
        f"result {result.shape} {result.dtype}; {tree.flops / 1e9:.4g} GFLOP; intermediates "
        f"{compiled.intermediate_bytes / 2**20:.2f} MiB; check against NumPy: "
        f"{'OK' if ok else 'MISMATCH'} (max error {error:.3g})"
    )
    if args.bench:
        out = np.empty_like(result)
        seconds = best_seconds(lambda: compiled(*arrays, out=out), args.seconds)
        print(f"time {seconds * 1e3:.3f} ms, {tree.flops / seconds / 1e9:.1f} GFLOP/s")
    return 0 if ok else 1


def _check_fits(tree: Any, compiled: Any, itemsize: int) -> None:
    """A clear error, before the leaves are allocated, where the leaves, the result (with
    --bench's out) and NumPy's FP64 check of them (its intermediates about as large as the
    compiled tree's) would not fit this machine's memory."""
    leaves = sum(prod(shape) for shape in tree.leaf_shapes)
    result = prod(tree.out_shape)
    needed = (leaves + result) * (itemsize + 8) + result * itemsize
    needed += compiled.intermediate_bytes // itemsize * 8
    check_memory(
        needed,
        f"the tree's random leaves ({leaves * itemsize / 2**30:.3g} GiB), its result "
        f"({result * itemsize / 2**30:.3g} GiB) and NumPy's FP64 check of them need {{size}}",
        "reduce --sizes",
    )


def _evaluate(tree: Any, arrays: list[Any]) -> Any:
    """The tree evaluated node by node with numpy.einsum (the oracle)."""
    import numpy as np

    from teir.tree.layout import einsum_text
    from teir.tree.nodes import Node

    def evaluate(node: Node) -> Any:
        if not node.children:
            return arrays[node.leaf]
        values = [evaluate(child) for child in node.children]
        return np.einsum(einsum_text(node), *values, optimize=True)

    return evaluate(tree.root)
