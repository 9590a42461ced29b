"""A memory-bound contraction whose kernel fills few vector lanes, beside a small input: only
that input is copied, into a layout whose kernel fills them (``einsum_plan.partner_copy``)."""

from __future__ import annotations

import numpy as np
import pytest

import teir
from teir.frontend import einsum_plan

SIZES = {"g": 4, "e": 31, "d": 12, "b": 48, "f": 31}


def _operands(sizes: dict[str, int], dtype, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    big = rng.standard_normal([sizes[x] for x in "edgbf"]).astype(dtype)
    small = rng.standard_normal([sizes[x] for x in "feb"]).astype(dtype)
    return big, small


def _copied_and_replayed(subscripts, operands, canonical, tolerance, calls):
    """Plan ``subscripts`` on 2 threads, check that it copies ``canonical`` into a kernel
    that fills the lanes, and that ``calls`` calls (the first records the steps, the others
    replay them) equal NumPy's result, which is returned."""
    plan = teir.einsum_plan(subscripts, *operands, threads=2)
    assert plan.canonical == canonical
    assert einsum_plan.vector_fill(plan.product) >= einsum_plan.POOR_FILL
    expected = np.einsum(subscripts, *(x.astype(np.float64) for x in operands))
    for _ in range(calls):
        result = teir.einsum(subscripts, *operands, threads=2)
        np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
    return plan, expected


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_small_input_alone_is_copied(dtype):
    """``edgbf,feb->gd``: the kernel as the operands lie fills one lane of 16 (FP32) along g;
    the small input copied with e, b, f in the large one's order gives dot products along
    the large input's contiguous b, f."""
    big, small = _operands(SIZES, dtype)
    tolerance = 1e-3 if dtype == np.float32 else 1e-10
    plan, expected = _copied_and_replayed(
        "edgbf,feb->gd", [big, small], (None, "ebf", None), tolerance, calls=3
    )
    assert "in1 is copied into the order ebf" in plan.explain()
    out = np.full((4, 12), -1e3, dtype)
    start = out.copy()
    for _ in range(2):
        teir.einsum("edgbf,feb->gd", big, small, out=out, accumulate=True, relu=True)
        start = np.maximum(start + expected, 0)
        np.testing.assert_allclose(out, start, rtol=tolerance, atol=tolerance)


def test_a_strided_view_of_the_large_input():
    """The large input as a view with a step along e and a reversed d: still only the small
    one is copied (the view is read in place), and the result equals NumPy's."""
    sizes = dict(SIZES, e=62)
    big, small = _operands(sizes, np.float32)
    view = big[::2, ::-1]
    small = small[:, ::2]
    assert teir.einsum_plan("edgbf,feb->gd", view, small, threads=2).canonical == (
        None,
        "ebf",
        None,
    )
    expected = np.einsum("edgbf,feb->gd", view.astype(np.float64), small.astype(np.float64))
    result = teir.einsum("edgbf,feb->gd", view, small, threads=2)
    np.testing.assert_allclose(result, expected, rtol=1e-3, atol=1e-3)


def test_small_contractions_and_equal_partners_stay_in_place():
    """Under ``PARTNER_MIN_BYTES`` the copy's call costs more than the kernel gains; an
    input as large as the other is no partner of it."""
    sizes = dict(SIZES, e=3)
    big, small = _operands(sizes, np.float32)
    assert big.nbytes < einsum_plan.PARTNER_MIN_BYTES
    plan = teir.einsum_plan("edgbf,feb->gd", big, small, threads=2)
    assert plan.canonical is None
    np.testing.assert_allclose(
        teir.einsum("edgbf,feb->gd", big, small, threads=2),
        np.einsum("edgbf,feb->gd", big, small),
        rtol=1e-4,
        atol=1e-4,
    )
    big, small = _operands(SIZES, np.float32)
    out = np.empty((4, 12), np.float32)
    plan = teir.einsum_plan("edgbf,feb->gd", big, small, out=out, threads=2)
    as_they_lie = [
        einsum_plan.operand(big, tuple("edgbf"), 0),
        einsum_plan.operand(small, tuple("feb"), 1),
    ]
    assert einsum_plan.partner_copy(plan, as_they_lie)
    assert not einsum_plan.partner_copy(plan, [as_they_lie[0], as_they_lie[0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_small_input_takes_the_large_ones_order_as_it_lies(dtype):
    """``bc,acb->a``: the kernel's order and the transposed product's both keep the small
    input's b, c, whose kernel fills one lane along a; the small input in the large one's
    order (c, b) gives dot products along all of the large one's rows."""
    rng = np.random.default_rng(9)
    small = rng.standard_normal((64, 448)).astype(dtype)
    big = rng.standard_normal((96, 448, 64)).astype(dtype)
    tolerance = 1e-2 if dtype == np.float32 else 1e-9
    _copied_and_replayed("bc,acb->a", [small, big], ("cb", None, None), tolerance, calls=2)


@pytest.mark.parametrize("k", [5, 7])
def test_a_candidate_that_would_not_pay_is_passed_over_for_the_next(k):
    """``abe,dce->badc`` FP32 with K (e) along in1's unit stride: the kernel as the operands
    lie is a dot form filling fewer than half of its 16 lanes. The smallest copy,
    of in0, fills only half of them and does not pay (``fuller``); the fallback goes on to
    in1 copied K-outermost, whose outer-product kernel fills them all, instead of giving up
    on copies."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((5, 32, k)).astype(np.float32)
    b = rng.standard_normal((32, 48, k)).astype(np.float32)
    tolerance = 1e-4
    plan, _ = _copied_and_replayed("abe,dce->badc", [a, b], (None, "edc", None), tolerance, calls=2)
    assert "in1 is copied into the order edc" in plan.explain()


def test_a_copy_whose_contraction_runs_as_it_lies_is_preferred():
    """FP32 ``dab,cad->cb`` with the small in0 a stride-2 view (b of 4 fills a quarter of
    the lanes): its copy in the kernel's order lists K as in0 does (d, a), unlike in1 (a,
    d), and the contraction of that copy needed copies of its own (in1's 550 k elements:
    242 us against 21 with K in in1's order)."""
    dtype = np.float32
    rng = np.random.default_rng(6)
    small = rng.standard_normal((16, 173, 4)).astype(dtype)[::2]
    large = rng.standard_normal((398, 173, 8)).astype(dtype)
    plan = teir.einsum_plan("dab,cad->cb", small, large, threads=2)
    assert plan.canonical is not None and plan.product is not None
    assert plan.product.canonical is None, plan.explain()  # runs on in1 as it lies
    expected = np.einsum("dab,cad->cb", small.astype(np.float64), large)
    for _ in range(2):
        result = teir.einsum("dab,cad->cb", small, large, threads=2)
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


def test_a_result_bound_contraction_copies_a_tiny_input_for_the_lanes():
    """FP32 ``abe,cdfe->fadcb`` into a C-ordered out (b, of in0, its unit stride): as the
    operands lie the dot form sums K = 2 in 2 of 16 lanes; the 1424-element in0 copied
    gives the outer form along b (half the lanes), writing tiles of the 10 MB result as
    single runs, though smaller ones than copying all three would give (451 -> 88 us;
    NumPy 145)."""
    rng = np.random.default_rng(7)
    # abe with b outermost in memory, e innermost
    small = np.ascontiguousarray(rng.standard_normal((8, 89, 2)).astype(np.float32)).transpose(
        1, 0, 2
    )
    large = rng.standard_normal((22, 7, 24, 2)).astype(np.float32)
    out = np.zeros((24, 89, 7, 22, 8), np.float32)
    plan = teir.einsum_plan("abe,cdfe->fadcb", small, large, out=out, threads=2)
    assert plan.canonical is not None and plan.canonical[1:] == (None, None), plan.explain()
    teir.einsum("abe,cdfe->fadcb", small, large, out=out, threads=2)
    expected = np.einsum("abe,cdfe->fadcb", small, large)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
