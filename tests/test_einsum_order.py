"""``order``: the memory layout of a new einsum result ("C", "F", "A", or teir's choice "K")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import teir
from teir.frontend.result_layout import (
    LAYOUT_GAIN,
    LAYOUT_MIN_SAVING,
    candidate_orders,
    result_order,
)

RNG = np.random.default_rng(11)


def _operands(subscripts, sizes, dtype=np.float32):
    inputs = subscripts.split("->")[0].split(",")
    return [RNG.uniform(-1, 1, [sizes[c] for c in term]).astype(dtype) for term in inputs]


def _innermost(array):
    """The axis of the smallest stride."""
    return int(np.argmin([abs(s) for s in array.strides]))


def test_k_lays_the_result_out_for_the_kernel_and_c_keeps_the_listed_order():
    # the listed result's unit stride would be e (3 elements): its kernels fill 3 of 16 lanes
    subscripts = "ebda,fa->fbde"
    a, b = _operands(subscripts, {"e": 3, "b": 40, "d": 32, "a": 3, "f": 31})
    expected = np.einsum(subscripts, a, b)
    for _call in (1, 2):  # planned, then through the cached direct path
        result = teir.einsum(subscripts, a, b)
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
        assert not result.flags.c_contiguous and _innermost(result) != 3
        assert result.base is not None and result.base.flags.c_contiguous  # one new array
    listed = teir.einsum(subscripts, a, b, order="C")
    np.testing.assert_allclose(listed, expected, rtol=1e-5, atol=1e-5)
    assert listed.flags.c_contiguous
    expression = teir.contract_expression(subscripts, a.shape, b.shape, dtype=np.float32)
    for _call in (1, 2):
        result = expression(a, b)
        assert not result.flags.c_contiguous
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    kept = teir.contract_expression(subscripts, a.shape, b.shape, dtype=np.float32, order="C")
    assert kept(a, b).flags.c_contiguous


def test_k_keeps_the_listed_order_where_it_fits_the_kernels_and_for_small_results():
    a, b = _operands("ik,kj->ij", {"i": 128, "k": 64, "j": 96})
    assert teir.einsum("ik,kj->ij", a, b).flags.c_contiguous
    small = _operands("ebda,fa->fbde", {"e": 3, "b": 4, "d": 4, "a": 3, "f": 5})
    assert teir.einsum("ebda,fa->fbde", *small).flags.c_contiguous
    assert teir.einsum("ij->ji", RNG.uniform(size=(64, 80))).flags.c_contiguous  # one operand


def test_k_lays_out_a_small_result_of_large_operands():
    # 1020 elements summed over 482 K of in1 (the listed order, of unit stride on a, fills two
    # lanes of a kernel; relaid, its time falls 2.5-5x)
    subscripts = "abg,gbch->hca"
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (2, 15, 63)), rng.uniform(-1, 1, (63, 15, 255, 2))
    result = teir.einsum(subscripts, a, b)
    assert not result.flags.c_contiguous
    assert teir.einsum(subscripts, a, b, order="C").flags.c_contiguous
    np.testing.assert_allclose(result, np.einsum(subscripts, a, b), rtol=1e-12, atol=1e-12)


def test_k_lays_out_sums_whose_listed_result_leaves_one_lane_per_kernel():
    # listed, the result's unit stride (g) lies along neither input's: each element is a
    # one-by-one kernel tile, one chain of FMAs over K read with stride 1600 (0.59 ms); laid
    # out hg, the inputs' unit stride h is the result's too (0.09 ms)
    subscripts = "fdgh,fgdh->hg"
    rng = np.random.default_rng(4)
    a, b = rng.uniform(-1, 1, (8, 63, 25, 32)), rng.uniform(-1, 1, (8, 25, 63, 32))
    a, b = a.astype(np.float32), b.astype(np.float32)
    result = teir.einsum(subscripts, a, b)
    assert not result.flags.c_contiguous
    expected = np.einsum(subscripts, a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_f_and_a_orders(count):
    subscripts = {1: "ijk->kji", 2: "ijk,kl->jil", 3: "ij,jk,kl->li"}[count]
    sizes = {"i": 6, "j": 5, "k": 4, "l": 7}
    arrays = _operands(subscripts, sizes, np.float64)
    expected = np.einsum(subscripts, *arrays)
    fortran = teir.einsum(subscripts, *arrays, order="F")
    np.testing.assert_allclose(fortran, expected, rtol=1e-12)
    assert fortran.flags.f_contiguous
    as_c = teir.einsum(subscripts, *arrays, order="A")
    assert as_c.flags.c_contiguous  # C-ordered operands
    as_f = teir.einsum(subscripts, *[np.asfortranarray(a) for a in arrays], order="A")
    np.testing.assert_allclose(as_f, expected, rtol=1e-12)
    assert as_f.flags.f_contiguous


def test_f_order_through_the_copying_fallback_and_its_replay():
    # a batch label of unit stride in the result fits no kernel: copies run it
    subscripts = "adb,acd->bca"
    a, b = _operands(subscripts, {"a": 9, "b": 7, "c": 6, "d": 5}, np.float64)
    expected = np.einsum(subscripts, a, b)
    for _call in (1, 2):
        result = teir.einsum(subscripts, a, b, order="F")
        np.testing.assert_allclose(result, expected, rtol=1e-12)
        assert result.flags.f_contiguous


def test_k_spares_copies_where_the_listed_result_fits_no_kernel():
    # listed, the result's unit stride is on a batch label (a): copies ran it; laid out by K,
    # a kernel writes it where it lies
    subscripts = "cabe,abde->cdba"
    a, b = _operands(subscripts, {"a": 3, "b": 40, "c": 16, "d": 8, "e": 9}, np.float64)
    assert "# no kernel layout fits" in teir.einsum_plan(subscripts, a, b, order="C").explain()
    assert "# no kernel layout fits" not in teir.einsum_plan(subscripts, a, b).explain()
    result = teir.einsum(subscripts, a, b)
    np.testing.assert_allclose(result, np.einsum(subscripts, a, b), rtol=1e-12)
    assert not result.flags.c_contiguous


def test_k_lays_out_a_result_no_order_fits_for_the_fewest_copies():
    # no result order fits a kernel as the operands lie (in1's unit stride is on the batch
    # d): the listed one copies the large in0 (its M labels b, a in the result's order), the
    # order edbac only the small in1, which the result layout is priced by
    subscripts = "dfbac,efd->edabc"
    sizes = {"a": 7, "b": 128, "c": 8, "d": 50, "e": 4, "f": 4}
    a, b = _operands(subscripts, sizes)
    listed = teir.einsum_plan(subscripts, a, b, order="C")
    assert listed.canonical is not None and listed.canonical[0] is not None
    chosen = teir.einsum_plan(subscripts, a, b)
    assert chosen.memory_order is not None
    assert chosen.canonical is not None and chosen.canonical[0] is None
    result = teir.einsum(subscripts, a, b)
    np.testing.assert_allclose(result, np.einsum(subscripts, a, b), rtol=1e-5, atol=1e-5)


def test_a_bad_order_is_refused():
    a = np.ones((3, 4))
    with pytest.raises(teir.EinsumError, match="order must be 'C', 'F', 'A' or 'K'"):
        teir.einsum("ij,jk->ik", a, a.T, order="X")
    with pytest.raises(teir.EinsumError, match="order must be"):
        teir.contract_expression("ij,jk->ik", (3, 4), (4, 3), order="c")


class _Op:
    def __init__(self, labels, strides):
        self.labels, self.strides, self.array = list(labels), strides, np.empty(0)


def test_candidates_group_the_labels_by_role_in_the_operands_memory_order():
    first = _Op("ebda", {"e": 76800, "b": 384, "d": 3, "a": 1})
    second = _Op("fa", {"f": 3, "a": 1})
    orders = candidate_orders([first, second], list("fbde"))
    assert orders[0] == (0, 1, 2, 3)  # the listed order first
    labels = {"".join("fbde"[i] for i in order) for order in orders}
    assert {"ebdf", "febd"} <= labels and len(orders) == len(set(orders))


def test_another_layout_only_where_it_costs_clearly_less():
    first, second = _Op("ik", {"i": 64, "k": 1}), _Op("kj", {"k": 64, "j": 1})
    sizes = {"i": 64, "j": 64, "k": 64}
    listed = {"i": 64, "j": 1}

    def price(cost_of_other, listed_cost=10.0 * LAYOUT_MIN_SAVING, listed_fits=True):
        return lambda strides: (
            (listed_cost, listed_fits) if strides == listed else (cost_of_other * listed_cost, True)
        )

    operands, output = [first, second], list("ij")
    assert result_order("K", operands, output, sizes, price(LAYOUT_GAIN * 1.01)) is None
    assert result_order("K", operands, output, sizes, price(LAYOUT_GAIN * 0.99)) == (1, 0)
    assert result_order("C", operands, output, sizes, price(0.1)) is None
    assert result_order("F", operands, output, sizes, price(2.0)) == (1, 0)
    # a tenth of the cost, but a saving too small to pay for the view on every call
    assert result_order("K", operands, output, sizes, price(0.1, LAYOUT_MIN_SAVING)) is None
    # a listed order that no kernel fits as it lies (priced with its copies) yields to any
    # cheaper one, however small the gain; not to a dearer one
    unfit = 10.0 * LAYOUT_MIN_SAVING
    assert result_order("K", operands, output, sizes, price(0.8, listed_fits=False)) == (1, 0)
    assert result_order("K", operands, output, sizes, price(1.01, unfit, False)) is None


@st.composite
def binary_einsums(draw):
    letters = "abcdef"
    count = draw(st.integers(3, 5))
    labels = letters[:count]
    roles = draw(st.lists(st.sampled_from("CMNK"), min_size=count, max_size=count))
    first = [x for x, r in zip(labels, roles) if r in "CMK"]
    second = [x for x, r in zip(labels, roles) if r in "CNK"]
    output = [x for x, r in zip(labels, roles) if r in "CMN"]
    first, second, output = (draw(st.permutations(term)) for term in (first, second, output))
    sizes = {x: draw(st.integers(2, 14)) for x in labels}
    subscripts = f"{''.join(first)},{''.join(second)}->{''.join(output)}"
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    order = draw(st.sampled_from("CFAK"))
    return subscripts, sizes, dtype, order


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(binary_einsums())
def test_generated_einsums_in_every_order_equal_numpy(case):
    subscripts, sizes, dtype, order = case
    arrays = _operands(subscripts, sizes, dtype)
    expected = np.einsum(subscripts, *arrays)
    tolerance = 2e-4 if dtype == np.float32 else 1e-11
    for _call in (1, 2):
        result = teir.einsum(subscripts, *arrays, order=order)
        np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
        if order in "CA":
            assert np.asarray(result).flags.c_contiguous
        elif order == "F":
            assert np.asarray(result).flags.f_contiguous


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_k_streams_a_large_input_beside_a_small_one(dtype):
    """``heb,h->be``: memory-bound, a 16 MB (FP32) input beside a vector; "K" lays the result
    out with the large input's unit stride b innermost (a vector-matrix product streaming
    its rows), which the kernel cost model alone would not choose."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((80, 64, 776)).astype(dtype)
    x = rng.standard_normal(80).astype(dtype)
    plan = teir.einsum_plan("heb,h->be", a, x, threads=2)
    assert plan.memory_order == (1, 0)
    result = teir.einsum("heb,h->be", a, x, threads=2)
    assert result.shape == (776, 64) and result.strides[0] == result.itemsize
    expected = np.einsum("heb,h->be", a.astype(np.float64), x.astype(np.float64))
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
    # C keeps the listed order
    listed = teir.einsum("heb,h->be", a, x, threads=2, order="C")
    assert listed.flags.c_contiguous
    np.testing.assert_allclose(listed, expected, rtol=tolerance, atol=tolerance)


def test_k_does_not_stream_short_runs_small_inputs_or_equal_partners():
    """No streaming layout where the large input's unit-stride run is shorter than a line,
    where it has under 1 MiB, or where the other input is not much smaller."""
    from teir.frontend import result_layout

    rng = np.random.default_rng(8)
    short = rng.standard_normal((4096, 96, 3)).astype(np.float32)  # f of 3 innermost
    x = rng.standard_normal(4096).astype(np.float32)
    assert teir.einsum_plan("hef,h->fe", short, x, threads=2).memory_order is None
    np.testing.assert_allclose(
        teir.einsum("hef,h->fe", short, x, threads=2),
        np.einsum("hef,h->fe", short, x),
        rtol=1e-3,
        atol=1e-3,
    )
    assert result_layout.STREAMING_MIN_BYTES > 64 * 1024
    small = rng.standard_normal((8, 16, 64)).astype(np.float32)
    assert teir.einsum_plan("heb,h->be", small, x[:8], threads=2).memory_order is None


@pytest.mark.parametrize("memory", ["edabc", "edbac", "ebacd", "cabde", "dceab"])
def test_copies_order_the_result_labels_as_out_lies(memory):
    # copies made for a kernel list the result labels of each role (batch d, rows a b c,
    # columns e) as the result lies in memory, so that they fuse with its own axes (as
    # listed, a copy of in0 in "dfabc" beside an out laid out edbac leaves the kernel 8 rows
    # of M where it could have 7168)
    subscripts = "dfbac,efd->edabc"
    sizes = {"a": 7, "b": 12, "c": 8, "d": 5, "e": 4, "f": 4}
    a, b = _operands(subscripts, sizes)
    output = subscripts.split("->")[1]
    perm = [output.index(label) for label in memory]
    out = np.zeros([sizes[x] for x in memory], np.float32).transpose(np.argsort(perm))
    plan = teir.einsum_plan(subscripts, a, b, out=out)
    assert "".join(plan.out_memory) == memory
    assert plan.canonical is not None
    for order in plan.canonical:
        for role in ("d", "abc", "e"):
            if order is not None:
                in_memory = [x for x in memory if x in role and x in order]
                assert [x for x in order if x in role] == in_memory
    teir.einsum(subscripts, a, b, out=out)
    np.testing.assert_allclose(out, np.einsum(subscripts, a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("share", "follows"), [("1M", True), ("64M", False)])
def test_k_follows_a_large_input_of_short_unit_runs_beyond_half_the_l3_share(share, follows):
    # an elementwise product whose large input's unit-stride label is short (b 28, under two
    # FP32 vectors): its new result follows that input's order where the input outgrows
    # half this process's share of L3 (read in order once instead of in runs of 112 bytes),
    # not within it
    from conftest import pinned_machine

    subscripts = "ba,cab->acb"
    sizes = {"a": 64, "b": 28, "c": 400}  # in1 2.9 MB
    a, b = _operands(subscripts, sizes)
    with pinned_machine("znver4", f"L1=32K,L2=1M,L3=64M,L3share={share}"):
        result = teir.einsum(subscripts, a, b)
        np.testing.assert_allclose(result, np.einsum(subscripts, a, b), rtol=1e-6)
        # in in1's order c, a, b: b innermost, then a
        in_order = result.strides[2] < result.strides[0] < result.strides[1]
        assert in_order is follows


@pytest.mark.parametrize(
    ("subscripts", "share", "follows"),
    [
        ("dacb,b->cda", "1M", True),  # summing 3 per element: in0's order d, a, c
        ("dacb,b->cda", "64M", False),  # within half the L3 share: the listed order
    ],
)
def test_k_follows_a_large_input_summed_over_a_few_elements(subscripts, share, follows):
    # a product summing only a few elements per result element, all in its large input:
    # memory-bound, its new result follows that input's order beyond half the L3 share (as
    # listed, in0 would be read across rows a page or more apart on every step of the
    # result's unit stride: FP64 dacb,b->cda 100 MB, 17.4 -> 6.9 ms)
    from conftest import pinned_machine

    sizes = {"a": 64, "b": 3, "c": 4 if "bc," in subscripts else 96, "d": 48}
    a, b = _operands(subscripts, sizes)
    with pinned_machine("znver4", f"L1=32K,L2=1M,L3=64M,L3share={share}"):
        result = teir.einsum(subscripts, a, b)
        np.testing.assert_allclose(result, np.einsum(subscripts, a, b), rtol=1e-5, atol=1e-6)
        output = subscripts.split("->")[1]
        lying = sorted(output, key=lambda x: -result.strides[output.index(x)])
        large = subscripts.split(",")[0]
        in_order = lying == sorted(output, key=large.index)
        assert in_order is follows, (lying, output)


def test_only_few_summed_elements_of_the_large_input_set_its_order():
    from conftest import pinned_machine
    from teir.frontend.einsum_plan import operand
    from teir.frontend.result_layout import _few_summed_order

    def lying(labels, sizes):  # an FP64 input of these labels, C order (pages left untouched)
        return operand(np.empty([sizes[x] for x in labels]), tuple(labels), 0)

    sizes = {"a": 256, "b": 3, "c": 512, "d": 32}
    small = {"a": 16, "b": 3, "c": 32, "d": 8}
    with pinned_machine("znver4", "L1=32K,L2=1M,L3=32M,L3share=12M"):
        large = lying("dacb", sizes)
        assert _few_summed_order(large, {"b"}, "cda", sizes) == (1, 2, 0)  # d, a, c
        # summing 12 per element: not few
        assert _few_summed_order(large, {"b", "e"}, "cda", {**sizes, "e": 4}) is None
        # a summed label the large input lacks
        assert _few_summed_order(lying("dac", sizes), {"b"}, "cda", sizes) is None
        # listed along the large input's unit stride already
        assert _few_summed_order(lying("dabc", sizes), {"b"}, "dac", sizes) is None
        # within half this process's L3 share
        assert _few_summed_order(lying("dacb", small), {"b"}, "cda", small) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("accumulate", "relu"), [(False, False), (True, True)])
def test_a_small_result_is_computed_along_the_large_inputs_unit_stride(dtype, accumulate, relu):
    # x @ A over a, into an out whose unit stride is b, not A's c: computed as bc (A read in
    # whole rows) and permuted into place, accumulate and ReLU applied there
    subscripts = "abc,a->cb"
    sizes = {"a": 64, "b": 6, "c": 4096}
    a, x = _operands(subscripts, sizes, dtype)
    out = RNG.uniform(-1, 1, (sizes["c"], sizes["b"])).astype(dtype)
    plan = teir.einsum_plan(subscripts, a, x, out=out)
    assert plan.canonical == (None, None, "bc")
    assert "streams in long runs" in plan.explain()
    expected = np.einsum(subscripts, a, x) + (out if accumulate else 0)
    expected = np.maximum(expected, 0) if relu else expected
    for _call in (1, 2):  # the second call replays the recorded steps
        target = out.copy()
        teir.einsum(subscripts, a, x, out=target, accumulate=accumulate, relu=relu)
        tolerance = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(target, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    ("subscripts", "sizes", "dtype"),
    [
        ("adb,acd->bca", {"a": 24, "b": 40, "c": 36, "d": 20}, np.float32),
        ("adb,acd->bca", {"a": 24, "b": 40, "c": 36, "d": 20}, np.float64),
        ("cfbd,eabf->adec", {"a": 12, "b": 16, "c": 100, "d": 32, "e": 64, "f": 5}, np.float32),
    ],
)
def test_k_lays_a_new_result_out_as_the_copies_compute_it(monkeypatch, subscripts, sizes, dtype):
    """A new result (order K) whose copies compute it in another order than its own is laid
    out in that order instead of being permuted into place, with the layout choice held at
    the listed order, as when a chosen layout's kernel turns out not to fit: ``adb,acd->bca``
    (a batch label at the result's unit stride fits no kernel) then needs no copies at all;
    ``cfbd,eabf->adec`` still copies both inputs, but a result laid out as their product's
    is not copied again (``einsum_plan.dense_in``). order="C" still permutes."""
    from teir.frontend import einsum_plan
    from teir.frontend.einsum import clear_plans

    def listed(order, *args):
        return order if isinstance(order, tuple) else None

    monkeypatch.setattr(einsum_plan, "result_order", listed)
    clear_plans()
    a, b = _operands(subscripts, sizes, dtype)
    expected = np.einsum(subscripts, a, b)
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    plan = teir.einsum_plan(subscripts, a, b)
    assert plan.canonical is None or plan.canonical[2] is None
    assert plan.memory_order is not None and "permuted into place" not in plan.explain()
    for _call in (1, 2):
        result = teir.einsum(subscripts, a, b)
        np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
        assert not result.flags.c_contiguous
    listed_plan = teir.einsum_plan(subscripts, a, b, order="C")
    assert "permuted into place" in listed_plan.explain()
    result = teir.einsum(subscripts, a, b, order="C")
    assert result.flags.c_contiguous
    np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
    clear_plans()
