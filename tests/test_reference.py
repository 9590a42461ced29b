"""The reference executor against explicit np.einsum on real layouts, and its argument checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import teir
from helpers import EXAMPLES, operands
from naive import assert_matches_naive, naive_execute
from teir import reference

RNG = np.random.default_rng(1234)


def relu(x):
    return np.maximum(x, 0)


@pytest.mark.parametrize("name", ["lab1_gemm", "lab2_brgemm", "lab3_zero_brgemm_relu"])
def test_lab_configurations_equal_einsum(name):
    cfg = teir.load(EXAMPLES / f"{name}.json")
    # Layouts: in0 [m0][k0][k1][m1], in1 [n0][k0][n1][k1], out [m0][n0][n1][m1].
    a = RNG.uniform(-1, 1, (32, 8, 32, 32)).astype(np.float32)
    b = RNG.uniform(-1, 1, (32, 8, 32, 32)).astype(np.float32)
    c = RNG.uniform(-1, 1, (32, 32, 32, 32)).astype(np.float32)
    init = c.copy()
    reference.execute(cfg, a, b, c)
    product = np.einsum("acfd,bcef->abed", a.astype(np.float64), b.astype(np.float64))
    expected = relu(product) if name.startswith("lab3") else init + product
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4)


def test_transpose_example():
    cfg = teir.load(EXAMPLES / "transpose_3x4.json")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.zeros((4, 3), dtype=np.float32)
    reference.execute(cfg, a, None, out)
    np.testing.assert_array_equal(out, a.T)


def test_permutation_example():
    cfg = teir.load(EXAMPLES / "permute_abcd_dcab.json")
    # sizes (a, b, c, d) = (2, 4, 3, 5); in0 abcd row-major as strides (60, 5, 20, 1) say:
    # a:60 c:20 b:5 d:1 -> memory order a c b d; out strides a:3 b:6 c:1 d:24 -> d b a c.
    a = RNG.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32)  # [a][c][b][d]
    out = np.zeros((5, 4, 2, 3), dtype=np.float32)  # [d][b][a][c]
    reference.execute(cfg, a, None, out)
    np.testing.assert_array_equal(out, np.einsum("acbd->dbac", a))


def trus_config(r, p, t, s, q, u, variant, first, last, shared, dtype="FP32"):
    execs = {
        "gemm": ["seq", "seq", "seq", "prim", "prim", "prim"],
        "brgemm": ["seq", "seq", "prim", "prim", "prim", "prim"],
    }[variant]
    for axis in shared:
        execs[axis] = "shared"
    return teir.Config(
        data_type=dtype,
        prim_first=first,
        prim_main=variant.upper(),
        prim_last=last,
        dim_types=["M", "N", "K", "M", "N", "K"],
        exec_types=execs,
        dim_sizes=[r, p, t, s, q, u],
        strides_in0=[u * s, 0, r * u * s, 1, 0, s],
        strides_in1=[0, q * t * u, u, 0, t * u, 1],
        strides_out=[s, q * r * s, 0, 1, r * s, 0],
    )


def check_trus(cfg, r, p, t, s, q, u, first, last):
    dtype = cfg.dtype
    a = RNG.uniform(-1, 1, (t, r, u, s)).astype(dtype)
    b = RNG.uniform(-1, 1, (p, q, t, u)).astype(dtype)
    c = RNG.uniform(-1, 1, (p, q, r, s)).astype(dtype)
    init = c.astype(np.float64)
    reference.execute(cfg, a, b, c)
    start = {"None": init, "Zero": np.zeros_like(init), "ReLU": relu(init)}[first]
    expected = start + np.einsum("trus,pqtu->pqrs", a.astype(np.float64), b.astype(np.float64))
    if last == "ReLU":
        expected = relu(expected)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c, expected, rtol=tol, atol=tol)


VARIANTS = list(
    itertools.product(
        ["gemm", "brgemm"], ["None", "Zero", "ReLU"], ["None", "ReLU"], [(), (0,), (1,), (0, 1)]
    )
)


@pytest.mark.parametrize(("variant", "first", "last", "shared"), VARIANTS)
@pytest.mark.parametrize("sizes", [(3, 3, 3, 3, 3, 3), (3, 7, 7, 5, 4, 7), (3, 3, 7, 4, 7, 5)])
def test_trus_pqtu_pqrs_variants(variant, first, last, shared, sizes):
    cfg = trus_config(*sizes, variant, first, last, shared)
    check_trus(cfg, *sizes, first, last)


@pytest.mark.parametrize(("p", "t"), [(3, 3), (3, 7), (7, 3), (7, 7)])
@pytest.mark.parametrize("s", [3, 4, 5, 7])
@pytest.mark.parametrize("q", [3, 4, 5, 7])
@pytest.mark.parametrize("u", [3, 4, 5, 7])
def test_trus_pqtu_pqrs_sizes(p, t, s, q, u):
    variant = "brgemm" if (s + q + u) % 2 else "gemm"
    cfg = trus_config(3, p, t, s, q, u, variant, "Zero", "ReLU", (0,), dtype="FP64")
    check_trus(cfg, 3, p, t, s, q, u, "Zero", "ReLU")


def _run_against_naive(data: dict, seed: int = 0) -> None:
    cfg = teir.Config.from_dict(data)
    in0, in1, out = operands(cfg, seed)
    naive = naive_execute(
        data, [] if in0 is None else list(in0), [] if in1 is None else list(in1), list(out)
    )
    reference.execute(cfg, in0, in1, out)
    assert_matches_naive(data, out, naive, cfg.dtype)


def test_aliasing_output_accumulates_and_applies_first_last_once():
    # The M loop axis 0 has out stride 0: its 3 iterations all touch the same output tile.
    data = dict(
        data_type="FP64",
        prim_first="Zero",
        prim_main="GEMM",
        prim_last="ReLU",
        dim_types=["M", "M", "N", "K"],
        exec_types=["seq", "prim", "prim", "prim"],
        dim_sizes=[3, 2, 2, 2],
        strides_in0=[4, 1, 0, 2],
        strides_in1=[0, 0, 2, 1],
        strides_out=[0, 1, 2, 0],
    )
    cfg = teir.Config.from_dict(data)
    a = RNG.uniform(-1, 1, 12)
    b = RNG.uniform(-1, 1, 4)
    out = np.full(4, 5.0)
    reference.execute(cfg, a, b, out)
    blocks = [a[4 * i : 4 * i + 4].reshape(2, 2, order="F") for i in range(3)]
    expected = relu(sum(blocks) @ b.reshape(2, 2, order="F"))
    np.testing.assert_allclose(out.reshape(2, 2, order="F"), expected, rtol=1e-12)
    _run_against_naive(data)


def test_aliasing_copy_keeps_the_last_iteration():
    data = dict(
        data_type="FP32",
        prim_main="Copy",
        dim_types=["C", "C"],
        exec_types=["seq", "prim"],
        dim_sizes=[4, 3],
        strides_in0=[3, 1],
        strides_in1=[0, 0],
        strides_out=[0, 1],
    )
    cfg = teir.Config.from_dict(data)
    a = np.arange(12, dtype=np.float32)
    out = np.zeros(3, dtype=np.float32)
    reference.execute(cfg, a, None, out)
    np.testing.assert_array_equal(out, [9, 10, 11])


def test_aliasing_within_a_tile_copy_last_element_wins():
    data = dict(
        data_type="FP32",
        prim_main="Copy",
        dim_types=["C"],
        exec_types=["prim"],
        dim_sizes=[5],
        strides_in0=[1],
        strides_in1=[0],
        strides_out=[0],
    )
    a = np.arange(5, dtype=np.float32)
    out = np.zeros(1, dtype=np.float32)
    reference.execute(teir.Config.from_dict(data), a, None, out)
    assert out[0] == 4


def test_overlapping_tiles_are_distinct_tiles():
    # Tiles of 2 elements at bases 0, 1, 2 overlap; K loop outermost, so Zero on first access of
    # each tile position wipes what the previous tile wrote into the shared element.
    data = dict(
        data_type="FP64",
        prim_first="Zero",
        prim_main="GEMM",
        prim_last="None",
        dim_types=["K", "M", "M", "N", "K"],
        exec_types=["seq", "seq", "prim", "prim", "prim"],
        dim_sizes=[2, 3, 2, 1, 1],
        strides_in0=[6, 2, 1, 0, 0],
        strides_in1=[1, 0, 0, 0, 0],
        strides_out=[0, 1, 1, 1, 0],
    )
    _run_against_naive(data)
    cfg = teir.Config.from_dict(data)
    a = np.arange(1.0, 13.0)
    b = np.array([1.0, 10.0])
    out = np.full(4, 100.0)
    reference.execute(cfg, a, b, out)
    # Sequence: k=0: m=0 zero[0,1] +a0,a1; m=1 zero[1,2] +a2,a3; m=2 zero[2,3] +a4,a5
    #           k=1: m=0 +10*(a6,a7) at [0,1]; m=1 +10*(a8,a9) at [1,2]; m=2 +10*(a10,a11) at [2,3]
    expected = np.array([1 + 70, 3 + 80 + 90, 5 + 100 + 110, 6 + 120], dtype=float)
    np.testing.assert_array_equal(out, expected)


def test_in_place_on_any_shape_and_fortran_order():
    cfg = teir.load(EXAMPLES / "lab3_zero_brgemm_relu.json")
    in0, in1, out = operands(cfg)
    expected = out.copy()
    reference.execute(cfg, in0, in1, expected)
    a = np.asfortranarray(in0.reshape(64, 4096, order="F"))
    b = in1.reshape(8, 8, 4096)
    c = np.asfortranarray(out.copy().reshape(1024, 1024, order="F"))
    reference.execute(cfg, a, b, c)
    np.testing.assert_array_equal(c.reshape(-1, order="F"), expected)


def test_buffers_larger_than_needed_keep_their_tail():
    cfg = teir.load(EXAMPLES / "transpose_3x4.json")
    a = np.arange(20, dtype=np.float32)
    out = np.full(20, -7, dtype=np.float32)
    reference.execute(cfg, a, None, out)
    np.testing.assert_array_equal(out[12:], -7)
    np.testing.assert_array_equal(out[:12].reshape(4, 3), a[:12].reshape(3, 4).T)


class TestArgumentErrors:
    cfg = teir.load(EXAMPLES / "lab1_gemm.json")

    def call(self, **given):
        a, b, c = operands(self.cfg)
        arguments = {"in0": a, "in1": b, "out": c, **given}
        reference.execute(self.cfg, arguments["in0"], arguments["in1"], arguments["out"])

    def test_too_small(self):
        with pytest.raises(teir.ExecutionError, match=r"in1 holds 100 elements.*262144"):
            self.call(in1=np.zeros(100, dtype=np.float32))

    def test_wrong_dtype(self):
        with pytest.raises(teir.ExecutionError, match=r"out has dtype float64.*FP32"):
            self.call(out=np.zeros(1048576))

    def test_none_for_a_needed_input(self):
        with pytest.raises(teir.ExecutionError, match=r"in0 is read by GEMM.*None"):
            self.call(in0=None)

    def test_not_an_array(self):
        with pytest.raises(teir.ExecutionError, match="NumPy array"):
            self.call(in0=[1.0] * 262144)

    def test_non_contiguous(self):
        with pytest.raises(teir.ExecutionError, match="not contiguous"):
            self.call(in0=np.zeros(2 * 262144, dtype=np.float32)[::2])

    def test_read_only_output(self):
        out = np.zeros(1048576, dtype=np.float32)
        out.flags.writeable = False
        with pytest.raises(teir.ExecutionError, match="read-only"):
            self.call(out=out)

    def test_output_overlapping_an_input(self):
        big = np.zeros(2 * 1048576, dtype=np.float32)
        with pytest.raises(teir.ExecutionError, match="overlaps in0"):
            self.call(in0=big[:262144], out=big[100 : 100 + 1048576])

    def test_byte_swapped_dtype(self):
        with pytest.raises(teir.ExecutionError, match="dtype"):
            self.call(in0=np.zeros(262144, dtype=">f4"))

    def test_nothing_is_written_on_error(self):
        a, _b, c = operands(self.cfg)
        before = c.copy()
        with pytest.raises(teir.ExecutionError):
            reference.execute(self.cfg, a, np.zeros(5, dtype=np.float32), c)
        np.testing.assert_array_equal(c, before)


def test_unused_inputs_may_be_none_or_an_ignored_array():
    cfg = teir.load(EXAMPLES / "transpose_3x4.json")
    out = np.zeros(12, dtype=np.float32)
    reference.execute(cfg, np.ones(12, dtype=np.float32), None, out)
    reference.execute(cfg, np.ones(12, dtype=np.float32), np.zeros(1, dtype=np.int8), out)
    np.testing.assert_array_equal(out, 1)
    with pytest.raises(teir.ExecutionError, match="in1 is not read"):
        reference.execute(cfg, np.ones(12, dtype=np.float32), "x", out)


def test_config_argument_must_be_a_config():
    with pytest.raises(teir.ExecutionError, match=r"teir\.Config"):
        reference.execute({"prim_main": "GEMM"}, None, None, np.zeros(3))
