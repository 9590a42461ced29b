"""Dot products whose kernel gathers one input a line per K step (``ij,ji->i``): that input
is copied once into the other's layout (``einsum_plan.gathered_dots``)."""

from __future__ import annotations

import numpy as np
import pytest

import teir
from teir.frontend import einsum_plan
from teir.frontend.einsum_plan import gathered_dots


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_gathered_input_is_copied_into_the_others_layout(dtype):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((600, 500)).astype(dtype)
    b = rng.standard_normal((500, 600)).astype(dtype)
    plan = teir.einsum_plan("ij,ji->i", a, b)
    assert plan.canonical == (None, "ij", None)  # b's column of j, one element per line
    expected = np.einsum("ij,ji->i", a, b)
    rtol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(teir.einsum("ij,ji->i", a, b), expected, rtol=rtol, atol=rtol)
    out = np.ones(600, dtype)
    teir.einsum("ij,ji->i", a, b, out=out, accumulate=True)
    np.testing.assert_allclose(out, expected + 1, rtol=rtol, atol=rtol)
    # the mirror case: a gathered, copied into b's layout
    plan = teir.einsum_plan("ji,ij->i", b, a)
    assert plan.canonical == ("ij", None, None)
    np.testing.assert_allclose(teir.einsum("ji,ij->i", b, a), expected, rtol=rtol, atol=rtol)


def test_small_gathered_inputs_stay_in_place():
    a = np.ones((60, 60), np.float32)
    assert a.nbytes < einsum_plan.GATHERED_MIN_BYTES
    assert teir.einsum_plan("ij,ji->i", a, a).canonical is None
    np.testing.assert_allclose(teir.einsum("ij,ji->i", a, a), np.full(60, 60.0))


def test_dots_along_unit_strides_are_not_gathered():
    a = np.ones((600, 600), np.float32)
    plan = teir.einsum_plan("ij,ij->i", a, a)
    assert plan.canonical is None
    assert not gathered_dots(plan, [einsum_plan.operand(a, ("i", "j"), i) for i in (0, 1)])


def test_gathered_dots_along_two_summed_labels_copy_one_input_into_the_others_layout():
    # each input gathered along one of the two summed labels: copies of both cost more than
    # they save (FP64 bdc,cdb->c 39 MB: 15.5 -> 18.5 ms), but in0 copied with its summed
    # labels as in1 lies (cdb) gives both a unit stride on b (3.5 -> 1.4 ms; 64 x 96 x 50:
    # 0.143 -> 0.130 ms)
    rng = np.random.default_rng(5)
    b = rng.standard_normal((64, 96, 50))
    c = rng.standard_normal((50, 96, 64))
    plan = teir.einsum_plan("bdc,cdb->c", b, c)
    assert plan.canonical is not None and plan.canonical[:2] == ("cdb", None)
    np.testing.assert_allclose(
        teir.einsum("bdc,cdb->c", b, c), np.einsum("bdc,cdb->c", b, c), rtol=1e-12
    )


def test_a_gathered_batch_of_dots_copies_the_gathered_input():
    # echg,gceh->ge: in0's unit stride lies on the output label g, so each dot over c and h
    # reads one element per line of in0 (FP32 256 x 6 x 16 x 64: 0.99 -> 0.60 ms)
    rng = np.random.default_rng(11)
    a = rng.standard_normal((6, 256, 64, 16)).astype(np.float32)
    b = rng.standard_normal((16, 256, 6, 64)).astype(np.float32)
    plan = teir.einsum_plan("echg,gceh->ge", a, b, threads=2)
    assert plan.canonical is not None and plan.canonical[0] is not None
    assert plan.canonical[1:] == (None, None)
    exact = np.einsum("echg,gceh->ge", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(
        teir.einsum("echg,gceh->ge", a, b, threads=2), exact, rtol=1e-4, atol=5e-3
    )
