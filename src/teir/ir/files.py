"""Reading and writing configurations as JSON files (one configuration per file)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from teir.errors import TeirError, ValidationError, Violation
from teir.ir.records import Config, parse_json

PathLike = str | os.PathLike[str]


def _read(path: PathLike) -> Any:
    source = os.fspath(path)
    return parse_json(Path(source).read_bytes(), source)


def load(path: PathLike) -> Config:
    """Read and validate the configuration stored in the JSON file at ``path``.

    Raises :class:`teir.ValidationError` (naming the file) if the file is not a valid
    configuration, and ``OSError`` if it cannot be read.
    """
    source = os.fspath(path)
    data = _read(path)
    if isinstance(data, list):
        raise ValidationError(
            [
                Violation(
                    "json",
                    None,
                    "type",
                    f"holds a list of {len(data)} entries, not one configuration",
                    "use teir.load_all for files with a list of configurations",
                )
            ],
            source,
        )
    return Config.from_dict(data, source=source)


def load_all(path: PathLike) -> list[Config]:
    """Read a file holding one configuration object or a JSON list of them.

    Every entry is validated; all violations of all entries are raised together, each field
    prefixed with the entry's index.
    """
    source = os.fspath(path)
    data = _read(path)
    if not isinstance(data, list):
        return [Config.from_dict(data, source=source)]
    configs: list[Config] = []
    found: list[Violation] = []
    for index, entry in enumerate(data):
        try:
            configs.append(Config.from_dict(entry))
        except ValidationError as error:
            found += [
                Violation(f"[{index}].{v.field}", v.axis, v.rule, v.message, v.hint)
                for v in error.violations
            ]
    if found:
        raise ValidationError(found, source)
    return configs


def save(config: Config | Sequence[Config], path: PathLike) -> None:
    """Write ``config`` as JSON to ``path`` (``load(path) == config`` afterwards), or a list
    of configurations as a JSON list (``load_all(path)`` reads them back)."""
    if isinstance(config, Config):
        text = config.to_json()
    elif isinstance(config, (list, tuple)) and all(isinstance(c, Config) for c in config):
        text = json.dumps([c.to_dict() for c in config], indent=1)
    else:
        raise TeirError(
            f"save takes a teir.Config or a list of them, not {type(config).__name__}: "
            "make one with teir.Config.from_dict or teir.load"
        )
    Path(os.fspath(path)).write_text(text + "\n", encoding="utf-8")
