"""Repeated einsums through the copying fallback replay their recorded steps on addresses:
every result must equal NumPy's for new arrays of the same layout, and anything the cache
key does not fix must still send the call down the full path."""

from __future__ import annotations

import numpy as np
import pytest

import teir
from teir.frontend import copy_fallback
from teir.frontend import einsum as einsum_module
from teir.frontend.fallback_call import FallbackCall


def _entry(subscripts, operands, out=None, threads=1, accumulate=False, relu=False):
    key = einsum_module._key(subscripts, operands, out, accumulate, relu, threads)
    return einsum_module._plans[key][2]


def _strided(rng, shape, dtype, order="C"):
    """A non-contiguous view of ``shape`` (every other element of a larger array)."""
    base = rng.random((*shape[:-1], 2 * shape[-1])).astype(dtype)
    return np.asarray(base[..., ::2], order=order)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("with_out", [False, True])
def test_repeated_fallback_calls_replay_on_new_arrays(dtype, threads, with_out):
    rng = np.random.default_rng(1)
    shape_a, shape_b = (9, 7, 5), (7, 11, 5)
    subscripts = "ijb,jkb->ikb"
    views = [(_strided(rng, shape_a, dtype), _strided(rng, shape_b, dtype)) for _ in range(3)]
    out = np.empty((9, 11, 5), dtype) if with_out else None
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for call, (a, b) in enumerate(views):
        result = teir.einsum(subscripts, a, b, out=out, threads=threads)
        if with_out:
            assert result is out
        np.testing.assert_allclose(result, np.einsum(subscripts, a, b), rtol=tolerance)
        replay = _entry(subscripts, (a, b), out, threads)
        assert isinstance(replay, FallbackCall), f"call {call}"
        assert len(replay.steps) >= 2  # copies and the contraction


def test_the_replay_alone_answers(monkeypatch):
    rng = np.random.default_rng(2)
    a, b = np.asfortranarray(rng.random((4, 6, 5))), np.asfortranarray(rng.random((4, 5, 3)))
    teir.einsum("bij,bjk->bik", a, b, threads=1)
    assert isinstance(_entry("bij,bjk->bik", (a, b)), FallbackCall)
    monkeypatch.setattr(einsum_module, "_through_canonical", None)
    a2, b2 = np.asfortranarray(rng.random((4, 6, 5))), np.asfortranarray(rng.random((4, 5, 3)))
    np.testing.assert_allclose(
        teir.einsum("bij,bjk->bik", a2, b2, threads=1), np.einsum("bij,bjk->bik", a2, b2)
    )


def test_relu_and_accumulate_through_the_fallback():
    rng = np.random.default_rng(3)
    for _ in range(3):
        a, b = rng.standard_normal((6, 5, 3)), rng.standard_normal((5, 7, 3))
        expected = np.maximum(np.einsum("ijb,jkb->ikb", a, b), 0)
        np.testing.assert_allclose(teir.einsum("ijb,jkb->ikb", a, b, relu=True), expected)
        out = rng.standard_normal((6, 7, 3))
        before = out.copy()
        teir.einsum("ijb,jkb->ikb", a, b, out=out, accumulate=True)
        np.testing.assert_allclose(out, before + np.einsum("ijb,jkb->ikb", a, b))


def test_what_the_key_does_not_fix_sends_calls_down_the_full_path():
    rng = np.random.default_rng(4)
    a, b = rng.random((6, 6, 3)), rng.random((6, 6, 3))
    out = np.empty((6, 6, 3))
    teir.einsum("ijb,jkb->ikb", a, b, out=out)
    assert isinstance(_entry("ijb,jkb->ikb", (a, b), out, None), FallbackCall)
    # the same layouts, with out an operand: computed as if it were not
    for index in (0, 1):
        operands = [rng.random((6, 6, 3)), rng.random((6, 6, 3))]
        expected = np.einsum("ijb,jkb->ikb", *operands)
        target = operands[index]
        assert teir.einsum("ijb,jkb->ikb", *operands, out=target) is target
        np.testing.assert_allclose(target, expected)
    # in0 read where it lies while the contraction writes out directly
    subscripts = "bij,kjb->bik"
    # (large enough that the kernels store some of out before they read all of in0)
    first, second = rng.random((3, 96, 96)), rng.random((96, 96, 3))
    plan = teir.einsum_plan(subscripts, first, second, out=np.empty((3, 96, 96)))
    assert plan.canonical is not None and plan.canonical[0] is None and plan.canonical[2] is None
    teir.einsum(subscripts, first, second, out=np.empty((3, 96, 96)))
    assert isinstance(_entry(subscripts, (first, second), first, None), FallbackCall)
    expected = np.einsum(subscripts, first, second)
    assert teir.einsum(subscripts, first, second, out=first) is first
    np.testing.assert_allclose(first, expected)
    frozen = np.empty((6, 6, 3))
    frozen.flags.writeable = False
    with pytest.raises(teir.TeirError, match="read-only"):
        teir.einsum("ijb,jkb->ikb", a, b, out=frozen)
    with pytest.raises(teir.TeirError, match="dtype"):
        teir.einsum("ijb,jkb->ikb", a, b, out=np.empty((6, 6, 3), np.float32))
    mixed = teir.einsum("ijb,jkb->ikb", a, b.astype(np.float32))
    assert mixed.dtype == np.float64
    np.testing.assert_allclose(mixed, np.einsum("ijb,jkb->ikb", a, b.astype(np.float32)))


def test_one_array_as_both_operands_is_computed_without_a_replay():
    rng = np.random.default_rng(5)
    for _ in range(3):
        a = rng.random((5, 5, 3))
        np.testing.assert_allclose(
            teir.einsum("ijb,jkb->ikb", a, a, threads=1), np.einsum("ijb,jkb->ikb", a, a)
        )
    # roots overlapping when recorded: which operand a step read would be ambiguous
    assert _entry("ijb,jkb->ikb", (a, a)) is None
    b = rng.random((5, 5, 3))
    np.testing.assert_allclose(
        teir.einsum("ijb,jkb->ikb", a, b, threads=1), np.einsum("ijb,jkb->ikb", a, b)
    )


def test_chunked_fallback_replays_each_chunk(monkeypatch):
    # force chunks on small tensors: every step of every chunk lies at its own offset
    monkeypatch.setattr(copy_fallback, "CHUNK_ABOVE_BYTES", 1024)
    monkeypatch.setattr(copy_fallback, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(copy_fallback, "CHUNK_RUN_BYTES", 8)
    monkeypatch.setattr(copy_fallback, "CHUNK_REREAD_BYTES", 1 << 20)
    einsum_module.clear_plans()
    rng = np.random.default_rng(6)
    subscripts = "cabe,abde->cdba"
    shapes = [(6, 5, 4, 3), (5, 4, 7, 3)]
    for _ in range(3):
        a, b = (rng.random(shape) for shape in shapes)
        plan = teir.einsum_plan(subscripts, a, b, threads=1)
        assert plan.canonical is not None
        np.testing.assert_allclose(
            teir.einsum(subscripts, a, b, threads=1), np.einsum(subscripts, a, b)
        )
    replay = _entry(subscripts, (a, b))
    assert isinstance(replay, FallbackCall)
    einsum_module.clear_plans()
