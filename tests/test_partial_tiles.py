"""Partial tiles of teir.optimize: an axis with no good tile size becomes a main part and
rests (``Config.rests``), each its own nest on the same tensors."""

from __future__ import annotations

import json
from math import prod

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import teir
from teir import reference
from teir.cli.main import main


def _contraction(
    dtype: str, m: int, n: int, k: int, layout: str, first: str = "Zero", last: str = "None"
) -> dict:
    """Unscheduled fields of C = A @ B (all axes seq): ``layout`` "nn" (A column-major M x K,
    B column-major K x N) or "tt" (both row-major), C column-major M x N."""
    a = [1, 0, m] if layout == "nn" else [k, 0, 1]
    b = [0, k, 1] if layout == "nn" else [0, 1, n]
    return {
        "data_type": dtype,
        "prim_first": first,
        "prim_main": "GEMM",
        "prim_last": last,
        "dim_types": ["M", "N", "K"],
        "exec_types": ["seq"] * 3,
        "dim_sizes": [m, n, k],
        "strides_in0": a,
        "strides_in1": b,
        "strides_out": [1, m, 0],
    }


def _expected(fields: dict, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    m, n, k = fields["dim_sizes"]
    big_a = a.reshape(k, m).T if fields["strides_in0"][0] == 1 else a.reshape(m, k)
    big_b = b.reshape(n, k).T if fields["strides_in1"][2] == 1 else b.reshape(k, n)
    start = c.reshape(n, m).T.astype(np.float64)
    if fields["prim_first"] == "Zero":
        start = np.zeros_like(start)
    result = start + big_a.astype(np.float64) @ big_b.astype(np.float64)
    if fields["prim_last"] == "ReLU":
        result = np.maximum(result, 0)
    return result


CASES = [
    ("FP64", 97, 1601, 300, "nn", "Zero", "ReLU"),  # N prime
    ("FP32", 1601, 64, 96, "tt", "Zero", "None"),  # M prime
    ("FP32", 97, 64, 1601, "nn", "Zero", "ReLU"),  # K prime: its rest adds, only it ReLUs
    ("FP64", 67, 331, 1009, "tt", "None", "ReLU"),  # N and K: four regions, accumulating
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[1:4])) + c[4])
@pytest.mark.parametrize("threads", [1, 2])
def test_awkward_axes_run_as_a_main_part_and_its_rests(case, threads):
    dtype, m, n, k, layout, first, last = case
    fields = _contraction(dtype, m, n, k, layout, first, last)
    config, log = teir.optimize_with_log(fields, threads=threads)
    assert config.rests and any(line.startswith("partial tiles: ") for line in log)
    assert config.flops == 2 * m * n * k
    # a main part that tiles (a multiple of 16 on the split axes), rests thinner than 16
    split = [s for s in (m, n, k) if s > 320]
    own = prod(config.dim_sizes)
    assert own == prod(s - s % 16 if s in split else s for s in (m, n, k))
    extents = (m * k, n * k, m * n)
    assert config.extents == extents
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, e).astype(config.dtype) for e in extents[:2])
    c = rng.uniform(-1, 1, extents[2]).astype(config.dtype)
    expected = _expected(fields, a, b, c)
    op = teir.compile(config, threads=threads)
    got = c.copy()
    op(a, b, got)
    tolerance = (2e-5 if dtype == "FP32" else 1e-12) * k
    np.testing.assert_allclose(got.reshape(n, m).T, expected, rtol=tolerance, atol=tolerance)
    # the reference oracles run the rests too
    oracle = c.copy()
    reference.execute(config, a, b, oracle)
    np.testing.assert_allclose(oracle, got, rtol=tolerance, atol=tolerance)
    dense = reference.dense_result(config, a, b, c)
    assert reference.compare(config, c, got, dense).ok
    text = op.explain()
    assert "# partial tiles: rest 0" in text and "generic" not in text
    if threads == 2:  # the main part's tiles are shared (one prime axis gave them no loop)
        assert len(op.slices) == 2


def test_rests_survive_json_and_a_second_optimization():
    fields = _contraction("FP32", 97, 1601, 1009, "nn", "Zero", "ReLU")
    config = teir.optimize(fields, threads=2)
    assert teir.Config.from_json(config.to_json()) == config
    again = teir.optimize(config, threads=1)
    assert again.flops == config.flops and again.extents == config.extents
    a, b, c = (
        np.random.default_rng(2).uniform(-1, 1, e).astype(np.float32) for e in config.extents
    )
    first, second = c.copy(), c.copy()
    teir.compile(config, threads=2)(a, b, first)
    teir.compile(again, threads=1)(a, b, second)
    np.testing.assert_allclose(first, second, rtol=1e-4, atol=1e-4)
    assert "partial tiles: then rest 0" in teir.explain.explain(config)


def test_partial_tiles_can_be_turned_off():
    fields = _contraction("FP64", 97, 1601, 300, "nn")
    assert not teir.optimize(fields, threads=2, partial_tiles=False).rests
    # sizes that tile, and copies within the caches, keep one region
    assert not teir.optimize(_contraction("FP64", 96, 1600, 1000, "nn"), threads=2).rests
    copy = {
        "data_type": "FP32",
        "prim_main": "Copy",
        "dim_types": ["M", "M"],
        "exec_types": ["seq"] * 2,
        "dim_sizes": [331, 7],
        "strides_in0": [7, 1],
        "strides_in1": [0, 0],
        "strides_out": [1, 331],
    }
    assert not teir.optimize(copy, threads=2).rests


def test_a_large_transpose_with_a_prime_side_is_split():
    rows, columns = 3001, 1999  # 24 MB: a copy in memory
    copy = {
        "data_type": "FP32",
        "prim_main": "Copy",
        "dim_types": ["M", "M"],
        "exec_types": ["seq"] * 2,
        "dim_sizes": [rows, columns],
        "strides_in0": [columns, 1],
        "strides_in1": [0, 0],
        "strides_out": [1, rows],
    }
    config = teir.optimize(copy, threads=2)
    assert config.rests
    source = np.random.default_rng(3).uniform(-1, 1, rows * columns).astype(np.float32)
    out = np.zeros(rows * columns, np.float32)
    teir.compile(config, threads=2)(source, None, out)
    np.testing.assert_array_equal(out.reshape(columns, rows), source.reshape(rows, columns).T)


def _small_gemm(n: int = 3, **changes: object) -> teir.Config:
    fields = {
        "data_type": "FP64",
        "prim_first": "Zero",
        "prim_main": "GEMM",
        "dim_types": ["M", "N", "K"],
        "exec_types": ["prim"] * 3,
        "dim_sizes": [4, n, 5],
        "strides_in0": [1, 0, 4],
        "strides_in1": [0, 5, 1],
        "strides_out": [1, 4, 0],
    }
    fields.update(changes)
    return teir.Config(**fields)


def test_handwritten_rests_are_checked():
    main_part, column = _small_gemm(3), _small_gemm(1)
    config = teir.Config(
        main_part.primitives, main_part.schedule, rests=[teir.Rest((0, 15, 12), column)]
    )
    assert config.extents == (20, 20, 16) and config.flops == 2 * 4 * 4 * 5
    assert config.own == main_part and config.parts[1].config == column
    data = config.to_dict()
    assert data["rests"][0]["offsets"] == [0, 15, 12]
    bad = [
        ({**data, "rests": 3}, "must be a list"),
        ({**data, "rests": [{**data["rests"][0], "offsets": [0, -1, 12]}]}, "offsets"),
        ({**data, "rests": [{**data["rests"][0], "data_type": "FP32"}]}, "data type FP32"),
        ({**data, "rests": [{**data["rests"][0], "dim_sizes": [4, 1]}]}, "length"),
        ({**data, "rests": [{**data, "offsets": [0, 0, 0]}]}, "rests of its own"),
        ({**data, "rests": ["x"]}, "region object"),
    ]
    for fields, message in bad:
        with pytest.raises(teir.ValidationError, match=message) as error:
            teir.Config.from_dict(fields)
        assert all(v.field == "rests" for v in error.value.violations)
    copy = teir.Config(
        data_type="FP64",
        prim_main="Copy",
        dim_types=["M"],
        exec_types=["prim"],
        dim_sizes=[4],
        strides_in0=[1],
        strides_in1=[0],
        strides_out=[1],
    )
    with pytest.raises(teir.ValidationError, match="main primitive Copy"):
        teir.Config(main_part.primitives, main_part.schedule, rests=[teir.Rest((0, 0, 0), copy)])
    with pytest.raises(teir.ValidationError, match="field by field"):
        config.replace(prim_last="ReLU")
    # arrays too small for a rest's reach are refused before anything runs
    op = teir.compile(config, threads=1)
    out = np.full(15, 7.0)
    with pytest.raises(teir.ExecutionError, match="16"):
        op(np.ones(20), np.ones(20), out)
    assert np.all(out == 7.0)


def test_cli_optimize_writes_rests_that_run_and_check(tmp_path, capsys):
    source = tmp_path / "prime.json"
    source.write_text(json.dumps(_contraction("FP64", 97, 1601, 64, "nn", "Zero", "ReLU")))
    target = tmp_path / "optimized.json"
    assert main(["optimize", str(source), "-o", str(target), "--threads", "2"]) == 0
    written = json.loads(target.read_text())
    assert len(written["rests"]) == 1
    capsys.readouterr()
    assert main(["run", str(target), "--check", "--repeat", "1", "--threads", "2"]) == 0
    assert "check against np.einsum: OK" in capsys.readouterr().out
    assert main(["explain", str(target)]) == 0
    assert "partial tiles" in capsys.readouterr().out
    # optimizing the written configuration again keeps its rests
    again = tmp_path / "again.json"
    assert main(["optimize", str(target), "-o", str(again), "--threads", "1"]) == 0
    assert teir.load(again).flops == teir.load(target).flops == 2 * 97 * 1601 * 64


LETTERS = {"C": "c", "M": "m", "N": "n", "K": "k"}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_awkward_contractions_equal_numpy(data):
    draw = data.draw
    dtype = draw(st.sampled_from(["FP32", "FP64"]))
    sizes = {
        "c": draw(st.sampled_from([1, 2, 3])),
        "m": draw(st.sampled_from([5, 24, 331, 347])),
        "n": draw(st.sampled_from([7, 40, 337, 353])),
        "k": draw(st.sampled_from([9, 64, 1009])),
    }
    if sizes["k"] > 1000:  # keep the example small: one awkward output axis at most
        sizes["m"], sizes["n"] = draw(st.sampled_from([(24, 337), (331, 40), (5, 7)]))
    orders = {
        name: "".join(draw(st.permutations(labels)))
        for name, labels in (("in0", "cmk"), ("in1", "cnk"), ("out", "cmn"))
    }

    def strides(name: str, label: str) -> int:
        order = orders[name]
        if label not in order:
            return 0
        return prod(sizes[x] for x in order[order.index(label) + 1 :])

    types = ["C", "M", "N", "K"]
    first = draw(st.sampled_from(["Zero", "None"]))
    last = draw(st.sampled_from(["ReLU", "None"]))
    fields = {
        "data_type": dtype,
        "prim_first": first,
        "prim_main": "GEMM",
        "prim_last": last,
        "dim_types": types,
        "exec_types": ["seq"] * 4,
        "dim_sizes": [sizes[LETTERS[t]] for t in types],
        **{
            f"strides_{name}": [strides(name, LETTERS[t]) for t in types]
            for name in ("in0", "in1", "out")
        },
    }
    threads = draw(st.sampled_from([1, 2]))
    config = teir.optimize(fields, threads=threads)
    awkward = any(n > 320 for n in (sizes["m"], sizes["n"])) or sizes["k"] > 1000
    assert bool(config.rests) == awkward
    event(f"{len(config.parts)} region(s)")
    np_dtype = config.dtype
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    arrays = {
        name: rng.uniform(-1, 1, [sizes[x] for x in orders[name]]).astype(np_dtype)
        for name in ("in0", "in1", "out")
    }
    got = arrays["out"].copy()
    teir.compile(config, threads=threads)(arrays["in0"], arrays["in1"], got)
    product = np.einsum(
        f"{orders['in0']},{orders['in1']}->{orders['out']}",
        arrays["in0"].astype(np.float64),
        arrays["in1"].astype(np.float64),
    )
    expected = product + (0 if first == "Zero" else arrays["out"].astype(np.float64))
    if last == "ReLU":
        expected = np.maximum(expected, 0)
    tolerance = (4e-6 if dtype == "FP32" else 1e-14) * (sizes["k"] + 2)
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("m", "n", "k"), [(97, 311, 400), (97, 97, 2400), (307, 37, 2000)])
def test_outputs_without_a_loop_for_the_threads_get_one_from_a_split(m, n, k):
    """Output axes with no divisor that tiles (97, 311) give the threads nothing to share:
    the one whose rest costs least (not the output's unit-stride axis, whose rest would fill
    few vector lanes, unless the other's rest is a large share) is split."""
    fields = _contraction("FP32", m, n, k, "nn", "Zero", "ReLU")
    alone = teir.optimize(fields, threads=1)
    assert not alone.rests
    config = teir.optimize(fields, threads=2)
    assert len(config.rests) == 1
    rest = config.rests[0]
    split_m = (m, n) == (307, 37)  # N's rest (5 of 37 columns) would be 14 % of the work
    assert rest.offsets == (
        (m - m % 16, 0, m - m % 16) if split_m else (0, (n - n % 16) * k, (n - n % 16) * m)
    )
    op = teir.compile(config, threads=2)
    assert len(op.slices) == 2 and "generic" not in op.explain()
    rng = np.random.default_rng(4)
    a, b, c = (rng.uniform(-1, 1, e).astype(np.float32) for e in config.extents)
    got = c.copy()
    op(a, b, got)
    tolerance = 2e-5 * k
    np.testing.assert_allclose(
        got.reshape(n, m).T, _expected(fields, a, b, c), rtol=tolerance, atol=tolerance
    )


def test_unevenly_shared_batches_get_more_loops_from_a_split():
    """Three batch elements of 97 x 97 outputs on two threads (a quarter of their time idle)
    gain row or column tiles from a split: six shared iterations, and the rest after them."""
    c, m, n, k = 3, 97, 97, 400
    fields = {
        "data_type": "FP32",
        "prim_first": "Zero",
        "prim_main": "GEMM",
        "dim_types": ["C", "M", "N", "K"],
        "exec_types": ["seq"] * 4,
        "dim_sizes": [c, m, n, k],
        "strides_in0": [m * k, 1, 0, m],
        "strides_in1": [n * k, 0, k, 1],
        "strides_out": [m * n, 1, m, 0],
    }
    unsplit = teir.optimize(fields, threads=2, partial_tiles=False)
    assert teir.compile(unsplit, threads=2).nest.parallel_size == 3
    config = teir.optimize(fields, threads=2)
    assert len(config.rests) == 1
    op = teir.compile(config, threads=2)
    assert op.nest.parallel_size % 2 == 0
    rng = np.random.default_rng(5)
    a, b, out = (rng.uniform(-1, 1, e).astype(np.float32) for e in config.extents)
    op(a, b, out)
    expected = np.einsum(
        "ckm,cnk->cnm", a.reshape(c, k, m).astype(np.float64), b.reshape(c, n, k).astype(np.float64)
    )
    np.testing.assert_allclose(out.reshape(c, n, m), expected, rtol=1e-3, atol=1e-3)
