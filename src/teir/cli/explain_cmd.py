"""``teir explain FILE``: the configuration as a loop nest, and how it is compiled."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from teir.cli import arguments
from teir.explain import explain
from teir.ir import load


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "explain",
        help="print a configuration as a loop nest and how it is compiled",
        description="Print the configuration as a loop nest in readable pseudo-code (loops with "
        "their sizes and exec types, tile offsets, shapes and strides, where the "
        "first and last primitives run), then the compiled form: the kernels "
        "chosen, the thread split and any fallback taken.",
    )
    parser.add_argument("file", metavar="FILE", help="JSON configuration file")
    parser.add_argument(
        "--threads",
        type=arguments.positive_int,
        default=None,
        metavar="N",
        help="threads to plan for (default: TEIR_NUM_THREADS or all cores)",
    )
    parser.add_argument(
        "--config-only",
        action="store_true",
        help="only the configuration's loop nest, without compiling it",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load(args.file)
    name = Path(args.file).stem
    if args.config_only:
        print(explain(config, name))
    else:
        from teir.frontend.config_views import compile as compile_config

        print(compile_config(config, args.threads).explain(name))
    return 0
