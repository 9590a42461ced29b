"""The exceptions teir raises for bad input.

Every error a user can cause is one of these, so callers need one ``except teir.TeirError``.
They derive from ``ValueError`` as well: bad input is a bad value.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class TeirError(ValueError):
    """Base class of every error teir raises for bad input."""


@dataclass(frozen=True)
class Violation:
    """One broken rule of a configuration.

    ``field`` names the record field (``"strides_out"``), ``axis`` the axis index where the
    rule is broken (``None`` for whole-record rules), ``rule`` the rule's identifier (``"R2"``,
    ``"stride-zero"``, ... see :mod:`teir.validate`), ``message`` what is wrong and ``hint``
    how to fix it.
    """

    field: str
    axis: int | None
    rule: str
    message: str
    hint: str

    @property
    def where(self) -> str:
        return self.field if self.axis is None else f"{self.field}[{self.axis}]"

    def __str__(self) -> str:
        return f"{self.where}: [{self.rule}] {self.message}; fix: {self.hint}"


class ValidationError(TeirError, ValueError):
    """An invalid TEIR configuration; ``violations`` lists every broken rule."""

    def __init__(self, violations: Iterable[Violation], source: str | None = None) -> None:
        self.violations: tuple[Violation, ...] = tuple(violations)
        self.source = source
        count = len(self.violations)
        head = f"invalid TEIR configuration{f' in {source}' if source else ''}: "
        head += f"{count} violation{'s' if count != 1 else ''}"
        super().__init__(head + "".join(f"\n  - {v}" for v in self.violations))

    @property
    def rules(self) -> frozenset[str]:
        """The identifiers of the broken rules."""
        return frozenset(v.rule for v in self.violations)


class ExecutionError(TeirError, ValueError):
    """Arguments that cannot be used to execute a configuration (checked before any access)."""


class OutOfMemoryError(ExecutionError, MemoryError):
    """Memory a call would need beyond this machine's, refused before any is allocated (also
    a ``MemoryError``, as NumPy raises where an allocation fails)."""
