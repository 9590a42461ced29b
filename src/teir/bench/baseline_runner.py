"""Child process of ``teir bench einsum``: times einsums on a baseline library, alone in its
process, which starts with its BLAS and OpenMP thread counts set in its environment
(``einsum_suite.baseline_environment``).

Usage: ``python -m teir.bench.baseline_runner numpy|torch|opt_einsum`` with JSON on standard
input: ``{"cases": [[subscripts, [shapes...], dtype], ...], "seconds": budget, "threads": n}``;
for opt_einsum (NumPy backend) a case has a fourth element, the contraction path (a list of
pairs) or the name of a path optimizer.
Prints a JSON list of best seconds per case (``null`` where the library failed).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any


def _best(run: Callable[..., Any], seconds: float) -> float:
    run()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    count = 0
    while count < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        count += 1
    return best


def main() -> None:
    library = sys.argv[1]
    request = json.load(sys.stdin)
    # The parent sets the BLAS thread count in this process's environment: ``-m`` imports the
    # teir package, and with it NumPy and its BLAS, before this function runs.
    import numpy as np

    results: list[float | None] = []
    torch: Any = None
    if library == "torch":
        import torch

        torch.set_num_threads(int(request["threads"]))
    for case in request["cases"]:
        subscripts, shapes, dtype = case[:3]
        try:
            rng = np.random.default_rng(0)
            arrays = [rng.uniform(-1, 1, shape).astype(dtype) for shape in shapes]
            if library == "opt_einsum":
                import opt_einsum  # type: ignore[import-untyped]

                path = case[3] if isinstance(case[3], str) else [tuple(p) for p in case[3]]
                expression = opt_einsum.contract_expression(subscripts, *shapes, optimize=path)
                results.append(
                    _best(lambda a=arrays, e=expression: e(*a, backend="numpy"), request["seconds"])
                )
            elif library == "numpy" and len(arrays) == 1 and "->" in subscripts:
                # A permutation: NumPy's copy of the transposed view into a new array.
                source, target = subscripts.split("->")
                order = [source.index(c) for c in target]
                out = np.empty([shapes[0][i] for i in order], dtype)
                results.append(
                    _best(
                        lambda a=arrays[0], o=out, p=order: np.copyto(o, a.transpose(p)),
                        request["seconds"],
                    )
                )
            elif library == "numpy":
                results.append(
                    _best(
                        lambda a=arrays, s=subscripts: np.einsum(s, *a, optimize=True),
                        request["seconds"],
                    )
                )
            elif len(arrays) == 1 and "->" in subscripts:
                # A permutation: torch.einsum returns a view; the copy is .contiguous().
                source, target = subscripts.split("->")
                order = [source.index(c) for c in target]
                tensor = torch.from_numpy(arrays[0])
                results.append(
                    _best(lambda t=tensor, p=order: t.permute(*p).contiguous(), request["seconds"])
                )
            else:
                tensors = [torch.from_numpy(a) for a in arrays]
                results.append(
                    _best(lambda t=tensors, s=subscripts: torch.einsum(s, *t), request["seconds"])
                )
        except Exception:
            results.append(None)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
