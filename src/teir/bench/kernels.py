"""``teir bench kernels``: the primitives against the machine probe of the same run.

GEMM/BRGEMM report GFLOP/s and the fraction of one core's measured FMA peak. Unary kernels
report GB/s and the fraction of the copy bandwidth the probe measures for the same matrix size:
the time of the probe's copy of the output's bytes over the kernel's time (so Zero, which only
writes, is compared with copying as many bytes). Each kernel is timed in a compiled loop and per
call from Python (with argument checks); its cold compile time and its load time from a warm
disk cache (in a fresh process) are reported too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from teir import machine
from teir.bench.progress import Progress
from teir.codegen.specs import BrgemmSpec, UnaryOp, UnarySpec
from teir.codegen.target import Target
from teir.kernels import jit
from teir.kernels.api import (
    BrgemmKernel,
    UnaryKernel,
    brgemm_kernel,
    brgemm_source,
    unary_kernel,
    unary_source,
)
from teir.kernels.cache import _write, cache_key

GEMM_TILES = ((16, 16, 16), (32, 32, 32), (64, 64, 64), (64, 48, 64), (128, 128, 128))
BATCHES = (1, 16)
UNARY_SIZES = (64, 128, 256, 512)
UNARY_CASES = (
    ("zero", False, False),
    ("copy", False, False),
    ("relu", False, False),
    ("copy", True, False),
    ("relu", False, True),
)


@dataclass
class Row:
    kernel: str
    sizes: str
    unit: str
    loop: float
    loop_fraction: float
    call: float
    call_fraction: float
    compile_ms: float
    load_ms: float | None = None


def _specs(dtype: str) -> list[BrgemmSpec | UnarySpec]:
    specs: list[BrgemmSpec | UnarySpec] = []
    for m, n, k in GEMM_TILES:
        for batch in BATCHES:
            specs.append(BrgemmSpec(dtype, m, n, k, batch, stride_a=m * k, stride_b=k * n))
    for size in UNARY_SIZES:
        for op, transposed, in_place in UNARY_CASES:
            specs.append(
                UnarySpec(dtype, UnaryOp(op), size, size, trans_a=transposed, in_place=in_place)
            )
    return specs


def _label(spec: BrgemmSpec | UnarySpec) -> tuple[str, str]:
    if isinstance(spec, BrgemmSpec):
        kind = "gemm" if spec.batch == 1 else f"brgemm(batch {spec.batch})"
        return kind, f"{spec.m}x{spec.n}x{spec.k}"
    kind = spec.op.value + ("^T" if spec.trans_a else "") + (" in place" if spec.in_place else "")
    return kind, f"{spec.m}x{spec.n}"


def _timed(run: Callable[[int], float], work_seconds: float) -> float:
    """Seconds per repetition: best of three runs of about ``work_seconds`` each."""
    run(1)
    once = max(run(3) / 3, 1e-9)
    count = max(1, int(work_seconds / once))
    return min(run(count) / count for _ in range(3))


def _source(spec: BrgemmSpec | UnarySpec, target: Target) -> tuple[str, Any]:
    if isinstance(spec, BrgemmSpec):
        description, _, generate = brgemm_source(spec, target)
        return description, generate
    return unary_source(spec, target)


def _measure(spec: BrgemmSpec | UnarySpec, peak: float, seconds: float) -> Row:
    target = Target.host()
    _, generate = _source(spec, target)
    start = time.perf_counter()
    jit.compile_object(generate("teir_bench_cold"), target)
    compile_ms = (time.perf_counter() - start) * 1e3
    kind, sizes = _label(spec)
    dtype = np.float32 if spec.dtype == "f32" else np.float64
    rng = np.random.default_rng(0)
    addresses: tuple[int, ...]
    kernel: BrgemmKernel | UnaryKernel
    if isinstance(spec, BrgemmSpec):
        kernel = brgemm_kernel(spec)
        a = rng.uniform(-1, 1, spec.extent_a()).astype(dtype)
        b = rng.uniform(-1, 1, spec.extent_b()).astype(dtype)
        c = np.zeros(spec.extent_c(), dtype)
        addresses = kernel.addresses(a, b, c)
        arrays: tuple[np.ndarray, ...] = (a, b, c)
        work, unit, reference = float(spec.flops), "GFLOP/s", peak
    else:
        unary = unary_kernel(spec)
        kernel = unary
        b = rng.uniform(-1, 1, spec.extent_b()).astype(dtype)
        a = rng.uniform(-1, 1, max(spec.extent_a(), 1)).astype(dtype)
        addresses = unary.addresses(a, b)
        arrays = (a, b) if spec.reads_a else (b,)
        work, unit = float(spec.bytes_moved), "GB/s"
        nbytes = spec.m * spec.n * spec.itemsize
        # The probe's bandwidth for copying the output's bytes, as the same unit of work.
        reference = machine.copy_bandwidth(nbytes) * spec.bytes_moved / (2 * nbytes)

    def loop(count: int) -> float:
        return kernel.repeat_addresses(count, *addresses)

    def calls(count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            kernel(*arrays)
        return time.perf_counter() - start

    loop_rate = work / _timed(loop, seconds) / 1e9
    call_rate = work / _timed(calls, seconds / 2) / 1e9
    return Row(
        kind,
        sizes,
        unit,
        loop_rate,
        loop_rate / reference,
        call_rate,
        call_rate / reference,
        compile_ms,
    )


def _disk_load_times(specs: list[BrgemmSpec | UnarySpec]) -> list[float | None]:
    """Milliseconds to load each kernel from a warm disk cache, in a fresh process."""
    target = Target.host()
    with tempfile.TemporaryDirectory(prefix="teir-bench-") as directory:
        for spec in specs:
            description, generate = _source(spec, target)
            key = cache_key(description, target)
            _write(
                Path(directory) / f"{key}.o", jit.compile_object(generate(f"teir_{key}"), target)
            )
        payload = json.dumps(
            [
                [
                    type(s).__name__,
                    {k: (v.value if isinstance(v, UnaryOp) else v) for k, v in asdict(s).items()},
                ]
                for s in specs
            ]
        )
        environment = dict(os.environ, TEIR_CACHE_DIR=directory)
        result = subprocess.run(
            [sys.executable, "-m", "teir.bench.load_probe"],
            input=payload,
            capture_output=True,
            text=True,
            env=environment,
            check=False,
        )
        if result.returncode != 0:
            return [None] * len(specs)
        return list(json.loads(result.stdout))


def run(dtype: str = "f32", seconds: float = 0.05) -> dict[str, Any]:
    """Measure every kernel of the suite; returns the report (rows and the probe)."""
    specs = _specs(dtype)
    progress = Progress(len(specs) + 2, f"bench kernels {dtype}")
    info = machine.info()
    peak = machine.peak_gflops(dtype, 1)
    progress.step("probe")
    rows = []
    for spec in specs:
        rows.append(_measure(spec, peak, seconds))
        progress.step(" ".join(_label(spec)))
    for row, load in zip(rows, _disk_load_times(specs)):
        row.load_ms = load
    progress.step("disk loads")
    peak_after = machine.peak_gflops(dtype, 1)
    progress.close()
    return {
        "dtype": dtype,
        "machine": {
            "cpu": info.cpu,
            "llvm_cpu": info.llvm_cpu,
            "vector_bits": info.vector_bits,
            "cores": info.cores,
        },
        "peak_gflops_1core": peak,
        "peak_gflops_1core_after": peak_after,
        "rows": [asdict(row) for row in rows],
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"kernels, {report['dtype']}, on {report['machine']['cpu']} "
        f"({report['machine']['llvm_cpu']}, {report['machine']['vector_bits']}-bit vectors)",
        f"probe: one core {report['peak_gflops_1core']:.1f} GFLOP/s before, "
        f"{report['peak_gflops_1core_after']:.1f} after; unary kernels are compared with the "
        "probe's copy of the same bytes",
        "",
        f"{'kernel':<20} {'sizes':<12} {'loop':>9} {'of peak':>8} {'py call':>9} {'of peak':>8}"
        f" {'unit':<8} {'compile':>8} {'disk load':>9}",
    ]
    for row in report["rows"]:
        load = "-" if row["load_ms"] is None else f"{row['load_ms']:.2f}ms"
        lines.append(
            f"{row['kernel']:<20} {row['sizes']:<12} {row['loop']:9.1f} "
            f"{row['loop_fraction'] * 100:7.1f}% {row['call']:9.1f} "
            f"{row['call_fraction'] * 100:7.1f}% {row['unit']:<8} {row['compile_ms']:6.1f}ms "
            f"{load:>9}"
        )
    return "\n".join(lines)
