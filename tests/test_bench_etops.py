"""The etops baseline of ``teir bench einsum``: each einsum's unscheduled configuration, in
the form etops takes it, must describe the same einsum. A stand-in for etops runs the
configurations it is given with NumPy and, like etops, takes contractions only with the
output's unit stride on an M axis."""

from __future__ import annotations

import string
import types
from typing import Any

import numpy as np
import pytest

from teir.bench import einsum_suite
from teir.bench.etops_runner import TARGETS, einsum_seconds
from teir.frontend.einsum_parse import EinsumError, parse
from teir.frontend.einsum_plan import unscheduled_fields


class _Config:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class _Operation:
    def __init__(self, config: _Config) -> None:
        self.config = config
        unit = [t for t, s in zip(config.dim_types, config.strides[0][-1]) if s == 1]
        if config.prim_main == "gemm" and unit and unit != ["m"]:
            raise RuntimeError("compilation_failed: out needs unit stride on M")

    def execute(self, in0: np.ndarray, in1: np.ndarray | None, out: np.ndarray) -> None:
        config = self.config
        letters = string.ascii_letters[: len(config.dim_sizes)]
        tensors = [in0, out] if in1 is None else [in0, in1, out]
        views, terms = [], []
        for array, strides in zip(tensors, config.strides[0]):
            axes = [i for i, s in enumerate(strides) if s != 0]
            views.append(
                np.lib.stride_tricks.as_strided(
                    array,
                    shape=[config.dim_sizes[i] for i in axes],
                    strides=[strides[i] * array.itemsize for i in axes],
                )
            )
            terms.append("".join(letters[i] for i in axes))
        expression = ",".join(terms[:-1]) + "->" + terms[-1]
        views[-1][...] = np.einsum(expression, *views[:-1])


def _fake_etops(optimized: list[dict[str, Any]]) -> Any:
    names = {"DataType": ("float32", "float64")}
    names["PrimType"] = ("none", "zero", "copy", "relu", "gemm", "brgemm")
    names["DimType"] = ("c", "m", "n", "k")
    names["ExecType"] = ("seq", "prim", "shared", "sfc")
    module = types.SimpleNamespace(
        **{kind: types.SimpleNamespace(**{n: n for n in values}) for kind, values in names.items()}
    )
    module.TensorOperationConfig = _Config
    module.TensorOperation = _Operation
    defaults = {"target_m": 16, "target_n": 12, "target_k": 64, "num_threads": 0}
    module.backend = types.SimpleNamespace(
        tpp=types.SimpleNamespace(get_default_optimization_config=lambda: dict(defaults))
    )

    def optimize(config: _Config, options: dict[str, Any]) -> _Config:
        optimized.append(options)
        return config

    module.optimize = optimize
    return module


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("ik,kj->ij", [(5, 7), (7, 6)]),  # out's unit stride on N: etops gets the operands swapped
        ("ki,kj->ij", [(7, 5), (7, 6)]),
        ("mk,kn->nm", [(5, 7), (7, 6)]),  # already on M
        ("bik,bkj->bji", [(3, 5, 4), (3, 4, 6)]),
        ("abcd,dbef->acef", [(2, 3, 4, 5), (5, 3, 2, 3)]),
        ("i,i->", [(9,), (9,)]),
        ("ijk->kji", [(2, 3, 4)]),
        ("ijkl->ljki", [(2, 3, 4, 5)]),
    ],
)
def test_etops_gets_each_einsum_in_its_own_form(subscripts, shapes):
    rng = np.random.default_rng(1)
    arrays = [rng.uniform(-1, 1, shape).astype(np.float32) for shape in shapes]
    optimized: list[dict[str, Any]] = []
    seconds = einsum_seconds(_fake_etops(optimized), subscripts, arrays, 2, 0.01)
    # None would mean that every configuration was refused or computed a wrong result
    assert seconds is not None and seconds > 0
    assert [(o["target_m"], o["target_n"], o["target_k"]) for o in optimized] == list(TARGETS)
    assert all(o["num_threads"] == 2 for o in optimized)


def test_etops_results_are_checked():
    # a baseline computing something else is reported as missing, not timed
    class Wrong(_Operation):
        def execute(self, in0, in1, out):
            super().execute(in0, in1, out)
            out += 1

    etops = _fake_etops([])
    etops.TensorOperation = Wrong
    arrays = [np.ones((4, 4), np.float32)] * 2
    assert einsum_seconds(etops, "ij,jk->ik", arrays, 1, 0.01) is None


def test_unscheduled_fields_are_one_axis_per_label():
    arrays = [np.zeros((5, 7), np.float32), np.zeros((7, 6), np.float32)]
    fields = unscheduled_fields(parse("ik,kj->ij", [2, 2]), arrays)
    assert fields["dim_types"] == ["M", "N", "K"]
    assert fields["dim_sizes"] == [5, 6, 7]
    assert (fields["strides_in0"], fields["strides_in1"]) == ([7, 0, 1], [0, 1, 6])
    assert fields["strides_out"] == [6, 1, 0]
    assert (fields["prim_first"], fields["prim_main"]) == ("Zero", "GEMM")
    with pytest.raises(EinsumError, match="operand 0: 'x' appear in no other term"):
        unscheduled_fields(parse("ix,ij->j", [2, 2]), arrays)


def test_etops_is_a_baseline_for_fp32_only(monkeypatch):
    # its FP64 path aborts the interpreter
    assert einsum_suite.baselines("f32") == ("numpy", "torch", "etops")
    assert "etops" not in einsum_suite.baselines("f64")
    monkeypatch.setattr(
        einsum_suite, "CONTRACTIONS", [("gemm", "ik,kj->ij", {"i": 8, "j": 8, "k": 8})]
    )
    monkeypatch.setattr(einsum_suite, "PERMUTATIONS", [("t", "ij->ji", {"i": 8, "j": 16})])
    monkeypatch.setattr(einsum_suite, "_time_teir", lambda *args: 2.0)
    times = {"numpy": [4.0, 4.0], "torch": [None, None], "etops": [1.0, 8.0]}
    monkeypatch.setattr(einsum_suite, "_baseline", lambda library, *args: times[library])
    report = einsum_suite.run("f32", seconds=0.1, threads=1, rounds=1)
    gemm, transpose = report["rows"]
    assert (gemm["speedup_etops"], transpose["speedup_etops"]) == (0.5, 4.0)
    assert report["summary"]["contraction_worst_vs_best_baseline"] == 0.5
    assert report["summary"]["permutation_geomean_speedup_etops"] == 4.0
    assert "vs etops" in einsum_suite.format_report(report)
