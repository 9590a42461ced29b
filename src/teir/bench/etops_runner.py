"""Child process of teir's benchmarks: times configurations on etops (the course's reference
implementation), if it is installed. Run in its own process so its OpenMP threads never compete
with teir's.

Reads ``{"configs": [flat config dicts], "seconds": budget}`` as JSON on standard input and
prints a JSON list with the best seconds per configuration (``null`` where etops failed).
``einsum_seconds`` is the etops baseline of ``teir bench einsum`` (run by
:mod:`teir.bench.baseline_runner`): etops optimizes and runs each einsum itself.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from teir.bench.timing import best_seconds

TENSORS = ("strides_in0", "strides_in1", "strides_out")


def _unary(data: dict[str, Any]) -> bool:
    return str(data["prim_main"]).lower() in ("copy", "zero")


def _etops_config(etops: Any, data: dict[str, Any]) -> Any:
    lower = {k: (v.lower() if isinstance(v, str) else v) for k, v in data.items()}
    tensors = ("strides_in0", "strides_out") if _unary(data) else TENSORS
    strides = [[data[name] for name in tensors]]
    exec_names = [
        ("shared" if e.lower() in ("shared", "parallel") else e.lower()) for e in data["exec_types"]
    ]
    return etops.TensorOperationConfig(
        data_type=getattr(
            etops.DataType, {"fp32": "float32", "fp64": "float64"}[lower["data_type"]]
        ),
        prim_first=getattr(etops.PrimType, lower["prim_first"]),
        prim_main=getattr(etops.PrimType, lower["prim_main"]),
        prim_last=getattr(etops.PrimType, lower["prim_last"]),
        dim_types=[getattr(etops.DimType, t.lower()) for t in data["dim_types"]],
        exec_types=[getattr(etops.ExecType, e) for e in exec_names],
        dim_sizes=list(data["dim_sizes"]),
        strides=strides,
        backend="tpp",
    )


def _column_major(data: dict[str, Any]) -> dict[str, Any]:
    """A contraction as etops expects it: the output's unit stride on an M axis (column-major
    C = A B). Where it is on an N axis the operands trade places and M and N their roles,
    as a column-major caller writes a row-major product (C^T = B^T A^T)."""
    if _unary(data):
        return data
    unit = [t for t, s in zip(data["dim_types"], data["strides_out"]) if s == 1]
    if unit != ["N"]:
        return data
    swapped = {"M": "N", "N": "M"}
    return dict(
        data,
        dim_types=[swapped.get(t, t) for t in data["dim_types"]],
        strides_in0=data["strides_in1"],
        strides_in1=data["strides_in0"],
    )


def _extent(sizes: list[int], strides: list[int]) -> int:
    return 1 + sum((n - 1) * s for n, s in zip(sizes, strides))


# Target block sizes (M, N, K) etops's optimizer is given for an einsum; each case keeps the
# fastest. Its defaults (16, 12, 64) reach 79 GFLOP/s on a 1024^3 FP32 GEMM on 2 Zen 4
# cores, (128, 64, 128) 205 and (64, 32, 512) 202.
TARGETS = ((16, 12, 64), (64, 64, 256), (128, 64, 128), (64, 32, 512))


def einsum_seconds(
    etops: Any, subscripts: str, arrays: list[np.ndarray], threads: int, seconds: float
) -> float | None:
    """The best time of etops on a one- or two-operand einsum: its unscheduled configuration
    optimized by etops for each of ``TARGETS`` and ``threads``, each result checked against
    NumPy; None where etops cannot run it or computes a wrong result."""
    from teir.frontend.einsum_parse import parse
    from teir.frontend.einsum_plan import unscheduled_fields

    fields = unscheduled_fields(parse(subscripts, [a.ndim for a in arrays]), arrays)
    data = _column_major(fields)
    inputs = arrays[::-1] if data is not fields else arrays
    expected = np.einsum(subscripts, *arrays, optimize=True)
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1.0)
    tolerance = (1e-3 if expected.dtype == np.float32 else 1e-9) * scale
    out = np.empty(expected.shape, expected.dtype)
    arguments = (inputs[0], inputs[1] if len(inputs) == 2 else None, out)
    best: float | None = None
    for target_m, target_n, target_k in TARGETS:
        options = etops.backend.tpp.get_default_optimization_config()
        options.update(num_threads=threads, target_m=target_m, target_n=target_n, target_k=target_k)
        try:
            operation = etops.TensorOperation(etops.optimize(_etops_config(etops, data), options))
            out.fill(np.nan)
            operation.execute(*arguments)
        except Exception:
            continue
        if out.shape != expected.shape or not np.all(np.abs(out - expected) <= tolerance):
            continue
        measured = best_seconds(lambda op=operation: op.execute(*arguments), seconds / len(TARGETS))
        best = measured if best is None else min(best, measured)
    return best


def main() -> None:
    request = json.load(sys.stdin)
    import etops  # type: ignore[import-untyped]

    results: list[float | None] = []
    for data in request["configs"]:
        try:
            operation = etops.TensorOperation(_etops_config(etops, data))
            dtype = np.float32 if data["data_type"].upper() == "FP32" else np.float64
            rng = np.random.default_rng(0)
            arrays = [
                rng.uniform(-1, 1, _extent(data["dim_sizes"], data[name])).astype(dtype)
                for name in TENSORS
            ]
            results.append(
                best_seconds(lambda op=operation, a=arrays: op.execute(*a), request["seconds"])
            )
        except Exception:
            results.append(None)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
