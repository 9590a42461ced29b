"""Child process of teir's benchmarks: times configurations on etops (the course's reference
implementation), if it is installed. Run in its own process so its OpenMP threads never compete
with teir's.

Reads ``{"configs": [flat config dicts], "seconds": budget}`` as JSON on standard input and
prints a JSON list with the best seconds per configuration (``null`` where etops failed).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np


def _etops_config(etops: Any, data: dict[str, Any]) -> Any:
    lower = {k: (v.lower() if isinstance(v, str) else v) for k, v in data.items()}
    strides = [[data["strides_in0"], data["strides_in1"], data["strides_out"]]]
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


def _extent(sizes: list[int], strides: list[int]) -> int:
    return 1 + sum((n - 1) * s for n, s in zip(sizes, strides))


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
                for name in ("strides_in0", "strides_in1", "strides_out")
            ]
            operation.execute(*arrays)
            best = float("inf")
            deadline = time.perf_counter() + request["seconds"]
            count = 0
            while count < 3 or time.perf_counter() < deadline:
                start = time.perf_counter()
                operation.execute(*arrays)
                best = min(best, time.perf_counter() - start)
                count += 1
            results.append(best)
        except Exception:
            results.append(None)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
