"""LLVM IR for the generic tile primitive: scalar loops that are correct for any strides.

It is the fallback for tiles no kernel layout fits (no unit stride, broadcasts, aliasing
inside the tile). Elements are processed in row-major order of the tile axes as listed, each
output element updated in place, which is exactly the reference semantics even when output
elements alias.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from teir.codegen.irtext import FunctionBuilder, Module, scalar_type
from teir.codegen.specs import KernelError


@dataclass(frozen=True)
class GenericAxis:
    """One axis of a generic tile: its size, the stride of each tensor, and whether it is
    summed over (a K axis of a contraction)."""

    size: int
    in0: int
    in1: int
    out: int
    summed: bool = False


Offsets = tuple[str | int, str | int, str | int]
GENERIC_OPS = ("contract", "copy", "relu", "zero", "relu_inplace")


@dataclass(frozen=True)
class GenericSpec:
    """``op`` on a tile: ``contract`` (out += sum over summed axes of in0 * in1), ``copy``
    (out := in0), ``relu`` (out := max(in0, 0)), ``zero`` (out := 0), ``relu_inplace``
    (out := max(out, 0))."""

    dtype: str
    op: str
    axes: tuple[GenericAxis, ...]

    def __post_init__(self) -> None:
        if self.op not in GENERIC_OPS:
            raise KernelError(f"generic op must be one of {GENERIC_OPS}, got {self.op!r}")

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "f32" else 8

    @property
    def name(self) -> str:
        shape = "x".join(f"{a.size}{'k' if a.summed else ''}" for a in self.axes) or "1"
        return f"generic_{self.op}_{self.dtype}_{shape}"


def generic_function(
    spec: GenericSpec, module: Module, name: str, linkage: str = "", attributes: str = ""
) -> None:
    """Add ``void name(ptr in0, ptr in1, ptr out)`` computing ``spec`` with scalar loops."""
    t = scalar_type(spec.itemsize)
    align = spec.itemsize
    f = FunctionBuilder(
        module, f"define {linkage} void @{name}(ptr %in0, ptr %in1, ptr %out) nounwind {attributes}"
    )
    tile_axes = [a for a in spec.axes if not a.summed]
    summed_axes = [a for a in spec.axes if a.summed]

    def element(pointer_base: str, offset: str | int) -> str:
        return f.gep(t, pointer_base, offset)

    def load(pointer: str) -> str:
        return f.assign(f"load {t}, ptr {pointer}, align {align}", "s")

    def relu(value: str) -> str:
        negative = f.assign(f"fcmp olt {t} {value}, 0.0", "c")
        return f.assign(f"select i1 {negative}, {t} 0.0, {t} {value}", "s")

    def over(
        axes: list[GenericAxis],
        offsets: Offsets,
        body: Callable[[Offsets, list[str]], list[str]],
        carried: list[tuple[str, str]],
    ) -> list[str]:
        """Nested loops over ``axes`` (first = outermost) with running offsets."""
        if not axes:
            return body(offsets, [value for _, value in carried])
        axis, rest = axes[0], axes[1:]

        def loop_body(index: str, values: list[str]) -> list[str]:
            moved = (
                f.add_i64(offsets[0], f.mul_i64(index, axis.in0)),
                f.add_i64(offsets[1], f.mul_i64(index, axis.in1)),
                f.add_i64(offsets[2], f.mul_i64(index, axis.out)),
            )
            return over(rest, moved, body, [(kind, v) for (kind, _), v in zip(carried, values)])

        return f.loop(axis.size, carried, loop_body, "g")

    def tile_body(offsets: tuple[str | int, str | int, str | int], _: list[str]) -> list[str]:
        target = element("%out", offsets[2])
        if spec.op == "zero":
            f.emit(f"store {t} 0.0, ptr {target}, align {align}")
        elif spec.op == "relu_inplace":
            f.emit(f"store {t} {relu(load(target))}, ptr {target}, align {align}")
        elif spec.op in ("copy", "relu"):
            value = load(element("%in0", offsets[0]))
            if spec.op == "relu":
                value = relu(value)
            f.emit(f"store {t} {value}, ptr {target}, align {align}")
        else:

            def product(
                inner: tuple[str | int, str | int, str | int], values: list[str]
            ) -> list[str]:
                a = load(element("%in0", inner[0]))
                b = load(element("%in1", inner[1]))
                term = f.assign(f"fmul {t} {a}, {b}", "s")
                return [f.assign(f"fadd {t} {values[0]}, {term}", "s")]

            (total,) = over(summed_axes, offsets, product, [(t, "0.0")])
            updated = f.assign(f"fadd {t} {load(target)}, {total}", "s")
            f.emit(f"store {t} {updated}, ptr {target}, align {align}")
        return []

    over(tile_axes, (0, 0, 0), tile_body, [])
    f.finish()
