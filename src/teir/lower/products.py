"""Elementwise products that write an input transposed: the innermost loops of a
one-element nest run as one transposing kernel.

An elementwise product (a GEMM without K whose kernel multiplies one element) of a tensor A
by a smaller S, into an output whose unit stride lies on another axis than A's, runs its
loops around a one-by-one kernel: each call reads one element of A and writes one of the
output, and one of the two goes a line (or a page) at a time. Where the innermost loops of the
nest form exactly two axes once fused, one along the output's unit stride (the tile's rows)
and one along A's (its columns), and S runs along the rows with stride 0 or 1, the nest calls
the transposed unary kernel on that tile instead (``B := A^T * S``, ``UnarySpec.scale``): A
read in vectors along its rows, transposed in registers, scaled and stored in vectors along
the output's, around the caches where the output was to be. An internal extension of TEIR's
loop-nest form, shown by ``explain()``; the configuration and its loops stay as written.

Measured on 2 cores into an ``out``, alternating processes against the one-element nest:
``dge,d->egd`` 800 x 512 x 24 FP32 5.1 -> 2.3 ms (the permutation ``dge->egd`` alone takes
2.4 ms), FP64 25 -> 4.2 ms; ``gc,g->cg`` 12288 x 2560 FP32 54 -> 9.5 ms;
``da,gbadc->cdgab`` FP32 48 MB 34 -> 3.1 ms; ``ge,e->eg`` 4096 x 512 FP32 2.4 -> 0.53 ms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from teir.codegen.specs import BrgemmSpec, KernelError, UnaryOp, UnarySpec
from teir.codegen.target import Target
from teir.ir import Tensor
from teir.lower.tiles import TileOp, streams_columns

_OUT = Tensor.OUT.value


def fills_vectors(rows: int, columns: int, itemsize: int) -> bool:
    """Whether a tile runs mostly on whole blocks of the kernel: rows of two vectors or more
    and columns of one. Shorter ones leave the work to its edge blocks, slower than the
    one-element nest (FP32 on 2 cores: bd,db->bd with d 16, 1.09-1.4x the time;
    hdf,fhdgab->gdabhf with f 2, 1.7x)."""
    lanes = Target.host().lanes(itemsize)
    return rows >= 2 * lanes and columns >= lanes


@dataclass(frozen=True)
class TransposedTile:
    """The nest's loops from ``depth`` inwards run inside ``op`` (a scaled transposed unary
    kernel: A, out, S)."""

    depth: int
    op: TileOp

    def describe(self, loop_axes: tuple[int, ...]) -> str:
        spec = self.op.spec
        assert isinstance(spec, UnarySpec) and spec.scale is not None
        a, s = self.op.operands[0], self.op.operands[2]
        axes = ", ".join(str(axis) for axis in loop_axes[self.depth :])
        return (
            f"loop axes {axes} run inside one transposing kernel ({spec.name}): out tile "
            f"{spec.m} x {spec.n} := {a.name.lower()}^T scaled by {s.name.lower()}"
        )


@dataclass(frozen=True)
class _Chain:
    """Loops that fuse into one axis: size and the innermost loop's strides."""

    size: int
    strides: tuple[int, int, int]

    def extended(self, size: int, strides: tuple[int, int, int]) -> _Chain | None:
        if all(outer == self.size * inner for outer, inner in zip(strides, self.strides)):
            return _Chain(self.size * size, self.strides)
        return None


def _two_axes(
    sizes: tuple[int, ...], strides: tuple[tuple[int, int, int], ...], a: int
) -> tuple[_Chain, _Chain] | None:
    """(rows, columns): the loops fused into an axis along the output's unit stride and one
    along input ``a``'s, A transposed (not unit along the rows); None if they do not form
    exactly those two."""
    looping = [(size, s) for size, s in zip(sizes, strides) if size > 1]
    row = next((i for i, (_, s) in enumerate(looping) if s[_OUT] == 1), None)
    col = next((i for i, (_, s) in enumerate(looping) if s[a] == 1 and i != row), None)
    if row is None or col is None or looping[row][1][a] == 1:
        return None
    rows = _Chain(*looping[row])
    cols = _Chain(*looping[col])
    rest = [loop for i, loop in enumerate(looping) if i not in (row, col)]
    while rest:  # inner members first: a chain grows by the loop that continues it
        for position, (size, s) in enumerate(rest):
            if (grown := rows.extended(size, s)) is not None:
                rows = grown
            elif (grown := cols.extended(size, s)) is not None:
                cols = grown
            else:
                continue
            del rest[position]
            break
        else:
            return None
    return rows, cols


def plan_transposed_tile(
    loop_sizes: tuple[int, ...],
    loop_strides: tuple[tuple[int, int, int], ...],
    loop_parallel: tuple[bool, ...],
    main_zero: TileOp | None,
    relu: bool,
) -> TransposedTile | None:
    """The transposing kernel for the fewest innermost loops that form its tile (the
    optimizer cuts them to a tile's size), or None.
    ``main_zero`` must be a one-element kernel writing each output element once (no K, Zero
    fused); ``relu``: a last ReLU folded into the kernel."""
    if main_zero is None or not isinstance(main_zero.spec, BrgemmSpec):
        return None
    spec = main_zero.spec
    if (spec.m, spec.n, spec.k, spec.batch, spec.beta) != (1, 1, 1, 1, 0):
        return None
    elements = prod(loop_sizes)
    for depth in range(len(loop_sizes) - 2, -1, -1):
        if loop_parallel[depth]:
            break
        op = _tile_op(loop_sizes[depth:], loop_strides[depth:], spec, relu)
        if op is None:
            continue
        a = op.operands[0].value
        if any(size > 1 and strides[a] == 0 for size, strides in zip(loop_sizes, loop_strides)):
            return None  # an output label A lacks: an outer product's kernel writes it better
        # stored around the caches as a transposing Copy's tile would be
        unary = op.spec
        assert isinstance(unary, UnarySpec)
        outside = [i for i in range(depth) if loop_sizes[i] > 1]
        continued = bool(outside) and loop_strides[outside[-1]][_OUT] == unary.m
        stream = streams_columns(unary.m, unary.ldb, True, continued, elements, unary.itemsize)
        return TransposedTile(depth, replace(op, spec=replace(unary, stream_b=stream)))
    return None


def _tile_op(
    sizes: tuple[int, ...],
    strides: tuple[tuple[int, int, int], ...],
    spec: BrgemmSpec,
    relu: bool,
) -> TileOp | None:
    if prod(sizes) < 2:
        return None
    for a_tensor, s_tensor in ((Tensor.IN0, Tensor.IN1), (Tensor.IN1, Tensor.IN0)):
        axes = _two_axes(sizes, strides, a_tensor.value)
        if axes is None:
            continue
        rows, cols = axes
        if not fills_vectors(rows.size, cols.size, spec.itemsize):
            continue
        along_rows, along_cols = rows.strides[s_tensor.value], cols.strides[s_tensor.value]
        lda, ldb = rows.strides[a_tensor.value], cols.strides[_OUT]
        if along_rows not in (0, 1) or along_cols < 0 or lda < 1 or ldb < 1:
            continue  # S across the rows, a broadcast A or out: no transposed tile
        try:
            unary = UnarySpec(
                spec.dtype,
                UnaryOp.RELU if relu else UnaryOp.COPY,
                rows.size,
                cols.size,
                lda=lda,
                ldb=ldb,
                trans_a=True,
                scale=(along_rows, along_cols),
            )
        except KernelError:
            continue  # leading dimensions that let columns overlap
        return TileOp(unary, (a_tensor, Tensor.OUT, s_tensor))
    return None
