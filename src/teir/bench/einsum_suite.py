"""``teir bench einsum``: binary contractions and permutations against NumPy, torch and etops.

Each case runs on teir (``teir.einsum`` with a cached plan) in this process and on every
baseline in a process of its own with the same thread count: ``numpy.einsum(optimize=True)``
(``np.copyto`` of the transposed view for permutations), ``torch.einsum`` if installed, and
for FP32 etops if installed (the course's reference implementation, given each einsum's
unscheduled configuration to optimize with its own optimizer).
Contractions report GFLOP/s and the fraction of all cores' FMA peak, permutations GB/s and the
fraction of the copy bandwidth the probe measures for the same bytes on the same threads, both
from this run.
Teir and the baselines alternate in rounds (``ROUNDS``), each case keeping its best round;
the probes run in every round too, keeping their best.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from teir import machine
from teir.bench.progress import Progress
from teir.bench.timing import best_of_rounds, best_seconds
from teir.frontend.einsum import einsum
from teir.runtime.pool import default_threads

# (name, subscripts, size of every label)
CONTRACTIONS: list[tuple[str, str, dict[str, int]]] = [
    ("gemm nn 1024", "ik,kj->ij", {"i": 1024, "j": 1024, "k": 1024}),
    ("gemm nt 1024", "ik,jk->ij", {"i": 1024, "j": 1024, "k": 1024}),
    ("gemm tn 1024", "ki,kj->ij", {"i": 1024, "j": 1024, "k": 1024}),
    ("gemm tt 1024", "ki,jk->ij", {"i": 1024, "j": 1024, "k": 1024}),
    ("gemm 1000^3", "ik,kj->ij", {"i": 1000, "j": 1000, "k": 1000}),
    ("gemm 97x1601x1000", "ik,kj->ij", {"i": 97, "j": 1601, "k": 1000}),
    ("gemm out-transposed", "mk,kn->nm", {"m": 768, "n": 640, "k": 512}),
    ("gemm small 64", "ab,cb->ac", {"a": 64, "b": 64, "c": 64}),
    ("batched gemm", "bik,bkj->bij", {"b": 64, "i": 128, "j": 128, "k": 128}),
    ("batched gemm out^T", "bik,bkj->bji", {"b": 64, "i": 128, "j": 128, "k": 128}),
    ("batch last", "ijb,jkb->ikb", {"i": 96, "j": 96, "k": 96, "b": 32}),
    ("attention scores", "bhqd,bhkd->bhqk", {"b": 4, "h": 8, "q": 256, "k": 256, "d": 64}),
    ("attention output", "bhqk,bhkd->bhqd", {"b": 4, "h": 8, "q": 256, "k": 256, "d": 64}),
    ("trus,pqtu->pqrs", "trus,pqtu->pqrs", {"t": 32, "r": 64, "u": 64, "s": 64, "p": 48, "q": 48}),
    ("abcd,cdef->abef", "abcd,cdef->abef", {"a": 32, "b": 32, "c": 32, "d": 32, "e": 32, "f": 32}),
    ("abcd,dbef->acef", "abcd,dbef->acef", {"a": 32, "b": 32, "c": 32, "d": 32, "e": 32, "f": 32}),
    ("aebf,dfce->abcd", "aebf,dfce->abcd", {"a": 24, "b": 24, "c": 24, "d": 24, "e": 24, "f": 24}),
    (
        "ijab,abkl->ijkl (CC)",
        "ijab,abkl->ijkl",
        {"i": 24, "j": 24, "a": 48, "b": 48, "k": 24, "l": 24},
    ),
    ("iajb,jb->ia", "iajb,jb->ia", {"i": 32, "a": 96, "j": 32, "b": 96}),
    ("ijk,jkl->il", "ijk,jkl->il", {"i": 256, "j": 64, "k": 64, "l": 256}),
    ("ijk,kl->ijl", "ijk,kl->ijl", {"i": 64, "j": 64, "k": 256, "l": 256}),
    ("abc,bcd->ad", "abc,bcd->ad", {"a": 200, "b": 50, "c": 60, "d": 300}),
    ("gemv 4096", "ij,j->i", {"i": 4096, "j": 4096}),
    ("batched gemv", "bij,bj->bi", {"b": 256, "i": 128, "j": 128}),
    ("outer product", "i,j->ij", {"i": 2048, "j": 2048}),
    ("dot 2M", "i,i->", {"i": 2_000_000}),
    ("5-D contraction", "abcde,cdfe->abf", {"a": 16, "b": 16, "c": 16, "d": 16, "e": 16, "f": 64}),
]

PERMUTATIONS: list[tuple[str, str, dict[str, int]]] = [
    ("ij->ji 2048", "ij->ji", {"i": 2048, "j": 2048}),
    ("ijk->kji", "ijk->kji", {"i": 256, "j": 256, "k": 64}),
    ("ijk->ikj", "ijk->ikj", {"i": 256, "j": 256, "k": 64}),
    ("ijk->jik", "ijk->jik", {"i": 256, "j": 256, "k": 64}),
    ("ijkl->lkji", "ijkl->lkji", {"i": 48, "j": 48, "k": 48, "l": 48}),
    ("ijkl->ljki", "ijkl->ljki", {"i": 48, "j": 48, "k": 48, "l": 48}),
    ("ijklm->mlkji", "ijklm->mlkji", {c: 24 for c in "ijklm"}),
    ("ijklm->ikmjl", "ijklm->ikmjl", {c: 24 for c in "ijklm"}),
    ("abcdef->fedcba", "abcdef->fedcba", {c: 12 for c in "abcdef"}),
    ("abcdef->acebdf", "abcdef->acebdf", {c: 12 for c in "abcdef"}),
    # awkward sizes: rows no whole number of cache lines, primes
    ("ij->ji 3001x1999", "ij->ji", {"i": 3001, "j": 1999}),
    ("ijk->kji 150^3", "ijk->kji", {"i": 150, "j": 150, "k": 150}),
    ("ijkl->ljki odd", "ijkl->ljki", {"i": 37, "j": 41, "k": 43, "l": 47}),
]


def _shapes(subscripts: str, sizes: dict[str, int]) -> list[list[int]]:
    inputs = subscripts.split("->")[0].split(",")
    return [[sizes[c] for c in term] for term in inputs]


def _flops(subscripts: str, sizes: dict[str, int]) -> int:
    labels = set(subscripts.replace(",", "").replace("->", ""))
    return 2 * math.prod(sizes[c] for c in labels)


def baseline_environment(threads: int) -> dict[str, str]:
    """This process's environment with every BLAS and OpenMP thread count set to ``threads``:
    a baseline process must start with it, since its BLAS reads it when NumPy is imported."""
    counts = dict.fromkeys(
        ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), str(threads)
    )
    return dict(os.environ, **counts)


def baselines(dtype: str) -> tuple[str, ...]:
    """The libraries teir is compared with: NumPy, torch and, for FP32 (its FP64 path aborts
    the interpreter), etops, the course's reference implementation; those not installed are
    reported as missing."""
    return ("numpy", "torch", "etops") if dtype == "f32" else ("numpy", "torch")


def _baseline(
    library: str, cases: list[tuple[str, list[list[int]], str]], threads: int, seconds: float
) -> list[float | None]:
    if library != "numpy" and importlib.util.find_spec(library) is None:
        return [None] * len(cases)
    environment = baseline_environment(threads)
    if library == "etops":  # OpenMP threads pinned to their cores, as the course runs them
        environment["OMP_PROC_BIND"] = "true"
    result = subprocess.run(
        [sys.executable, "-m", "teir.bench.baseline_runner", library],
        input=json.dumps({"cases": cases, "seconds": seconds, "threads": threads}),
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )
    if result.returncode != 0:
        return [None] * len(cases)
    times: list[float | None] = json.loads(result.stdout)
    return times


def _time_teir(
    subscripts: str, arrays: list[np.ndarray], out: np.ndarray, threads: int, seconds: float
) -> float:
    return best_seconds(lambda: einsum(subscripts, *arrays, out=out, threads=threads), seconds)


# The cases are timed in this many rounds, each round teir and then every baseline; a case's
# time is its best round. The machine's speed drifts over tens of seconds (2-3x on shared
# hosts), and timing all of teir before all of NumPy turned that drift into the ratios.
ROUNDS = 3


def _teir_round(
    cases: list[tuple[str, str, str, dict[str, int]]],
    np_dtype: type,
    threads: int,
    seconds: float,
    progress: Progress,
    rows: list[dict[str, Any]] | None,
    bandwidth: dict[str, float],
) -> list[float | None]:
    """One round of teir's times (and the copy bandwidth for each permutation, the best so
    far kept in ``bandwidth``); on the first (``rows`` given) each result is checked against
    NumPy and its row made."""
    times: list[float | None] = []
    for kind, name, subscripts, sizes in cases:
        rng = np.random.default_rng(0)
        arrays: list[np.ndarray] = [
            rng.uniform(-1, 1, shape).astype(np_dtype) for shape in _shapes(subscripts, sizes)
        ]
        out = np.zeros(np.shape(einsum(subscripts, *arrays, threads=threads)), np_dtype)
        times.append(_time_teir(subscripts, arrays, out, threads, seconds))
        if kind == "permutation":  # the probe's copy bandwidth for the same bytes, this round
            bandwidth[name] = max(
                bandwidth.get(name, 0.0), machine.copy_bandwidth(out.nbytes, threads=threads)
            )
        progress.step(name)
        if rows is None:
            continue
        # The check runs NumPy, whose BLAS threads then spin for a while: let them sleep
        # before the next case is timed.
        expected = np.einsum(subscripts, *arrays, optimize=True)
        time.sleep(0.1)
        error = float(np.max(np.abs(out - expected))) if out.size else 0.0
        scale = float(np.max(np.abs(expected))) if out.size else 1.0
        ok = error <= (1e-3 if np_dtype is np.float32 else 1e-9) * max(scale, 1.0)
        rows.append({"kind": kind, "name": name, "subscripts": subscripts, "ok": ok})
    return times


def run(
    dtype: str = "f32", seconds: float = 0.3, threads: int | None = None, rounds: int = ROUNDS
) -> dict[str, Any]:
    """Every case on teir and the baselines, ``seconds`` of timing per case and library
    spread over ``rounds`` alternating rounds."""
    threads = threads or default_threads()
    np_dtype = np.float32 if dtype == "f32" else np.float64
    cases = [("contraction", *c) for c in CONTRACTIONS] + [
        ("permutation", *p) for p in PERMUTATIONS
    ]
    progress = Progress(rounds * (len(cases) + 3), f"bench einsum {dtype}")
    peak = 0.0
    bandwidth: dict[str, float] = {}
    requests = [(s, _shapes(s, sizes), np.dtype(np_dtype).name) for _, _, s, sizes in cases]
    rows: list[dict[str, Any]] = []
    best: dict[str, list[float | None]] = {}
    share = seconds / rounds
    for round_index in range(rounds):
        peak = max(peak, machine.peak_gflops(dtype, threads))
        progress.step("probe")
        first = rows if round_index == 0 else None
        times: dict[str, list[float | None]] = {
            "teir": _teir_round(cases, np_dtype, threads, share, progress, first, bandwidth)
        }
        for library in baselines(dtype):
            times[library] = _baseline(library, requests, threads, share)
            progress.step(library)
        for library, measured in times.items():
            best[library] = best_of_rounds(best.get(library), measured)
    progress.close()
    for index, (row, (_, _, subscripts, sizes)) in enumerate(zip(rows, cases)):
        teir_seconds = best["teir"][index]
        assert teir_seconds is not None
        row["seconds"] = teir_seconds
        if row["kind"] == "contraction":
            row["rate"] = _flops(subscripts, sizes) / teir_seconds / 1e9
            row["unit"] = "GFLOP/s"
            row["fraction"] = row["rate"] / peak
        else:
            output = subscripts.split("->")[1]
            moved = 2 * np.dtype(np_dtype).itemsize * math.prod(sizes[x] for x in output)
            row["rate"] = moved / teir_seconds / 1e9
            row["unit"] = "GB/s"
            row["fraction"] = row["rate"] / bandwidth[row["name"]]
        for library in ("numpy", "torch", "etops"):
            baseline = best.get(library, [None] * len(cases))[index]
            row[library] = baseline
            row[f"speedup_{library}"] = None if baseline is None else baseline / teir_seconds
    return {
        "dtype": dtype,
        "threads": threads,
        "rounds": rounds,
        "peak_gflops": peak,
        "rows": rows,
        "summary": _summary(rows),
    }


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for kind in ("contraction", "permutation"):
        chosen = [r for r in rows if r["kind"] == kind]
        for library in ("numpy", "torch", "etops"):
            values = [r[f"speedup_{library}"] for r in chosen if r[f"speedup_{library}"]]
            summary[f"{kind}_geomean_speedup_{library}"] = _geomean(values)
        best = [
            min(times) / r["seconds"]
            for r in chosen
            if (times := [t for t in (r["numpy"], r["torch"], r["etops"]) if t])
        ]
        summary[f"{kind}_worst_vs_best_baseline"] = min(best) if best else None
    return summary


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"einsum suite, {report['dtype']}, {report['threads']} threads, best of "
        f"{report['rounds']} rounds; probe peak "
        f"{report['peak_gflops']:.1f} GFLOP/s",
        "",
        f"{'case':<24} {'subscripts':<18} {'teir':>9} {'unit':<8} {'of peak':>7} "
        f"{'vs numpy':>9} {'vs torch':>9} {'vs etops':>9}  check",
    ]
    for row in report["rows"]:

        def speed(key: str, r: dict[str, Any] = row) -> str:
            return "-" if r[key] is None else f"{r[key]:.2f}x"

        lines.append(
            f"{row['name']:<24} {row['subscripts']:<18} {row['rate']:9.1f} "
            f"{row['unit']:<8} {row['fraction'] * 100:6.1f}% "
            f"{speed('speedup_numpy'):>9} {speed('speedup_torch'):>9} "
            f"{speed('speedup_etops'):>9}  "
            f"{'OK' if row['ok'] else 'MISMATCH'}"
        )
    lines.append("")
    for key, value in report["summary"].items():
        lines.append(f"{key}: {'-' if value is None else f'{value:.2f}'}")
    return "\n".join(lines)


def check_plot_target(path: str) -> None:
    """Exit with a clear message now, before the benchmark runs, where the chart could not be
    saved at ``path``: no matplotlib, no such folder, or a format matplotlib does not write."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase  # type: ignore[import-not-found]
    except ImportError:
        raise SystemExit("teir: --plot needs matplotlib: pip install matplotlib") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SystemExit(f"teir: --plot {path}: the folder {folder} does not exist or is read-only")
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise SystemExit(
            f"teir: --plot {path}: give a file name ending in one of "
            + ", ".join(f".{name}" for name in sorted(formats))
        )


def plot(report: dict[str, Any], path: str) -> None:
    """A bar chart of speedups over NumPy (needs matplotlib)."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        raise SystemExit("teir: --plot needs matplotlib: pip install matplotlib") from None
    rows = [r for r in report["rows"] if r["speedup_numpy"]]
    figure, axis = plt.subplots(figsize=(10, 0.3 * len(rows) + 1.5))
    axis.barh([r["name"] for r in rows], [r["speedup_numpy"] for r in rows])
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_xlabel("speedup over numpy (same threads)")
    axis.set_title(f"teir einsum, {report['dtype']}, {report['threads']} threads")
    figure.tight_layout()
    figure.savefig(path)
