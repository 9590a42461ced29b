"""Repeated calls of a split reduction replay its parts' runs on addresses
(``teir.frontend.split_call``)."""

from __future__ import annotations

import numpy as np
import pytest

import teir
from teir.frontend import einsum as einsum_module
from teir.frontend.split_call import SplitCall, add_parts


def replays() -> list[SplitCall]:
    return [e[2] for e in einsum_module._plans.values() if isinstance(e[2], SplitCall)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "subscripts, shapes",
    [
        ("i,i->", [(140_001,), (140_001,)]),  # odd: the rest is one more part
        ("k,kj->j", [(8192,), (8192, 512)]),
    ],
)
def test_repeated_split_calls_replay_on_new_arrays(subscripts, shapes, dtype):
    einsum_module.clear_plans()
    rng = np.random.default_rng(4)
    for round_ in range(3):  # the first call records, the others replay on new arrays
        arrays = [rng.integers(-8, 9, shape).astype(dtype) for shape in shapes]
        expected = np.einsum(subscripts, *[a.astype(np.int64) for a in arrays])
        result = teir.einsum(subscripts, *arrays, threads=2)
        np.testing.assert_array_equal(result, expected)
        assert np.ndim(result) == np.ndim(expected)
        start = rng.integers(-5, 6, np.shape(expected)).astype(dtype)
        out = np.array(start)
        teir.einsum(subscripts, *arrays, out=out, accumulate=True, relu=True, threads=2)
        np.testing.assert_array_equal(out, np.maximum(expected + start, 0))
        if round_ == 0:
            assert teir.einsum_plan(subscripts, *arrays, threads=2).split is not None
            found = replays()
            assert len(found) == 2  # without and with out
            assert any(len(call.runs) == 2 for call in found) == (shapes[0][0] % 2 == 1)


def test_the_replay_declines_what_its_key_does_not_fix():
    einsum_module.clear_plans()
    x, y = np.ones(140_000, np.float32), np.ones(140_000, np.float32)
    out = np.zeros((), np.float32)
    teir.einsum("i,i->", x, y, out=out, threads=2)
    (call,) = replays()
    assert call((x, y), out) is out and out == 140_000
    assert call((x, y), np.zeros((), np.float64)) is None  # another dtype
    frozen = np.zeros((), np.float32)
    frozen.flags.writeable = False
    assert call((x, y), frozen) is None
    # an out inside an operand: the full path
    assert call((x, y), x[:1].reshape(())) is None


def test_add_parts_sums_or_adds_every_part():
    parts = np.arange(12.0).reshape(3, 4)
    result = np.full(4, 100.0)
    add_parts(parts, result, accumulate=False)
    np.testing.assert_array_equal(result, parts.sum(axis=0))
    add_parts(parts[:1], result, accumulate=True)
    np.testing.assert_array_equal(result, parts.sum(axis=0) + parts[0])
    add_parts(parts[:1], result, accumulate=False)
    np.testing.assert_array_equal(result, parts[0])
