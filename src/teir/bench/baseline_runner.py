"""Child process of ``teir bench einsum``: times einsums on a baseline library, alone in its
process, which starts with its BLAS and OpenMP thread counts set in its environment
(``einsum_suite.baseline_environment``).

Usage: ``python -m teir.bench.baseline_runner numpy|torch|etops|opt_einsum`` with JSON on standard
input: ``{"cases": [[subscripts, [shapes...], dtype], ...], "seconds": budget, "threads": n}``;
for opt_einsum (NumPy backend) a case has a fourth element, the contraction path (a list of
pairs) or the name of a path optimizer. etops (the course's reference implementation) is given
each einsum's unscheduled TEIR configuration to optimize itself
(:func:`teir.bench.etops_runner.einsum_seconds`).
Prints a JSON list of best seconds per case (``null`` where the library failed).
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from teir.bench.etops_runner import einsum_seconds
from teir.bench.timing import best_seconds


def main() -> None:
    library = sys.argv[1]
    request = json.load(sys.stdin)
    # The parent sets the BLAS thread count in this process's environment: ``-m`` imports the
    # teir package, and with it NumPy and its BLAS, before this function runs.
    import numpy as np

    results: list[float | None] = []
    torch: Any = None
    etops: Any = None
    if library == "torch":
        import torch

        torch.set_num_threads(int(request["threads"]))
    elif library == "etops":
        etops = importlib.import_module("etops")
    seconds = request["seconds"]
    for case in request["cases"]:
        subscripts, shapes, dtype = case[:3]
        try:
            rng = np.random.default_rng(0)
            arrays = [rng.uniform(-1, 1, shape).astype(dtype) for shape in shapes]
            if library == "etops":
                results.append(
                    einsum_seconds(etops, subscripts, arrays, int(request["threads"]), seconds)
                )
            elif library == "opt_einsum":
                import opt_einsum  # type: ignore[import-untyped]

                path = case[3] if isinstance(case[3], str) else [tuple(p) for p in case[3]]
                expression = opt_einsum.contract_expression(subscripts, *shapes, optimize=path)
                results.append(
                    best_seconds(lambda a=arrays, e=expression: e(*a, backend="numpy"), seconds)
                )
            elif library == "numpy" and len(arrays) == 1 and "->" in subscripts:
                # A permutation: NumPy's copy of the transposed view into a new array.
                source, target = subscripts.split("->")
                order = [source.index(c) for c in target]
                out = np.empty([shapes[0][i] for i in order], dtype)
                results.append(
                    best_seconds(
                        lambda a=arrays[0], o=out, p=order: np.copyto(o, a.transpose(p)),
                        seconds,
                    )
                )
            elif library == "numpy":
                results.append(
                    best_seconds(
                        lambda a=arrays, s=subscripts: np.einsum(s, *a, optimize=True),
                        seconds,
                    )
                )
            elif len(arrays) == 1 and "->" in subscripts:
                # A permutation: torch.einsum returns a view; the copy is .contiguous().
                source, target = subscripts.split("->")
                order = [source.index(c) for c in target]
                tensor = torch.from_numpy(arrays[0])
                results.append(
                    best_seconds(lambda t=tensor, p=order: t.permute(*p).contiguous(), seconds)
                )
            else:
                tensors = [torch.from_numpy(a) for a in arrays]
                results.append(
                    best_seconds(lambda t=tensors, s=subscripts: torch.einsum(s, *t), seconds)
                )
        except Exception:
            results.append(None)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
