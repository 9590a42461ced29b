"""``teir demo``: real configurations, checked against NumPy, timed next to it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from teir.cli import arguments


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the lab configurations and others, check and time them next to NumPy",
        description="Run TEIR configurations (the course's lab configurations and a few others) "
        "on random data, check each against np.einsum, and print GFLOP/s, the "
        "fraction of the machine's measured peak and NumPy's time for the same "
        "result.",
    )
    parser.add_argument(
        "--threads",
        type=arguments.positive_int,
        default=None,
        metavar="N",
        help="threads (default: TEIR_NUM_THREADS or all usable cores)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from teir.bench import demo

    report = demo.run(args.threads)
    print(json.dumps(report, indent=1) if args.json else demo.format_report(report))
    failed = [row["name"] for row in report["rows"] if row["check"] != "OK"]
    if failed:
        print(f"teir: CHECK FAILED for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
