"""The TEIR records: ``Primitives``, ``Schedule`` and ``Config`` (the pair of both).

All three are frozen dataclasses, validated when they are built: a record that exists is valid.
Fields hold enums and tuples of ints, so records compare and hash by value.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

from teir.errors import ValidationError, Violation
from teir.ir.enums import DataType, DimType, ExecType, PrimFirst, PrimLast, PrimMain, Tensor
from teir.validate import (
    INT64_MAX,
    PRIMITIVE_FIELDS,
    SCHEDULE_VECTORS,
    check_config,
    check_primitives,
    check_schedule,
    is_integer,
)

FIELDS = PRIMITIVE_FIELDS + SCHEDULE_VECTORS
# teir's extension of the flat fields: the partial tiles' regions (``Rest``), run after the rest
# of the configuration. Only teir.optimize writes them; a configuration without them is flat TEIR.
RESTS = "rests"
# Fields that may be left out of a flat constructor call or a JSON object.
DEFAULTS: dict[str, Any] = {"prim_first": "None", "prim_last": "None"}


@dataclass(frozen=True)
class Primitives:
    """TEIR-Primitives: the data type and the first, main and last primitive.

    >>> Primitives("fp32", prim_main="gemm")
    Primitives(data_type=FP32, prim_first=None, prim_main=GEMM, prim_last=None)
    """

    data_type: DataType
    prim_first: PrimFirst = PrimFirst.NONE
    prim_main: PrimMain = PrimMain.NONE
    prim_last: PrimLast = PrimLast.NONE

    def __post_init__(self) -> None:
        values, found = check_primitives(
            self.data_type, self.prim_first, self.prim_main, self.prim_last
        )
        if values is None:
            raise ValidationError(found)
        for name, value in zip(PRIMITIVE_FIELDS, values):
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name).value}" for name in PRIMITIVE_FIELDS)
        return f"Primitives({inner})"


@dataclass(frozen=True)
class Schedule:
    """TEIR-Schedule: per axis its dim type, exec type, size and the stride of each tensor.

    Strides are in elements. A tensor that does not take part in an axis has stride 0 there.
    """

    dim_types: tuple[DimType, ...]
    exec_types: tuple[ExecType, ...]
    dim_sizes: tuple[int, ...]
    strides_in0: tuple[int, ...]
    strides_in1: tuple[int, ...]
    strides_out: tuple[int, ...]

    def __post_init__(self) -> None:
        values, found = check_schedule(*(getattr(self, name) for name in SCHEDULE_VECTORS))
        if values is None:
            raise ValidationError(found)
        for name, value in zip(SCHEDULE_VECTORS, values):
            object.__setattr__(self, name, value)

    @property
    def num_dims(self) -> int:
        """D, the number of axes."""
        return len(self.dim_types)

    def strides(self, tensor: Tensor | str) -> tuple[int, ...]:
        """The strides of ``tensor`` (in elements; ``tensor`` may be named: ``"in0"``)."""
        return (self.strides_in0, self.strides_in1, self.strides_out)[Tensor.of(tensor).value]

    def axis_strides(self, axis: int) -> tuple[int, int, int]:
        """The strides of (in0, in1, out) on ``axis``."""
        return (self.strides_in0[axis], self.strides_in1[axis], self.strides_out[axis])

    @property
    def prim_axes(self) -> tuple[int, ...]:
        """Indices of the axes consumed by the primitive, in listed order."""
        return tuple(i for i, e in enumerate(self.exec_types) if e is ExecType.PRIM)

    @property
    def loop_axes(self) -> tuple[int, ...]:
        """Indices of the seq and shared axes: the loop nest, outermost first."""
        return tuple(i for i, e in enumerate(self.exec_types) if e is not ExecType.PRIM)

    def axes_of(self, dim_type: DimType, exec_type: ExecType | None = None) -> tuple[int, ...]:
        """Indices of the axes of ``dim_type`` (and ``exec_type`` if given), in listed order."""
        return tuple(
            i
            for i, (t, e) in enumerate(zip(self.dim_types, self.exec_types))
            if t is dim_type and (exec_type is None or e is exec_type)
        )

    def span(self, tensor: Tensor | str) -> int:
        """Elements from the first to one past the last element the strides of ``tensor`` reach."""
        return 1 + sum((n - 1) * s for n, s in zip(self.dim_sizes, self.strides(tensor)))

    def __repr__(self) -> str:
        return _table(self)


@dataclass(frozen=True, init=False)
class Config:
    """A TEIR configuration: ``Primitives`` and ``Schedule``, validated together.

    Build it from the two records or from the flat fields of the spec (strings are parsed
    case-insensitively; ``prim_first`` and ``prim_last`` default to None)::

        >>> import teir
        >>> cfg = teir.Config(
        ...     data_type="FP32", prim_main="GEMM",
        ...     dim_types=["M", "N", "K"], exec_types=["prim"] * 3, dim_sizes=[4, 3, 2],
        ...     strides_in0=[1, 0, 4], strides_in1=[0, 2, 1], strides_out=[1, 4, 0])
        >>> cfg.flops
        48

    Every violation of every rule is raised together as one :class:`teir.ValidationError`.

    ``rests`` (teir's extension for partial tiles, written by :func:`teir.optimize`) are
    :class:`Rest` regions: each one's configuration runs after this one's own schedule, on the
    tensors advanced by its offsets, so that an axis with no good tile size (a prime like 1601)
    runs as a main part in whole tiles and the peeled rest. ``flops``, ``extents``, the reference
    and the compiled operation include them.
    """

    primitives: Primitives
    schedule: Schedule
    rests: tuple[Rest, ...]

    def __init__(
        self,
        primitives: Primitives | None = None,
        schedule: Schedule | None = None,
        *,
        rests: Any = (),
        **flat: Any,
    ) -> None:
        if primitives is not None or schedule is not None:
            if flat or not isinstance(primitives, Primitives) or not isinstance(schedule, Schedule):
                raise ValidationError(
                    [
                        Violation(
                            "Config",
                            None,
                            "type",
                            "give either a Primitives and a Schedule record, or the flat fields",
                            "call Config(primitives, schedule) or "
                            "Config(data_type=..., dim_types=..., ...)",
                        )
                    ]
                )
            found = check_config(
                _primitive_values(primitives), schedule.dim_types, schedule.exec_types
            )
            if found:
                raise ValidationError(found)
        else:
            primitives, schedule = _build_flat(flat)
        object.__setattr__(self, "primitives", primitives)
        object.__setattr__(self, "schedule", schedule)
        object.__setattr__(self, "rests", _checked_rests(rests, primitives) if rests else ())

    # ---- flat access to the fields -------------------------------------------------------
    @property
    def data_type(self) -> DataType:
        return self.primitives.data_type

    @property
    def prim_first(self) -> PrimFirst:
        return self.primitives.prim_first

    @property
    def prim_main(self) -> PrimMain:
        return self.primitives.prim_main

    @property
    def prim_last(self) -> PrimLast:
        return self.primitives.prim_last

    @property
    def dim_types(self) -> tuple[DimType, ...]:
        return self.schedule.dim_types

    @property
    def exec_types(self) -> tuple[ExecType, ...]:
        return self.schedule.exec_types

    @property
    def dim_sizes(self) -> tuple[int, ...]:
        return self.schedule.dim_sizes

    @property
    def strides_in0(self) -> tuple[int, ...]:
        return self.schedule.strides_in0

    @property
    def strides_in1(self) -> tuple[int, ...]:
        return self.schedule.strides_in1

    @property
    def strides_out(self) -> tuple[int, ...]:
        return self.schedule.strides_out

    # ---- derived facts ---------------------------------------------------------------------
    @property
    def num_dims(self) -> int:
        """D, the number of axes."""
        return self.schedule.num_dims

    @property
    def prim_axes(self) -> tuple[int, ...]:
        return self.schedule.prim_axes

    @property
    def loop_axes(self) -> tuple[int, ...]:
        return self.schedule.loop_axes

    @property
    def is_unary(self) -> bool:
        """True for Copy and unary ReLU: the operation reads in0 and writes out, no in1."""
        return self.prim_main.is_unary

    def uses(self, tensor: Tensor | str) -> bool:
        """Whether executing the configuration touches ``tensor`` at all."""
        tensor = Tensor.of(tensor)
        if tensor is Tensor.OUT:
            return True
        if tensor is Tensor.IN0:
            return self.prim_main is not PrimMain.NONE
        return self.prim_main.is_contraction

    def extent(self, tensor: Tensor | str) -> int:
        """Number of elements an array for ``tensor`` (a Tensor or its name, ``"in0"``) must
        hold (0 when it is not used)."""
        if not self.uses(tensor):
            return 0
        index = Tensor.of(tensor).value
        return max(
            [self.schedule.span(tensor)]
            + [r.offsets[index] + r.config.extent(tensor) for r in self.rests]
        )

    @property
    def extents(self) -> tuple[int, int, int]:
        """Elements needed by (in0, in1, out)."""
        return (self.extent(Tensor.IN0), self.extent(Tensor.IN1), self.extent(Tensor.OUT))

    @property
    def flops(self) -> int:
        """Floating-point operations: 2 * product of all dim sizes for GEMM and BRGEMM, else 0."""
        own = 2 * prod(self.dim_sizes) if self.prim_main.is_contraction else 0
        return own + sum(r.config.flops for r in self.rests)

    @property
    def own(self) -> Config:
        """This configuration without its rests: the region of its own schedule."""
        return Config(self.primitives, self.schedule) if self.rests else self

    @property
    def parts(self) -> tuple[Rest, ...]:
        """Every region in the order it runs: its own schedule (offsets 0), then its rests."""
        return (Rest((0, 0, 0), self.own), *self.rests)

    @property
    def dtype(self) -> Any:
        """The NumPy dtype of the tensors."""
        return self.data_type.numpy

    # ---- conversion ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The flat fields with the spec's names and spellings (JSON-ready)."""
        out: dict[str, Any] = {name: getattr(self, name).value for name in PRIMITIVE_FIELDS}
        for name in SCHEDULE_VECTORS:
            out[name] = [
                v.value if isinstance(v, DimType | ExecType) else v
                for v in getattr(self.schedule, name)
            ]
        if self.rests:
            out[RESTS] = [{"offsets": list(r.offsets), **r.config.to_dict()} for r in self.rests]
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> Config:
        """Build from a mapping with the spec's field names.

        Keys starting with ``_`` and unknown keys (``name``, ``flops``, ...) are ignored.
        """
        if not isinstance(data, Mapping):
            raise ValidationError(
                [
                    Violation(
                        "Config",
                        None,
                        "type",
                        "expected an object with the fields of a configuration, got "
                        f"{type(data).__name__}",
                        "write the configuration as a JSON object "
                        '{"data_type": ..., "dim_types": ...}',
                    )
                ],
                source,
            )
        fields = {k: v for k, v in data.items() if k in FIELDS}
        try:
            return cls(
                **fields,
                rests=data.get(RESTS, ()),
                _unknown=[
                    k
                    for k in data
                    if isinstance(k, str)
                    and k not in FIELDS
                    and k != RESTS
                    and not k.startswith("_")
                ],
            )
        except ValidationError as error:
            if source is None:
                raise
            raise ValidationError(error.violations, source) from None

    def to_json(self, indent: int | None = 1) -> str:
        """The configuration as JSON text (the format of the spec's lab configurations)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str | None = None) -> Config:
        """Parse JSON text holding one configuration object."""
        return cls.from_dict(parse_json(text, source), source=source)

    def replace(self, **changes: Any) -> Config:
        """A new, validated configuration with some flat fields changed."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise ValidationError(
                [
                    Violation(
                        name,
                        None,
                        "type",
                        "is not a field of a configuration",
                        f"use one of {', '.join(FIELDS)}",
                    )
                    for name in unknown
                ]
            )
        if self.rests:
            raise ValidationError(
                [
                    Violation(
                        RESTS,
                        None,
                        "rest",
                        "a configuration with partial tiles' rests cannot be changed field by "
                        "field (its rests would no longer fit it)",
                        "change the configuration given to teir.optimize and optimize it again",
                    )
                ]
            )
        fields = {name: getattr(self, name) for name in FIELDS}
        fields.update(changes)
        return Config(**fields)

    def __repr__(self) -> str:
        p = self.primitives
        head = (
            f"Config({p.data_type.value}: first={p.prim_first.value} "
            f"main={p.prim_main.value} last={p.prim_last.value})"
        )
        text = head + "\n" + _table(self.schedule)
        for index, rest in enumerate(self.rests):
            text += (
                f"\nrest {index} at offsets {rest.offsets} (partial tiles; first="
                f"{rest.config.prim_first.value} last={rest.config.prim_last.value}):\n"
                + _table(rest.config.schedule)
            )
        return text


@dataclass(frozen=True)
class Rest:
    """A region of a configuration that runs after its own schedule (teir's extension for
    partial tiles): ``config`` on the tensors advanced by ``offsets`` elements (in0, in1, out).

    A rest's configuration has the same data type and main primitive (a GEMM's region may
    be a BRGEMM and the other way round) and no rests of its own;
    where it adds into an output part written before (the rest of a summed axis), its first
    primitive is None and only the last region applies the ReLU.
    """

    offsets: tuple[int, int, int]
    config: Config


def _checked_rests(value: Any, primitives: Primitives) -> tuple[Rest, ...]:
    """``value`` (Rest records, or mappings ``{"offsets": [...], **fields}`` as JSON holds
    them) as validated rests of a configuration with ``primitives``."""
    found: list[Violation] = []

    def bad(index: int | None, message: str, hint: str) -> None:
        found.append(Violation(RESTS, index, "rest", message, hint))

    if not isinstance(value, (list, tuple)):
        bad(None, f"must be a list of regions, got {type(value).__name__}", "write a JSON list")
        raise ValidationError(found)
    rests = []
    for index, entry in enumerate(value):
        offsets: Any
        if isinstance(entry, Rest):
            offsets, config = entry.offsets, entry.config
        elif isinstance(entry, Mapping):
            offsets = entry.get("offsets")
            try:
                config = Config.from_dict({k: v for k, v in entry.items() if k != "offsets"})
            except ValidationError as error:
                for v in error.violations:
                    bad(index, f"{v.where}: {v.message}", v.hint)
                continue
        else:
            bad(
                index,
                f"must be a region object, got {type(entry).__name__}",
                'write {"offsets": [in0, in1, out], ...the fields of a configuration}',
            )
            continue
        if (
            not isinstance(offsets, (list, tuple))
            or len(offsets) != 3
            or not all(is_integer(o) and 0 <= int(o) <= INT64_MAX for o in offsets)
        ):
            bad(
                index,
                f"offsets must be three integers >= 0 (in0, in1, out), got {offsets!r}",
                "give the element offsets of the region in in0, in1 and out",
            )
            continue
        if config.rests:
            bad(index, "a rest has rests of its own", "list every region in the outer rests")
        if config.data_type is not primitives.data_type:
            bad(
                index,
                f"has data type {config.data_type.value}, the configuration "
                f"{primitives.data_type.value}",
                "give every region the configuration's data type",
            )
        both_contract = config.prim_main.is_contraction and primitives.prim_main.is_contraction
        if config.prim_main is not primitives.prim_main and not both_contract:
            bad(
                index,
                f"has main primitive {config.prim_main.value}, the configuration "
                f"{primitives.prim_main.value}",
                "give every region the configuration's main primitive (GEMM and BRGEMM may "
                "stand for each other)",
            )
        rests.append(Rest((int(offsets[0]), int(offsets[1]), int(offsets[2])), config))
    if found:
        raise ValidationError(found)
    return tuple(rests)


def parse_json(text: str | bytes, source: str | None = None) -> Any:
    """JSON text to Python values, with any syntax problem raised as a ValidationError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        message, hint = (
            f"not valid JSON: {error.msg} at line {error.lineno} column {error.colno}",
            ("fix the JSON syntax at that position"),
        )
    except UnicodeDecodeError as error:
        message, hint = f"not UTF-8 text ({error.reason})", "save the file as UTF-8 JSON"
    except RecursionError:
        message, hint = "nested too deeply to read", "write one flat configuration object"
    except (TypeError, ValueError) as error:
        message, hint = f"not JSON text ({error})", "pass a str or bytes holding a JSON object"
    raise ValidationError([Violation("json", None, "json", message, hint)], source)


def _primitive_values(p: Primitives) -> tuple[DataType, PrimFirst, PrimMain, PrimLast]:
    return (p.data_type, p.prim_first, p.prim_main, p.prim_last)


def _build_flat(flat: dict[str, Any]) -> tuple[Primitives, Schedule]:
    unknown_keys: list[str] = flat.pop("_unknown", [])
    found: list[Violation] = []
    for name in sorted(set(flat) - set(FIELDS)):
        close = difflib.get_close_matches(name, FIELDS, n=1)
        found.append(
            Violation(
                name,
                None,
                "type",
                "is not a field of a configuration",
                f"did you mean {close[0]}?" if close else f"use the fields {', '.join(FIELDS)}",
            )
        )
    values = {name: flat.get(name, DEFAULTS.get(name, _MISSING)) for name in FIELDS}
    for name, value in values.items():
        if value is _MISSING:
            close = difflib.get_close_matches(name, unknown_keys, n=1)
            hint = (
                f"the key {close[0]!r} looks like a misspelling of {name!r}"
                if close
                else f"add the field {name}"
            )
            found.append(Violation(name, None, "missing", "is missing", hint))
    if found:
        raise ValidationError(found)
    prims, found_p = check_primitives(*(values[n] for n in PRIMITIVE_FIELDS))
    sched, found_s = check_schedule(*(values[n] for n in SCHEDULE_VECTORS))
    found = found_p + found_s
    if prims is not None:
        found += check_config(prims, values["dim_types"], values["exec_types"])
    if found or prims is None or sched is None:
        raise ValidationError(found)
    # The values are checked: build the records without checking them again.
    primitives = object.__new__(Primitives)
    for name, value in zip(PRIMITIVE_FIELDS, prims):
        object.__setattr__(primitives, name, value)
    schedule = object.__new__(Schedule)
    for name, value in zip(SCHEDULE_VECTORS, sched):
        object.__setattr__(schedule, name, value)
    return primitives, schedule


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _table(s: Schedule) -> str:
    header = ("axis", "type", "exec", "size", "in0", "in1", "out")
    rows = [
        (str(i), t.value, e.value, str(n), str(a), str(b), str(c))
        for i, (t, e, n, a, b, c) in enumerate(
            zip(s.dim_types, s.exec_types, s.dim_sizes, s.strides_in0, s.strides_in1, s.strides_out)
        )
    ]
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    lines = [
        "  ".join(
            cell.rjust(w) if k in (0, 3, 4, 5, 6) else cell.ljust(w)
            for k, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)
