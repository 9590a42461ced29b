"""Compute-bound contractions whose layout leaves kernel tiles of a few accumulators: the
copying fallback gives them larger tiles (``einsum_plan.small_tile``)."""

from __future__ import annotations

import numpy as np
import pytest

import teir
from teir.frontend import einsum_plan

SIZES = {"h": 128, "f": 250, "a": 6, "g": 2, "e": 63, "c": 2}


def arrays(dtype, sizes=SIZES):
    rng = np.random.default_rng(2)
    a = rng.standard_normal([sizes[x] for x in "efcg"]).astype(dtype)
    b = rng.standard_normal([sizes[x] for x in "fhca"]).astype(dtype)
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_small_tile_is_widened_by_copying_an_input(dtype, two_pipe_xeon):
    # in0 efcg leaves M its unit-stride g of 2: tiles of 2 x 6 as it lies (FP64 4.4 ms,
    # torch 0.85); in0 copied as fceg gives M e*g of 126 (1.4 ms)
    a, b = arrays(dtype)
    out = np.zeros([SIZES[x] for x in "hega"], dtype)
    plan = teir.einsum_plan("efcg,fhca->hega", a, b, out=out)
    assert plan.canonical == ("fceg", None, None)
    # FP32's kernel also fills few lanes (6 of 16), for which copies were considered
    # already; only their wider tiles take them
    assert plan.for_small_tiles == (dtype == np.float64)
    expected = np.einsum("efcg,fhca->hega", a.astype(np.float64), b.astype(np.float64))
    rtol = 1e-4 if dtype == np.float32 else 1e-12
    out[...] = 1
    teir.einsum("efcg,fhca->hega", a, b, out=out, accumulate=True)
    np.testing.assert_allclose(out, expected + 1, rtol=rtol, atol=rtol * 100)
    result = teir.einsum("efcg,fhca->hega", a, b)
    np.testing.assert_allclose(result, expected, rtol=rtol, atol=rtol * 100)


def test_the_reason_is_explained():
    a, b = arrays(np.float64)
    text = teir.einsum_plan("efcg,fhca->hega", a, b).explain()
    assert "computes 12 elements of C per call" in text, text


def test_small_work_keeps_its_tiles():
    sizes = dict(SIZES, h=32, f=100)  # 9.7 MFLOP: copied without the threshold
    a, b = arrays(np.float64, sizes)
    plan = teir.einsum_plan("efcg,fhca->hega", a, b)
    assert plan.operation is not None
    assert plan.operation.config.flops < einsum_plan.SMALL_TILE_MIN_FLOPS
    assert plan.canonical is None
    np.testing.assert_allclose(
        teir.einsum("efcg,fhca->hega", a, b),
        np.einsum("efcg,fhca->hega", a, b),
        rtol=1e-12,
        atol=1e-12,  # sums of 200 products of magnitude ~1
    )
