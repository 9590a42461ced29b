"""Child process of ``teir bench kernels``: times loading kernels from a warm disk cache.

Reads a JSON list of [spec type, fields] from standard input and prints the load time of each
in milliseconds (``null`` where a kernel was not found on disk).
"""

from __future__ import annotations

import json
import sys

from teir.codegen.specs import BrgemmSpec, UnaryOp, UnarySpec
from teir.codegen.target import Target, cache_sizes
from teir.kernels import jit
from teir.kernels.api import Kernel, brgemm_kernel, unary_kernel
from teir.kernels.cache import cache_key


def main() -> None:
    # Per-process setup (LLVM's JIT engine, the host target, cache sizes) is paid once by
    # every process that uses teir; it is not part of loading a kernel.
    _engine_setup()
    times: list[float | None] = []
    for kind, fields in json.load(sys.stdin):
        kernel: Kernel
        if kind == "BrgemmSpec":
            kernel = brgemm_kernel(BrgemmSpec(**fields))
        else:
            kernel = unary_kernel(UnarySpec(**dict(fields, op=UnaryOp(fields["op"]))))
        times.append(kernel.load_seconds * 1e3 if kernel.origin == "disk" else None)
    print(json.dumps(times))


def _engine_setup() -> None:
    jit._engine()
    cache_sizes()
    cache_key("", Target.host())


if __name__ == "__main__":
    main()
