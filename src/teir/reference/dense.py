"""An evaluation of a configuration with ``np.einsum`` on whole tensors, independent of tiles.

It gathers each tensor into a dense array over the axes it takes part in, contracts with
``np.einsum`` and applies the first/last primitives to every output element once. That equals
the tiled semantics whenever the output has no aliasing (distinct C/M/N indices address distinct
elements), which :func:`dense_result` checks. It serves ``teir run --check`` and the tests as a
second opinion next to the reference executor.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from teir.buffers import checked_buffers
from teir.errors import ExecutionError, TeirError
from teir.ir import Config, DimType, PrimFirst, PrimLast, PrimMain, Tensor
from teir.ir.layout import all_distinct, is_injective
from teir.reference.tiles import tile_offsets

# np.einsum's sublist format labels axes with integers below 52.
MAX_AXES = 52


@dataclass(frozen=True)
class DenseResult:
    """What ``out`` must hold after executing a configuration.

    ``positions`` are the flat offsets in ``out`` the configuration writes, ``values`` the
    expected values there and ``scale`` a bound on the magnitude of the terms summed into each
    value (for rounding tolerances); ``terms`` is the number of products summed per element.
    """

    positions: np.ndarray
    values: np.ndarray
    scale: np.ndarray
    terms: int


def _gather(config: Config, tensor: Tensor, buffer: np.ndarray) -> tuple[np.ndarray, list[int]]:
    s = config.schedule
    axes = tuple(i for i, t in enumerate(s.dim_types) if t.roles[tensor.value])
    return buffer[tile_offsets(s, tensor, axes)], list(axes)


def dense_result(config: Config, in0: Any, in1: Any, out: Any) -> DenseResult:
    """Evaluate ``config`` with ``np.einsum`` without writing anything.

    Raises :class:`teir.TeirError` if the output has aliasing (the dense form cannot express
    the per-tile first/last semantics then) or the configuration has more than 52 axes.
    """
    buf0, buf1, buf_out = checked_buffers(config, in0, in1, out)
    if not config.rests:
        return _dense_flat(config, buf0, buf1, buf_out)
    # Partial tiles' rests run after the configuration's own schedule, each on the output as
    # the parts before it left it (the rest of a summed axis adds into its main part's sums).
    work = buf_out.copy()
    scale = np.zeros(work.size)
    written = np.zeros(work.size, dtype=bool)
    terms = 0
    for part in config.parts:
        o0, o1, oo = part.offsets
        result = _dense_flat(
            part.config,
            None if buf0 is None else buf0[o0:],
            None if buf1 is None else buf1[o1:],
            work[oo:],
        )
        where = oo + result.positions
        # a part's scale counts the value it found there; what it adds is the rest of it
        before = np.where(written[where], scale[where] - np.abs(work[where]), 0.0)
        scale[where] = before + result.scale
        work[where] = result.values
        written[where] = True
        terms += result.terms
    positions = np.flatnonzero(written)
    return DenseResult(positions, work[positions], scale[positions], terms)


def _dense_flat(
    config: Config, buf0: np.ndarray | None, buf1: np.ndarray | None, buf_out: np.ndarray
) -> DenseResult:
    """:func:`dense_result` of one region (a configuration without rests) on flat buffers."""
    if config.num_dims > MAX_AXES:
        raise TeirError(
            f"the einsum evaluation supports at most {MAX_AXES} axes, "
            f"the configuration has {config.num_dims}"
        )
    positions, out_axes = _gather(config, Tensor.OUT, np.arange(buf_out.size))
    s = config.schedule
    distinct = is_injective(
        [s.dim_sizes[a] for a in out_axes], [s.strides_out[a] for a in out_axes]
    )
    if distinct is None:
        distinct = all_distinct(positions)
    if not distinct:
        raise TeirError(
            "the output has aliasing (distinct C/M/N indices address the same element of out), "
            "which the einsum evaluation cannot express; use the reference executor instead"
        )
    init = buf_out[positions]
    if config.prim_first is PrimFirst.ZERO:
        init = np.zeros_like(init)
    elif config.prim_first is PrimFirst.RELU:
        init = np.maximum(init, 0)
    scale = np.abs(init)
    terms = 0
    main = config.prim_main
    if main.is_contraction:
        assert buf0 is not None and buf1 is not None
        a, a_axes = _gather(config, Tensor.IN0, buf0)
        b, b_axes = _gather(config, Tensor.IN1, buf1)
        values = init + np.einsum(a, a_axes, b, b_axes, out_axes, optimize=True)
        scale = scale + np.einsum(np.abs(a), a_axes, np.abs(b), b_axes, out_axes, optimize=True)
        terms = prod(config.dim_sizes[i] for i, t in enumerate(config.dim_types) if t is DimType.K)
    elif main.is_unary:
        assert buf0 is not None
        a, a_axes = _gather(config, Tensor.IN0, buf0)
        if a_axes != out_axes:  # unreachable: unary operations have only C and M axes
            raise ExecutionError("a unary operation's in0 and out must span the same axes")
        values = a if main is PrimMain.COPY else np.maximum(a, 0)
        scale = np.abs(values)
    else:
        values = init
    if config.prim_last is PrimLast.RELU:
        values = np.maximum(values, 0)
    return DenseResult(positions, np.asarray(values, dtype=config.dtype), scale, terms)


def einsum_execute(config: Config, in0: Any, in1: Any, out: Any) -> None:
    """Execute ``config`` in place through :func:`dense_result` (outputs without aliasing)."""
    result = dense_result(config, in0, in1, out)
    flat = out.reshape(-1, order="A")
    flat[result.positions] = result.values


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing an executed output with a :class:`DenseResult`."""

    ok: bool
    max_error: float
    worst_position: int | None
    untouched_changed: int
    message: str


def compare(
    config: Config, out_before: np.ndarray, out_after: np.ndarray, expected: DenseResult
) -> Comparison:
    """Compare ``out_after`` with ``expected``; positions not written must be unchanged.

    Contractions may differ by rounding: element ``i`` passes if its error is within
    ``4 * eps * (terms + 2) * scale[i]``, a bound on the rounding error of any summation
    order. Copy, ReLU and Zero results must match exactly.
    """
    before = out_before.reshape(-1, order="A")
    after = out_after.reshape(-1, order="A")
    untouched = np.ones(after.size, dtype=bool)
    untouched[expected.positions] = False
    changed = int(np.count_nonzero(untouched & ~_same(before, after)))
    got = after[expected.positions]
    error = np.abs(got.astype(np.float64) - expected.values.astype(np.float64))
    eps = float(np.finfo(config.dtype).eps)
    allowed = 4 * eps * (expected.terms + 2) * expected.scale.astype(np.float64)
    bad = ~((error <= allowed) | _same(got, expected.values))
    worst = int(np.argmax(np.where(np.isnan(error), np.inf, error))) if error.size else None
    max_error = float(np.nanmax(error)) if error.size and not np.all(np.isnan(error)) else 0.0
    problems = []
    if np.any(bad):
        index = int(np.argmax(bad))
        problems.append(
            f"{int(np.count_nonzero(bad))} of {got.size} output elements differ from np.einsum "
            f"(first at out[{int(expected.positions.reshape(-1)[index])}]: got "
            f"{got.reshape(-1)[index]!r}, expected {expected.values.reshape(-1)[index]!r})"
        )
    if changed:
        problems.append(
            f"{changed} elements of out that the configuration does not address were changed"
        )
    return Comparison(
        not problems,
        max_error,
        None if worst is None else int(expected.positions.reshape(-1)[worst]),
        changed,
        "; ".join(problems) or f"matches np.einsum (max error {max_error:.3g})",
    )


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise equality that treats NaN as equal to NaN."""
    same: np.ndarray = (a == b) | (np.isnan(a) & np.isnan(b))
    return same
