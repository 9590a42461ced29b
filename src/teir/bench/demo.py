"""``teir demo``: real TEIR configurations executed, checked against NumPy and timed next to it.

The cases are the course's lab configurations (as given, on one thread, and with their first
two axes shared over all cores), a batched GEMM, a larger ``trus,pqtu->pqrs`` contraction and a
3-D permutation. Each is checked against an independent ``np.einsum`` evaluation; its speed is
reported next to the machine's peak measured in the same run and NumPy's time for the same
result (``np.einsum(optimize=True)`` on the same buffers, with NumPy's own threads).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from teir import machine, reference
from teir.bench.numpy_baseline import numpy_evaluator
from teir.bench.progress import Progress
from teir.bench.timing import best_seconds
from teir.ir import Config, Tensor
from teir.runtime.operation import compile as compile_config


def _lab(name: str) -> dict[str, Any]:
    """The lab configurations (shipped in the package so the demo runs anywhere)."""
    base = {
        "data_type": "FP32",
        "prim_first": "None",
        "prim_main": "GEMM",
        "prim_last": "None",
        "dim_types": ["M", "N", "K", "M", "N", "K"],
        "exec_types": ["seq", "seq", "seq", "prim", "prim", "prim"],
        "dim_sizes": [32, 32, 8, 32, 32, 32],
        "strides_in0": [8192, 0, 1024, 1, 0, 32],
        "strides_in1": [0, 8192, 1024, 0, 32, 1],
        "strides_out": [32768, 1024, 0, 1, 32, 0],
    }
    brgemm = ["seq", "seq", "prim", "prim", "prim", "prim"]
    if name == "lab2_brgemm":
        base.update(prim_main="BRGEMM", exec_types=brgemm)
    elif name == "lab3_zero_brgemm_relu":
        base.update(prim_first="Zero", prim_main="BRGEMM", prim_last="ReLU", exec_types=brgemm)
    return base


def _shared_first_two(data: dict[str, Any]) -> dict[str, Any]:
    return dict(data, exec_types=["shared", "shared", *data["exec_types"][2:]])


def _trus(r: int, p: int, t: int, s: int, q: int, u: int) -> dict[str, Any]:
    return {
        "data_type": "FP32",
        "prim_first": "Zero",
        "prim_main": "BRGEMM",
        "prim_last": "ReLU",
        "dim_types": ["M", "N", "K", "M", "N", "K"],
        "exec_types": ["shared", "shared", "prim", "prim", "prim", "prim"],
        "dim_sizes": [r, p, t, s, q, u],
        "strides_in0": [u * s, 0, r * u * s, 1, 0, s],
        "strides_in1": [0, q * t * u, u, 0, t * u, 1],
        "strides_out": [s, q * r * s, 0, 1, r * s, 0],
    }


CASES: list[tuple[str, dict[str, Any]]] = [
    ("lab1_gemm", _lab("lab1_gemm")),
    ("lab2_brgemm", _lab("lab2_brgemm")),
    ("lab3_zero_brgemm_relu", _lab("lab3_zero_brgemm_relu")),
    ("lab1_gemm shared", _shared_first_two(_lab("lab1_gemm"))),
    ("lab3 shared", _shared_first_two(_lab("lab3_zero_brgemm_relu"))),
    ("lab3 shared FP64", dict(_shared_first_two(_lab("lab3_zero_brgemm_relu")), data_type="FP64")),
    (
        "batched gemm c,m,n,k",
        {
            "data_type": "FP32",
            "prim_first": "Zero",
            "prim_main": "GEMM",
            "prim_last": "None",
            "dim_types": ["C", "M", "N", "K"],
            "exec_types": ["shared", "prim", "prim", "prim"],
            "dim_sizes": [48, 64, 32, 128],
            "strides_in0": [8192, 1, 0, 64],
            "strides_in1": [4096, 0, 128, 1],
            "strides_out": [2048, 1, 64, 0],
        },
    ),
    ("trus,pqtu->pqrs", _trus(32, 48, 8, 64, 32, 64)),
    (
        "permute abc->cba",
        {
            "data_type": "FP32",
            "prim_first": "None",
            "prim_main": "Copy",
            "prim_last": "None",
            "dim_types": ["C", "C", "C"],
            "exec_types": ["prim", "shared", "prim"],
            "dim_sizes": [64, 128, 96],
            "strides_in0": [12288, 96, 1],
            "strides_in1": [0, 0, 0],
            "strides_out": [1, 64, 8192],
        },
    ),
]


@dataclass
class DemoRow:
    name: str
    dtype: str
    threads: int
    seconds: float
    rate: float
    unit: str
    fraction: float
    numpy_seconds: float
    check: str


def run(threads: int | None = None) -> dict[str, Any]:
    """Run every demo case; returns the rows and the probe's numbers."""
    progress = Progress(len(CASES) + 1, "demo")
    cores = machine.usable_cores()

    def probe() -> dict[tuple[str, int], float]:
        return {(d, n): machine.peak_gflops(d, n) for d in ("f32", "f64") for n in {1, cores}}

    peaks = probe()
    progress.step("probe")
    prepared = [_prepare(name, Config.from_dict(data), threads) for name, data in CASES]

    def time_teir(step: bool) -> list[float]:
        time.sleep(0.3)  # NumPy's BLAS threads spin after each call, taking cores from teir
        seconds = []
        for case in prepared:
            seconds.append(best_seconds(partial(case.operation, *case.operands), 0.3))
            if step:
                progress.step(case.name)
        return seconds

    def time_numpy(case: _Prepared) -> float:
        in0, in1, out = case.operands
        return best_seconds(numpy_evaluator(case.config, in0, in1, out.copy()), 0.3)

    # A machine whose speed drifts (shared VMs: ±25 % within a minute) is sampled twice,
    # around NumPy's round, keeping each case's best and each probe's highest peak.
    first = time_teir(step=True)
    numpy_seconds = [time_numpy(case) for case in prepared]
    teir_seconds = [min(pair) for pair in zip(first, time_teir(step=False))]
    peaks = {key: max(value, peaks[key]) for key, value in probe().items()}
    rows = [
        _row(case, seconds, numpy_time, peaks)
        for case, seconds, numpy_time in zip(prepared, teir_seconds, numpy_seconds)
    ]
    progress.close()
    return {
        "cores": cores,
        "peaks": {f"{d} x{n}": v for (d, n), v in peaks.items()},
        "rows": [row.__dict__ for row in rows],
    }


@dataclass
class _Prepared:
    name: str
    config: Config
    operands: tuple[Any, Any, np.ndarray]
    operation: Any
    check: str


def _prepare(name: str, config: Config, threads: int | None) -> _Prepared:
    """Compile the case and check its result against np.einsum."""
    rng = np.random.default_rng(0)
    in0, in1, out = (
        rng.uniform(-1, 1, config.extent(t)).astype(config.dtype) if config.uses(t) else None
        for t in Tensor
    )
    assert out is not None
    op = compile_config(config, threads)
    expected = reference.dense_result(config, in0, in1, out)
    result = out.copy()
    op(in0, in1, result)
    comparison = reference.compare(config, out, result, expected)
    check = "OK" if comparison.ok else f"MISMATCH: {comparison.message}"
    return _Prepared(name, config, (in0, in1, out), op, check)


def _row(
    case: _Prepared, seconds: float, numpy_seconds: float, peaks: dict[tuple[str, int], float]
) -> DemoRow:
    config = case.config
    used = len(case.operation.slices)
    dtype = config.data_type.short
    if config.flops:
        rate, unit = config.flops / seconds / 1e9, "GFLOP/s"
        fraction = rate / peaks[(dtype, used if (dtype, used) in peaks else 1)]
    else:
        moved = 2 * config.extent(Tensor.OUT) * config.data_type.itemsize
        rate, unit = moved / seconds / 1e9, "GB/s"
        fraction = rate / machine.copy_bandwidth(moved // 2, threads=used)
    return DemoRow(
        case.name,
        config.data_type.value,
        used,
        seconds,
        rate,
        unit,
        fraction,
        numpy_seconds,
        case.check,
    )


def format_report(report: dict[str, Any]) -> str:
    peaks = ", ".join(f"{k}: {v:.1f}" for k, v in report["peaks"].items())
    lines = [
        f"teir demo on {report['cores']} usable cores; probe peaks in GFLOP/s ({peaks})",
        "",
        f"{'configuration':<24} {'dtype':<5} {'thr':>3} {'teir ms':>9} {'rate':>9} "
        f"{'unit':<8} {'of peak':>7} {'numpy ms':>9} {'speedup':>8}  check",
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['name']:<24} {row['dtype']:<5} {row['threads']:>3} "
            f"{row['seconds'] * 1e3:9.3f} {row['rate']:9.1f} {row['unit']:<8} "
            f"{row['fraction'] * 100:6.1f}% {row['numpy_seconds'] * 1e3:9.3f} "
            f"{row['numpy_seconds'] / row['seconds']:7.1f}x  {row['check']}"
        )
    lines += [
        "",
        "of peak: against one core's measured FMA peak on 1 thread, all cores' on "
        "more; copies against the measured copy bandwidth. NumPy: np.einsum(optimize="
        "True) on the same buffers, with its own BLAS threads.",
    ]
    return "\n".join(lines)
