"""Child process of ``teir bench kernels``: times loading kernels from a warm disk cache.

Reads a JSON list of [spec type, fields] from standard input and prints the load time of each
in milliseconds (``null`` where a kernel was not found on disk).
"""

from __future__ import annotations

import json
import sys

from teir.codegen.specs import BrgemmSpec, UnaryOp, UnarySpec
from teir.kernels.api import Kernel, brgemm_kernel, unary_kernel


def main() -> None:
    times: list[float | None] = []
    for kind, fields in json.load(sys.stdin):
        kernel: Kernel
        if kind == "BrgemmSpec":
            kernel = brgemm_kernel(BrgemmSpec(**fields))
        else:
            kernel = unary_kernel(UnarySpec(**dict(fields, op=UnaryOp(fields["op"]))))
        times.append(kernel.load_seconds * 1e3 if kernel.origin == "disk" else None)
    print(json.dumps(times))


if __name__ == "__main__":
    main()
