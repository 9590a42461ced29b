"""Packing the kernel's vector operand once for the loops that reuse it.

A BRGEMM kernel whose A columns lie far apart in memory (many pages per tile, or a transposed A)
copies its A into a contiguous buffer on every call (:func:`teir.codegen.brgemm.choose_blocking`,
``pack_a``). When the innermost loops of the nest do not move A's tile (stride 0), every one of
their iterations repeats that copy on the same data. The nest then copies the tile once, before
those loops, into a contiguous stack buffer in the kernel's column-major layout (columns padded
to whole vectors), and the kernel reads the buffer: a BLIS-style packed panel, made only where
the kernel would have packed anyway, where A is stored transposed and the buffer lets the
kernel run its outer-product form, or where A's columns lie half as far apart as the kernel's
own packing asks (:func:`panel_leading_bytes`). Measured on 2 cores, same arrays in one
process, fraction of the probe's peak without -> with the panel:

- ``abcd,dbef->acef`` 32^6 (A columns 128 KiB apart): FP32 72 -> 99 %, FP64 65 -> 90 %;
- 1024^3 ``ik,kj->ij`` (A columns 4 KiB apart): FP32 91 -> 99 %, FP64 82 -> 92 %;
- 1024^3 ``ik,jk->ij``: FP32 87 -> 96 %, FP64 85 -> 93 %.

A B stored transposed (unit stride on N) whose K steps lie so far apart that the kernel would
copy it a column block at a time on every call is packed the same way where the loops inside
do not move it (the optimizer then runs the loop that moves only A innermost): rows of whole
lines, one per K step, from which the kernel broadcasts directly (1024^3 ``ki,kj->ij`` FP32,
same process alternating: one thread 60-63 -> 65 % of peak, two 68 -> 71 %; FP64 alike).

The buffer lives on the stack of the thread that runs the nest (each thread packs its own), so
it is capped well below the 8 MiB default thread stack, and at half of L2, where a packed panel
must stay while the inner loops sweep the other operand past it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from teir.codegen.brgemm import b_steps_far_apart, choose_blocking, pack_leading_bytes
from teir.codegen.specs import BrgemmSpec, UnaryOp, UnarySpec
from teir.codegen.target import Target, cache_sizes
from teir.codegen.transpose import LINE_BYTES
from teir.ir import Tensor
from teir.lower.tiles import TileLoop, TileOp

STACK_LIMIT_BYTES = 512 * 1024


def panel_limit_bytes() -> int:
    """The largest packed panel: within the stack cap and half of L2."""
    return min(STACK_LIMIT_BYTES, cache_sizes()["L2"] // 2)


@dataclass(frozen=True)
class PanelPack:
    """Before nest loop ``depth`` (0: before the outermost), ``copy`` writes ``tensor``'s tile
    into a stack buffer of ``elements`` elements; the kernels then read A from the buffer, for
    ``reuse`` iterations of the loops inside."""

    tensor: Tensor
    depth: int
    copy: TileOp
    elements: int
    reuse: int

    def describe(self, loop_axis: int) -> str:
        spec = self.copy.spec
        assert isinstance(spec, UnarySpec)
        batch = self.copy.loops[0].size if self.copy.loops else 1
        shape = f"{spec.m} x {spec.n}" + (f" x batch {batch}" if batch > 1 else "")
        shape += ", transposed" if spec.trans_a else ""
        kib = self.elements * spec.itemsize / 1024
        return (
            f"{self.tensor.name.lower()}'s kernel tile ({shape}) "
            f"is packed into a contiguous {kib:.0f} KiB buffer before loop axis {loop_axis}, "
            f"reused by {self.reuse} iterations"
        )


def plan_panel(
    loop_sizes: tuple[int, ...],
    loop_strides: tuple[tuple[int, int, int], ...],
    main: TileOp | None,
    main_zero: TileOp | None,
    target: Target | None = None,
) -> tuple[PanelPack | None, TileOp | None, TileOp | None]:
    """(pack, main, main_zero): the pack and the kernels that read its buffer, or
    ``(None, main, main_zero)`` unchanged when no pack pays."""
    unchanged = (None, main, main_zero)
    if main is None or main.loops or not isinstance(main.spec, BrgemmSpec):
        return unchanged
    target = target or Target.host()
    a_panel = _a_panel(loop_sizes, loop_strides, main, main_zero, target)
    if a_panel[0] is not None:
        return a_panel
    return _b_panel(loop_sizes, loop_strides, main, main_zero, target)


def panel_leading_bytes(target: Target) -> int:
    """How far apart A's columns must lie for the nest to pack A into a panel for the loops
    that reuse it: half the distance at which the kernel packs A on every call. Closer
    columns still leave the kernel's A tile in rows of their own, each a prefetch stream and
    a part of a page (FP32 ``ijk,jkl->il`` 256 x 64 x 64 x 256, A's columns 1 KiB apart, in
    4 K steps on 2 threads: 1.79 -> 1.35 ms; ``abc,bcd->ad`` 200 x 3000 x 300 1.20 -> 1.06
    ms). Only tiles of two vectors or more: an A of 8 rows padded to 16 lost 7 %."""
    return pack_leading_bytes(target) // 2


def a_spread(spec: BrgemmSpec) -> bool:
    """Whether the kernel's A tile is spread over batch elements far apart (each its own
    block of memory, ``A_SPREAD_BYTES`` or more from the next): packed together, the tile
    stays in L2 for the loops that reuse it, where its scattered blocks contend for the same
    cache sets with everything else that passes (FP32 ``trus,pqtu->pqrs`` 32x60x64x64 by
    48x48, A's blocks 960 KiB apart, 2 threads: 63-64 -> 77-80 % of peak)."""
    if spec.batch < 2 or spec.trans_a:
        return False
    block = spec.lda * (spec.k - 1) + spec.m
    return spec.stride_a > block and spec.stride_a * spec.itemsize >= A_SPREAD_BYTES


A_SPREAD_BYTES = 128 << 10


def _reuse_depth(
    loop_sizes: tuple[int, ...], loop_strides: tuple[tuple[int, int, int], ...], tensor: Tensor
) -> tuple[int, int]:
    """(depth, reuse): the loops from ``depth`` on do not move ``tensor``'s tile, and run
    ``reuse`` iterations."""
    depth = len(loop_sizes)
    while depth > 0 and (loop_strides[depth - 1][tensor.value] == 0 or loop_sizes[depth - 1] == 1):
        depth -= 1
    return depth, prod(loop_sizes[depth:])


def b_panel_row(spec: BrgemmSpec) -> int:
    """Values per K step in a packed panel of a transposed B: its columns in whole lines."""
    per_line = LINE_BYTES // spec.itemsize
    return -(-spec.n // per_line) * per_line


def packs_b_panel(spec: BrgemmSpec, target: Target) -> bool:
    """Whether a kernel's transposed B, which the kernel would copy a column block at a time
    on every call (its K steps far apart), fits a packed panel in the nest instead."""
    if spec.trans_a or not b_steps_far_apart(spec) or spec.m < 2 * target.lanes(spec.itemsize):
        return False
    return spec.batch * spec.k * b_panel_row(spec) * spec.itemsize <= panel_limit_bytes()


def _b_panel(
    loop_sizes: tuple[int, ...],
    loop_strides: tuple[tuple[int, int, int], ...],
    main: TileOp,
    main_zero: TileOp | None,
    target: Target,
) -> tuple[PanelPack | None, TileOp | None, TileOp | None]:
    """A transposed B's tile packed once for the loops that do not move it: rows of whole
    lines, K steps one row apart, so that the kernel broadcasts from it without its own
    column-block copies (1024^3 ``ki,kj->ij`` FP32, the kernel on one core with A streamed:
    60 -> 67 % of peak)."""
    unchanged = (None, main, main_zero)
    spec = main.spec
    assert isinstance(spec, BrgemmSpec)
    if not packs_b_panel(spec, target):
        return unchanged
    tensor = main.operands[1]
    depth, reuse = _reuse_depth(loop_sizes, loop_strides, tensor)
    if reuse < 2:
        return unchanged
    row = b_panel_row(spec)

    def reading_buffer(kernel: BrgemmSpec) -> BrgemmSpec:
        return dataclasses.replace(kernel, ldb=row, stride_b=spec.k * row)

    if choose_blocking(reading_buffer(spec), target).pack_b:
        return unchanged
    copy_spec = UnarySpec(spec.dtype, UnaryOp.COPY, spec.n, spec.k, spec.ldb, row)
    pack = _pack(tensor, depth, reuse, copy_spec, spec.batch, spec.stride_b, spec.k * row)
    return pack, *_reading(main, main_zero, reading_buffer)


def _a_panel(
    loop_sizes: tuple[int, ...],
    loop_strides: tuple[tuple[int, int, int], ...],
    main: TileOp,
    main_zero: TileOp | None,
    target: Target,
) -> tuple[PanelPack | None, TileOp | None, TileOp | None]:
    """The kernel's A tile packed once for the loops that do not move it (see the module)."""
    unchanged = (None, main, main_zero)
    spec = main.spec
    assert isinstance(spec, BrgemmSpec)
    lanes = target.lanes(spec.itemsize)
    # A transposed A (unit stride on K) runs the dot or mirror form; once transposed into the
    # buffer it runs the outer form (1024^3 ki,jk->ij: 89 -> 96 % FP32, 83 -> 92 % FP64).
    transposes = spec.trans_a and spec.m >= lanes and spec.k >= lanes
    padded = -(-spec.m // lanes) * lanes
    # (columns farther apart are the kernel's own rule's to pack or not)
    rows_apart = (
        not spec.trans_a
        and spec.m >= 2 * lanes
        and spec.lda > padded
        and panel_leading_bytes(target) <= spec.lda * spec.itemsize < pack_leading_bytes(target)
    )
    if not (choose_blocking(spec, target).pack_a or transposes or a_spread(spec) or rows_apart):
        return unchanged
    tensor = main.operands[0]
    depth, reuse = _reuse_depth(loop_sizes, loop_strides, tensor)
    if reuse < 2:
        return unchanged
    elements = spec.batch * spec.k * padded
    if elements * spec.itemsize > panel_limit_bytes():
        return unchanged

    def reading_buffer(kernel: BrgemmSpec) -> BrgemmSpec:
        return dataclasses.replace(kernel, trans_a=False, lda=padded, stride_a=spec.k * padded)

    if choose_blocking(reading_buffer(spec), target).pack_a:
        return unchanged  # columns of the buffer itself are far apart: the kernel would repack
    copy_spec = UnarySpec(
        spec.dtype, UnaryOp.COPY, spec.m, spec.k, spec.lda, padded, trans_a=spec.trans_a
    )
    pack = _pack(tensor, depth, reuse, copy_spec, spec.batch, spec.stride_a, spec.k * padded)
    return pack, *_reading(main, main_zero, reading_buffer)


def _pack(
    tensor: Tensor,
    depth: int,
    reuse: int,
    copy_spec: UnarySpec,
    batch: int,
    source_stride: int,
    buffer_stride: int,
) -> PanelPack:
    """The pack of ``tensor``'s tile: ``copy_spec`` per batch element, the elements
    ``source_stride`` apart in the tensor and ``buffer_stride`` apart in the buffer."""
    copy_loops: tuple[TileLoop, ...] = ()
    if batch > 1:
        strides = [0, 0, 0]
        strides[tensor.value] = source_stride
        strides[Tensor.OUT.value] = buffer_stride
        copy_loops = (TileLoop(batch, (strides[0], strides[1], strides[2])),)
    copy = TileOp(copy_spec, (tensor, Tensor.OUT), copy_loops)
    return PanelPack(tensor, depth, copy, batch * buffer_stride, reuse)


def _reading(
    main: TileOp, main_zero: TileOp | None, reading_buffer: Callable[[BrgemmSpec], BrgemmSpec]
) -> tuple[TileOp, TileOp | None]:
    """The main kernels (and the one with a fused Zero) reading the buffer."""
    assert isinstance(main.spec, BrgemmSpec)
    packed_main = dataclasses.replace(main, spec=reading_buffer(main.spec))
    if main_zero is None:
        return packed_main, None
    assert isinstance(main_zero.spec, BrgemmSpec)
    return packed_main, dataclasses.replace(main_zero, spec=reading_buffer(main_zero.spec))
