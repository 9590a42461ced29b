"""Elementwise products whose three tensors have their unit strides on three labels: one
input is copied into the result's layout, or the other input's where that one lacks a label
of the result (``teir.frontend.element_layout``)."""

from __future__ import annotations

import numpy as np
import pytest

import teir
from teir.frontend import einsum as einsum_module
from teir.frontend import element_layout
from teir.frontend.element_layout import copy_orders, memory_order, small_copies
from teir.frontend.fallback_call import FallbackCall


def c_strides(labels: str, sizes: dict[str, int]) -> dict[str, int]:
    strides, step = {}, 1
    for label in reversed(labels):
        strides[label] = step
        step *= sizes[label]
    return strides


SIZES = {"a": 1089, "b": 108, "c": 360}


def tensors(*terms: str) -> list[tuple[str, dict[str, int]]]:
    return [(term, c_strides(term, SIZES)) for term in terms]


def test_memory_order_sorts_by_stride_with_still_labels_outermost():
    sizes = {"a": 4, "b": 1, "c": 5}
    assert memory_order("abc", {"a": 1, "b": 0, "c": 4}, sizes) == "bca"
    assert memory_order("ac", {"a": 0, "c": 1}, sizes) == "ac"


def test_three_unit_labels_copy_the_smaller_input_into_the_results_layout():
    # in0 unit c, in1 unit a, out unit b: in1 (the tie's) copied into the result's order cab
    # (in0 then runs transposed on the scaling transposing kernel)
    assert copy_orders(tensors("bac", "bca", "cab"), SIZES, 4) == (None, "cab", None)
    # in0 the smaller: copied into the result's order (its own labels)
    sizes = dict(SIZES, d=3)
    terms = [("bac", c_strides("bac", sizes)), ("dbca", c_strides("dbca", sizes))]
    out = ("dcab", c_strides("dcab", sizes))
    assert copy_orders([*terms, out], sizes, 4) == ("cab", None, None)


def test_two_unit_labels_or_small_tensors_keep_the_nest():
    # out shares in0's unit stride: the nest serves both as they lie
    assert copy_orders(tensors("bac", "bca", "bac"), SIZES, 4) is None
    # a small input (under an eighth of the largest) stays in the caches
    sizes = dict(SIZES, a=2000)
    terms = [(t, c_strides(t, sizes)) for t in ("ba", "bca", "cab")]
    assert copy_orders(terms, sizes, 4) is None
    # all three large, but the copy would be below MIN_COPY_BYTES
    little = {"a": 20, "b": 30, "c": 40}
    terms = [(t, c_strides(t, little)) for t in ("bac", "bca", "cab")]
    assert copy_orders(terms, little, 8) is None


def test_the_copied_inputs_labels_missing_from_the_other_go_outermost():
    # in1 lacks the result's d: the copy takes in1's layout
    sizes = {"a": 600, "b": 100, "c": 300, "d": 2, "e": 3}
    in0 = ("dbac", c_strides("dbac", sizes))
    in1 = ("ebca", c_strides("ebca", sizes))
    out = ("decab", c_strides("decab", sizes))
    assert copy_orders([in0, in1, out], sizes, 4) == ("dbca", None, None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_three_way_product_runs_through_one_copy(dtype, monkeypatch):
    monkeypatch.setattr(element_layout, "MIN_COPY_BYTES", 1 << 16)
    einsum_module.clear_plans()
    rng = np.random.default_rng(7)
    a = rng.standard_normal((40, 30, 50)).astype(dtype)  # bac
    b = rng.standard_normal((30, 50, 40)).astype(dtype)  # acb
    expected = np.einsum("bac,acb->cba", a, b)
    plan = teir.einsum_plan("bac,acb->cba", a, b)
    assert plan.elementwise_copies and plan.canonical == (None, "cba", None)
    assert "transposing kernel" in plan.product.explain()
    assert "three labels" in plan.explain()
    np.testing.assert_allclose(teir.einsum("bac,acb->cba", a, b), expected, rtol=1e-6)
    out = np.ones((50, 40, 30), dtype)
    for _ in range(2):  # the second call replays the recorded steps
        out[...] = 1
        teir.einsum("bac,acb->cba", a, b, out=out, accumulate=True, relu=True)
        np.testing.assert_allclose(out, np.maximum(expected + 1, 0), rtol=1e-6, atol=1e-6)
    replays = [e[2] for e in einsum_module._plans.values() if isinstance(e[2], FallbackCall)]
    assert replays
    # a strided view of in1 and an out with negative strides
    view = np.ascontiguousarray(b[:, :, ::-1])[:, :, ::-1]
    reversed_out = np.zeros((50, 40, 30), dtype)[::-1]
    teir.einsum("bac,acb->cba", a, view, out=reversed_out)
    np.testing.assert_allclose(reversed_out, expected, rtol=1e-6)


def test_a_broadcast_input_counts_its_elements_in_memory():
    # in1 broadcast along c (stride 0), unit stride on a: 108 x 1089 elements in memory,
    # not 108 x 360 x 1089, so it is small and stays as it lies
    broadcast = ("bca", {"b": 1089, "c": 0, "a": 1})
    assert copy_orders([tensors("bac")[0], broadcast, tensors("cab")[0]], SIZES, 4) is None


def test_small_inputs_strided_along_the_results_unit_label_take_its_layout():
    sizes = {"a": 64, "b": 1024, "c": 192}
    # cb,a->bac: in0 runs along c (the result's unit label) 1024 apart; in1 lacks c
    terms = [("cb", c_strides("cb", sizes)), ("a", c_strides("a", sizes))]
    out = ("bac", c_strides("bac", sizes))
    assert small_copies([*terms, out], sizes) == ("bc", None, None)
    # both inputs strided along it (ac,ab->bca): both copied, each in the result's order
    sizes = {"a": 8, "b": 80, "c": 24576}
    terms = [("ac", c_strides("ac", sizes)), ("ab", c_strides("ab", sizes))]
    assert small_copies([*terms, ("bca", c_strides("bca", sizes))], sizes) == ("ca", "ba", None)
    # an input already along it, or broadcast along it (stride 0), stays as it lies
    sizes = {"a": 64, "b": 1024, "c": 192}
    terms = [("bc", c_strides("bc", sizes)), ("ca", {"c": 0, "a": 1})]
    assert small_copies([*terms, out], sizes) is None


def test_small_copies_need_a_large_result_and_small_inputs():
    sizes = {"a": 16, "b": 16, "c": 16}  # a result of 4096 elements: the nest as it lies
    terms = [("cb", c_strides("cb", sizes)), ("a", c_strides("a", sizes))]
    assert small_copies([*terms, ("bac", c_strides("bac", sizes))], sizes) is None
    # an input of more than SMALL_SHARE of the result's elements is no small input
    sizes = {"a": 4, "b": 1024, "c": 192}
    terms = [("cb", c_strides("cb", sizes)), ("a", c_strides("a", sizes))]
    assert small_copies([*terms, ("bac", c_strides("bac", sizes))], sizes) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_outer_product_copies_its_small_strided_input(dtype):
    einsum_module.clear_plans()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((192, 1024)).astype(dtype)  # cb
    y = rng.standard_normal(64).astype(dtype)  # a
    expected = np.einsum("cb,a->bac", x, y)
    out = np.zeros((1024, 64, 192), dtype)
    plan = teir.einsum_plan("cb,a->bac", x, y, out=out)
    assert plan.elementwise_copies == einsum_module.SMALL_COPIES
    assert plan.canonical == ("bc", None, None)
    assert "a small input lies a stride apart" in plan.explain()
    for _ in range(2):  # the second call replays the recorded steps
        out[...] = 1
        teir.einsum("cb,a->bac", x, y, out=out, accumulate=True, relu=True, threads=2)
        np.testing.assert_allclose(out, np.maximum(expected + 1, 0), rtol=1e-6, atol=1e-6)
    # a strided view of in0 and a new result
    view = np.ascontiguousarray(x[:, ::-1])[:, ::-1]
    np.testing.assert_allclose(teir.einsum("cb,a->bac", view, y), expected, rtol=1e-6)
