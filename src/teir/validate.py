"""Every rule a TEIR configuration must satisfy, checked on plain field values.

The checks take raw values (whatever a user or a JSON file supplied) and return the typed values
together with *all* violations found, so that one error can list every problem at once. The
records in :mod:`teir.ir.records` call these checks when they are built; the checks do not
depend on the records, which is why they can sit beneath them.

Rule identifiers (``Violation.rule``):

=============  ==================================================================================
``json``       a file or string is not valid JSON text
``missing``    a required field is absent
``type``       a field has the wrong type (a vector that is not a list, a size that is a string)
``enum``       an unknown value for data type, dim type, exec type or a primitive
``D>=1``       a configuration has at least one axis
``length``     all schedule vectors have length D (the spec's well-formedness)
``size>=1``    dim sizes are integers >= 1
``stride>=0``  strides are integers >= 0
``stride-zero`` a tensor that does not take part in an axis has stride 0 there (well-formedness)
``R1``         Copy, unary ReLU, or a first/last primitive needs a prim axis of type C, M or N
``R2``         GEMM needs exactly one prim M, N and K axis and no prim C axis
``R3``         BRGEMM needs one prim M, one prim N, two prim K axes and no prim C axis
``unary``      a unary operation (Copy, ReLU) has only C and M axes: in1 is absent
``int64``      sizes, strides and the element extents they span fit in signed 64-bit integers
``rest``       a partial tile's region (teir's ``rests``) has the configuration's data type and
               main primitive (GEMM or BRGEMM for either), three offsets >= 0 and no rests
=============  ==================================================================================
"""

from __future__ import annotations

import numbers
from typing import Any, TypeVar

import numpy as np

from teir.errors import Violation
from teir.ir.enums import (
    DataType,
    DimType,
    ExecType,
    PrimFirst,
    PrimLast,
    PrimMain,
    TeirEnum,
    Tensor,
)

RULES: dict[str, str] = {
    "json": "a configuration file holds valid JSON text",
    "missing": "every field of the records is present",
    "type": "fields have the types of the spec (strings for enums, lists of integers for vectors)",
    "enum": "enum fields hold one of the spec's values",
    "D>=1": "a schedule has at least one axis (D >= 1)",
    "length": "all schedule vectors have the same length D",
    "size>=1": "dim_sizes are integers >= 1",
    "stride>=0": "strides are integers >= 0",
    "stride-zero": "a tensor that does not take part in an axis has stride 0 there",
    "R1": "Copy, unary ReLU or a first/last primitive needs a prim axis of type C, M or N",
    "R2": "GEMM needs exactly one prim M, one prim N, one prim K and no prim C axis",
    "R3": "BRGEMM needs one prim M, one prim N, two prim K and no prim C axis",
    "unary": "a unary operation (Copy, ReLU) has only C and M axes",
    "int64": "sizes, strides and the extents they span fit in signed 64-bit integers",
    "rest": "a partial tile's region has the configuration's data type and main primitive, "
    "offsets >= 0 and no rests of its own",
}

INT64_MAX = 2**63 - 1
SCHEDULE_VECTORS = (
    "dim_types",
    "exec_types",
    "dim_sizes",
    "strides_in0",
    "strides_in1",
    "strides_out",
)
PRIMITIVE_FIELDS = ("data_type", "prim_first", "prim_main", "prim_last")

E = TypeVar("E", bound=TeirEnum)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_integer(value: Any) -> bool:
    """True for Python and NumPy integers, False for bools, floats and everything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def parse_enum(
    cls: type[E], value: Any, field: str, axis: int | None, out: list[Violation]
) -> E | None:
    """Parse one enum value, appending a violation to ``out`` when it names no member."""
    if value is None and cls in (PrimFirst, PrimMain, PrimLast):
        return cls.parse("None")
    member = cls.parse(value)
    if member is not None:
        return member
    if isinstance(value, str):
        out.append(
            Violation(
                field,
                axis,
                "enum",
                f"unknown value {_show(value)}",
                f"use one of {cls.spellings()} (case does not matter)",
            )
        )
    else:
        out.append(
            Violation(
                field,
                axis,
                "type",
                f"expected a string, got {type(value).__name__} {_show(value)}",
                f"use one of {cls.spellings()} as a string",
            )
        )
    return None


def check_primitives(
    data_type: Any, prim_first: Any, prim_main: Any, prim_last: Any
) -> tuple[tuple[DataType, PrimFirst, PrimMain, PrimLast] | None, list[Violation]]:
    """Typed primitive fields, or ``None`` with the violations that prevent them."""
    found: list[Violation] = []
    values = (
        parse_enum(DataType, data_type, "data_type", None, found),
        parse_enum(PrimFirst, prim_first, "prim_first", None, found),
        parse_enum(PrimMain, prim_main, "prim_main", None, found),
        parse_enum(PrimLast, prim_last, "prim_last", None, found),
    )
    if found:
        return None, found
    return values, found  # type: ignore[return-value]


def _as_vector(field: str, value: Any, out: list[Violation]) -> list[Any] | None:
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return list(value.tolist())
    if isinstance(value, (list, tuple)):
        return list(value)
    kind = "None" if value is None else type(value).__name__
    out.append(
        Violation(
            field,
            None,
            "type",
            f"expected a list with one entry per axis, got {kind} {_show(value)}",
            f"write {field} as a list, e.g. [...] with D entries",
        )
    )
    return None


def _parse_count(
    field: str, axis: int, value: Any, minimum: int, out: list[Violation]
) -> int | None:
    rule = "size>=1" if minimum == 1 else "stride>=0"
    noun = "a dim size" if minimum == 1 else "a stride"
    if not is_integer(value):
        hint = f"write {noun} as a whole number >= {minimum}"
        if isinstance(value, float) and value.is_integer():
            hint = f"write {int(value)} without a fractional part"
        out.append(
            Violation(
                field,
                axis,
                rule,
                f"{noun} must be an integer, got {type(value).__name__} {_show(value)}",
                hint,
            )
        )
        return None
    number = int(value)
    if number < minimum:
        hint = (
            "every axis needs at least one index"
            if minimum == 1
            else (
                "strides are non-negative element counts; address the tensor from its first element"
            )
        )
        out.append(Violation(field, axis, rule, f"{noun} must be >= {minimum}, got {number}", hint))
        return None
    if number > INT64_MAX:
        out.append(
            Violation(
                field,
                axis,
                "int64",
                f"{number} does not fit in 64 bits",
                "use sizes and strides below 2**63",
            )
        )
        return None
    return number


ScheduleFields = tuple[
    tuple[DimType, ...],
    tuple[ExecType, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
]


def check_schedule(
    dim_types: Any,
    exec_types: Any,
    dim_sizes: Any,
    strides_in0: Any,
    strides_in1: Any,
    strides_out: Any,
) -> tuple[ScheduleFields | None, list[Violation]]:
    """Typed schedule fields, or ``None`` with the violations that prevent them.

    Checks the domains, the lengths, well-formedness (stride 0 where a tensor does not take
    part) and that extents fit in 64 bits.
    """
    found: list[Violation] = []
    raw = dict(
        zip(
            SCHEDULE_VECTORS,
            (dim_types, exec_types, dim_sizes, strides_in0, strides_in1, strides_out),
        )
    )
    vectors = {name: _as_vector(name, value, found) for name, value in raw.items()}
    lengths = {name: len(v) for name, v in vectors.items() if v is not None}
    if not lengths:
        return None, found
    # D is the number of dim_types (the spec's first equation) when that vector is readable.
    d = lengths.get("dim_types", max(set(lengths.values()), key=list(lengths.values()).count))
    if d == 0:
        found.append(
            Violation(
                "dim_types",
                None,
                "D>=1",
                "the schedule has no axes",
                "give at least one axis in every schedule vector",
            )
        )
    for name, length in lengths.items():
        if length != d:
            found.append(
                Violation(
                    name,
                    None,
                    "length",
                    f"has {length} entries but D = {d} (the length of dim_types)",
                    f"give {name} exactly one entry per axis ({d})",
                )
            )

    typed: dict[str, list[Any]] = {}
    for name, vector in vectors.items():
        if vector is None:
            continue
        if name == "dim_types":
            typed[name] = [parse_enum(DimType, v, name, i, found) for i, v in enumerate(vector)]
        elif name == "exec_types":
            typed[name] = [parse_enum(ExecType, v, name, i, found) for i, v in enumerate(vector)]
        else:
            minimum = 1 if name == "dim_sizes" else 0
            typed[name] = [_parse_count(name, i, v, minimum, found) for i, v in enumerate(vector)]

    _check_participation(typed, found)
    if found:
        return None, found
    fields = tuple(tuple(typed[name]) for name in SCHEDULE_VECTORS)
    _check_int64(fields, found)  # type: ignore[arg-type]
    if found:
        return None, found
    return fields, found  # type: ignore[return-value]


def _check_participation(typed: dict[str, list[Any]], out: list[Violation]) -> None:
    types = typed.get("dim_types")
    if types is None:
        return
    for tensor in Tensor:
        strides = typed.get(tensor.strides_field)
        if strides is None:
            continue
        for axis, (dim_type, stride) in enumerate(zip(types, strides)):
            if dim_type is None or stride is None or stride == 0:
                continue
            if not dim_type.roles[tensor.value]:
                out.append(
                    Violation(
                        tensor.strides_field,
                        axis,
                        "stride-zero",
                        f"{tensor.label} does not take part in axis {axis} of type "
                        f"{dim_type.value}, but its stride there is {stride}",
                        f"set {tensor.strides_field}[{axis}] to 0, or change dim_types[{axis}] "
                        f"to a type {tensor.label} takes part in",
                    )
                )


def _check_int64(fields: ScheduleFields, out: list[Violation]) -> None:
    sizes = fields[2]
    iterations = 1
    for size in sizes:
        iterations *= size
    if iterations > INT64_MAX:
        out.append(
            Violation(
                "dim_sizes",
                None,
                "int64",
                f"the axes span {iterations} index combinations, more than fit in 64 bits",
                "use smaller dim sizes",
            )
        )
    for tensor in Tensor:
        strides: tuple[int, ...] = fields[3 + tensor.value]  # type: ignore[assignment]
        extent = 1 + sum((size - 1) * stride for size, stride in zip(sizes, strides))
        if extent * 8 > INT64_MAX:
            out.append(
                Violation(
                    tensor.strides_field,
                    None,
                    "int64",
                    f"{tensor.label} spans {extent} elements, more than a 64-bit "
                    "address space holds",
                    "use smaller sizes or strides",
                )
            )


def check_config(
    primitives: tuple[DataType, PrimFirst, PrimMain, PrimLast], dim_types: Any, exec_types: Any
) -> list[Violation]:
    """The rules that relate primitives and schedule: R1, R2, R3 and the unary rules.

    ``dim_types`` and ``exec_types`` may be raw values: the rules are checked whenever both
    parse and have equal lengths (so they are reported next to unrelated stride violations),
    and skipped otherwise (their own violations are reported by :func:`check_schedule`).
    """
    if isinstance(dim_types, np.ndarray):
        dim_types = dim_types.tolist()
    if isinstance(exec_types, np.ndarray):
        exec_types = exec_types.tolist()
    if not all(isinstance(v, (list, tuple)) for v in (dim_types, exec_types)):
        return []
    dim_types = [DimType.parse(v) for v in dim_types]
    exec_types = [ExecType.parse(v) for v in exec_types]
    if not dim_types or len(dim_types) != len(exec_types):
        return []  # D >= 1 and length violations say what is wrong
    if None in dim_types or None in exec_types:
        return []
    _, first, main, last = primitives
    prim = {
        t: [
            i
            for i, (dt, et) in enumerate(zip(dim_types, exec_types))
            if et is ExecType.PRIM and dt is t
        ]
        for t in DimType
    }
    found: list[Violation] = []

    def listing() -> str:
        return ", ".join(f"{t.value} {prim[t]}" for t in DimType)

    needs_tile = main.is_unary or first is not PrimFirst.NONE or last is not PrimLast.NONE
    if needs_tile and not (prim[DimType.C] or prim[DimType.M] or prim[DimType.N]):
        users = [f"prim_main {main.value}"] if main.is_unary else []
        users += [f"prim_first {first.value}"] if first is not PrimFirst.NONE else []
        users += [f"prim_last {last.value}"] if last is not PrimLast.NONE else []
        found.append(
            Violation(
                "exec_types",
                None,
                "R1",
                f"{' and '.join(users)} {'needs' if len(users) == 1 else 'need'} an output "
                f"tile, but no axis of type C, M or N is prim (prim axes: {listing()})",
                "mark at least one C, M or N axis as prim",
            )
        )

    expected = {PrimMain.GEMM: ("R2", 1), PrimMain.BRGEMM: ("R3", 2)}
    if main in expected:
        rule, k_count = expected[main]
        counts = (
            len(prim[DimType.C]),
            len(prim[DimType.M]),
            len(prim[DimType.N]),
            len(prim[DimType.K]),
        )
        if counts != (0, 1, 1, k_count):
            k_text = (
                "one prim K axis"
                if k_count == 1
                else ("two prim K axes (the batch-reduce axis first, then the GEMM K axis)")
            )
            alternative = ""
            if counts[:3] == (0, 1, 1) and counts[3] in (1, 2):
                alternative = (
                    "; two prim K axes make a BRGEMM"
                    if counts[3] == 2
                    else "; one prim K axis makes a GEMM"
                )
            found.append(
                Violation(
                    "exec_types",
                    None,
                    rule,
                    f"{main.value} needs exactly one prim M axis, one prim N axis, {k_text} and "
                    f"no prim C axis; the prim axes are {listing()}",
                    f"set exec_types so that exactly these axes are prim, the others seq or "
                    f"shared{alternative}"
                    + (
                        "; or let teir.optimize (teir optimize FILE) choose them"
                        if not any(prim.values())
                        else ""
                    ),
                )
            )

    if main.is_unary:
        for axis, dim_type in enumerate(dim_types):
            if dim_type in (DimType.N, DimType.K):
                found.append(
                    Violation(
                        "dim_types",
                        axis,
                        "unary",
                        f"prim_main {main.value} is unary (in0 -> out, no in1), but axis {axis} "
                        f"has type {dim_type.value}, which "
                        + (
                            "only in1 and out take part in"
                            if dim_type is DimType.N
                            else "is summed over in in0 and in1"
                        ),
                        "give every axis of a unary operation type C or M",
                    )
                )
    return found


__all__ = [
    "PRIMITIVE_FIELDS",
    "RULES",
    "SCHEDULE_VECTORS",
    "check_config",
    "check_primitives",
    "check_schedule",
    "is_integer",
]
