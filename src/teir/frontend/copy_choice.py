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


__all__ = [
    "LARGE_KERNEL_VOLUME",
    "LARGE_TILE",
    "KernelShape",
    "as_good",
    "kernel_fill",
    "kernel_shape",
]
