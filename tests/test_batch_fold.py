"""teir.einsum on contractions whose short batch label is the result's unit stride and
follows a summed label in both inputs (``ic,ic->c``): folded into one vector-long batch, the
groups summed by a second einsum (frontend/batch_fold.py), with NumPy's results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import teir
from helpers import uniform_arrays as _arrays
from teir.frontend.einsum import einsum_plan


def _close(got: np.ndarray, expected: np.ndarray, dtype: type) -> None:
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    tolerance = 1e-4 if dtype is np.float32 else 1e-11
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * scale)


CASES = [
    ("ic,ic->c", [(100_000, 2), (100_000, 2)]),
    ("ijc,ijc->c", [(200, 300, 3), (200, 300, 3)]),
    ("ijc,ijc->ic", [(300, 400, 3), (300, 400, 3)]),
    ("jkic,jkic->kc", [(4, 5, 3000, 2), (4, 5, 3000, 2)]),
    ("...ic,...ic->...c", [(3, 20_000, 4), (3, 20_000, 4)]),
    # prime summed sizes: whole rows of the fold, the rest contracted as it lies and added
    ("ic,ic->c", [(99_991, 2), (99_991, 2)]),
    ("ijc,ijc->ic", [(300, 401, 3), (300, 401, 3)]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("subscripts", "shapes"), CASES)
def test_folded_contractions_equal_numpy(subscripts, shapes, dtype) -> None:
    arrays = _arrays(shapes, dtype)
    plan = einsum_plan(subscripts, *arrays, threads=2)
    assert plan.fold is not None, plan.explain()
    expected = np.einsum(subscripts, *arrays)
    _close(teir.einsum(subscripts, *arrays), expected, dtype)
    out = np.full(expected.shape, np.nan, dtype)
    for _ in range(2):  # the second call takes the cached per-call path
        teir.einsum(subscripts, *arrays, out=out)
        _close(out, expected, dtype)


def test_explain_shows_the_fold_and_the_folded_contraction() -> None:
    text = teir.contract_expression("ic,ic->c", (100_000, 2), (100_000, 2)).explain()
    assert "'i' steps over it in both inputs: the two are folded into" in text
    assert "contracted as ab,ab->b into a temporary, whose groups cb->b adds" in text


def test_a_prime_summed_size_folds_whole_rows_and_adds_the_rest() -> None:
    plan = einsum_plan("ic,ic->c", *_arrays([(99_991, 2), (99_991, 2)], np.float32))
    assert plan.fold is not None and plan.fold.rest == 99_991 % plan.fold.groups > 0
    assert f"its last {plan.fold.rest} indices of 'i' are contracted as they lie" in (
        plan.explain()
    )
    x, y = _arrays([(300, 401, 3), (300, 401, 3)], np.float64, seed=7)
    expected = np.einsum("ijc,ijc->ic", x, y)
    out = np.ones(expected.shape)
    teir.einsum("ijc,ijc->ic", x, y, out=out, accumulate=True, relu=True)
    _close(out, np.maximum(expected + 1, 0), np.float64)


def test_accumulate_relu_and_views() -> None:
    c, d = _arrays([(50_000, 3), (50_000, 3)], np.float64)
    assert einsum_plan("ic,ic->c", c, d).fold is not None
    out = np.ones(3)
    teir.einsum("ic,ic->c", c, d, out=out, accumulate=True)
    _close(out, np.einsum("ic,ic->c", c, d) + 1, np.float64)
    teir.einsum("ic,ic->c", c, -d, out=out, relu=True)
    _close(out, np.maximum(np.einsum("ic,ic->c", c, -d), 0), np.float64)
    base = _arrays([(60_000, 4), (60_000, 4)], np.float64, seed=2)
    a, b = base[0][::2, :2], base[1][::2, 2:]  # rows 8 elements apart: not over the batch
    assert einsum_plan("ic,ic->c", a, b).fold is None
    _close(teir.einsum("ic,ic->c", a, b), np.einsum("ic,ic->c", a, b), np.float64)
    e, f = (v[::-1] for v in _arrays([(50_000, 2), (50_000, 2)], np.float32, seed=3))
    assert einsum_plan("ic,ic->c", e, f).fold is not None  # copied forwards first
    _close(teir.einsum("ic,ic->c", e, f), np.einsum("ic,ic->c", e, f), np.float32)


@pytest.mark.parametrize(
    ("subscripts", "shapes", "why"),
    [
        ("ic,ic->c", [(500, 2), (500, 2)], "too small"),
        ("ic,ic->ic", [(100_000, 2), (100_000, 2)], "nothing summed"),
        ("ic,ic->c", [(100_000, 16), (100_000, 16)], "a batch that fills a vector"),
    ],
)
def test_other_contractions_keep_their_plan(subscripts, shapes, why) -> None:
    arrays = _arrays(shapes, np.float32)
    assert einsum_plan(subscripts, *arrays).fold is None, why
    _close(teir.einsum(subscripts, *arrays), np.einsum(subscripts, *arrays), np.float32)


@st.composite
def _contractions(draw: st.DrawFn) -> tuple[str, list[np.ndarray], bool, bool]:
    """Operands alike: batch 'c' (2-7) innermost in both inputs and the output, summed 'k'
    right outside it in both, up to two more labels of any kind, random orders of the rest."""
    kinds = {}
    for label in "ij"[: draw(st.integers(0, 2))]:
        kinds[label] = draw(st.sampled_from(["k", "m", "n", "b"]))
    sizes = {label: draw(st.integers(1, 6)) for label in kinds}
    sizes["k"] = draw(st.sampled_from([1601, 20_011, 30_000, 40_000, 65_537]))
    sizes["c"] = draw(st.integers(2, 7))
    left = [x for x in kinds if kinds[x] in "kmb"]
    right = [x for x in kinds if kinds[x] in "knb"]
    out = [x for x in kinds if kinds[x] in "mnb"]
    terms = [draw(st.permutations(t)) for t in (left, right, out)]
    inputs = ["".join(terms[0]) + "kc", "".join(terms[1]) + "kc"]
    subscripts = ",".join(inputs) + "->" + "".join(terms[2]) + "c"
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    arrays = _arrays(
        [tuple(sizes[x] for x in term) for term in inputs], dtype, draw(st.integers(0, 99))
    )
    return subscripts, arrays, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_contractions())
def test_generated_contractions_equal_numpy(case: tuple[str, list[np.ndarray], bool, bool]) -> None:
    subscripts, arrays, accumulate, relu = case
    event("folded" if einsum_plan(subscripts, *arrays).fold else "as planned")
    expected = np.einsum(subscripts, *arrays) + (1 if accumulate else 0)
    out = np.ones(expected.shape, arrays[0].dtype)
    teir.einsum(subscripts, *arrays, out=out, accumulate=accumulate, relu=relu)
    _close(out, np.maximum(expected, 0) if relu else expected, arrays[0].dtype.type)


def test_tree_steps_with_such_a_batch_run_through_einsum() -> None:
    arrays = _arrays([(100_000, 2), (100_000, 2), (2,)], np.float64, seed=4)
    expression = teir.contract_expression(
        "ic,ic,c->c", *(a.shape for a in arrays), dtype=np.float64
    )
    assert "teir.einsum folds it with the summed label over it" in expression.explain()
    _close(expression(*arrays), np.einsum("ic,ic,c->c", *arrays), np.float64)
