"""The reference executor: the spec's semantics read literally, with NumPy on each tile.

Loops run over the non-prim axes in listed order (first listed = outermost). For every
iteration, each tensor's tile starts at ``sum(index * stride)`` over the loop axes and spans the
prim axes. ``prim_first`` runs before the main primitive on the first iteration that touches an
output tile, ``prim_last`` after it on the last one; a tile is identified by its base offset in
``out``, so aliasing outputs are handled exactly as the spec says.

Within a tile, elements are processed in row-major order of the prim axes as listed; that order
matters only when the output tile aliases itself, where accumulation (GEMM, BRGEMM) adds every
contribution and assignment (Copy, unary ReLU) keeps the last value written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from teir.buffers import checked_buffers
from teir.ir import Config, DimType, PrimFirst, PrimLast, PrimMain, Schedule, Tensor


def tile_offsets(schedule: Schedule, tensor: Tensor, axes: tuple[int, ...]) -> np.ndarray:
    """Element offsets of a tile of ``tensor`` spanning ``axes``, one array dimension per axis."""
    sizes = [schedule.dim_sizes[a] for a in axes]
    offsets = np.zeros(sizes, dtype=np.int64)
    strides = schedule.strides(tensor)
    for position, axis in enumerate(axes):
        shape = [1] * len(axes)
        shape[position] = sizes[position]
        offsets = offsets + (np.arange(sizes[position], dtype=np.int64) * strides[axis]).reshape(
            shape
        )
    return offsets


def loop_bases(schedule: Schedule, tensor: Tensor) -> np.ndarray:
    """The tile base offset of ``tensor`` for every iteration of the loop nest, in order."""
    loops = schedule.loop_axes
    return tile_offsets(schedule, tensor, loops).reshape(-1)


def first_and_last(bases_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration: does it touch its output tile for the first / the last time?"""
    count = bases_out.size
    _, first_index = np.unique(bases_out, return_index=True)
    _, last_from_end = np.unique(bases_out[::-1], return_index=True)
    is_first = np.zeros(count, dtype=bool)
    is_last = np.zeros(count, dtype=bool)
    is_first[first_index] = True
    is_last[count - 1 - last_from_end] = True
    return is_first, is_last


def assign_last_wins(buffer: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """``buffer[index] = values`` where, for repeated indices, the last value (in order) wins."""
    flat_index = index.reshape(-1)[::-1]
    flat_values = np.broadcast_to(values, index.shape).reshape(-1)[::-1]
    unique, position = np.unique(flat_index, return_index=True)
    buffer[unique] = flat_values[position]


class _TileOperation:
    """The per-tile operands of one configuration: offsets relative to the tile bases."""

    def __init__(self, config: Config) -> None:
        s = config.schedule
        self.config = config
        prim = s.prim_axes

        def prim_of(t: DimType) -> tuple[int, ...]:
            return tuple(a for a in prim if s.dim_types[a] is t)

        out_axes = tuple(a for a in prim if s.dim_types[a] is not DimType.K)
        self.out_tile = tile_offsets(s, Tensor.OUT, out_axes)
        main = config.prim_main
        if main.is_contraction:
            (m,), (n,) = prim_of(DimType.M), prim_of(DimType.N)
            ks = prim_of(DimType.K)  # BRGEMM: (batch-reduce axis, GEMM K axis)
            self.a = tile_offsets(s, Tensor.IN0, (*ks[:-1], m, ks[-1]))
            self.b = tile_offsets(s, Tensor.IN1, (*ks[:-1], ks[-1], n))
            self.c = tile_offsets(s, Tensor.OUT, (m, n))
        elif main.is_unary:
            self.a = tile_offsets(s, Tensor.IN0, out_axes)

    def main(self, in0: Any, in1: Any, out: np.ndarray, b0: int, b1: int, bo: int) -> None:
        main = self.config.prim_main
        if main is PrimMain.GEMM:
            np.add.at(out, bo + self.c, in0[b0 + self.a] @ in1[b1 + self.b])
        elif main is PrimMain.BRGEMM:
            products = np.matmul(in0[b0 + self.a], in1[b1 + self.b])
            np.add.at(out, bo + self.c, products.sum(axis=0, dtype=out.dtype))
        elif main is PrimMain.COPY:
            assign_last_wins(out, bo + self.out_tile, in0[b0 + self.a])
        elif main is PrimMain.RELU:
            assign_last_wins(out, bo + self.out_tile, np.maximum(in0[b0 + self.a], 0))

    def first(self, out: np.ndarray, bo: int) -> None:
        first = self.config.prim_first
        if first is PrimFirst.ZERO:
            out[bo + self.out_tile] = 0
        elif first is PrimFirst.RELU:
            self._relu(out, bo)

    def last(self, out: np.ndarray, bo: int) -> None:
        if self.config.prim_last is PrimLast.RELU:
            self._relu(out, bo)

    def _relu(self, out: np.ndarray, bo: int) -> None:
        index = bo + self.out_tile
        out[index] = np.maximum(out[index], 0)


def execute(config: Config, in0: Any, in1: Any, out: Any) -> None:
    """Execute ``config`` on NumPy arrays, in place on ``out``: the oracle of teir.

    ``in0``, ``in1`` and ``out`` are NumPy arrays of the configuration's dtype, C- or
    F-contiguous, of any shape; the configuration's strides address their flat element buffers,
    which must hold at least ``config.extents`` elements. Unused inputs may be ``None`` (in1
    for unary operations, both inputs for prim_main None).

    >>> import numpy as np, teir
    >>> cfg = teir.Config(data_type="FP64", prim_first="Zero", prim_main="GEMM",
    ...     dim_types="M N K".split(), exec_types=["prim"] * 3, dim_sizes=[2, 2, 3],
    ...     strides_in0=[1, 0, 2], strides_in1=[0, 3, 1], strides_out=[1, 2, 0])
    >>> a, b, c = np.arange(6.0), np.ones(6), np.full(4, 7.0)
    >>> teir.reference.execute(cfg, a, b, c)
    >>> c   # column-major C = A @ B with A = [[0, 2, 4], [1, 3, 5]], B = ones
    array([6., 9., 6., 9.])
    """
    buf0, buf1, buf_out = checked_buffers(config, in0, in1, out)
    for part in config.parts:  # the configuration's own schedule, then its partial tiles' rests
        o0, o1, oo = part.offsets
        _execute_flat(
            part.config,
            None if buf0 is None else buf0[o0:],
            None if buf1 is None else buf1[o1:],
            buf_out[oo:],
        )


def _execute_flat(
    config: Config, buf0: np.ndarray | None, buf1: np.ndarray | None, buf_out: np.ndarray
) -> None:
    """One region (a configuration without rests) on flat element buffers."""
    tiles = _TileOperation(config)
    s = config.schedule
    bases0, bases1, bases_out = (loop_bases(s, t) for t in Tensor)
    is_first, is_last = first_and_last(bases_out)
    first_needed = config.prim_first is not PrimFirst.NONE
    last_needed = config.prim_last is not PrimLast.NONE
    for it in range(bases_out.size):
        bo = int(bases_out[it])
        if first_needed and is_first[it]:
            tiles.first(buf_out, bo)
        tiles.main(buf0, buf1, buf_out, int(bases0[it]), int(bases1[it]), bo)
        if last_needed and is_last[it]:
            tiles.last(buf_out, bo)
