"""``teir optimize FILE``: write the schedule for a configuration."""

from __future__ import annotations

import argparse
from typing import Any

from teir.cli import arguments
from teir.ir import save


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "optimize",
        help="write the schedule (prim axes, blocks, loop order, shared loops)",
        description="Optimize a configuration (its prim axes may still be unchosen, all seq) "
        "for this machine and print each pass's decision and the result as JSON.",
    )
    parser.add_argument("file", metavar="FILE", help="JSON configuration file")
    parser.add_argument(
        "--threads",
        type=arguments.positive_int,
        default=None,
        metavar="N",
        help="threads to plan for (default: TEIR_NUM_THREADS or all cores)",
    )
    parser.add_argument("-o", "--output", metavar="OUT", help="also save the result to OUT")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from teir.optimizer import optimize_with_log

    config, log = optimize_with_log(args.file, args.threads)
    for line in log:
        print(f"# {line}")
    print(config.to_json())
    if args.output:
        save(config, args.output)
    return 0
