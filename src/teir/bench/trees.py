"""``teir bench trees``: the course's einsum trees against opt_einsum and torch.

Each tree is optimized and compiled by teir and timed in this process, in rounds that
alternate with the baselines (each side's best round counts). Baselines run in
processes of their own with the same thread count: opt_einsum (NumPy backend) along the
tree's own contraction order and along its own best path ("optimal"), and ``torch.einsum``
if installed. Reports GFLOP/s, the fraction of all cores' FMA peak from the same run, the
speedups, and peak intermediate memory: teir's arena next to opt_einsum's for the same path
(the most intermediate bytes live at one step when each is freed after its last use).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from teir import machine
from teir.bench.einsum_suite import ROUNDS, _baseline
from teir.bench.progress import Progress
from teir.bench.timing import best_of_rounds, best_seconds
from teir.runtime.pool import default_threads
from teir.tree.einsum_tree import EinsumTree
from teir.tree.layout import LETTERS
from teir.tree.memory import path_peak
from teir.tree.nodes import Node, NodeKind, leaves, post_order

# The course's trees (lab "einsum_tree": two lowering and three optimization examples).
COURSE_TREES: list[tuple[str, str, list[int]]] = [
    (
        "tt_coil100",
        "[[8,4],[7,3,8]->[7,3,4]],[[[2,6,7],[1,5,6]->[1,2,5,7]],[0,5]->[0,1,2,7]]->[0,1,2,3,4]",
        [100, 72, 128, 128, 3, 71, 305, 32, 3],
    ),
    (
        "fctn",
        "[[[[3,6,8,9]->[8,6,9,3]],[[2,5,7,9]->[7,5,2,9]]->[7,8,5,6,2,3]],[0,4,5,6]->[0,4,7,8,2,3]]"
        ",[1,4,7,8]->[0,1,2,3]",
        [60, 60, 20, 20, 8, 8, 8, 8, 8, 8],
    ),
    (
        "opt1_tt",
        "[[7,3,8],[8,4]->[7,3,4]],[[0,5],[[5,1,6],[6,2,7]->[5,1,2,7]]->[0,1,2,7]]->[0,1,2,3,4]",
        [100, 72, 128, 128, 3, 71, 305, 32, 3],
    ),
    (
        "opt2_fctn",
        "[1,4,7,8],[[0,4,5,6],[[2,5,7,9],[3,6,8,9]->[2,5,7,3,6,8]]->[0,4,2,7,3,8]]->[0,1,2,3]",
        [60, 60, 20, 20, 8, 8, 8, 8, 8, 8],
    ),
    (
        "opt3_getd",
        "[[2,7,3],[3,8,4]->[2,7,8,4]],[[4,9,0],[[0,5,1],[1,6,2]->[0,5,6,2]]->[4,9,5,6,2]]"
        "->[5,6,7,8,9]",
        [40, 40, 40, 40, 40, 25, 25, 25, 25, 25],
    ),
]


def expression(root: Node) -> tuple[str, list[list[int]]]:
    """The tree as one einsum over its leaves (in leaf order) and the contraction path
    (opt_einsum's convention) that follows its contraction nodes; permutations vanish."""
    terms = ",".join("".join(LETTERS[i] for i in leaf.ids) for leaf in leaves(root))
    subscripts = f"{terms}->{''.join(LETTERS[i] for i in root.ids)}"
    operands: list[int] = [leaf.leaf for leaf in leaves(root)]  # tensor keys, in list order
    key: dict[int, int] = {}  # id(node) -> tensor key
    path: list[list[int]] = []
    fresh = len(operands)
    for node in post_order(root):
        if node.kind is NodeKind.LEAF:
            key[id(node)] = node.leaf
        elif node.kind is NodeKind.PERMUTATION:
            key[id(node)] = key[id(node.children[0])]
        else:
            a, b = (operands.index(key[id(c)]) for c in node.children)
            path.append(sorted([a, b]))
            for index in sorted((a, b), reverse=True):
                del operands[index]
            operands.append(fresh)
            key[id(node)] = fresh
            fresh += 1
    return subscripts, path


def opt_einsum_peak(root: Node, sizes: list[int], itemsize: int) -> int:
    """Peak intermediate bytes of opt_einsum along the tree's contraction order: each
    contraction's result lives from its step until the step that consumes it."""
    return path_peak(root, sizes, itemsize)


def run(dtype: str = "f32", seconds: float = 1.0, threads: int | None = None) -> dict[str, Any]:
    """Every course tree compiled by teir and on the baselines, ``seconds`` of timing per tree
    and library spread over alternating rounds (``einsum_suite.ROUNDS``): each one's best."""
    threads = threads or default_threads()
    np_dtype = np.dtype(np.float32 if dtype == "f32" else np.float64)
    progress = Progress(ROUNDS * (len(COURSE_TREES) + 2) + 1, f"bench trees {dtype}")
    peak = 0.0
    rows: list[dict[str, Any]] = []
    runs: list[Callable[[], object]] = []
    checks: list[tuple[str, list[list[int]], list[np.ndarray], np.ndarray]] = []
    requests: dict[str, list[Any]] = {"same": [], "best": []}
    for name, string, sizes in COURSE_TREES:
        tree = EinsumTree.parse(string, sizes, np_dtype)
        optimized = tree.optimize(threads)
        compiled = optimized.compile(threads)
        rng = np.random.default_rng(0)
        arrays = [rng.uniform(-1, 1, shape).astype(np_dtype) for shape in tree.leaf_shapes]
        out = np.empty(tree.out_shape, np_dtype)
        runs.append(partial(compiled, *arrays, out=out))
        subscripts, path = expression(tree.root)
        shapes = [list(s) for s in tree.leaf_shapes]
        requests["same"].append([subscripts, shapes, np_dtype.name, path])
        requests["best"].append([subscripts, shapes, np_dtype.name, "optimal"])
        rows.append(
            {
                "name": name,
                "tree": string,
                "optimized": optimized.to_string(),
                "gflop": tree.flops / 1e9,
                "arena_mib": compiled.intermediate_bytes / 2**20,
                "opt_einsum_mib": opt_einsum_peak(tree.root, list(tree.sizes), np_dtype.itemsize)
                / 2**20,
            }
        )
        checks.append((subscripts, path, arrays, out))
    share = seconds / ROUNDS
    best: dict[str, list[float | None]] = {}
    for _ in range(ROUNDS):
        peak = max(peak, machine.peak_gflops(dtype, threads))
        progress.step("probe")
        measured: dict[str, list[float | None]] = {"teir": []}
        for row, run_tree in zip(rows, runs):
            measured["teir"].append(best_seconds(run_tree, share))
            progress.step(row["name"])
        measured["opt_einsum_same_path"] = _baseline("opt_einsum", requests["same"], threads, share)
        measured["opt_einsum_best_path"] = _baseline("opt_einsum", requests["best"], threads, share)
        measured["torch"] = _baseline("torch", [r[:3] for r in requests["same"]], threads, share)
        progress.step("baselines")
        for library, times in measured.items():
            best[library] = best_of_rounds(best.get(library), times)
    for index, row in enumerate(rows):
        elapsed = best["teir"][index]
        assert elapsed is not None
        row["seconds"] = elapsed
        row["rate"] = row["gflop"] / elapsed
        row["fraction"] = row["rate"] / peak
        for library in ("opt_einsum_same_path", "opt_einsum_best_path", "torch"):
            baseline = best[library][index]
            row[library] = baseline
            row[f"speedup_{library}"] = None if baseline is None else baseline / elapsed
        row["ok"] = _check(*checks[index], np_dtype)
    progress.step("check")
    progress.close()
    return {"dtype": dtype, "threads": threads, "peak_gflops": peak, "rows": rows}


def _check(
    subscripts: str,
    path: list[list[int]],
    arrays: list[np.ndarray],
    out: np.ndarray,
    dtype: np.dtype[Any],
) -> bool:
    import opt_einsum  # type: ignore[import-untyped]

    expected = opt_einsum.contract(
        subscripts, *[a.astype(np.float64) for a in arrays], optimize=[tuple(p) for p in path]
    )
    scale = max(float(np.max(np.abs(expected))), 1.0)
    tolerance = 1e-3 if dtype == np.float32 else 1e-10
    return bool(np.max(np.abs(out - expected)) <= tolerance * scale)


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"einsum trees, {report['dtype']}, {report['threads']} threads; probe peak "
        f"{report['peak_gflops']:.1f} GFLOP/s",
        "",
        f"{'tree':<11} {'GFLOP':>7} {'GFLOP/s':>8} {'of peak':>7} {'vs oe same':>10} "
        f"{'vs oe best':>10} {'vs torch':>9} {'arena MiB':>9} {'oe MiB':>8}  check",
    ]

    def speed(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    for row in report["rows"]:
        lines.append(
            f"{row['name']:<11} {row['gflop']:7.2f} {row['rate']:8.1f} "
            f"{row['fraction'] * 100:6.1f}% {speed(row['speedup_opt_einsum_same_path']):>10} "
            f"{speed(row['speedup_opt_einsum_best_path']):>10} {speed(row['speedup_torch']):>9} "
            f"{row['arena_mib']:9.1f} {row['opt_einsum_mib']:8.1f}  "
            f"{'OK' if row['ok'] else 'MISMATCH'}"
        )
    lines.append("")
    lines += [f"{row['name']}: {row['optimized']}" for row in report["rows"]]
    return "\n".join(lines)


__all__ = ["COURSE_TREES", "expression", "format_report", "opt_einsum_peak", "run"]
