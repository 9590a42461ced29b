"""teir.einsum on contractions whose short batch label is the result's unit stride: the
smaller operand is expanded along a diagonal and the contraction runs as a summed label
and a free one (frontend/batch_diagonal.py), with NumPy's results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import teir
from helpers import uniform_arrays as _arrays
from teir.frontend.einsum import einsum_plan


def _tolerance(dtype: type) -> dict[str, float]:
    return {"rtol": 2e-4, "atol": 2e-4} if dtype is np.float32 else {"rtol": 1e-10, "atol": 1e-10}


CASES = [
    ("ijc,jc->ic", [(300, 300, 2), (300, 2)]),
    ("jc,ijc->ic", [(300, 3), (300, 300, 3)]),
    ("bhwc,hwc->bc", [(16, 32, 32, 3), (32, 32, 3)]),
    ("kc,knc->nc", [(64, 2), (64, 2000, 2)]),
    ("nkc,kc->nc", [(2000, 64, 3), (64, 3)]),
    ("ijc,ic->jc", [(300, 300, 2), (300, 2)]),
    ("...jc,jc->...c", [(4, 50, 300, 2), (300, 2)]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("subscripts", "shapes"), CASES)
def test_rewritten_contractions_equal_numpy(subscripts, shapes, dtype) -> None:
    arrays = _arrays(shapes, dtype)
    plan = einsum_plan(subscripts, *arrays, threads=2)
    assert plan.diagonal is not None, plan.explain()
    expected = np.einsum(subscripts, *arrays)
    np.testing.assert_allclose(teir.einsum(subscripts, *arrays), expected, **_tolerance(dtype))
    out = np.full(expected.shape, np.nan, dtype)
    for _ in range(2):  # the second call takes the cached per-call path
        teir.einsum(subscripts, *arrays, out=out)
        np.testing.assert_allclose(out, expected, **_tolerance(dtype))


def test_explain_shows_the_rewrite_and_the_contraction_that_runs() -> None:
    x, y = _arrays([(300, 300, 2), (300, 2)], np.float32)
    text = teir.contract_expression("ijc,jc->ic", x.shape, y.shape, dtype=np.float32).explain()
    assert "the batch label 'c' (2) is the result's unit stride" in text
    assert "operand 1 is expanded along a diagonal" in text
    assert "runs as abd,bdc->ac" in text  # c (d) summed in both, the batch a label of y's own


def test_accumulate_relu_and_strided_views() -> None:
    base = _arrays([(300, 600, 3), (600, 2, 3)], np.float64, seed=1)
    x, y = base[0][:, ::2, :], base[1][::2, 0, :]  # views: strided j in both operands
    expected = np.einsum("ijc,jc->ic", x, y)
    assert einsum_plan("ijc,jc->ic", x, y).diagonal is not None
    out = np.ones(expected.shape)
    teir.einsum("ijc,jc->ic", x, y, out=out, accumulate=True)
    np.testing.assert_allclose(out, expected + 1, rtol=1e-10)
    teir.einsum("ijc,jc->ic", x, y, out=out, relu=True)
    np.testing.assert_allclose(out, np.maximum(expected, 0), rtol=1e-10)


def test_repeated_labels_and_negative_strides() -> None:
    x, y = _arrays([(200, 200, 200, 2), (200, 2)], np.float32, seed=2)
    y = y[::-1]
    expected = np.einsum("iijc,jc->ic", x, y)
    assert einsum_plan("iijc,jc->ic", x, y).diagonal is not None
    np.testing.assert_allclose(teir.einsum("iijc,jc->ic", x, y), expected, rtol=2e-4, atol=2e-4)


def test_out_overlapping_an_operand_is_computed_aside() -> None:
    x, y = _arrays([(300, 300, 2), (300, 2)], np.float64, seed=3)
    expected = np.einsum("ijc,ic->jc", x, y.copy())
    assert einsum_plan("ijc,ic->jc", x, y).diagonal is not None
    teir.einsum("ijc,ic->jc", x, y, out=y)  # y is read and written
    np.testing.assert_allclose(y, expected, rtol=1e-10)


@pytest.mark.parametrize(
    ("subscripts", "shapes", "why"),
    [
        ("ijc,jc->ijc", [(300, 300, 2), (300, 2)], "nothing summed"),
        ("ijc,ijc->c", [(300, 300, 2), (300, 300, 2)], "operands alike in size"),
        ("ijc,jc->ic", [(20, 20, 2), (20, 2)], "too small"),
        ("ijc,jc->ic", [(300, 300, 16), (300, 16)], "a batch that fills a vector"),
        ("cij,jc->ic", [(3, 300, 300), (300, 3)], "the batch not the result's unit stride"),
        ("ijc,j->ic", [(300, 300, 2), (300,)], "no batch label"),
    ],
)
def test_other_contractions_keep_their_plan(subscripts, shapes, why) -> None:
    arrays = _arrays(shapes, np.float32)
    assert einsum_plan(subscripts, *arrays).diagonal is None, why
    np.testing.assert_allclose(
        teir.einsum(subscripts, *arrays), np.einsum(subscripts, *arrays), rtol=2e-4, atol=2e-4
    )


@st.composite
def _contractions(draw: st.DrawFn) -> tuple[str, list[np.ndarray], bool]:
    """A binary einsum with a batch label 'c' (2-7) innermost in both inputs and the output,
    a label of the larger operand's own (i) and a summed one (j), up to two more of any
    kind; random orders and sizes, either operand first."""
    kinds = {"c": "b", "i": "m", "j": "k"}
    for label in "kl"[: draw(st.integers(0, 2))]:
        kinds[label] = draw(st.sampled_from(["k", "m", "n", "b"]))
    sizes = {label: draw(st.integers(2, 9)) for label in kinds}
    sizes["i"], sizes["j"] = draw(st.integers(20, 300)), draw(st.integers(10, 100))
    sizes["c"] = draw(st.integers(2, 7))
    big = [x for x in kinds if kinds[x] in "kmb" and x != "c"]
    small = [x for x in kinds if kinds[x] in "knb" and x != "c"]
    out = [x for x in kinds if kinds[x] in "mnb" and x != "c"]
    terms = [draw(st.permutations(t)) for t in (big, small, out)]
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seed = draw(st.integers(0, 2**16))
    inputs = ["".join(terms[0]) + "c", "".join(terms[1]) + "c"]
    if draw(st.booleans()):
        inputs.reverse()
    subscripts = ",".join(inputs) + "->" + "".join(terms[2]) + "c"
    arrays = _arrays([tuple(sizes[x] for x in term) for term in inputs], dtype, seed)
    accumulate = draw(st.booleans())
    return subscripts, arrays, accumulate


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_contractions())
def test_generated_contractions_equal_numpy(case: tuple[str, list[np.ndarray], bool]) -> None:
    subscripts, arrays, accumulate = case
    event("rewritten" if einsum_plan(subscripts, *arrays).diagonal else "as planned")
    expected = np.einsum(subscripts, *arrays)
    out = np.ones(expected.shape, arrays[0].dtype)
    teir.einsum(subscripts, *arrays, out=out, accumulate=accumulate)
    tolerance = _tolerance(arrays[0].dtype.type)
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(
        out,
        expected + (1 if accumulate else 0),
        rtol=tolerance["rtol"] * 10,
        atol=tolerance["atol"] * 10 * scale,
    )


def test_tree_steps_with_such_a_batch_run_through_einsum() -> None:
    arrays = _arrays([(300, 300, 2), (300, 2), (300,)], np.float64, seed=4)
    expression = teir.contract_expression(
        "ijc,jc,i->ic", *(a.shape for a in arrays), dtype=np.float64
    )
    assert "teir.einsum expands an operand along a diagonal" in expression.explain()
    np.testing.assert_allclose(
        expression(*arrays), np.einsum("ijc,jc,i->ic", *arrays), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("af,aedbcf->bdfce", [(32, 3), (32, 25, 32, 3, 9, 3)]),
        ("ijc,jc->ci", [(300, 300, 2), (300, 2)]),
        ("ijkc,jc->cki", [(100, 60, 20, 2), (60, 2)]),
    ],
)
def test_a_batch_on_the_larger_operands_unit_stride_is_rewritten(subscripts, shapes) -> None:
    """The result's unit stride elsewhere: as the operands lie no kernel fits the larger one
    (a batch on its unit stride), which the plan would copy; the rewrite copies nothing of it."""
    arrays = _arrays(shapes, np.float32, seed=5)
    expected = np.einsum(subscripts, *arrays)
    out = np.zeros(expected.shape, np.float32)  # C order
    plan = einsum_plan(subscripts, *arrays, out=out)
    assert plan.diagonal is not None and "no kernel fits it as it lies" in plan.explain()
    teir.einsum(subscripts, *arrays, out=out)
    np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4)
