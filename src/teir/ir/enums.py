"""The enumerations of TEIR: data type, dim type, exec type and the three primitive slots.

Values are parsed case-insensitively from strings (``"gemm"``, ``"GEMM"``); each enum's
``value`` is the spelling of the spec, used when writing JSON.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

import numpy as np

from teir.errors import TeirError

E = TypeVar("E", bound="TeirEnum")


class TeirEnum(Enum):
    """An enum whose members parse case-insensitively from their spec spelling or an alias."""

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        """Extra accepted spellings (lower case) mapped to a member's value."""
        return {}

    @classmethod
    def parse(cls: type[E], value: Any) -> E | None:
        """The member ``value`` names, or ``None`` when it names none."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            return None
        key = value.strip().lower()
        key = cls._aliases().get(key, key)
        for member in cls:
            if member.value.lower() == key:
                return member
        return None

    @classmethod
    def spellings(cls) -> str:
        """The accepted values, for error messages."""
        return ", ".join(member.value for member in cls)

    def __str__(self) -> str:
        return str(self.value)


class DataType(TeirEnum):
    """Element type of all three tensors."""

    FP32 = "FP32"
    FP64 = "FP64"

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        return {"float32": "fp32", "f32": "fp32", "float64": "fp64", "f64": "fp64"}

    @classmethod
    def parse(cls, value: Any) -> DataType | None:
        if isinstance(value, (type, np.dtype)) and not isinstance(value, str):
            try:
                value = np.dtype(value).name
            except TypeError:
                return None
        return super().parse(value)

    @property
    def numpy(self) -> np.dtype[Any]:
        """The NumPy dtype of this data type."""
        return np.dtype(np.float32) if self is DataType.FP32 else np.dtype(np.float64)

    @property
    def itemsize(self) -> int:
        return 4 if self is DataType.FP32 else 8

    @property
    def short(self) -> str:
        """The kernels' name of this data type: "f32" or "f64"."""
        return "f32" if self is DataType.FP32 else "f64"


class DimType(TeirEnum):
    """Role of an axis: which tensors take part in it (see :meth:`roles`)."""

    C = "C"
    M = "M"
    N = "N"
    K = "K"

    @property
    def roles(self) -> tuple[bool, bool, bool]:
        """Whether (in0, in1, out) take part in an axis of this type (the spec's map m)."""
        return _ROLES[self]


_ROLES = {
    DimType.C: (True, True, True),
    DimType.M: (True, False, True),
    DimType.N: (False, True, True),
    DimType.K: (True, True, False),
}


class ExecType(TeirEnum):
    """How an axis is traversed: a sequential loop, a shared-memory parallel loop, or inside
    the primitive."""

    SEQ = "seq"
    SHARED = "shared"
    PRIM = "prim"

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        # `parallel` is the newer spec's name of `shared`.
        return {"parallel": "shared", "sequential": "seq"}


class PrimFirst(TeirEnum):
    """Primitive applied to an output tile on its first access."""

    NONE = "None"
    ZERO = "Zero"
    RELU = "ReLU"


class PrimMain(TeirEnum):
    """Primitive applied on every iteration of the loop nest.

    ``RELU`` is the unary main primitive of the newer spec: ``out tile := max(in0 tile, 0)``.
    """

    NONE = "None"
    COPY = "Copy"
    GEMM = "GEMM"
    BRGEMM = "BRGEMM"
    RELU = "ReLU"

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        return {"identity": "copy"}

    @property
    def is_unary(self) -> bool:
        """A unary operation reads in0 only (in1 is absent)."""
        return self in (PrimMain.COPY, PrimMain.RELU)

    @property
    def is_contraction(self) -> bool:
        return self in (PrimMain.GEMM, PrimMain.BRGEMM)


class PrimLast(TeirEnum):
    """Primitive applied to an output tile on its last access."""

    NONE = "None"
    RELU = "ReLU"


class Tensor(Enum):
    """The three tensors of an operation, in the spec's order."""

    IN0 = 0
    IN1 = 1
    OUT = 2

    @classmethod
    def of(cls, value: Any) -> Tensor:
        """``value`` as a Tensor: a member, or its name (``"in0"``, ``"in1"``, ``"out"``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.strip().upper() in cls.__members__:
            return cls[value.strip().upper()]
        raise TeirError(
            f"{value!r} names no tensor: give teir.Tensor.IN0, IN1 or OUT, or 'in0', 'in1' or 'out'"
        )

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def strides_field(self) -> str:
        return f"strides_{self.label}"
