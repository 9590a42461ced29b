"""``teir bench course``: the course's three tensor-operation configurations, as given (one
thread by construction) and with their first two axes shared (all cores), against the machine
probe of the same run and, where installed, etops (the course's reference implementation) in
separate processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from teir import machine
from teir.bench.demo import _lab, _shared_first_two
from teir.bench.progress import Progress
from teir.bench.timing import best_of_rounds, best_seconds
from teir.ir import Config, DataType, Tensor
from teir.runtime.operation import compile as compile_config

LABS = ("lab1_gemm", "lab2_brgemm", "lab3_zero_brgemm_relu")
# The course's optimizer inputs (all axes seq) and the same product as an einsum on row-major
# arrays for NumPy: (name, flat fields, subscripts, shapes).
OPTIMIZER_INPUTS: list[tuple[str, dict[str, Any], str, list[list[int]]]] = [
    (
        "opt_gemm_1600",
        {
            "prim_main": "GEMM",
            "dim_types": ["M", "N", "K"],
            "exec_types": ["seq"] * 3,
            "dim_sizes": [1600, 1600, 1600],
            "strides_in0": [1, 0, 1600],
            "strides_in1": [0, 1600, 1],
            "strides_out": [1, 1600, 0],
        },
        "km,nk->nm",
        [[1600, 1600], [1600, 1600]],
    ),
    (
        "opt_contraction_64_25",
        {
            "prim_main": "GEMM",
            "dim_types": ["M", "M", "N", "N", "K", "K"],
            "exec_types": ["seq"] * 6,
            "dim_sizes": [64, 25, 64, 25, 64, 25],
            "strides_in0": [25, 1, 0, 0, 40000, 1600],
            "strides_in1": [0, 0, 40000, 1600, 25, 1],
            "strides_out": [25, 1, 40000, 1600, 0, 0],
        },
        "abcd,efab->efcd",
        [[64, 25, 64, 25], [64, 25, 64, 25]],
    ),
]


def cases(dtypes: tuple[str, ...]) -> list[tuple[str, str, dict[str, Any], int]]:
    """(name, variant, flat config, threads) for every benchmark case."""
    cores = machine.usable_cores()
    result = []
    for dtype in dtypes:
        data_type = "FP32" if dtype == "f32" else "FP64"
        for lab in LABS:
            given = dict(_lab(lab), data_type=data_type)
            result.append((lab, "as given", given, 1))
            result.append((lab, "first two shared", _shared_first_two(given), cores))
    return result


def _time_teir(config: Config, threads: int, seconds: float) -> float:
    op = compile_config(config, threads)
    rng = np.random.default_rng(0)
    in0, in1, out = (rng.uniform(-1, 1, config.extent(t)).astype(config.dtype) for t in Tensor)
    return best_seconds(lambda: op(in0, in1, out), seconds)


def _time_etops(configs: list[dict[str, Any]], threads: int, seconds: float) -> list[float | None]:
    if not configs or importlib.util.find_spec("etops") is None:
        return [None] * len(configs)
    environment = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="true")
    result = subprocess.run(
        [sys.executable, "-m", "teir.bench.etops_runner"],
        input=json.dumps({"configs": configs, "seconds": seconds}),
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )
    if result.returncode != 0:
        return [None] * len(configs)
    times: list[float | None] = json.loads(result.stdout)
    return times


def run(dtypes: tuple[str, ...] = ("f32", "f64"), seconds: float = 0.5) -> dict[str, Any]:
    all_cases = cases(dtypes)
    progress = Progress(len(all_cases) + 4, "bench course")
    cores = machine.usable_cores()
    peaks = {f"{d} x{n}": machine.peak_gflops(d, n) for d in dtypes for n in sorted({1, cores})}
    progress.step("probe")
    rows: list[dict[str, Any]] = []
    for name, variant, data, threads in all_cases:
        config = Config.from_dict(data)
        best = _time_teir(config, threads, seconds)
        dtype = config.data_type.short
        gflops = config.flops / best / 1e9
        rows.append(
            {
                "name": name,
                "variant": variant,
                "dtype": config.data_type.value,
                "threads": threads,
                "seconds": best,
                "gflops": gflops,
                "fraction": None,  # of the higher probe, before or after: set at the end
                "etops_gflops": None,
                "etops_fraction": None,
            }
        )
        progress.step(f"{name} {variant} {dtype}")
    # etops in its own processes, FP32 only (its FP64 path aborts the interpreter).
    for threads in sorted({1, cores}):
        chosen = [
            i
            for i, (_, _, data, t) in enumerate(all_cases)
            if t == threads and data["data_type"] == "FP32"
        ]
        times = _time_etops([all_cases[i][2] for i in chosen], threads, seconds)
        for i, etops_seconds in zip(chosen, times):
            if etops_seconds is not None:
                row = rows[i]
                gflops = Config.from_dict(all_cases[i][2]).flops / etops_seconds / 1e9
                row["etops_gflops"] = gflops
        progress.step(f"etops x{threads}")
    optimized = _optimizer_inputs(dtypes, cores, seconds)
    progress.step("optimizer inputs")
    call_overhead = tiny_call_seconds()
    after = {f"{d} x{n}": machine.peak_gflops(d, n) for d in dtypes for n in sorted({1, cores})}
    progress.step("probe again")
    progress.close()
    # A probe reads low, never high, when a core is taken away meanwhile: every fraction is
    # of the higher of the two.
    higher = {key: max(peak, after[key]) for key, peak in peaks.items()}
    for row in [*rows, *optimized]:
        key = f"{DataType(row['dtype']).short} x{row['threads']}"
        row["fraction"] = row["gflops"] / higher[key]
        if row.get("etops_gflops") is not None:
            row["etops_fraction"] = row["etops_gflops"] / higher[key]
    return {
        "cores": cores,
        "peaks": peaks,
        "peaks_after": after,
        "rows": rows,
        "optimizer_inputs": optimized,
        "tiny_call_median_seconds": call_overhead,
        "etops": importlib.util.find_spec("etops") is not None,
    }


def _optimizer_inputs(dtypes: tuple[str, ...], cores: int, seconds: float) -> list[dict[str, Any]]:
    """The optimizer inputs scheduled by teir.optimize on all cores, next to NumPy's einsum
    of the same product (in its own process, same thread count), timed in alternating
    rounds as the einsum suite's cases are (``einsum_suite.ROUNDS``): each side's best round."""
    from teir.bench.einsum_suite import ROUNDS, _baseline
    from teir.optimizer import optimize

    configs = []
    requests = []
    for dtype in dtypes:
        for name, fields, subscripts, shapes in OPTIMIZER_INPUTS:
            data = dict(fields, data_type="FP32" if dtype == "f32" else "FP64")
            configs.append((name, optimize(data, cores)))
            requests.append((subscripts, shapes, "float32" if dtype == "f32" else "float64"))
    share = seconds / ROUNDS
    teir_best: list[float | None] | None = None
    numpy_best: list[float | None] | None = None
    for _ in range(ROUNDS):
        teir_round: list[float | None] = [_time_teir(c, cores, share) for _, c in configs]
        teir_best = best_of_rounds(teir_best, teir_round)
        numpy_best = best_of_rounds(numpy_best, _baseline("numpy", requests, cores, share))
    assert teir_best is not None and numpy_best is not None
    rows = []
    for (name, config), best, numpy_seconds in zip(configs, teir_best, numpy_best):
        assert best is not None
        gflops = config.flops / best / 1e9
        numpy_gflops = None if numpy_seconds is None else config.flops / numpy_seconds / 1e9
        rows.append(
            {
                "name": name,
                "dtype": config.data_type.value,
                "threads": cores,
                "gflops": gflops,
                "fraction": None,
                "flops": config.flops,
                "numpy_gflops": numpy_gflops,
                "speedup_numpy": None if numpy_gflops is None else gflops / numpy_gflops,
            }
        )
    return rows


def tiny_call_seconds(calls: int = 2000) -> float:
    """Median time of calling a compiled 2x2x2 GEMM from Python (checks and all)."""
    config = Config(
        data_type="FP32",
        prim_main="GEMM",
        dim_types=["M", "N", "K"],
        exec_types=["prim"] * 3,
        dim_sizes=[2, 2, 2],
        strides_in0=[1, 0, 2],
        strides_in1=[0, 2, 1],
        strides_out=[1, 2, 0],
    )
    op = compile_config(config, 1)
    a, b, c = (np.ones(4, np.float32) for _ in range(3))
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        op(a, b, c)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def format_report(report: dict[str, Any]) -> str:
    peaks = ", ".join(f"{k}: {v:.1f}" for k, v in report["peaks"].items())
    after = ", ".join(f"{k}: {v:.1f}" for k, v in report["peaks_after"].items())
    lines = [
        f"course configurations on {report['cores']} cores; probe peaks in GFLOP/s before "
        f"({peaks}) and after ({after})",
        "",
        f"{'configuration':<24} {'variant':<17} {'dtype':<5} {'thr':>3} {'teir':>9} "
        f"{'of peak':>7} {'etops':>9} {'of peak':>7}",
    ]
    for row in report["rows"]:
        etops = (
            ("-", "-")
            if row["etops_gflops"] is None
            else (f"{row['etops_gflops']:.1f}", f"{row['etops_fraction'] * 100:.1f}%")
        )
        lines.append(
            f"{row['name']:<24} {row['variant']:<17} {row['dtype']:<5} "
            f"{row['threads']:>3} {row['gflops']:9.1f} {row['fraction'] * 100:6.1f}% "
            f"{etops[0]:>9} {etops[1]:>7}"
        )
    lines += [
        "",
        "optimizer inputs (teir.optimize, all cores) vs numpy.einsum(optimize=True), same threads:",
    ]
    for row in report["optimizer_inputs"]:
        numpy = (
            "-"
            if row["numpy_gflops"] is None
            else (f"numpy {row['numpy_gflops']:.1f} GFLOP/s, speedup {row['speedup_numpy']:.2f}x")
        )
        lines.append(
            f"  {row['name']:<24} {row['dtype']} {row['gflops']:7.1f} GFLOP/s "
            f"{row['fraction'] * 100:5.1f}% of peak; {numpy}"
        )
    lines.append(
        f"\ncalling a compiled operation on tiny tensors: "
        f"{report['tiny_call_median_seconds'] * 1e6:.2f} us (median)"
    )
    if not report["etops"]:
        lines.append("\netops is not installed (pip install etops): its columns are empty.")
    return "\n".join(lines)
