"""``teir validate FILE...``: print OK or every violation per file."""

from __future__ import annotations

import argparse
from typing import Any

from teir.errors import ValidationError
from teir.ir import load_all


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "validate",
        help="check configuration files against every TEIR rule",
        description="Check JSON configuration files (one configuration, or a list of them, per "
        "file). Prints OK or every violation; exit status 1 if any file is invalid.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="JSON configuration file")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    invalid = 0
    for path in args.files:
        try:
            configs = load_all(path)
        except ValidationError as error:
            invalid += 1
            count = len(error.violations)
            print(f"{path}: INVALID ({count} violation{'s' if count != 1 else ''})")
            for violation in error.violations:
                print(f"  - {violation}")
        except OSError as error:
            invalid += 1
            print(f"{path}: UNREADABLE ({error.strerror or error})")
        else:
            suffix = f" ({len(configs)} configurations)" if len(configs) != 1 else ""
            print(f"{path}: OK{suffix}")
    return 1 if invalid else 0
