"""Parsing einsum subscripts with NumPy's rules.

Labels are ASCII letters; ``...`` stands for the leading dimensions an operand has beyond its
labels (broadcast against each other, right-aligned); without ``->`` the output is ``...``
followed by the labels that appear exactly once, in ASCII order. Spaces are ignored.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import lru_cache

from teir.errors import TeirError

LETTERS = string.ascii_letters


class EinsumError(TeirError, ValueError):
    """Subscripts or operands that do not form a valid einsum."""


@dataclass(frozen=True)
class Subscripts:
    """Labels per input operand and for the output; ellipsis dimensions get the labels
    ``"0"``, ``"1"``, ... (outermost first), which cannot clash with letters."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]


def _split_term(term: str, where: str) -> tuple[list[str], list[str], bool]:
    """(labels before '...', labels after '...', has ellipsis)."""
    if term.count("...") > 1:
        raise EinsumError(f"{where}: '...' may appear only once in {term!r}")
    before, dots, after = term.partition("...")
    for label in before + after:
        if label not in LETTERS:
            raise EinsumError(
                f"{where}: {label!r} in {term!r} is not a valid subscript; use "
                "ASCII letters, ',' between operands, '->' and '...'"
            )
    return list(before), list(after), bool(dots)


def parse(subscripts: str, ndims: list[int]) -> Subscripts:
    """Labels for every operand (of the given numbers of dimensions) and the output."""
    if not isinstance(subscripts, str):
        raise EinsumError(f"subscripts must be a string, got {type(subscripts).__name__}")
    text = subscripts.replace(" ", "")
    if text.count("->") > 1:
        raise EinsumError(f"subscripts {subscripts!r} contain '->' more than once")
    inputs_text, arrow, output_text = text.partition("->")
    if "-" in inputs_text or ">" in inputs_text or "-" in output_text or ">" in output_text:
        raise EinsumError(f"subscripts {subscripts!r}: '-' and '>' only appear as '->'")
    terms = inputs_text.split(",")
    if len(terms) != len(ndims):
        raise EinsumError(
            f"subscripts {subscripts!r} name {len(terms)} operand(s) but {len(ndims)} were given"
        )
    ellipsis_dims = 0
    parsed = []
    for index, (term, ndim) in enumerate(zip(terms, ndims)):
        before, after, dots = _split_term(term, f"operand {index}")
        named = len(before) + len(after)
        if dots:
            if named > ndim:
                raise EinsumError(
                    f"operand {index} has {ndim} dimensions but {term!r} names {named}"
                )
            ellipsis_dims = max(ellipsis_dims, ndim - named)
        elif named != ndim:
            raise EinsumError(
                f"operand {index} has {ndim} dimensions but {term!r} names "
                f"{named}; use '...' for the others"
            )
        parsed.append((before, after, dots, ndim - named if dots else 0))
    inputs = []
    for before, after, _, extra in parsed:
        broadcast = [str(ellipsis_dims - extra + i) for i in range(extra)]
        inputs.append(tuple(before + broadcast + after))
    all_ellipsis = [str(i) for i in range(ellipsis_dims)]
    if arrow:
        before, after, dots = _split_term(output_text, "output")
        if not dots and ellipsis_dims:
            raise EinsumError(
                "the inputs have '...' dimensions but the output has no '...' to "
                "place them; add '...' to the output"
            )
        output = before + all_ellipsis + after
        seen = set()
        for label in before + after:
            if label in seen:
                raise EinsumError(f"output subscript {label!r} appears more than once")
            seen.add(label)
            if not any(label in labels for labels in inputs):
                raise EinsumError(f"output subscript {label!r} does not appear in any input")
    else:
        counts: dict[str, int] = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        output = all_ellipsis + sorted(
            label for label, count in counts.items() if count == 1 and label in LETTERS
        )
    return Subscripts(tuple(inputs), tuple(output))


@lru_cache(maxsize=256)
def numpy_subscripts(inputs: tuple[tuple[str, ...], ...], output: tuple[str, ...]) -> str | None:
    """An einsum string for NumPy over these labels, each label one letter (the first seen
    first: '...' dimensions have digit labels, which einsum strings do not take); None where
    there are more labels than letters (NumPy 2 allows 64 dimensions).

    >>> numpy_subscripts((("0", "i", "i"),), ("i",))
    'abb->b'
    """
    letters: dict[str, str] = {}
    for label in (x for term in inputs for x in term):
        letters.setdefault(label, LETTERS[len(letters)] if len(letters) < len(LETTERS) else "")
    if "" in letters.values():
        return None
    terms = ",".join("".join(letters[x] for x in term) for term in inputs)
    return f"{terms}->{''.join(letters[x] for x in output)}"
