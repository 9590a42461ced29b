"""``teir run FILE``: execute a configuration on seeded random data and report its speed."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from teir import reference
from teir.buffers import check_memory
from teir.cli import arguments
from teir.errors import ExecutionError
from teir.ir import Config, Tensor, load

Executor = Callable[[Any, Any, Any], None]


def _native(config: Config, threads: int | None) -> Executor:
    from teir.frontend.config_views import compile as compile_config

    return compile_config(config, threads)


def _reference(config: Config, threads: int | None) -> Executor:
    return lambda in0, in1, out: reference.execute(config, in0, in1, out)


# Each backend prepares an executor (compiling outside the timed runs).
BACKENDS: dict[str, Callable[[Config, int | None], Executor]] = {
    "native": _native,
    "reference": _reference,
}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "run",
        help="execute a configuration on random data and time it",
        description="Allocate inputs of the needed size with seeded random values, execute the "
        "configuration and print its time and GFLOP/s. With --check the result is "
        "compared with an independent np.einsum evaluation.",
    )
    parser.add_argument("file", metavar="FILE", help="JSON configuration file")
    parser.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="native",
        help="executor: the compiled native code or the NumPy reference (default: %(default)s)",
    )
    parser.add_argument(
        "--threads",
        type=arguments.positive_int,
        default=None,
        metavar="N",
        help="threads for shared axes (default: TEIR_NUM_THREADS or all usable cores)",
    )
    parser.add_argument(
        "--optimize",
        action="store_true",
        help="schedule the configuration with teir.optimize first (its prim axes may be "
        "unchosen, as in examples/unscheduled)",
    )
    parser.add_argument(
        "--repeat",
        type=arguments.positive_int,
        default=3,
        metavar="N",
        help="number of timed executions (default: %(default)s)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare the result with an np.einsum evaluation; exit 1 on mismatch",
    )
    parser.add_argument(
        "--seed",
        type=arguments.seed,
        default=0,
        metavar="S",
        help="seed of the random inputs (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def random_operands(config: Config, seed: int) -> tuple[np.ndarray | None, ...]:
    """Seeded uniform values in [-1, 1) for every tensor the configuration uses; a clear
    error, before any allocation, where they would not fit this machine's memory."""
    itemsize = config.data_type.itemsize
    extents = {t: config.extent(t) for t in Tensor if config.uses(t)}
    needed = sum(extents.values()) * itemsize
    sizes = ", ".join(
        f"{t.name.lower()} {n * itemsize / 2**30:.3g} GiB" for t, n in extents.items()
    )
    check_memory(
        needed,
        f"the configuration's tensors need {{size}} ({sizes})",
        "reduce dim_sizes (or the strides, which set how far each tensor extends)",
    )
    rng = np.random.default_rng(seed)
    try:
        return tuple(
            rng.uniform(-1.0, 1.0, extents[t]).astype(config.dtype) if t in extents else None
            for t in Tensor
        )
    except MemoryError:
        raise ExecutionError(
            f"could not allocate the configuration's tensors ({needed / 2**30:.3g} GiB with "
            "their random values): reduce dim_sizes"
        ) from None


def run(args: argparse.Namespace) -> int:
    if args.optimize:
        from teir.optimizer import optimize

        config = optimize(args.file, args.threads)
    else:
        config = load(args.file)
    start = time.perf_counter()
    execute = BACKENDS[args.backend](config, args.threads)
    prepare_seconds = time.perf_counter() - start
    in0, in1, out_init = random_operands(config, args.seed)
    assert out_init is not None
    expected = None
    einsum_seconds = None
    if args.check:
        start = time.perf_counter()
        expected = reference.dense_result(config, in0, in1, out_init)
        einsum_seconds = time.perf_counter() - start
    seconds = []
    out = out_init.copy()
    for _ in range(args.repeat):
        out[...] = out_init  # every run starts from the same output, outside the timing
        start = time.perf_counter()
        execute(in0, in1, out)
        seconds.append(time.perf_counter() - start)
    best = min(seconds)
    report: dict[str, Any] = {
        "file": args.file,
        "name": Path(args.file).stem,
        "backend": args.backend,
        "threads": getattr(execute, "threads", 1),
        "prepare_seconds": prepare_seconds,
        "data_type": config.data_type.value,
        "flops": config.flops,
        "repeat": args.repeat,
        "seconds": seconds,
        "best_seconds": best,
        "median_seconds": statistics.median(seconds),
        "gflops": config.flops / best / 1e9 if config.flops else None,
    }
    ok = True
    if expected is not None:
        comparison = reference.compare(config, out_init, out, expected)
        ok = comparison.ok
        report["check"] = {
            "ok": comparison.ok,
            "max_error": comparison.max_error,
            "message": comparison.message,
            "einsum_seconds": einsum_seconds,
        }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_text(report)
    if not ok:
        print(f"teir: CHECK FAILED for {args.file}: {report['check']['message']}", file=sys.stderr)
        return 1
    return 0


def _print_text(report: dict[str, Any]) -> None:
    gflops = report["gflops"]
    speed = f", {gflops:.2f} GFLOP/s" if gflops is not None else ""
    print(
        f"{report['name']} ({report['data_type']}, backend {report['backend']}): "
        f"best {report['best_seconds'] * 1e3:.3f} ms, median "
        f"{report['median_seconds'] * 1e3:.3f} ms over {report['repeat']} runs{speed}"
    )
    if "check" in report:
        check = report["check"]
        verdict = "OK" if check["ok"] else "MISMATCH"
        print(
            f"check against np.einsum: {verdict}: {check['message']} "
            f"(np.einsum evaluation took {check['einsum_seconds'] * 1e3:.3f} ms)"
        )
