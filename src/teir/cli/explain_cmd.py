"""``teir explain FILE``: the configuration as a loop nest in pseudo-code."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from teir.explain import explain
from teir.ir import load


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "explain",
        help="print a configuration as a loop nest",
        description="Print the configuration as a loop nest in readable pseudo-code: loops with "
        "their sizes and exec types, tile offsets, shapes and strides, and where the "
        "first and last primitives run.",
    )
    parser.add_argument("file", metavar="FILE", help="JSON configuration file")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(explain(load(args.file), Path(args.file).stem))
    return 0
