"""Lowering a configuration into loop-nest form: the loops in order, the primitives on each
tile, how first and last accesses are found, and which loops may run in parallel."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod

import numpy as np

from teir.codegen.specs import UnaryOp
from teir.errors import TeirError
from teir.ir import Config, DimType, ExecType, PrimFirst, PrimLast, Tensor
from teir.ir.layout import is_injective, out_tiles_distinct
from teir.lower.panels import PanelPack, plan_panel
from teir.lower.products import TransposedTile, plan_transposed_tile
from teir.lower.tiles import TileOp, main_op, unary_op

# The tracked first/last path stores two flags per iteration.
TRACKED_ITERATION_LIMIT = 1 << 24


class Access(Enum):
    """How the nest decides that an iteration is the first or last access of its out tile."""

    NONE = "no first/last primitive"
    ALWAYS = "every iteration has its own output tile"
    K_INDICES = "first: all K loop indices 0; last: all at their maximum (no aliasing)"
    TRACKED = "per-iteration flags computed at compile time (out tiles alias)"


@dataclass(frozen=True)
class Loop:
    """One loop of the nest: the axis, its size and type, each tensor's stride, and whether
    its range is split between threads."""

    axis: int
    size: int
    dim_type: DimType
    strides: tuple[int, int, int]
    parallel: bool


@dataclass(frozen=True)
class LoopNest:
    config: Config
    loops: tuple[Loop, ...]
    first: TileOp | None
    main: TileOp | None
    main_zero: TileOp | None
    last: TileOp | None
    access: Access
    notes: tuple[str, ...]
    panel: PanelPack | None = None
    transposed: TransposedTile | None = None

    @property
    def parallel_size(self) -> int:
        """Size of the flattened index space of the parallel loops (1 when there are none)."""
        return prod(loop.size for loop in self.loops if loop.parallel)

    @property
    def iterations(self) -> int:
        return prod(loop.size for loop in self.loops)

    @property
    def key(self) -> str:
        """Everything the generated code depends on."""
        parts = [
            repr(self.loops),
            repr(self.first),
            repr(self.main),
            repr(self.main_zero),
            repr(self.last),
            self.access.name,
            repr(self.panel),
            repr(self.transposed),
        ]
        return "\n".join(parts)


def lower(config: Config, resident_output: bool = False) -> LoopNest:
    """The loop nest that executes ``config`` exactly as written. ``resident_output``: the
    output's memory is reused call after call (not a fresh allocation), which lets kernels
    store a large output around the caches."""
    s = config.schedule
    notes: list[str] = []
    has_first = config.prim_first is not PrimFirst.NONE
    has_last = config.prim_last is not PrimLast.NONE

    access = Access.NONE
    if has_first or has_last:
        distinct = out_tiles_distinct(s)
        k_loops = [a for a in s.loop_axes if s.dim_types[a] is DimType.K]
        if distinct:
            access = Access.K_INDICES if k_loops else Access.ALWAYS
        else:
            access = Access.TRACKED
            iterations = prod(s.dim_sizes[a] for a in s.loop_axes)
            if iterations > TRACKED_ITERATION_LIMIT:
                raise TeirError(
                    f"the output tiles may alias and the nest has {iterations} iterations: "
                    f"first/last accesses are tracked per iteration up to "
                    f"{TRACKED_ITERATION_LIMIT}; use an output layout without aliasing"
                )
            notes.append(
                "out tiles are not proven distinct: first/last accesses are tracked per iteration"
            )

    main, main_zero = main_op(config, config.prim_first is PrimFirst.ZERO, resident_output)
    if main_zero is not None and main_zero.kind != "brgemm":
        main_zero = None
    first = None
    if has_first:
        if main_zero is not None:
            notes.append("first Zero is fused into the kernel (beta = 0)")
        elif config.is_unary and main is not None and main.kind != "generic":
            notes.append(
                f"first {config.prim_first.value} is skipped: "
                f"{config.prim_main.value} overwrites the whole tile"
            )
        else:
            op = UnaryOp.ZERO if config.prim_first is PrimFirst.ZERO else UnaryOp.RELU
            first = unary_op(config, op, in_place=True)
    last = unary_op(config, UnaryOp.RELU, in_place=True) if has_last else None

    parallel = _parallel_axes(config, access, notes)
    loops = tuple(
        Loop(
            a,
            s.dim_sizes[a],
            s.dim_types[a],
            s.axis_strides(a),
            a in parallel,
        )
        for a in s.loop_axes
    )
    for tile_op in (first, main, main_zero, last):
        if tile_op is not None and tile_op.note:
            notes.append(f"{tile_op.spec.name}: generic scalar primitive because {tile_op.note}")
    panel, main, main_zero = plan_panel(
        tuple(loop.size for loop in loops), tuple(loop.strides for loop in loops), main, main_zero
    )
    if panel is not None:
        notes.append(panel.describe(loops[panel.depth].axis))
    transposed = None
    if access is Access.ALWAYS and first is None and panel is None:
        transposed = plan_transposed_tile(
            tuple(loop.size for loop in loops),
            tuple(loop.strides for loop in loops),
            tuple(loop.parallel for loop in loops),
            main_zero,
            relu=last is not None,
        )
    if transposed is not None:
        notes.append(transposed.describe(tuple(loop.axis for loop in loops)))
    return LoopNest(
        config, loops, first, main, main_zero, last, access, tuple(notes), panel, transposed
    )


def _parallel_axes(config: Config, access: Access, notes: list[str]) -> set[int]:
    s = config.schedule
    shared = [a for a in s.loop_axes if s.exec_types[a] is ExecType.SHARED]
    if not shared:
        return set()
    k_shared = [a for a in shared if s.dim_types[a] is DimType.K]
    if k_shared:
        notes.append(
            f"shared K axes {k_shared} run sequentially: out has stride 0 on them, so "
            "their iterations update the same output elements"
        )
    candidates = [a for a in shared if s.dim_types[a] is not DimType.K]
    if not candidates:
        return set()
    if access is Access.TRACKED:
        notes.append("shared axes run sequentially: first/last accesses are tracked in order")
        return set()
    out_axes = [a for a, t in enumerate(s.dim_types) if t is not DimType.K]
    injective = is_injective(
        [s.dim_sizes[a] for a in out_axes], [s.strides_out[a] for a in out_axes]
    )
    if not injective:
        why = "aliases" if injective is False else "is not proven free of aliasing"
        notes.append(
            f"shared axes run sequentially: the output {why}, so parallel "
            "iterations could update the same elements"
        )
        return set()
    return set(candidates)


def access_flags(nest: LoopNest) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration (in nest order): is it the first / last access of its output tile?"""
    bases = np.zeros(1, dtype=np.int64)
    for loop in nest.loops:
        steps = np.arange(loop.size, dtype=np.int64) * loop.strides[Tensor.OUT.value]
        bases = (bases[:, None] + steps[None, :]).reshape(-1)
    count = bases.size
    order = np.argsort(bases, kind="stable")
    ordered = bases[order]
    starts = np.ones(count, dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    ends = np.ones(count, dtype=bool)
    ends[:-1] = ordered[1:] != ordered[:-1]
    first = np.zeros(count, dtype=np.uint8)
    last = np.zeros(count, dtype=np.uint8)
    first[order[starts]] = 1
    last[order[ends]] = 1
    return first, last
