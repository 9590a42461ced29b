"""The records: enums, construction, derived properties, equality, repr."""

from __future__ import annotations

import numpy as np
import pytest

import teir
from helpers import EXAMPLES
from teir import DataType, DimType, ExecType, PrimFirst, PrimLast, PrimMain, Tensor

GEMM_FIELDS = dict(
    data_type="FP32",
    prim_first="None",
    prim_main="GEMM",
    prim_last="None",
    dim_types=["M", "N", "K"],
    exec_types=["prim", "prim", "prim"],
    dim_sizes=[4, 3, 2],
    strides_in0=[1, 0, 4],
    strides_in1=[0, 2, 1],
    strides_out=[1, 4, 0],
)


@pytest.mark.parametrize(
    ("cls", "text", "member"),
    [
        (DataType, "fp32", DataType.FP32),
        (DataType, "Float64", DataType.FP64),
        (DimType, "k", DimType.K),
        (ExecType, "SEQ", ExecType.SEQ),
        (ExecType, "parallel", ExecType.SHARED),
        (ExecType, "Shared", ExecType.SHARED),
        (PrimFirst, "zero", PrimFirst.ZERO),
        (PrimFirst, "RELU", PrimFirst.RELU),
        (PrimMain, "brgemm", PrimMain.BRGEMM),
        (PrimMain, "copy", PrimMain.COPY),
        (PrimMain, "relu", PrimMain.RELU),
        (PrimLast, "none", PrimLast.NONE),
    ],
)
def test_enums_parse_case_insensitively(cls, text, member):
    assert cls.parse(text) is member


def test_enum_parse_rejects_unknown_and_non_strings():
    assert PrimMain.parse("GEMV") is None
    assert DimType.parse(3) is None
    assert DataType.parse(np.int32) is None
    assert DataType.parse(np.float32) is DataType.FP32
    assert DataType.parse(np.dtype("float64")) is DataType.FP64


def test_roles_are_the_specs_map():
    assert DimType.C.roles == (True, True, True)
    assert DimType.M.roles == (True, False, True)
    assert DimType.N.roles == (False, True, True)
    assert DimType.K.roles == (True, True, False)


def test_flat_and_record_constructors_agree():
    flat = teir.Config(**GEMM_FIELDS)
    records = teir.Config(
        teir.Primitives("FP32", prim_main="GEMM"),
        teir.Schedule(
            dim_types=("M", "N", "K"),
            exec_types=("prim",) * 3,
            dim_sizes=(4, 3, 2),
            strides_in0=(1, 0, 4),
            strides_in1=(0, 2, 1),
            strides_out=(1, 4, 0),
        ),
    )
    assert flat == records
    assert hash(flat) == hash(records)
    assert flat.dim_types == (DimType.M, DimType.N, DimType.K)
    assert flat.exec_types == (ExecType.PRIM,) * 3
    assert flat.prim_main is PrimMain.GEMM


def test_flat_constructor_defaults_first_and_last_to_none():
    fields = {k: v for k, v in GEMM_FIELDS.items() if k not in ("prim_first", "prim_last")}
    cfg = teir.Config(**fields)
    assert cfg.prim_first is PrimFirst.NONE and cfg.prim_last is PrimLast.NONE


def test_python_none_means_primitive_none():
    cfg = teir.Config(**{**GEMM_FIELDS, "prim_first": None, "prim_last": None})
    assert cfg.prim_first is PrimFirst.NONE


def test_numpy_values_are_accepted_and_stored_as_python_ints():
    cfg = teir.Config(
        **{
            **GEMM_FIELDS,
            "dim_sizes": np.array([4, 3, 2]),
            "strides_in0": [np.int64(1), np.int32(0), np.uint8(4)],
        }
    )
    assert cfg.dim_sizes == (4, 3, 2)
    assert all(type(v) is int for v in cfg.dim_sizes + cfg.strides_in0)


def test_properties():
    cfg = teir.Config(**GEMM_FIELDS)
    assert cfg.num_dims == 3
    assert cfg.flops == 2 * 4 * 3 * 2
    assert cfg.extents == (8, 6, 12)
    assert cfg.prim_axes == (0, 1, 2)
    assert cfg.loop_axes == ()
    assert cfg.dtype == np.float32
    assert not cfg.is_unary


def test_properties_of_lab_configuration():
    cfg = teir.load(EXAMPLES / "lab3_zero_brgemm_relu.json")
    assert cfg.flops == 536870912
    assert cfg.extents == (262144, 262144, 1048576)
    assert cfg.loop_axes == (0, 1)
    assert cfg.prim_axes == (2, 3, 4, 5)
    assert cfg.schedule.axes_of(DimType.K, ExecType.PRIM) == (2, 5)


def test_unary_config_needs_no_in1():
    cfg = teir.load(EXAMPLES / "transpose_3x4.json")
    assert cfg.is_unary
    assert cfg.extent(Tensor.IN1) == 0
    assert cfg.extents == (12, 0, 12)
    assert cfg.flops == 0


def test_records_are_frozen():
    cfg = teir.Config(**GEMM_FIELDS)
    with pytest.raises(AttributeError):
        cfg.primitives = None  # type: ignore[misc]


def test_repr_is_a_table():
    text = repr(teir.load(EXAMPLES / "lab1_gemm.json"))
    lines = text.splitlines()
    assert lines[0] == "Config(FP32: first=None main=GEMM last=None)"
    assert lines[1].split() == ["axis", "type", "exec", "size", "in0", "in1", "out"]
    assert lines[2].split() == ["0", "M", "seq", "32", "8192", "0", "32768"]
    assert len(lines) == 2 + 6


def test_replace_returns_a_validated_copy():
    cfg = teir.Config(**GEMM_FIELDS)
    zeroed = cfg.replace(prim_first="Zero")
    assert zeroed.prim_first is PrimFirst.ZERO and cfg.prim_first is PrimFirst.NONE
    with pytest.raises(teir.ValidationError) as info:
        cfg.replace(prim_main="BRGEMM")
    assert info.value.rules == {"R3"}
    with pytest.raises(teir.ValidationError):
        cfg.replace(dim_sizez=[1, 2, 3])


def test_mixing_records_and_flat_fields_is_an_error():
    cfg = teir.Config(**GEMM_FIELDS)
    with pytest.raises(teir.ValidationError):
        teir.Config(cfg.primitives, cfg.schedule, data_type="FP64")
    with pytest.raises(teir.ValidationError):
        teir.Config(cfg.primitives, None)
    with pytest.raises(teir.ValidationError):
        teir.Config("FP32", cfg.schedule)  # type: ignore[arg-type]


def test_records_from_records_are_checked_together():
    prims = teir.Primitives("FP64", prim_main="BRGEMM")
    sched = teir.Config(**GEMM_FIELDS).schedule
    with pytest.raises(teir.ValidationError) as info:
        teir.Config(prims, sched)
    assert info.value.rules == {"R3"}


def test_schedule_alone_checks_well_formedness():
    with pytest.raises(teir.ValidationError) as info:
        teir.Schedule(["M"], ["seq"], [2], [1], [1], [1])
    assert info.value.rules == {"stride-zero"}
    assert info.value.violations[0].field == "strides_in1"
    assert info.value.violations[0].axis == 0
