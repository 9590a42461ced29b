"""Argument types the subcommands share: each rejects a bad value while the command line is
parsed (argparse's one-line usage error and exit status 2), before any work starts."""

from __future__ import annotations

import argparse
import math

# the data types the commands take, in lower case (``--dtype FP64`` is read as ``fp64``)
DTYPES = ["f32", "f64", "fp32", "fp64"]
# the longest time budget a benchmark option takes, in seconds
MOST_SECONDS = 3600.0


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    """An integer of at least 1 (threads, repeats, rounds)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seed(text: str) -> int:
    """A random seed: an integer of at least 0 (NumPy's generators take no negative ones)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def seconds(text: str) -> float:
    """A time budget: a finite number of seconds above 0 and at most MOST_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= MOST_SECONDS):
        raise argparse.ArgumentTypeError(
            f"must be above 0 and at most {MOST_SECONDS:g} seconds, got {text}"
        )
    return value


def dtype(text: str) -> str:
    """A data type name, in any case (``FP64``, ``f32``)."""
    return text.lower()
