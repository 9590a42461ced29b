"""Elementwise products that write an input transposed run their tiles on one transposing
kernel that scales as it goes (``teir.lower.products``), not a loop around a one-element
kernel: the plans, and results equal to NumPy's for every layout, view and option."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import teir
from teir.lower.nest import lower
from teir.optimizer import optimize


def _operands(subscripts: str, sizes: dict[str, int], dtype, seed: int = 3):
    rng = np.random.default_rng(seed)
    inputs = subscripts.split("->")[0].split(",")
    return [rng.standard_normal([sizes[x] for x in op]).astype(dtype) for op in inputs]


def _transposing(plan) -> bool:
    return "transposing kernel" in plan.explain()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_scaled_transpose_runs_on_the_transposing_kernel(dtype):
    """``dge,d->egd`` into an ``out``: d is the output's unit stride and in0's slowest axis;
    the plan runs tiles of d x e through the kernel, ReLU folded in. (A new result may be
    laid out in the input's order instead, no transpose at all.)"""
    sizes = {"d": 200, "g": 24, "e": 40}
    big, scale = _operands("dge,d->egd", sizes, dtype)
    expected = np.einsum("dge,d->egd", big.astype(np.float64), scale.astype(np.float64))
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(
        teir.einsum("dge,d->egd", big, scale, threads=2), expected, rtol=tolerance
    )
    out = np.full((40, 24, 200), np.nan, dtype)
    plan = teir.einsum_plan("dge,d->egd", big, scale, out=out, relu=True, threads=2)
    assert _transposing(plan)
    teir.einsum("dge,d->egd", big, scale, out=out, relu=True, threads=2)
    np.testing.assert_allclose(out, np.maximum(expected, 0), rtol=tolerance)
    # accumulating reads the output: the one-element nest adds into it instead
    teir.einsum("dge,d->egd", big, scale, out=out, accumulate=True, threads=2)
    np.testing.assert_allclose(out, np.maximum(expected, 0) + expected, rtol=tolerance)


CASES = [
    ("ab,a->ba", {"a": 37, "b": 45}),
    ("ba,b->ab", {"a": 1000, "b": 301}),
    ("acb,a->abc", {"a": 5, "c": 70, "b": 33}),  # the output's unit stride on an M axis
    ("abc,c->cab", {"a": 17, "b": 33, "c": 19}),
    ("ij,ji->ij", {"i": 50, "j": 61}),  # the other input as large, along the rows
    ("c,bca->abc", {"a": 20, "b": 30, "c": 40}),  # the large input second
    ("dcba,ca->abcd", {"a": 17, "b": 3, "c": 5, "d": 300}),
]


@pytest.mark.parametrize(("subscripts", "sizes"), CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_products_equal_numpy(subscripts, sizes, dtype):
    operands = _operands(subscripts, sizes, dtype)
    expected = np.einsum(subscripts, *[op.astype(np.float64) for op in operands])
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for threads in (1, 2):
        result = teir.einsum(subscripts, *operands, threads=threads)
        np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
    out = np.zeros(expected.shape, dtype)
    assert _transposing(teir.einsum_plan(subscripts, *operands, out=out, threads=2))
    teir.einsum(subscripts, *operands, out=out, threads=2)
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)


def test_views_and_misaligned_outputs():
    """Strided views of the large input, a reversed small one and an output that is a
    misaligned slice of a larger buffer: the kernel reads and writes only the views."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((130, 3, 90)).astype(np.float32)
    big = base[::2, 1, 3:80]  # 65 x 77, rows 540 elements apart
    small = rng.standard_normal(130).astype(np.float32)[::-2]
    buffer = np.full(77 * 66 + 5, np.nan, np.float32)
    out = buffer[1 : 1 + 77 * 66].reshape(77, 66)[:, :65]
    assert _transposing(teir.einsum_plan("ab,a->ba", big, small, out=out, threads=2))
    teir.einsum("ab,a->ba", big, small, out=out, threads=2)
    np.testing.assert_allclose(out, np.einsum("ab,a->ba", big, small), rtol=1e-6)
    written = np.zeros(buffer.size, bool)
    written[1 + np.arange(77 * 66).reshape(77, 66)[:, :65]] = True
    assert np.isnan(buffer[~written]).all()


@pytest.mark.parametrize("seed", range(6))
def test_random_products_without_k(seed):
    """Random elementwise products (no summed label) of 2-5 labels in random layouts."""
    rng = np.random.default_rng(100 + seed)
    labels = "abcde"[: rng.integers(2, 6)]
    sizes = {x: int(rng.choice([1, 2, 3, 7, 16, 17, 33])) for x in labels}
    big = "".join(rng.permutation(list(labels)))
    small = "".join(x for x in rng.permutation(list(labels)) if rng.random() < 0.5) or big[0]
    output = "".join(rng.permutation(list(labels)))
    subscripts = f"{big},{small}->{output}"
    for dtype in (np.float32, np.float64):
        operands = _operands(subscripts, sizes, dtype, seed)
        for pair in (operands, operands[::-1]):
            swapped = subscripts if pair is operands else f"{small},{big}->{output}"
            expected = np.einsum(swapped, *[op.astype(np.float64) for op in pair])
            result = teir.einsum(swapped, *pair, threads=2)
            np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def _product_config(sizes: dict[str, int], relu: bool = False) -> dict:
    """``dge,d->egd`` as an unscheduled configuration: d a C axis, g and e M axes."""
    d, g, e = sizes["d"], sizes["g"], sizes["e"]
    return {
        "data_type": "FP32",
        "prim_first": "Zero",
        "prim_main": "GEMM",
        "prim_last": "ReLU" if relu else "None",
        "dim_types": ["C", "M", "M"],
        "exec_types": ["seq"] * 3,
        "dim_sizes": [d, g, e],
        "strides_in0": [g * e, e, 1],
        "strides_in1": [1, 0, 0],
        "strides_out": [1, d, g * d],
    }


def test_the_optimizer_keeps_the_tile_innermost_and_unshared():
    config = optimize(_product_config({"d": 800, "g": 512, "e": 24}), threads=2)
    loops = [a for a, t in enumerate(config.exec_types) if t.value != "prim"]
    inner = loops[-2:]
    assert all(config.exec_types[a].value == "seq" for a in inner)
    assert [config.strides_out[inner[0]], config.strides_in0[inner[1]]] == [1, 1]
    nest = lower(config)
    assert nest.transposed is not None and nest.transposed.depth == len(nest.loops) - 2
    assert any(loop.parallel for loop in nest.loops[: nest.transposed.depth])


def test_a_config_with_a_first_relu_keeps_its_one_element_nest():
    """Only a Zero fused into the kernel (each output element written once) lets the tile
    run transposed; a last ReLU is folded into the kernel."""
    fields = _product_config({"d": 64, "g": 4, "e": 32}, relu=True)
    assert lower(optimize(fields, threads=1)).transposed is not None
    fields = dict(fields, prim_first="ReLU", prim_last="None")
    assert lower(optimize(fields, threads=1)).transposed is None


def test_every_pair_of_unit_axes_of_a_three_label_product():
    sizes = {"a": 9, "b": 20, "c": 17}
    for big in itertools.permutations("abc"):
        for output in itertools.permutations("abc"):
            subscripts = f"{''.join(big)},{big[0]}->{''.join(output)}"
            operands = _operands(subscripts, sizes, np.float64)
            expected = np.einsum(subscripts, *operands)
            np.testing.assert_allclose(
                teir.einsum(subscripts, *operands, threads=2), expected, rtol=1e-12
            )


def test_short_rows_keep_the_one_element_nest():
    """Rows (the output's unit stride) of fewer than two vectors would leave the kernel's
    edge blocks most of the work: such products keep their one-element nest."""
    big, small = _operands("bd,db->bd", {"b": 4096, "d": 8}, np.float32)
    out = np.empty((4096, 8), np.float32)
    assert not _transposing(teir.einsum_plan("bd,db->bd", big, small, out=out, threads=2))
    teir.einsum("bd,db->bd", big, small, out=out, threads=2)
    np.testing.assert_allclose(out, big * small.T, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_new_result_follows_the_large_input(dtype):
    """Without ``out``, an elementwise product's result is laid out in its large input's
    order (NumPy's order "K"), not written transposed."""
    big, small = _operands("ag,g->ga", {"a": 64, "g": 2048}, dtype)
    plan = teir.einsum_plan("ag,g->ga", big, small, threads=2)
    assert plan.memory_order == (1, 0) and not _transposing(plan)
    result = teir.einsum("ag,g->ga", big, small, threads=2)
    assert result.T.flags.c_contiguous
    np.testing.assert_allclose(result, (big * small).T, rtol=1e-6)
    assert teir.einsum_plan("ag,g->ga", big, small, order="C", threads=2).memory_order is None
    # a partner input as large as a sixth of it, stepping across its lines along the
    # large one's unit stride, would be gathered: the listed layout, the input transposed
    sizes = {"e": 6, "b": 63, "a": 64, "g": 2, "c": 15}
    big, partner = _operands("gaecb,cbga->bcega", sizes, dtype)
    plan = teir.einsum_plan("gaecb,cbga->bcega", big, partner, threads=2)
    assert plan.memory_order is None and _transposing(plan)


def test_a_product_in_its_inputs_layout_runs_along_the_unit_stride():
    """``dhcfbg,bcf->hbdgfc`` into an output laid out like in0: the kernel runs along the
    unit-stride g (25), not along the fused d x h (whose elements lie 38400 apart, which a
    kernel of one row would write one lane at a time)."""
    sizes = {"g": 25, "b": 32, "f": 24, "d": 3, "c": 2, "h": 64}
    big, small = _operands("dhcfbg,bcf->hbdgfc", sizes, np.float32)
    out = np.empty(big.shape, np.float32).transpose(1, 4, 0, 5, 3, 2)
    text = teir.einsum_plan("dhcfbg,bcf->hbdgfc", big, small, out=out, threads=2).explain()
    assert "brgemm_f32_25x1x1" in text, text
    teir.einsum("dhcfbg,bcf->hbdgfc", big, small, out=out, threads=2)
    np.testing.assert_allclose(out, np.einsum("dhcfbg,bcf->hbdgfc", big, small), rtol=1e-6)
