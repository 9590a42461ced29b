"""Entry point of the ``teir`` command: parses arguments and dispatches to a subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from teir import __version__
from teir.cli import (
    bench_cmd,
    demo_cmd,
    explain_cmd,
    optimize_cmd,
    run_cmd,
    tree_cmd,
    validate_cmd,
)
from teir.errors import TeirError

COMMANDS = (demo_cmd, validate_cmd, run_cmd, explain_cmd, optimize_cmd, tree_cmd, bench_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="teir",
        description="teir: a tensor compiler for the Tiled Execution IR (TEIR).",
    )
    parser.add_argument("--version", action="version", version=f"teir {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failure, 2 usage)."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except TeirError as error:
        print(f"teir: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"teir: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
