"""Validation: every rule, all violations at once, no other exception for any input."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import teir
from helpers import EXAMPLES
from strategies import broken_configs, configs, json_values

LAB = json.loads((EXAMPLES / "lab1_gemm.json").read_text())


def rules_of(data) -> set[str]:
    with pytest.raises(teir.ValidationError) as info:
        teir.Config.from_dict(data)
    return set(info.value.rules)


def test_validation_error_is_a_value_error_and_a_teir_error():
    assert issubclass(teir.ValidationError, ValueError)
    assert issubclass(teir.ValidationError, teir.TeirError)


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "invalid").glob("*.json")), ids=lambda p: p.stem
)
def test_each_invalid_example_is_rejected_naming_its_rule(path):
    expected = {
        "D_ge_1": "D>=1",
        "size_ge_1": "size>=1",
        "stride_ge_0": "stride>=0",
        "stride_zero": "stride-zero",
        "json_syntax": "json",
    }.get(path.stem, path.stem)
    assert expected in teir.RULES
    with pytest.raises(teir.ValidationError) as info:
        teir.load(path)
    assert info.value.rules == {expected}
    assert f"[{expected}]" in str(info.value)
    assert str(path) in str(info.value)


def test_every_rule_has_an_invalid_example():
    covered = {p.stem for p in (EXAMPLES / "invalid").glob("*.json")}
    names = {
        "D>=1": "D_ge_1",
        "size>=1": "size_ge_1",
        "stride>=0": "stride_ge_0",
        "stride-zero": "stride_zero",
        "json": "json_syntax",
    }
    assert {names.get(rule, rule) for rule in teir.RULES} <= covered


def test_all_violations_are_reported_together():
    data = dict(
        LAB,
        prim_main="GEMV",
        dim_sizes=[32, 0, 8, 32, 32, 32],
        strides_out=[32768, 1024, 5, 1, 32, 0],
        exec_types=["seq"] * 5,
    )
    with pytest.raises(teir.ValidationError) as info:
        teir.Config.from_dict(data)
    violations = info.value.violations
    assert {v.rule for v in violations} == {"enum", "size>=1", "stride-zero", "length"}
    where = {v.where for v in violations}
    assert {"prim_main", "dim_sizes[1]", "strides_out[2]", "exec_types"} == where
    for v in violations:
        assert v.message and v.hint
        assert str(v).startswith(f"{v.where}: [{v.rule}]")


def test_stride_zero_names_tensor_axis_and_fix():
    data = dict(LAB, strides_out=[32768, 1024, 7, 1, 32, 0])
    with pytest.raises(teir.ValidationError) as info:
        teir.Config.from_dict(data)
    (v,) = info.value.violations
    assert (v.field, v.axis, v.rule) == ("strides_out", 2, "stride-zero")
    assert "set strides_out[2] to 0" in v.hint


@pytest.mark.parametrize(
    ("exec_types", "main", "rule"),
    [
        (["seq", "seq", "seq", "prim", "prim", "seq"], "GEMM", "R2"),
        (["seq", "seq", "prim", "prim", "prim", "prim"], "GEMM", "R2"),
        (["seq", "prim", "seq", "prim", "prim", "prim"], "GEMM", "R2"),
        (["seq", "seq", "seq", "prim", "prim", "prim"], "BRGEMM", "R3"),
        (["seq", "seq", "prim", "prim", "seq", "prim"], "BRGEMM", "R3"),
        (["prim", "seq", "prim", "prim", "prim", "prim"], "BRGEMM", "R3"),
    ],
)
def test_gemm_and_brgemm_prim_axis_counts(exec_types, main, rule):
    assert rules_of(dict(LAB, exec_types=exec_types, prim_main=main)) == {rule}


def test_gemm_rejects_prim_c_axis():
    data = dict(
        LAB,
        dim_types=["C", "N", "K", "M", "N", "K"],
        exec_types=["prim", "seq", "seq", "prim", "prim", "prim"],
        strides_in1=[8192, 8192, 1024, 0, 32, 1],
    )
    assert rules_of(data) == {"R2"}


def test_r1_for_first_last_and_copy_without_output_axis():
    base = dict(LAB, prim_main="None", exec_types=["seq", "seq", "prim", "seq", "seq", "prim"])
    assert rules_of(dict(base, prim_first="Zero")) == {"R1"}
    assert rules_of(dict(base, prim_last="ReLU")) == {"R1"}
    assert rules_of(dict(base, prim_first="ReLU")) == {"R1"}
    teir.Config.from_dict(base)  # prim_main None with no first/last: nothing to do, valid
    unary = dict(
        data_type="FP32",
        prim_main="Copy",
        dim_types=["C", "M"],
        exec_types=["seq", "seq"],
        dim_sizes=[2, 3],
        strides_in0=[3, 1],
        strides_in1=[0, 0],
        strides_out=[1, 2],
    )
    assert rules_of(unary) == {"R1"}
    assert rules_of(dict(unary, prim_main="ReLU")) == {"R1"}


def test_unary_operations_accept_c_and_m_axes_only():
    unary = dict(
        data_type="FP64",
        prim_main="Copy",
        dim_types=["C", "M"],
        exec_types=["prim", "prim"],
        dim_sizes=[2, 3],
        strides_in0=[3, 1],
        strides_in1=[0, 0],
        strides_out=[1, 2],
    )
    teir.Config.from_dict(unary)
    teir.Config.from_dict(dict(unary, prim_main="relu", prim_first="zero", prim_last="relu"))
    for bad in ("N", "K"):
        data = dict(unary, dim_types=["C", bad], strides_in0=[3, 0], strides_out=[1, 0])
        with pytest.raises(teir.ValidationError) as info:
            teir.Config.from_dict(data)
        assert info.value.rules == {"unary"}
        assert info.value.violations[0].where == "dim_types[1]"


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("dim_sizes", [32, 32, 8, 32, 32, 32.0], "size>=1"),
        ("dim_sizes", [32, 32, 8, 32, 32, "32"], "size>=1"),
        ("dim_sizes", [32, 32, 8, 32, 32, None], "size>=1"),
        ("dim_sizes", [32, 32, 8, 32, 32, True], "size>=1"),
        ("dim_sizes", [32, 32, 8, 32, 32, -3], "size>=1"),
        ("strides_in0", [8192, 0, 1024, 1, 0, -32], "stride>=0"),
        ("strides_in0", [8192, 0, 1024, 1, 0, 32.5], "stride>=0"),
        ("strides_in0", [8192, 0, 1024, 1, 0, [32]], "stride>=0"),
        ("dim_types", "MNKMNK", "type"),
        ("dim_types", None, "type"),
        ("exec_types", {"a": 1}, "type"),
        ("dim_types", ["M", "N", "K", "M", "N", 5], "type"),
        ("exec_types", ["seq", "seq", "seq", "prim", "prim", "vector"], "enum"),
        ("data_type", "FP16", "enum"),
        ("data_type", 32, "type"),
        ("prim_first", "relu6", "enum"),
        ("prim_last", "Zero", "enum"),
        ("dim_sizes", [2**63, 1, 1, 1, 1, 1], "int64"),
        ("strides_out", [2**62, 1024, 0, 1, 32, 0], "int64"),
    ],
)
def test_domain_rules(field, value, rule):
    assert rule in rules_of(dict(LAB, **{field: value}))


def test_missing_key_with_misspelling_hint():
    data = {k: v for k, v in LAB.items() if k != "strides_in1"}
    data["strides_in_1"] = LAB["strides_in1"]
    with pytest.raises(teir.ValidationError) as info:
        teir.Config.from_dict(data)
    (v,) = info.value.violations
    assert v.rule == "missing" and v.field == "strides_in1"
    assert "strides_in_1" in v.hint


def test_unknown_keyword_in_flat_constructor():
    data = {k: v for k, v in LAB.items() if k not in ("name", "flops")}
    with pytest.raises(teir.ValidationError) as info:
        teir.Config(**data, dim_size=[1])
    assert "dim_sizes" in str(info.value)


def test_empty_schedule_violates_d_at_least_one():
    empty = dict(
        LAB,
        **{
            k: []
            for k in (
                "dim_types",
                "exec_types",
                "dim_sizes",
                "strides_in0",
                "strides_in1",
                "strides_out",
            )
        },
    )
    assert rules_of(empty) == {"D>=1"}


@given(broken_configs())
def test_generated_invalid_configs_raise_naming_the_broken_rule(case):
    data, rule = case
    with pytest.raises(teir.ValidationError) as info:
        teir.Config.from_dict(data)
    assert rule in info.value.rules
    assert all(v.rule in teir.RULES for v in info.value.violations)


@given(configs())
def test_generated_valid_configs_validate(data):
    cfg = teir.Config.from_dict(data)
    assert cfg.num_dims == len(data["dim_types"])


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "data_type",
                "prim_first",
                "prim_main",
                "prim_last",
                "dim_types",
                "exec_types",
                "dim_sizes",
                "strides_in0",
                "strides_in1",
                "strides_out",
                "name",
                "_x",
            ]
        ),
        json_values,
        max_size=10,
    )
)
def test_arbitrary_values_raise_only_validation_errors(data):
    with contextlib.suppress(teir.ValidationError):
        teir.Config.from_dict(data)


@given(
    configs(),
    st.sampled_from(
        ["data_type", "dim_types", "exec_types", "dim_sizes", "strides_in0", "strides_out"]
    ),
    json_values,
)
def test_one_arbitrary_field_raises_only_validation_errors(data, field, value):
    with contextlib.suppress(teir.ValidationError):
        teir.Config.from_dict(dict(data, **{field: value}))


@given(json_values)
def test_arbitrary_documents_raise_only_validation_errors(value):
    with contextlib.suppress(teir.ValidationError):
        teir.Config.from_dict(value)
    with contextlib.suppress(teir.ValidationError):
        teir.Config.from_json(json.dumps(value))


@given(st.text(max_size=60) | st.binary(max_size=60))
def test_arbitrary_text_raises_only_validation_errors(text):
    with contextlib.suppress(teir.ValidationError):
        teir.Config.from_json(text)


def test_deeply_nested_json_is_a_validation_error():
    with pytest.raises(teir.ValidationError):
        teir.Config.from_json("[" * 100000 + "]" * 100000)
