"""``teir bench kernels|course|einsum|trees``: benchmarks against the machine probe of the
same run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from teir.cli import arguments


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="benchmarks with ratios to the machine's measured peak",
        description="Run a benchmark suite and report each result next to the machine's "
        "peak, measured in the same run.",
    )
    suites = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
    kernels = suites.add_parser(
        "kernels",
        help="GEMM, BRGEMM and unary kernels against one core's FMA peak and the copy bandwidth",
    )
    kernels.add_argument("--dtype", type=arguments.dtype, choices=arguments.DTYPES, default="f32")
    kernels.add_argument("--json", action="store_true", help="print the report as JSON")
    kernels.add_argument(
        "--seconds",
        type=arguments.seconds,
        default=0.05,
        help="time per measurement (default: %(default)s)",
    )
    kernels.set_defaults(handler=run_kernels)
    course = suites.add_parser(
        "course",
        help="the course's lab configurations, as given and with shared axes, "
        "against the peak and etops",
    )
    course.add_argument(
        "--dtype",
        type=arguments.dtype,
        choices=arguments.DTYPES,
        default=None,
        help="one data type (default: both)",
    )
    course.add_argument("--json", action="store_true", help="print the report as JSON")
    course.add_argument(
        "--seconds",
        type=arguments.seconds,
        default=0.5,
        help="time per measurement (default: %(default)s)",
    )
    course.set_defaults(handler=run_course)
    suite = suites.add_parser(
        "einsum", help="binary contractions and permutations against numpy and torch"
    )
    suite.add_argument("--dtype", type=arguments.dtype, choices=arguments.DTYPES, default="f32")
    suite.add_argument("--json", action="store_true", help="print the report as JSON")
    suite.add_argument("--plot", metavar="FILE.png", help="save a chart (needs matplotlib)")
    suite.add_argument(
        "--seconds",
        type=arguments.seconds,
        default=0.3,
        help="time per case and library, over all rounds (default: %(default)s)",
    )
    suite.add_argument(
        "--rounds",
        type=arguments.positive_int,
        default=3,
        metavar="N",
        help="alternating rounds of teir and the baselines; each case keeps its best "
        "(default: %(default)s)",
    )
    suite.add_argument("--threads", type=arguments.positive_int, default=None, metavar="N")
    suite.set_defaults(handler=run_einsum)
    trees = suites.add_parser(
        "trees", help="the course's einsum trees against opt_einsum and torch"
    )
    trees.add_argument("--dtype", type=arguments.dtype, choices=arguments.DTYPES, default="f32")
    trees.add_argument("--json", action="store_true", help="print the report as JSON")
    trees.add_argument(
        "--seconds",
        type=arguments.seconds,
        default=1.0,
        help="time per measurement (default: %(default)s)",
    )
    trees.add_argument("--threads", type=arguments.positive_int, default=None, metavar="N")
    trees.set_defaults(handler=run_trees)


def run_kernels(args: argparse.Namespace) -> int:
    from teir.bench import kernels

    dtype = {"fp32": "f32", "fp64": "f64"}.get(args.dtype, args.dtype)
    report = kernels.run(dtype, args.seconds)
    print(json.dumps(report, indent=1) if args.json else kernels.format_report(report))
    return 0


def run_course(args: argparse.Namespace) -> int:
    from teir.bench import course

    dtypes = (
        ("f32", "f64")
        if args.dtype is None
        else ({"fp32": "f32", "fp64": "f64"}.get(args.dtype, args.dtype),)
    )
    report = course.run(dtypes, args.seconds)
    print(json.dumps(report, indent=1) if args.json else course.format_report(report))
    return 0


def run_einsum(args: argparse.Namespace) -> int:
    from teir.bench import einsum_suite

    dtype = {"fp32": "f32", "fp64": "f64"}.get(args.dtype, args.dtype)
    if args.plot:
        einsum_suite.check_plot_target(args.plot)
    report = einsum_suite.run(dtype, args.seconds, args.threads, args.rounds)
    print(json.dumps(report, indent=1) if args.json else einsum_suite.format_report(report))
    if args.plot:
        einsum_suite.plot(report, args.plot)
    return 0


def run_trees(args: argparse.Namespace) -> int:
    from teir.bench import trees

    dtype = {"fp32": "f32", "fp64": "f64"}.get(args.dtype, args.dtype)
    report = trees.run(dtype, args.seconds, args.threads)
    print(json.dumps(report, indent=1) if args.json else trees.format_report(report))
    return 0
