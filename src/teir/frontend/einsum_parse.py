"""Parsing einsum subscripts with NumPy's rules.

Labels are ASCII letters; ``...`` stands for the leading dimensions an operand has beyond its
labels (broadcast against each other, right-aligned); without ``->`` the output is ``...``
followed by the labels that appear exactly once, in ASCII order. Spaces are ignored.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral
from typing import Any

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


SUBLIST_FORM = "einsum(op0, sublist0, op1, sublist1, ..., [sublistout])"


def _sublist_term(sublist: Any, where: str) -> str:
    """One sublist as a term of an einsum string (NumPy's mapping: 0-25 are 'A'-'Z',
    26-51 'a'-'z', ``Ellipsis`` is '...')."""
    if not isinstance(sublist, (list, tuple)):
        raise EinsumError(
            f"{where} must be a list of integers in [0, 52) or Ellipsis, got "
            f"{type(sublist).__name__} (the sublist form is {SUBLIST_FORM})"
        )
    term = []
    for item in sublist:
        if item is Ellipsis:
            term.append("...")
            continue
        if isinstance(item, bool) or not isinstance(item, Integral):
            raise EinsumError(
                f"{where}: {item!r} is not a subscript; use integers in [0, 52) or Ellipsis"
            )
        label = int(item)
        if not 0 <= label < len(LETTERS):
            raise EinsumError(f"{where}: subscript {label} is not within [0, 52)")
        term.append(LETTERS[(label + 26) % 52])
    return "".join(term)


def from_sublists(arguments: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
    """(subscripts, operands) of NumPy's sublist form ``einsum(op0, sublist0, op1,
    sublist1, ..., [sublistout])``, which takes integers for labels.

    >>> from_sublists([1.0, [0, 1], 2.0, [1, Ellipsis], [Ellipsis, 0]])
    ('AB,B...->...A', (1.0, 2.0))
    """
    if len(arguments) < 2 or not isinstance(arguments[1], (list, tuple)):
        kind = type(arguments[0]).__name__
        raise EinsumError(
            f"subscripts must be a string, or operands and sublists in NumPy's form "
            f"{SUBLIST_FORM}; got {kind}"
        )
    count = len(arguments) // 2
    operands = tuple(arguments[0 : 2 * count : 2])
    terms = [_sublist_term(arguments[2 * i + 1], f"sublist {i}") for i in range(count)]
    subscripts = ",".join(terms)
    if len(arguments) % 2:
        subscripts += "->" + _sublist_term(arguments[-1], "the output sublist")
    return subscripts, operands


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


def letter_map(labels: Iterable[str], spare: int = 0) -> dict[str, str] | None:
    """A letter for every label, the first seen first ('...' dimensions have digit labels,
    which einsum strings do not take); None where the labels and ``spare`` further letters
    would need more letters than there are."""
    letters: dict[str, str] = {}
    for label in labels:
        if label not in letters:
            if len(letters) + spare >= len(LETTERS):
                return None
            letters[label] = LETTERS[len(letters)]
    return letters


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
