"""JSON: the spec's field names, exact round trips, files."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

import teir
from helpers import EXAMPLES
from strategies import configs

FIELD_ORDER = [
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
]
SPEC_FIXTURE = EXAMPLES.parent.parent / "shared" / "spec" / "lab_configs.json"


def test_to_dict_uses_spec_names_and_spellings():
    cfg = teir.load(EXAMPLES / "lab3_zero_brgemm_relu.json")
    data = cfg.to_dict()
    assert list(data) == FIELD_ORDER
    assert data["prim_first"] == "Zero" and data["prim_main"] == "BRGEMM"
    assert data["prim_last"] == "ReLU" and data["data_type"] == "FP32"
    assert data["dim_types"] == ["M", "N", "K", "M", "N", "K"]
    assert data["exec_types"] == ["seq", "seq", "prim", "prim", "prim", "prim"]
    source = json.loads((EXAMPLES / "lab3_zero_brgemm_relu.json").read_text())
    assert data == {k: source[k] for k in FIELD_ORDER}


def test_extra_and_underscore_keys_are_ignored():
    data = json.loads((EXAMPLES / "lab1_gemm.json").read_text())
    data.update(_comment="x", name="n", flops=1, anything={"nested": [1]})
    assert teir.Config.from_dict(data) == teir.load(EXAMPLES / "lab1_gemm.json")


def test_parallel_is_read_as_shared():
    data = json.loads((EXAMPLES / "lab1_gemm.json").read_text())
    data["exec_types"][0] = "parallel"
    cfg = teir.Config.from_dict(data)
    assert cfg.exec_types[0] is teir.ExecType.SHARED
    assert cfg.to_dict()["exec_types"][0] == "shared"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_examples_round_trip(path, tmp_path):
    cfg = teir.load(path)
    assert teir.Config.from_json(cfg.to_json()) == cfg
    assert teir.Config.from_dict(cfg.to_dict()) == cfg
    teir.save(cfg, tmp_path / "c.json")
    assert teir.load(tmp_path / "c.json") == cfg
    assert (tmp_path / "c.json").read_text() == cfg.to_json() + "\n"


@given(configs())
def test_generated_configs_round_trip(data):
    cfg = teir.Config.from_dict(data)
    text = cfg.to_json()
    again = teir.Config.from_json(text)
    assert again == cfg
    assert again.to_json() == text
    assert teir.Config.from_json(cfg.to_json(indent=None)) == cfg


@pytest.mark.skipif(not SPEC_FIXTURE.exists(), reason="shared spec fixture not beside the repo")
def test_spec_fixture_configs_load():
    fixture = json.loads(SPEC_FIXTURE.read_text())
    for entry in fixture["tensor_op_benchmarks"] + fixture["unary_examples"]:
        cfg = teir.Config.from_dict(entry)
        if "flops" in entry:
            assert cfg.flops == entry["flops"]
    for entry in fixture["optimizer_inputs"]:  # all seq: not yet a valid TEIR configuration
        with pytest.raises(teir.ValidationError) as info:
            teir.Config.from_dict(entry)
        assert info.value.rules == {"R2"}


def test_load_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"data_type": "FP32"}')
    with pytest.raises(teir.ValidationError) as info:
        teir.load(path)
    assert str(path) in str(info.value)
    assert info.value.source == str(path)


def test_load_rejects_lists_but_load_all_reads_them(tmp_path):
    cfg = teir.load(EXAMPLES / "lab1_gemm.json")
    path = tmp_path / "many.json"
    path.write_text(json.dumps([cfg.to_dict(), cfg.replace(data_type="FP64").to_dict()]))
    with pytest.raises(teir.ValidationError, match="load_all"):
        teir.load(path)
    assert teir.load_all(path) == [cfg, cfg.replace(data_type="FP64")]
    path.write_text(json.dumps([cfg.to_dict(), dict(cfg.to_dict(), prim_main="x")]))
    with pytest.raises(teir.ValidationError) as info:
        teir.load_all(path)
    assert info.value.violations[0].field == "[1].prim_main"


def test_save_writes_one_config_or_a_list(tmp_path):
    cfg = teir.load(EXAMPLES / "lab1_gemm.json")
    path = tmp_path / "many.json"
    teir.save([cfg, cfg.replace(data_type="FP64")], path)
    assert teir.load_all(path) == [cfg, cfg.replace(data_type="FP64")]
    teir.save(cfg, path)
    assert teir.load(path) == cfg
    for bad in ("x", [cfg, "x"], cfg.to_dict()):
        with pytest.raises(teir.TeirError, match=r"teir\.Config or a list"):
            teir.save(bad, path)  # type: ignore[arg-type]


def test_tensors_may_be_named(tmp_path):
    cfg = teir.load(EXAMPLES / "lab1_gemm.json")
    for tensor in teir.Tensor:
        assert cfg.extent(tensor.label) == cfg.extent(tensor.label.upper()) == cfg.extent(tensor)
        assert cfg.schedule.strides(tensor.label) == cfg.schedule.strides(tensor)
    for bad in (0, "in2", None):
        with pytest.raises(teir.TeirError, match="names no tensor"):
            cfg.extent(bad)  # type: ignore[arg-type]


def test_binary_garbage_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(teir.ValidationError) as info:
        teir.load(path)
    assert info.value.rules == {"json"}


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        teir.load(tmp_path / "nope.json")
