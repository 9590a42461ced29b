"""When copies of some of a contraction's tensors do as well as copies of all three: the rule
the copying fallback chooses its copies by (:func:`teir.frontend.copy_fallback.choose`),
shared with the cost model that prices result layouts run through that fallback
(:func:`teir.frontend.plan_cost.einsum_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from teir.codegen.brgemm import choose_blocking
from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target
from teir.ir import Config, DimType
from teir.lower.tiles import TileOp

# Kernel tiles of this many elements (M x N x K) are large enough, whatever copying all
# three tensors would give: aecb,eda->acbd FP64 with in1 copied has tiles of 184 x 129 x 44
# where copying all gives 920 x 129 x 44, and runs in 11 ms to their 24.
LARGE_KERNEL_VOLUME = 64**3
# So are tiles of at least LARGE_TILE x LARGE_TILE elements of C summed over at least
# LARGE_TILE steps of K (the course's 32³ GEMMs run at 93-97 % of peak): abe,dec->dacb with
# both inputs F-ordered (45x50x31x51x46), both copied, has tiles of 50 x 31 x 46 and writes
# the result in place: FP32 3.0 -> 2.4 ms, FP64 5.6-7.1 -> 4.4-4.7 ms against copying the
# 14 MB result. A long K does not make up for a small C (gafcb,agfed->beadc FP64 with 12 x 6
# x 608 tiles, of 43 K elements: 2.1 -> 2.6-3.4 ms).
LARGE_TILE = 32
# Measured on this kind of machine: a core does ~8 FLOPs in the time it copies one byte of a
# tensor that does not fit its caches.
COPY_FLOPS_PER_BYTE = 8.0


@dataclass(frozen=True)
class KernelShape:
    """What one kernel call of a scheduled contraction spans."""

    c_tile: int  # elements of C (the product of the prim axes other than K)
    depth: int  # steps of K (batch-reduce included)
    fill: float  # fraction of vector lanes filled along the vectorized extent

    @property
    def volume(self) -> int:
        return self.c_tile * self.depth

    @property
    def large(self) -> bool:
        """Whether the tiles reach LARGE_TILE in C's elements (squared) and in K."""
        return self.c_tile >= LARGE_TILE**2 and self.depth >= LARGE_TILE


def kernel_fill(main: TileOp | None) -> float:
    """The fraction of vector lanes a main primitive fills along the dimension it vectorizes
    (1 for kernels other than BRGEMM)."""
    if main is None or not isinstance(main.spec, BrgemmSpec):
        return 1.0
    spec = main.spec
    if spec.one_element:
        return 1.0  # the one-element kernel: LLVM vectorizes the loops around it
    blocking = choose_blocking(spec, Target.host())
    along = {"dot": spec.k, "mirror": spec.n}.get(blocking.form, spec.m)
    return along / (-(-along // blocking.lanes) * blocking.lanes)


def kernel_shape(config: Config, main: TileOp | None) -> KernelShape:
    """The kernel tile of ``config`` (scheduled) whose main primitive lowered to ``main``."""
    schedule = config.schedule
    sizes = [(schedule.dim_sizes[a], schedule.dim_types[a]) for a in schedule.prim_axes]
    c_tile = prod(size for size, dim_type in sizes if dim_type is not DimType.K)
    depth = prod(size for size, dim_type in sizes if dim_type is DimType.K)
    return KernelShape(c_tile, depth, kernel_fill(main))


def as_good(copied: KernelShape, everything: KernelShape) -> bool:
    """Whether the kernel after some of the copies does as well as the one after all three:
    tiles at least half as large (or large enough) that fill at least half as many lanes."""
    big = 2 * copied.volume >= min(everything.volume, LARGE_KERNEL_VOLUME) or copied.large
    return big and 2 * copied.fill >= everything.fill


def copy_cost(flops: float, shape: KernelShape, copied_bytes: int) -> float:
    """FLOP-equivalents of a contraction of ``flops`` on a kernel of ``shape`` after copies
    of ``copied_bytes`` (each byte read and written): the FLOPs over the lanes filled."""
    return flops / shape.fill + 2.0 * copied_bytes * COPY_FLOPS_PER_BYTE


def costs_no_more(
    flops: float,
    copied: KernelShape,
    copied_bytes: int,
    everything: KernelShape,
    everything_bytes: int,
) -> bool:
    """Whether the kernel after some of the copies, filling its lanes as it does, costs no
    more than the one after copies of all three (``copy_cost``). A compute-bound contraction
    whose result, copied, fills the lanes that its short unit-stride extent leaves empty:
    FP32 jcl,jhd->lhdc (c 12, l 48, h d j 200 8 200) with in0 and in1 copied writes the
    result in place with 12-row tiles, 3/4 of 16 lanes, 2.19 ms; with in0 and the result
    copied, 144-row tiles, 1.70 ms (NumPy 1.75). 24 random einsums whose copies this changes
    (2 threads, both variants in one process, interleaved): geometric mean 1.40x faster
    (0.51-3.55x; the 0.51x traded a dot form filling 0.9 of its lanes for an outer form on
    N 8 that fills them all)."""
    return copy_cost(flops, copied, copied_bytes) <= copy_cost(flops, everything, everything_bytes)


__all__ = [
    "COPY_FLOPS_PER_BYTE",
    "LARGE_KERNEL_VOLUME",
    "LARGE_TILE",
    "KernelShape",
    "as_good",
    "copy_cost",
    "costs_no_more",
    "kernel_fill",
    "kernel_shape",
]
