"""The optimizer's working form: axes with a type, size, exec type and strides, free of the
primitive-placement rules (R1-R3) so that passes can move axes in and out of the primitive."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from teir.errors import ValidationError, Violation
from teir.ir import Config, DimType, ExecType, Primitives, Schedule, Tensor
from teir.ir.records import RESTS, parse_json
from teir.validate import SCHEDULE_VECTORS


@dataclass(frozen=True)
class Axis:
    dim_type: DimType
    size: int
    strides: tuple[int, int, int]
    exec_type: ExecType = ExecType.SEQ
    # A K loop cut so that one of its steps of the kernel's vector operand (this tensor) fits
    # a packed panel: the loops are ordered so that the panel is reused inside it.
    panel_of: Tensor | None = None

    def stride(self, tensor: Tensor) -> int:
        return self.strides[tensor.value]

    def with_exec(self, exec_type: ExecType) -> Axis:
        return replace(self, exec_type=exec_type)


@dataclass(frozen=True)
class Problem:
    primitives: Primitives
    axes: tuple[Axis, ...]

    def to_config(self) -> Config:
        axes = self.axes
        return Config(
            self.primitives,
            Schedule(
                dim_types=tuple(a.dim_type for a in axes),
                exec_types=tuple(a.exec_type for a in axes),
                dim_sizes=tuple(a.size for a in axes),
                strides_in0=tuple(a.strides[0] for a in axes),
                strides_in1=tuple(a.strides[1] for a in axes),
                strides_out=tuple(a.strides[2] for a in axes),
            ),
        )

    def with_axes(self, axes: list[Axis] | tuple[Axis, ...]) -> Problem:
        return Problem(self.primitives, tuple(axes))

    def describe(self) -> str:
        return ", ".join(
            f"{a.dim_type.value}{a.size}"
            + ("" if a.exec_type is ExecType.SEQ else f"/{a.exec_type.value}")
            + f"({a.strides[0]},{a.strides[1]},{a.strides[2]})"
            for a in self.axes
        )


def _from_mapping(value: Mapping[str, Any]) -> tuple[Primitives, Schedule]:
    """Primitives and schedule from a mapping, each validated on its own (R1-R3, which tie
    prim axes to the primitive, are left to the optimizer)."""
    found: list[Violation] = []
    primitives: Primitives | None = None
    schedule: Schedule | None = None

    def field(name: str, default: Any = None) -> Any:
        return value.get(name, default)

    try:
        primitives = Primitives(
            field("data_type"),
            field("prim_first", "None"),
            field("prim_main", "None"),
            field("prim_last", "None"),
        )
    except ValidationError as error:
        found += error.violations
    try:
        schedule = Schedule(*(field(name) for name in SCHEDULE_VECTORS))
    except ValidationError as error:
        found += error.violations
    if found or primitives is None or schedule is None:
        raise ValidationError(found)
    return primitives, schedule


def read_source(value: Config | Mapping[str, Any] | str | os.PathLike[str]) -> Any:
    """The configuration or mapping that ``value`` is or that the JSON file it names holds
    (whatever JSON value it holds: :func:`problem_from` refuses what is not a mapping);
    a mapping with partial tiles' ``rests`` (an optimized configuration written out) as the
    :class:`Config` it describes, since only a whole configuration says how its rests run."""
    if isinstance(value, (str, os.PathLike)):
        source = os.fspath(value)
        value = parse_json(Path(source).read_bytes(), source)
        if isinstance(value, Mapping) and value.get(RESTS):
            return Config.from_dict(value, source=source)
    if isinstance(value, Mapping) and value.get(RESTS):
        return Config.from_dict(value)
    return value


def problem_from(value: Config | Mapping[str, Any] | str | os.PathLike[str]) -> Problem:
    """A :class:`Problem` from a configuration, or from a mapping with its fields (or a JSON
    file holding one) in which the prim axes need not be chosen yet (the course's optimizer
    inputs are all ``seq``). A configuration's own schedule only: its rests are not read."""
    value = read_source(value)
    if isinstance(value, Config):
        primitives, schedule = value.primitives, value.schedule
    elif isinstance(value, Mapping):
        primitives, schedule = _from_mapping(value)
    else:
        raise ValidationError(
            [
                Violation(
                    "Config",
                    None,
                    "type",
                    "expected a teir.Config or a mapping of its fields, got "
                    f"{type(value).__name__}",
                    "pass teir.Config(...), teir.load(path) or a dict in the JSON format",
                )
            ]
        )
    axes = tuple(
        Axis(
            schedule.dim_types[i],
            schedule.dim_sizes[i],
            schedule.axis_strides(i),
            schedule.exec_types[i],
        )
        for i in range(schedule.num_dims)
    )
    return Problem(primitives, axes)
