"""The cost model of binary contractions as einsum runs them: layouts that no kernel fits
are priced with the copies the copying fallback would make (teir.frontend.plan_cost), by
the rule it chooses them with (teir.frontend.copy_choice)."""

from __future__ import annotations

import numpy as np

from teir.frontend.copy_choice import (
    LARGE_KERNEL_VOLUME,
    LARGE_TILE,
    KernelShape,
    as_good,
    costs_no_more,
)
from teir.frontend.einsum_parse import parse
from teir.frontend.einsum_plan import unscheduled_fields
from teir.frontend.plan_cost import (
    COPY_FLOPS_PER_BYTE,
    GENERIC_EFFICIENCY,
    contraction_cost,
    copied_cost,
    einsum_cost,
)


def _fields(subscripts, sizes, dtype=np.float32):
    inputs = subscripts.split("->")[0].split(",")
    arrays = [np.zeros([sizes[x] for x in term], dtype) for term in inputs]
    return unscheduled_fields(parse(subscripts, [a.ndim for a in arrays]), arrays)


def test_a_layout_no_kernel_fits_is_priced_with_its_copies():
    # in1's unit stride is on the batch d: no kernel fits; a copy of in1 (16 elements per
    # d) makes one that does
    sizes = {"a": 7, "b": 128, "c": 8, "d": 50, "e": 4, "f": 4}
    fields = _fields("dfbac,efd->edbac", sizes)
    flops = 2.0 * np.prod(list(sizes.values()))
    assert contraction_cost(fields, 1) == flops / GENERIC_EFFICIENCY
    cost, fits = einsum_cost(fields, 1)
    assert not fits
    copied = copied_cost(fields, 1)
    assert copied is not None and cost == copied
    # the copy of the small in1 alone, not of in0's 1.4 M elements
    in1_copy = 2.0 * sizes["d"] * sizes["e"] * sizes["f"] * 4 * COPY_FLOPS_PER_BYTE
    in0_copy = 2.0 * _elements_of(fields, "strides_in0") * 4 * COPY_FLOPS_PER_BYTE
    assert in1_copy < cost < in0_copy


def _elements_of(fields, name):
    return int(np.prod([s for s, st in zip(fields["dim_sizes"], fields[name]) if st]))


def test_the_listed_layout_pays_for_the_large_copy():
    # listed, the result's rows a, b lie in another order than in0's: copying in0 (or the
    # result) costs more than the layout that needs only in1 copied
    sizes = {"a": 7, "b": 128, "c": 8, "d": 50, "e": 4, "f": 4}
    listed, _ = einsum_cost(_fields("dfbac,efd->edabc", sizes), 1)
    laid_out, _ = einsum_cost(_fields("dfbac,efd->edbac", sizes), 1)
    in0_copy = 2.0 * 7 * 128 * 8 * 50 * 4 * 4 * COPY_FLOPS_PER_BYTE
    assert listed - laid_out >= 0.9 * in0_copy


def test_a_kernel_that_fits_is_priced_as_it_lies():
    fields = _fields("ik,kj->ij", {"i": 256, "j": 256, "k": 256})
    cost, fits = einsum_cost(fields, 1)
    assert fits and cost == contraction_cost(fields, 1)


def test_some_copies_do_as_well_as_all_three_with_half_the_tile_and_the_lanes():
    everything = KernelShape(c_tile=64 * 64, depth=16, fill=1.0)
    assert as_good(KernelShape(32 * 64, 16, 0.5), everything)
    assert not as_good(KernelShape(31 * 64, 16, 1.0), everything)  # under half the volume
    assert not as_good(KernelShape(64 * 64, 16, 0.49), everything)  # under half the lanes
    # a large tile is enough, whatever all three copies would give
    huge = KernelShape(c_tile=1024 * 1024, depth=1024, fill=1.0)
    large = KernelShape(LARGE_TILE**2, LARGE_TILE, 1.0)
    assert large.volume < LARGE_KERNEL_VOLUME and as_good(large, huge)
    assert not as_good(KernelShape(LARGE_TILE**2, LARGE_TILE - 1, 1.0), huge)


def test_lanes_left_empty_cost_their_flops_against_the_further_copies():
    everything = KernelShape(c_tile=96 * 160, depth=200, fill=1.0)
    three_quarters = KernelShape(c_tile=12 * 160, depth=200, fill=0.75)
    assert as_good(three_quarters, everything)
    # 1/3 more time on 10 GFLOP: more than copying 10 MB more costs (160 M FLOPs)
    assert not costs_no_more(10e9, three_quarters, 10 << 20, everything, 20 << 20)
    # on 100 MFLOP it is not
    assert costs_no_more(100e6, three_quarters, 10 << 20, everything, 20 << 20)
    # whole lanes either way: the fewer bytes copied win
    whole = KernelShape(c_tile=12 * 160, depth=200, fill=1.0)
    assert costs_no_more(10e9, whole, 10 << 20, everything, 20 << 20)
