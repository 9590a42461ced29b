"""Binary einsums whose batch axis has unit stride in all three tensors run as lane-batched
contractions (``teir.codegen.lanes``): results against NumPy for every tail (rows, columns,
K blocks, a partial batch vector), outer batch axes, permuted and strided layouts,
accumulate and ReLU, and the cases that must stay on the copying fallback."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import teir
from teir.codegen.lanes import KC_MAX
from teir.codegen.target import Target
from teir.frontend import einsum as einsum_module
from teir.frontend.einsum_parse import parse
from teir.frontend.einsum_plan import unscheduled_fields
from teir.frontend.lane_plan import lane_spec
from teir.runtime.lane_operation import compile_lanes


def _operands(rng, subscripts, sizes, dtype):
    inputs = subscripts.split("->")[0].split(",")
    return [(rng.random([sizes[c] for c in term]) - 0.3).astype(dtype) for term in inputs]


def _expected(subscripts, arrays):
    return np.einsum(subscripts, *[a.astype(np.float64) for a in arrays])


def _tolerance(dtype, k):
    return (1e-6 if dtype == np.float32 else 1e-13) * max(k, 1) ** 0.5 * 10


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("subscripts", "sizes"),
    [
        ("ijb,jkb->ikb", {"i": 24, "j": 16, "k": 30, "b": 32}),
        # tails everywhere: rows (not a multiple of 4), columns (of 6), K (of 4)
        ("ijb,jkb->ikb", {"i": 13, "j": 7, "k": 11, "b": 16}),
        # K over several blocks (a loop over the middle ones), M over several jobs
        ("ijb,jkb->ikb", {"i": 9, "j": 3 * KC_MAX + 5, "k": 8, "b": 16}),
        ("ijb,jkb->ikb", {"i": 150, "j": 20, "k": 7, "b": 16}),
        # a partial last batch vector (masked loads and stores)
        ("ijb,jkb->ikb", {"i": 10, "j": 9, "k": 14, "b": 31}),
        ("ijb,jkb->ikb", {"i": 10, "j": 9, "k": 14, "b": 15}),
        # permuted M/N/K layouts and an outer batch axis with its own strides
        ("jib,kjb->kib", {"i": 11, "j": 10, "k": 9, "b": 32}),
        ("pijb,jpkb->kpib", {"p": 3, "i": 7, "j": 6, "k": 5, "b": 16}),
        # two batch labels fused into one lane axis
        ("ijbc,jkbc->ikbc", {"i": 5, "j": 6, "k": 7, "b": 2, "c": 8}),
    ],
)
def test_lane_batched_einsums_match_numpy(dtype, threads, subscripts, sizes):
    rng = np.random.default_rng(3)
    arrays = _operands(rng, subscripts, sizes, dtype)
    plan = teir.einsum_plan(subscripts, *arrays, threads=threads)
    assert plan.lanes is not None
    assert "lane-batched contraction" in plan.explain()
    expected = _expected(subscripts, arrays)
    tolerance = _tolerance(dtype, sizes.get("j", 1))
    for _ in range(2):  # the second call takes the per-call path
        result = teir.einsum(subscripts, *arrays, threads=threads)
        np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
        arrays = [a + 0.5 for a in arrays]
        expected = _expected(subscripts, arrays)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_batched_outer_products_run_the_nest_and_the_lane_kernel_computes_them(dtype, threads):
    # no K: the one-element nest, its batch loop innermost and vectorized whole, writes each
    # output line at once (batched matrix-vector products, with no N or no M, are summed
    # with the batch innermost too: test_optimizer); the lane kernel, still taken where no
    # kernel fits, computes them as well
    subscripts, sizes = "ib,kb->ikb", {"i": 9, "k": 14, "b": 32}
    rng = np.random.default_rng(3)
    a, b = _operands(rng, subscripts, sizes, dtype)
    plan = teir.einsum_plan(subscripts, a, b, threads=threads)
    assert plan.lanes is None and "GEMM on one element" in plan.explain()
    expected = _expected(subscripts, [a, b])
    tolerance = _tolerance(dtype, 1)
    np.testing.assert_allclose(
        teir.einsum(subscripts, a, b, threads=threads), expected, rtol=tolerance, atol=tolerance
    )
    parsed = parse(subscripts, [2, 2])
    spec = lane_spec(unscheduled_fields(parsed, [a, b]), threads, Target.host())
    assert spec is not None and spec.k == 1
    out = np.full([sizes[x] for x in "ikb"], np.nan, dtype)
    compile_lanes(spec, threads).run_addresses(a.ctypes.data, b.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_accumulate_and_relu_into_a_strided_out(dtype):
    rng = np.random.default_rng(4)
    sizes = {"i": 9, "j": 2 * KC_MAX + 3, "k": 13, "b": 16}
    a, b = _operands(rng, "ijb,jkb->ikb", sizes, dtype)
    # out: every other row and column of a larger array, the batch still contiguous; the
    # elements in between must stay untouched
    base = rng.random((18, 26, 16)).astype(dtype)
    out = base[::2, ::2]
    before = base.copy()
    product = _expected("ijb,jkb->ikb", [a, b])
    tolerance = _tolerance(dtype, sizes["j"])
    for relu in (False, True):
        out[...] = before[::2, ::2]
        assert teir.einsum_plan("ijb,jkb->ikb", a, b, out=out, accumulate=True).lanes
        teir.einsum("ijb,jkb->ikb", a, b, out=out, accumulate=True, relu=relu)
        expected = before[::2, ::2] + product
        if relu:
            expected = np.maximum(expected, 0)
        np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)
        untouched = np.ones(base.shape, bool)
        untouched[::2, ::2] = False
        assert np.array_equal(base[untouched], before[untouched])


@pytest.mark.parametrize(("dtype", "batch"), [(np.float32, 8), (np.float32, 24), (np.float64, 4)])
def test_a_batch_that_fills_half_width_vectors_uses_them_where_they_are_free(dtype, batch):
    rng = np.random.default_rng(10)
    sizes = {"i": 11, "j": 13, "k": 7, "b": batch}
    arrays = _operands(rng, "ijb,jkb->ikb", sizes, dtype)
    plan = teir.einsum_plan("ijb,jkb->ikb", *arrays)
    target = Target.host()
    full = target.lanes(np.dtype(dtype).itemsize)
    if target.half_width_is_free:
        assert plan.lanes is not None and plan.lanes.spec.lanes == full // 2
    elif batch % full:
        assert plan.lanes is None or plan.lanes.spec.lanes == full
    tolerance = _tolerance(dtype, sizes["j"])
    np.testing.assert_allclose(
        teir.einsum("ijb,jkb->ikb", *arrays),
        _expected("ijb,jkb->ikb", arrays),
        rtol=tolerance,
        atol=tolerance,
    )


def test_out_overlapping_an_input_is_computed_into_a_temporary():
    rng = np.random.default_rng(5)
    a = rng.random((8, 8, 16)).astype(np.float32)
    b = rng.random((8, 8, 16)).astype(np.float32)
    expected = _expected("ijb,jkb->ikb", [a, b])
    teir.einsum("ijb,jkb->ikb", a, b, out=a)
    np.testing.assert_allclose(a, expected, rtol=1e-5)


@pytest.mark.parametrize(
    ("subscripts", "sizes", "dtype"),
    [
        # 5 of 16 lanes: the copying fallback fills its kernels better
        ("ijb,jkb->ikb", {"i": 9, "j": 7, "k": 6, "b": 5}, np.float32),
        # 6 of 8 FP64 lanes (or of 2 x 4 at half width): the partial vector costs a full one
        ("ijb,jkb->ikb", {"i": 9, "j": 7, "k": 6, "b": 6}, np.float64),
        # two M axes that do not fuse
        ("iljb,jkb->likb", {"i": 4, "l": 3, "j": 5, "k": 6, "b": 16}, np.float32),
    ],
)
def test_cases_that_stay_on_the_copying_fallback(subscripts, sizes, dtype):
    rng = np.random.default_rng(6)
    arrays = _operands(rng, subscripts, sizes, dtype)
    plan = teir.einsum_plan(subscripts, *arrays)
    assert plan.lanes is None
    assert plan.canonical is not None
    np.testing.assert_allclose(
        teir.einsum(subscripts, *arrays), _expected(subscripts, arrays), rtol=1e-4
    )


def test_a_batch_axis_without_unit_stride_in_every_tensor_is_not_lanes():
    rng = np.random.default_rng(7)
    a = rng.random((6, 5, 32)).astype(np.float32)
    b = rng.random((5, 7, 64)).astype(np.float32)[:, :, ::2]  # batch stride 2 in in1
    plan = teir.einsum_plan("ijb,jkb->ikb", a, b)
    assert plan.lanes is None
    np.testing.assert_allclose(
        teir.einsum("ijb,jkb->ikb", a, b), _expected("ijb,jkb->ikb", [a, b]), rtol=1e-5
    )


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    m=st.integers(1, 14),
    n=st.integers(1, 14),
    k=st.integers(1, 110),
    vectors=st.integers(1, 3),
    short=st.integers(0, 1),
    order=st.permutations("ijb"),
    threads=st.integers(1, 3),
    accumulate=st.booleans(),
    relu=st.booleans(),
)
def test_generated_lane_einsums(dtype, m, n, k, vectors, short, order, threads, accumulate, relu):
    lanes = 16 if dtype == np.float32 else 8
    batch = vectors * lanes - short
    in0 = "".join(order).replace("b", "") + "b"
    subscripts = f"{in0},jkb->ikb"
    sizes = {"i": m, "j": k, "k": n, "b": batch}
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    arrays = _operands(rng, subscripts, sizes, dtype)
    out = rng.random((m, n, batch)).astype(dtype)
    expected = _expected(subscripts, arrays) + (out if accumulate else 0)
    if relu:
        expected = np.maximum(expected, 0)
    teir.einsum(subscripts, *arrays, out=out, threads=threads, accumulate=accumulate, relu=relu)
    tolerance = _tolerance(dtype, k)
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)


def teardown_module() -> None:
    einsum_module.clear_plans()


@pytest.mark.parametrize(
    ("subscripts", "swapped"), [("ikb,klb->ilb", False), ("klb,ikb->ilb", True)]
)
def test_the_output_axis_further_apart_becomes_the_kernels_rows(subscripts, swapped):
    # out[i, l, b]: i lies further apart than l, so i's operand is packed as the kernel's
    # rows whichever operand it is
    rng = np.random.default_rng(8)
    sizes = {"i": 13, "k": 10, "l": 9, "b": 16}
    arrays = _operands(rng, subscripts, sizes, np.float32)
    plan = teir.einsum_plan(subscripts, *arrays, threads=2)
    assert plan.lanes is not None and plan.lanes.spec.swapped is swapped
    assert plan.lanes.spec.m == sizes["i"]
    tolerance = _tolerance(np.float32, sizes["k"])
    np.testing.assert_allclose(
        teir.einsum(subscripts, *arrays, threads=2),
        _expected(subscripts, arrays),
        rtol=tolerance,
        atol=tolerance,
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_multi_operand_einsums_keep_the_batch_innermost(dtype):
    # every pairwise contraction runs as a lane-batched one on the layouts as they are: the
    # tree inserts no permutation (copy) nodes
    subscripts = "ijb,jkb,klb->ilb"
    sizes = {"i": 8, "j": 9, "k": 10, "l": 11, "b": 16}
    rng = np.random.default_rng(9)
    arrays = _operands(rng, subscripts, sizes, dtype)
    expression = teir.contract_expression(subscripts, *[a.shape for a in arrays], dtype=dtype)
    text = expression.explain()
    assert "permutation" not in text
    assert text.count("lane-batched contraction") == 2
    tolerance = _tolerance(dtype, 100)
    expected = _expected(subscripts, arrays)
    np.testing.assert_allclose(expression(*arrays), expected, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(
        teir.einsum(subscripts, *arrays), expected, rtol=tolerance, atol=tolerance
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threads_take_whole_blocks_of_rows(dtype):
    """With several batch vectors, the rows are cut so that no thread's slice of the jobs
    (batch vectors fastest) begins inside a block of rows, where two threads would read the
    block's lines and write the output lines its vectors share; one thread keeps the
    largest block."""
    lanes = Target.host().lanes(np.dtype(dtype).itemsize)
    rng = np.random.default_rng(3)
    sizes = {"i": 96, "j": 40, "k": 24, "b": 2 * lanes}
    arrays = _operands(rng, "ijb,jkb->ikb", sizes, dtype)
    expression = teir.contract_expression(
        "ijb,jkb->ikb", *[a.shape for a in arrays], dtype=dtype, threads=2
    )
    text = expression.explain()
    assert "jobs: 4 (batch vector x block of 48 rows)" in text, text
    result = expression(*arrays)
    np.testing.assert_allclose(
        result,
        _expected("ijb,jkb->ikb", arrays),
        rtol=_tolerance(dtype, 40),
        atol=_tolerance(dtype, 40),
    )
    one = teir.contract_expression(
        "ijb,jkb->ikb", *[a.shape for a in arrays], dtype=dtype, threads=1
    )
    assert "jobs: 2 (batch vector x block of 96 rows)" in one.explain()
