"""teir.compile on contractions whose layouts fit no GEMM kernel: they run as teir.einsum on
views of the same buffers (frontend/config_views.py) instead of the generic scalar nest."""

from __future__ import annotations

import json
from math import prod

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import teir
from helpers import operands
from teir import reference
from teir.cli.main import main
from teir.frontend.config_views import MIN_FLOPS, ViewedOperation, einsum_form
from teir.runtime.operation import compile as compile_nest

ROLES = {"c": ("in0", "in1", "out"), "m": ("in0", "out"), "n": ("in1", "out"), "k": ("in0", "in1")}


def _fields(
    sizes: dict[str, int],
    orders: tuple[str, str, str],
    dtype: str = "FP32",
    first: str = "Zero",
    last: str = "None",
    main_prim: str = "GEMM",
) -> dict:
    """Unscheduled fields of a contraction over the labels of ``sizes`` (c/m/n/k and, for
    BRGEMM, a second K label "r"), each tensor dense in its label order (innermost last)."""
    labels = list(sizes)
    types = {"c": "C", "m": "M", "n": "N", "k": "K", "r": "K"}

    def dense(order: str) -> list[int]:
        return [
            prod(sizes[x] for x in order[order.index(label) + 1 :]) if label in order else 0
            for label in labels
        ]

    return {
        "data_type": dtype,
        "prim_first": first,
        "prim_main": main_prim,
        "prim_last": last,
        "dim_types": [types[label] for label in labels],
        "exec_types": ["seq"] * len(labels),
        "dim_sizes": [sizes[label] for label in labels],
        "strides_in0": dense(orders[0]),
        "strides_in1": dense(orders[1]),
        "strides_out": dense(orders[2]),
    }


def _check(config: teir.Config, op: teir.Operation, seed: int = 0) -> None:
    in0, in1, out = operands(config, seed)
    expected = reference.dense_result(config, in0, in1, out)
    got = out.copy()
    op(in0, in1, got)
    result = reference.compare(config, out, got, expected)
    assert result.ok, result.message


@pytest.mark.parametrize(
    "orders",
    [
        ("mkc", "nkc", "mnc"),  # the batch innermost everywhere: lane-batched
        ("mkc", "cnk", "cmn"),  # in0's unit stride on the batch
        ("cmk", "nkc", "cmn"),  # in1's
        ("cmk", "cnk", "mnc"),  # the output's
        ("ckm", "knc", "cnm"),
    ],
)
@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
def test_layouts_without_a_kernel_run_as_an_einsum(orders, dtype):
    fields = _fields({"c": 16, "m": 40, "n": 24, "k": 48}, orders, dtype)
    config = teir.optimize(fields, threads=2)
    op = teir.compile(config, threads=2)
    assert isinstance(op, ViewedOperation) and isinstance(op, teir.Operation)
    text = op.explain()
    assert f"teir.einsum('{op.form.subscripts}')" in text and "generic scalar primitive" in text
    assert "# einsum " in text  # the einsum's own plan follows
    assert "einsum" in repr(op)
    # the nest it replaces would have run the generic primitive
    assert "generic" in compile_nest(config, 2).explain()
    _check(config, op)


@pytest.mark.parametrize(
    "first, last", [("Zero", "None"), ("None", "None"), ("Zero", "ReLU"), ("None", "ReLU")]
)
def test_first_and_last_primitives_carry_over(first, last):
    fields = _fields(
        {"c": 8, "m": 32, "n": 32, "k": 32}, ("mkc", "nkc", "mnc"), "FP64", first, last
    )
    config = teir.Config(**dict(fields, exec_types=["seq", "prim", "prim", "prim"]))
    form = einsum_form(config)
    assert form is not None
    assert (form.accumulate, form.relu) == (first == "None", last == "ReLU")
    op = teir.compile(config, threads=1)
    assert isinstance(op, ViewedOperation)
    _check(config, op, seed=3)


def test_brgemm_with_a_user_schedule_and_padded_strides():
    sizes = {"c": 8, "m": 24, "n": 24, "k": 16, "r": 4}
    fields = _fields(sizes, ("rmkc", "rnkc", "mnc"), "FP32", main_prim="BRGEMM")
    fields["strides_out"] = [1, 24 * 9, 9, 0, 0]  # rows of out 9 elements apart (1 unused)
    config = teir.Config(**dict(fields, exec_types=["seq", "prim", "prim", "prim", "prim"]))
    op = teir.compile(config, threads=2)
    assert isinstance(op, ViewedOperation)
    _check(config, op, seed=1)


def test_partial_tile_rests_each_run_their_way():
    fields = _fields({"c": 4, "m": 97, "n": 1601, "k": 300}, ("mkc", "nkc", "mnc"), "FP64")
    config = teir.optimize(fields, threads=2)
    assert config.rests
    op = teir.compile(config, threads=2)
    assert isinstance(op, ViewedOperation)
    assert "# partial tiles: rest 0" in op.explain()
    _check(config, op, seed=2)


def test_what_stays_on_the_nest():
    small = teir.Config(
        **dict(
            _fields({"c": 2, "m": 8, "n": 8, "k": 8}, ("mkc", "nkc", "mnc")),
            exec_types=["seq", "prim", "prim", "prim"],
        )
    )
    assert small.flops < MIN_FLOPS
    assert not isinstance(teir.compile(small), ViewedOperation)  # too little work
    relu_first = teir.Config(
        **dict(
            _fields({"c": 16, "m": 40, "n": 24, "k": 48}, ("mkc", "nkc", "mnc"), first="ReLU"),
            exec_types=["seq", "prim", "prim", "prim"],
        )
    )
    assert einsum_form(relu_first) is None  # an einsum has no first ReLU
    op = teir.compile(relu_first, threads=2)
    assert not isinstance(op, ViewedOperation)
    _check(relu_first, op)
    fitting = teir.optimize(_fields({"c": 16, "m": 40, "n": 24, "k": 48}, ("cmk", "cnk", "cmn")))
    assert not isinstance(teir.compile(fitting), ViewedOperation)  # a kernel fits


def test_a_k_axis_no_input_moves_along_stays_on_the_nest():
    # sum over k of in0 * in1 where neither depends on k: K times the product, which an
    # einsum (that would drop the label) cannot say
    config = teir.Config(
        data_type="FP32",
        prim_first="Zero",
        prim_main="GEMM",
        prim_last="None",
        dim_types=["C", "M", "N", "K"],
        exec_types=["seq", "prim", "prim", "prim"],
        dim_sizes=[16, 64, 64, 5],
        strides_in0=[1, 16, 0, 0],
        strides_in1=[1, 0, 16, 0],
        strides_out=[1, 1024, 16, 0],
    )
    assert config.flops >= MIN_FLOPS and einsum_form(config) is None
    op = teir.compile(config, threads=2)
    assert not isinstance(op, ViewedOperation)
    _check(config, op)


@pytest.mark.parametrize("first, last", [("None", "None"), ("Zero", "ReLU")])
def test_an_output_that_aliases_itself_stays_on_the_nest(first, last):
    # the C and M axes both of output stride 1: elements updated in sequence (the reference
    # executor's semantics), which an einsum's overwrite would not reproduce
    config = teir.Config(
        data_type="FP64",
        prim_first=first,
        prim_main="GEMM",
        prim_last=last,
        dim_types=["C", "M", "N", "K"],
        exec_types=["seq", "prim", "prim", "prim"],
        dim_sizes=[8, 64, 64, 64],
        strides_in0=[1, 8, 0, 512],
        strides_in1=[1, 0, 8, 512],
        strides_out=[1, 1, 64, 0],
    )
    assert einsum_form(config) is None
    op = teir.compile(config, threads=2)
    assert not isinstance(op, ViewedOperation)
    in0, in1, out = operands(config)
    expected = out.copy()
    reference.execute(config, in0, in1, expected)
    op(in0, in1, out)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_bad_arguments_are_refused_before_any_memory_is_touched():
    config = teir.optimize(_fields({"c": 16, "m": 40, "n": 24, "k": 48}, ("mkc", "nkc", "mnc")))
    op = teir.compile(config, threads=2)
    in0, in1, out = operands(config)
    with pytest.raises(teir.ExecutionError, match="out"):
        op(in0, in1, out[:-1])
    with pytest.raises(teir.ExecutionError, match="float32"):
        op(in0.astype(np.float64), in1, out)
    with pytest.raises(teir.ExecutionError, match="overlaps"):
        op(in0, in1, in0)


def test_cli_run_check_and_explain(tmp_path, capsys):
    config = teir.optimize(_fields({"c": 16, "m": 40, "n": 24, "k": 48}, ("cmk", "nkc", "mnc")))
    path = tmp_path / "batch_inner.json"
    path.write_text(json.dumps(config.to_dict()))
    assert main(["run", str(path), "--check", "--repeat", "1"]) == 0
    assert "check against np.einsum: OK" in capsys.readouterr().out
    assert main(["explain", str(path)]) == 0
    assert "teir.einsum('" in capsys.readouterr().out


@st.composite
def _unfitting(draw) -> tuple[dict, int]:
    """A contraction config (C/M/N/K and maybe more axes) with some tensor's unit stride on a
    C axis, padded strides and broadcast inputs now and then, random first/last primitives."""
    types = ["C", "M", "N", "K", *draw(st.lists(st.sampled_from("CMNK"), max_size=2))]
    types = draw(st.permutations(types))
    sizes = [draw(st.sampled_from([1, 3, 5, 8, 13, 16, 24, 32, 48])) for _ in types]
    assume(prod(sizes) <= 1_500_000)  # the nest's generic primitive runs the rest
    batch = draw(st.sampled_from([i for i, t in enumerate(types) if t == "C"]))
    roles = {"C": ("in0", "in1", "out"), "M": ("in0", "out"), "N": ("in1", "out")}
    roles["K"] = ("in0", "in1")
    strides = {}
    for name in ("in0", "in1", "out"):
        axes = draw(st.permutations([i for i, t in enumerate(types) if name in roles[t]]))
        if draw(st.booleans()):
            axes = [i for i in axes if i != batch] + [batch]
        stride, values = 1, [0] * len(types)
        for i in reversed(axes):
            values[i] = stride
            stride *= sizes[i] + draw(st.sampled_from([0, 0, 0, 1]))
        strides[name] = values
    for name in ("in0", "in1"):  # now and then an input broadcast along a C or K axis
        broadcast = [i for i, t in enumerate(types) if t in "CK" and strides[name][i]]
        if broadcast and draw(st.integers(0, 3)) == 0:
            strides[name][draw(st.sampled_from(broadcast))] = 0
    k_axes = [i for i, t in enumerate(types) if t == "K"]
    if draw(st.integers(0, 5)) == 0:  # a K axis neither input moves along
        strides["in0"][k_axes[0]] = strides["in1"][k_axes[0]] = 0
    fields = {
        "data_type": draw(st.sampled_from(["FP32", "FP64"])),
        "prim_first": draw(st.sampled_from(["Zero", "None"])),
        "prim_main": "GEMM",
        "prim_last": draw(st.sampled_from(["None", "ReLU"])),
        "dim_types": types,
        "exec_types": ["seq"] * len(types),
        "dim_sizes": sizes,
        "strides_in0": strides["in0"],
        "strides_in1": strides["in1"],
        "strides_out": strides["out"],
    }
    return fields, draw(st.integers(1, 3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_unfitting())
def test_generated_unfitting_layouts_match_the_reference(case):
    fields, threads = case
    try:
        config = teir.optimize(fields, threads=threads)
    except teir.ValidationError:
        assume(False)  # e.g. an output that aliases itself
    op = teir.compile(config, threads=threads)
    event("as an einsum" if isinstance(op, ViewedOperation) else "as a nest")
    _check(config, op)
