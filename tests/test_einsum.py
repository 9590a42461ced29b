"""teir.einsum against np.einsum: NumPy's own cases, views of every kind, out=, options,
errors, contract_expression, and generated einsums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import teir
from helpers import out_array
from teir.frontend import copy_fallback
from teir.frontend import einsum as einsum_module
from teir.frontend.split_reduction import (
    LONGEST_CHAIN,
    accuracy_parts,
    chain_length,
    split_views,
)

RNG = np.random.default_rng(7)

# (subscripts, shapes) in the spirit of NumPy's test_einsum: one and two operands.
CASES = [
    ("i->i", [(6,)]),
    ("ij->ij", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("ijkl->ljik", [(2, 3, 4, 5)]),
    ("ii->i", [(5, 5)]),
    ("ii", [(5, 5)]),
    ("iii->i", [(3, 3, 3)]),
    ("ij->", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("ijk->ik", [(2, 3, 4)]),
    ("...->...", [(2, 3)]),
    ("...ij->...ji", [(2, 3, 4)]),
    ("i...->...", [(3, 2, 4)]),
    ("ji", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("i,i->i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,j", [(3,), (4,)]),
    ("ij,j->i", [(3, 4), (4,)]),
    ("ij,i->j", [(3, 4), (3,)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("ji,jk->ik", [(4, 3), (4, 5)]),
    ("ji,kj->ik", [(4, 3), (5, 4)]),
    ("ij,jk->ki", [(3, 4), (4, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("ij,ji->", [(3, 4), (4, 3)]),
    ("bij,bjk->bik", [(4, 3, 5), (4, 5, 2)]),
    ("bij,bjk->bki", [(4, 3, 5), (4, 5, 2)]),
    ("ijk,jil->kl", [(3, 4, 5), (4, 3, 2)]),
    ("abcd,dcbe->ae", [(2, 3, 4, 5), (5, 4, 3, 6)]),
    ("trus,pqtu->pqrs", [(3, 4, 5, 6), (2, 3, 3, 5)]),
    ("iij,jk->ik", [(4, 4, 5), (5, 3)]),
    ("ijk,jl->il", [(3, 4, 5), (4, 6)]),
    (",i->i", [(), (3,)]),
    ("i,->i", [(3,), ()]),
    (",->", [(), ()]),
    ("...ij,...jk", [(5, 1, 3, 4), (2, 4, 6)]),
    ("ij...,jk...", [(3, 4, 5), (4, 6, 1)]),
    ("...,...", [(3,), (2, 3)]),
    ("ij,ij->ij", [(3, 1), (3, 4)]),
    ("ij,jk", [(3, 1), (4, 2)]),
    ("Ba,aC->BC", [(3, 4), (4, 5)]),
    ("ba", [(3, 4)]),
    ("i j -> j i", [(2, 3)]),
    ("ij,jk->ik", [(1, 1), (1, 1)]),
    ("ij,jk->ik", [(97, 61), (61, 13)]),
    ("mk,kn->mn", [(130, 70), (70, 90)]),
    ("ik,jk->ij", [(64, 48), (32, 48)]),
    ("abc,cd->abd", [(7, 11, 13), (13, 5)]),
    ("ab,bcd->acd", [(6, 9), (9, 4, 7)]),
]


def operands(shapes, dtype=np.float64):
    return [RNG.uniform(-1, 1, shape).astype(dtype) for shape in shapes]


def check(subscripts, ops, **options):
    got = teir.einsum(subscripts, *ops, **options)
    expected = np.einsum(subscripts, *[np.asarray(o, dtype=np.float64) for o in ops])
    assert np.shape(got) == np.shape(expected)
    dtype = np.result_type(*ops) if ops else np.float64
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
    return got


def check_accumulated_twice(subscripts, a, b, out, bound):
    """Sum ``subscripts`` of ``a``, ``b`` into ``out`` of ones, planned and then replayed."""
    expected = np.einsum(subscripts, a.astype(np.float64), b.astype(np.float64))
    for _ in range(2):  # planned, then replayed
        out[...] = 1
        teir.einsum(subscripts, a, b, out=out, accumulate=True)
        np.testing.assert_allclose(out, expected + 1, rtol=bound, atol=bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("subscripts", "shapes"), CASES, ids=[c[0] for c in CASES])
def test_numpy_cases(subscripts, shapes, dtype):
    result = check(subscripts, operands(shapes, dtype))
    if np.ndim(result) > 0:
        assert result.dtype == dtype


def test_scalar_results_are_numpy_scalars():
    value = teir.einsum("i,i", np.ones(3), np.ones(3))
    assert isinstance(value, np.float64) and value == 3


def test_views_transposed_sliced_negative_and_broadcast():
    base = RNG.uniform(-1, 1, (20, 30))
    other = RNG.uniform(-1, 1, (30, 20))
    check("ij,jk->ik", [base.T, other.T])
    check("ij,jk->ik", [base[::2, 1::3], other[1::3, ::4]])
    check("ij,jk->ik", [base[::-1], other[:, ::-2]])
    check("ij,jk->ik", [np.broadcast_to(base[:1], (20, 30)), other])
    check("ij->ji", [base[3:15:2, ::-3]])
    check("ijk->kij", [RNG.uniform(-1, 1, (4, 5, 6)).transpose(2, 0, 1)])
    fortran = np.asfortranarray(base)
    check("ij,jk", [fortran, other])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_labels_summed_in_one_operand(dtype):
    # NumPy sums them first; an operand with more dimensions than einsum has letters
    # (NumPy 2 allows 64) too
    x, y = operands([(6, 5, 4, 3), (3, 7)], dtype)
    check("abcd->db", [x])
    check("abcd->", [x])
    check("abcd,de->ae", [x, y])
    check("aabc->cb", operands([(4, 4, 3, 5)], dtype))
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        many = operands([(1,) * 50 + (2, 2, 3)], dtype)[0]
        check("...i->...", [many])
        check("...i,...i->...", [many, many])


def test_mixed_precision_promotes_like_numpy():
    a = RNG.uniform(-1, 1, (4, 5)).astype(np.float32)
    b = RNG.uniform(-1, 1, (5, 3))
    assert teir.einsum("ij,jk", a, b).dtype == np.einsum("ij,jk", a, b).dtype == np.float64
    assert teir.einsum(",i->i", 2.0, a[0]).dtype == np.float64


def test_out_in_place_and_layouts():
    a, b = operands([(6, 7), (7, 5)])
    expected = a @ b
    out = np.full((6, 5), 9.0)
    assert teir.einsum("ij,jk->ik", a, b, out=out) is out
    np.testing.assert_allclose(out, expected)
    fortran = np.asfortranarray(np.zeros((6, 5)))
    teir.einsum("ij,jk->ik", a, b, out=fortran)
    np.testing.assert_allclose(fortran, expected)
    big = np.zeros((12, 15))
    view = big[::2, ::3]
    teir.einsum("ij,jk->ik", a, b, out=view)
    np.testing.assert_allclose(view, expected)
    assert not big[1::2].any()
    reversed_out = np.zeros((6, 5))[::-1]
    teir.einsum("ij,jk->ik", a, b, out=reversed_out)
    np.testing.assert_allclose(reversed_out, expected)


def test_out_overlapping_an_input():
    a = RNG.uniform(-1, 1, (5, 5))
    expected = a @ a
    teir.einsum("ij,jk->ik", a, a.copy(), out=a)
    np.testing.assert_allclose(a, expected)
    x = RNG.uniform(-1, 1, (4, 4))
    transposed = x.T.copy()
    teir.einsum("ij->ji", x, out=x)
    np.testing.assert_allclose(x, transposed)


def test_accumulate_and_relu():
    a, b = operands([(6, 7), (7, 5)])
    out = RNG.uniform(-1, 1, (6, 5))
    start = out.copy()
    teir.einsum("ij,jk->ik", a, b, out=out, accumulate=True)
    np.testing.assert_allclose(out, start + a @ b)
    np.testing.assert_allclose(teir.einsum("ij,jk->ik", a, b, relu=True), np.maximum(a @ b, 0))
    out = start.copy()
    teir.einsum("ij,jk->ik", a, b, out=out, accumulate=True, relu=True)
    np.testing.assert_allclose(out, np.maximum(start + a @ b, 0))
    out = start.copy()
    teir.einsum("ij->ji", a[:5, :6], out=out, accumulate=True)
    np.testing.assert_allclose(out, start + a[:5, :6].T)
    np.testing.assert_allclose(teir.einsum("ij->ji", a, relu=True), np.maximum(a.T, 0))


@pytest.mark.parametrize("count", [1, 2, 3])
def test_accumulate_needs_an_out_and_flags_are_booleans(count):
    """accumulate adds into out: without one it would add into whatever memory a new array
    held (it returned NaN and 1e6 after a freed array of 1e6); flags of other types are
    refused rather than read as truthy."""
    shapes = [(6, 7), (7, 5), (5, 4)][:count]
    subscripts = ["ij", "ij,jk->ik", "ij,jk,kl->il"][count - 1]
    ops = operands(shapes)
    with pytest.raises(teir.EinsumError, match="accumulate=True adds the result to out"):
        teir.einsum(subscripts, *ops, accumulate=True)
    expression = teir.contract_expression(subscripts, *shapes, accumulate=True)
    with pytest.raises(teir.EinsumError, match="pass out="):
        expression(*ops)
    out = np.ones(np.einsum(subscripts, *ops).shape)
    expression(*ops, out=out)
    np.testing.assert_allclose(out, 1 + np.einsum(subscripts, *ops))
    for flags in ({"accumulate": "yes", "out": out}, {"relu": None}, {"relu": 1}):
        with pytest.raises(teir.EinsumError, match="must be True or False"):
            teir.einsum(subscripts, *ops, **flags)
    with pytest.raises(teir.EinsumError, match="must be True or False"):
        teir.contract_expression(subscripts, *shapes, relu="no")


@pytest.mark.parametrize("subscripts", ["ij,jk->ik", "ik->ki"])
def test_an_out_that_cannot_take_the_result_is_refused_before_planning(subscripts):
    """A read-only or broadcast out is named as such, not as a schedule that aliases."""
    ops = operands([(3, 4), (4, 5)] if "," in subscripts else [(5, 3)])
    with pytest.raises(teir.EinsumError, match="out is read-only"):
        teir.einsum(subscripts, *ops, out=np.broadcast_to(np.zeros(5), (3, 5)))
    repeated = np.lib.stride_tricks.as_strided(np.zeros(5), (3, 5), (0, 8))
    with pytest.raises(teir.EinsumError, match="repeats elements"):
        teir.einsum(subscripts, *ops, out=repeated)
    assert issubclass(teir.TeirError, ValueError)


def test_temporaries_beyond_the_machines_memory_are_refused_before_allocating(monkeypatch):
    """A broadcast view of 2^33 elements in a layout no kernel fits is copied whole: beyond
    the machine's memory that is a clear error, not NumPy's MemoryError (here with the
    machine's memory set to 4 MiB, so that the check runs on 16 MiB of copies)."""
    import teir.buffers
    from teir.frontend.einsum import clear_plans

    clear_plans()
    monkeypatch.setattr(teir.buffers, "memory_bytes", lambda: 4 << 20)
    x = np.broadcast_to(np.ones(1), (1 << 20,))
    with pytest.raises(teir.ExecutionError, match=r"GiB of temporaries.*broadcast view"):
        teir.einsum("i,i->", x, x, threads=1)
    monkeypatch.undo()
    clear_plans()
    assert teir.einsum("i,i->", x, x, threads=1) == 1 << 20


def test_zero_sized_dimensions():
    np.testing.assert_array_equal(
        teir.einsum("ij,jk->ik", np.ones((3, 0)), np.ones((0, 2))), np.zeros((3, 2))
    )
    assert teir.einsum("ij,jk->ik", np.ones((0, 4)), np.ones((4, 2))).shape == (0, 2)


def test_three_or_more_operands():
    a, b, c, d = operands([(3, 4), (4, 5), (5, 6), (6, 2)])
    np.testing.assert_allclose(teir.einsum("ij,jk,kl,lm->im", a, b, c, d), a @ b @ c @ d)
    np.testing.assert_allclose(teir.einsum("ij,jk,kl", a, b, c), a @ b @ c)
    x = RNG.uniform(-1, 1, (2, 3, 4))
    np.testing.assert_allclose(
        teir.einsum(
            "abc,ci,ai->bi", x, RNG.uniform(-1, 1, (4, 5))[:, :3], RNG.uniform(-1, 1, (2, 3))
        ).shape,
        (3, 3),
    )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: teir.einsum("ij,jk", np.ones((2, 3), int), np.ones((3, 2))), "int64"),
        (lambda: teir.einsum("ij,jk", np.ones((2, 3)), np.ones((4, 2))), "size"),
        (lambda: teir.einsum("ij->k", np.ones((2, 3))), "does not appear"),
        (lambda: teir.einsum("i->ii", np.ones(3)), "more than once"),
        (lambda: teir.einsum("ij", np.ones(3)), "dimensions"),
        (lambda: teir.einsum("i,i", np.ones(3)), "operand"),
        (lambda: teir.einsum("i#", np.ones((2, 2))), "not a valid subscript"),
        (lambda: teir.einsum("ii->i", np.ones((3, 4))), "different sizes"),
        (
            lambda: teir.einsum(
                "ij,jk->ik", np.ones((2, 3)), np.ones((3, 2)), out=np.zeros((3, 3))
            ),
            "shape",
        ),
        (
            lambda: teir.einsum(
                "ij,jk->ik", np.ones((2, 3)), np.ones((3, 2)), out=np.zeros((2, 2), np.float32)
            ),
            "dtype",
        ),
        (lambda: teir.einsum("i", np.ones(3, np.complex128)), "complex128"),
        (lambda: teir.einsum(3, np.ones(3)), "string"),
        # an out of the result's size but another shape (its strides would alias the result)
        (
            lambda: teir.einsum(
                "ij,jk->ik", np.ones((3, 4)), np.ones((4, 5)), out=np.zeros((5, 3))
            ),
            r"out has shape \(5, 3\), the result has shape \(3, 5\)",
        ),
        (lambda: teir.einsum("ij,jk", np.ones((2, 3)), np.ones((3, 2)), threads=0), "threads"),
        (lambda: teir.einsum("ij,jk", np.ones((2, 3)), np.ones((3, 2)), threads=True), "threads"),
        (lambda: teir.einsum("i,i,i", np.ones(3), np.ones(3), np.ones(3), threads=0), "threads"),
        (lambda: teir.contract_expression("ij,jk", (2, 3), (3, 2), threads=2.0), "threads"),
    ],
)
def test_errors(call, match):
    with pytest.raises(teir.TeirError, match=match):
        call()
    assert issubclass(teir.EinsumError, ValueError)


def test_a_result_larger_than_memory_is_refused_before_allocation():
    # 10^6 x 10^6 FP64 is 7.3 TiB: teir's own error, a MemoryError as NumPy's would be
    with pytest.raises(teir.OutOfMemoryError, match=r"\(1000000, 1000000\).*more than"):
        teir.einsum("i,j->ij", np.ones(10**6), np.ones(10**6))
    assert issubclass(teir.OutOfMemoryError, MemoryError)
    assert issubclass(teir.OutOfMemoryError, teir.ExecutionError)


def test_read_only_out():
    out = np.zeros((2, 2))
    out.flags.writeable = False
    with pytest.raises(teir.EinsumError, match="read-only"):
        teir.einsum("ij,jk->ik", np.ones((2, 3)), np.ones((3, 2)), out=out)


def test_contract_expression_is_reusable():
    expr = teir.contract_expression("bij,bjk->bik", (4, 6, 5), (4, 5, 3), dtype=np.float32)
    for _ in range(3):
        x, y = operands([(4, 6, 5), (4, 5, 3)], np.float32)
        np.testing.assert_allclose(expr(x, y), x @ y, rtol=1e-5)
    assert "BRGEMM" in expr.explain() or "GEMM" in expr.explain()
    with pytest.raises(teir.EinsumError, match="shape"):
        expr(np.ones((4, 6, 5), np.float32), np.ones((4, 5, 4), np.float32))
    with pytest.raises(teir.EinsumError, match="expected 2 operands"):
        expr(np.ones((4, 6, 5), np.float32))


@pytest.mark.parametrize(
    "subscripts, shapes",
    [("ij,jk->ik", [(6, 5), (5, 3)]), ("ij,jk,kl->il", [(6, 5), (5, 3), (3, 4)])],
    ids=["two", "three"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_contract_expression_converts_operands_to_its_dtype(subscripts, shapes, dtype):
    other = np.float64 if dtype == np.float32 else np.float32
    expr = teir.contract_expression(subscripts, *shapes, dtype=dtype)
    arrays = operands(shapes, other)
    teir.einsum(subscripts, *arrays)  # einsum itself keeps the arrays' dtype, and
    result = expr(*arrays)  # its cached call for them must not answer the expression
    assert result.dtype == dtype
    expected = np.einsum(subscripts, *[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    assert expr(*[[list(row) for row in a] for a in arrays]).dtype == dtype  # lists too


def test_plans_are_cached():
    a, b = operands([(9, 8), (8, 7)])
    first = teir.einsum_plan("ij,jk->ik", a, b)
    assert teir.einsum_plan("ij,jk->ik", a + 1, b) is first
    assert teir.einsum_plan("ij,jk->ik", a.T.copy().T, b) is not first  # other strides
    einsum_module.clear_plans()
    assert teir.einsum_plan("ij,jk->ik", a, b) is not first


def test_large_contraction_uses_kernels():
    a, b = operands([(256, 192), (192, 160)], np.float32)
    plan = teir.einsum_plan("ij,jk->ik", a, b)
    assert "generic" not in plan.explain()
    check("ij,jk->ik", [a, b])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_operands_no_kernel_layout_fits_go_through_copies(dtype):
    # The batch label is innermost everywhere: no GEMM layout fits, so both operands and the
    # result are permuted through temporaries. Calls reuse those, also while out is summed into.
    # A new result of teir's layout (order K) is laid out as the copies compute it instead.
    a, b = operands([(9, 7, 5), (7, 6, 5)], dtype)
    laid_out = teir.einsum_plan("ijb,jkb->ikb", a, b)
    assert laid_out.memory_order is not None and "the result is" not in laid_out.explain()
    plan = teir.einsum_plan("ijb,jkb->ikb", a, b, order="C")
    text = plan.explain()
    assert (
        "in0 is copied into the order bji; in1 is copied into the order bkj; the result is " in text
    )
    assert "the contraction of the copies:\n# einsum abc,adb->adc" in text
    assert "generic" not in text  # the generic operation planned first does not run
    out = np.zeros((9, 6, 5), dtype)
    for _ in range(3):
        check("ijb,jkb->ikb", [a, b])
        teir.einsum("ijb,jkb->ikb", a, b, out=out, accumulate=True)
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(out, 3 * np.einsum("ijb,jkb->ikb", a, b), rtol=tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("subscripts", ["ki,kj->ij", "ki,jk->ij", "ik,kj->ji"])
@pytest.mark.parametrize("padding", [0, 3])
def test_transposed_operands_are_copied_once_into_the_plain_kernel_layout(
    subscripts, padding, dtype
):
    # Compute-bound (640 FLOPs per input element): a kernel that would copy a transposed
    # operand on every call, or broadcast from its rows, gives way to copies made once into
    # the layouts of the plain outer-product kernel. Inputs may be views with padded rows.
    sizes = {"i": 640, "j": 640, "k": 1024}
    terms = subscripts.split("->")[0].split(",")
    padded = operands([[sizes[x] + padding for x in term] for term in terms], dtype)
    ops = [array[padding:, padding:] for array in padded]
    text = teir.einsum_plan(subscripts, *ops, threads=2).explain()
    assert "copied once, they run the plain outer-product kernel: " in text
    assert "outer form" in text.split("the contraction of the copies:")[1]
    check(subscripts, ops, threads=2)
    result_shape = [sizes[x] for x in subscripts.split("->")[1]]
    out = np.ones(result_shape, dtype)
    teir.einsum(subscripts, *ops, out=out, accumulate=True, relu=True, threads=2)
    wide = [np.asarray(op, dtype=np.float64) for op in ops]
    expected = np.maximum(1 + np.einsum(subscripts, *wide), 0)
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("heavy", [False, True])
def test_relayout_copies_stay_within_the_scratch_buffer(monkeypatch, heavy):
    # With a 1 MiB scratch buffer no copy of a 640 x 1024 FP64 operand fits: the kernel that
    # fits the operands as they lie runs, not the copies of everything; unless the
    # contraction spends RELAYOUT_FLOPS_PER_TEMPORARY per element copied (1280 here), which
    # pays for a buffer of the copy's own, allocated for the call.
    einsum_module.clear_plans()
    monkeypatch.setattr(copy_fallback, "SCRATCH_LIMIT_BYTES", 1 << 20)
    monkeypatch.setattr(copy_fallback, "RELAYOUT_FLOPS_PER_TEMPORARY", 1024 if heavy else 2048)
    a, b = operands([(1024, 640), (1024, 640)])
    text = teir.einsum_plan("ki,kj->ij", a, b, threads=2).explain()
    if heavy:
        assert "in0 is copied into the order ik" in text
    else:
        assert "copied" not in text and "computed in the order" not in text
    check("ki,kj->ij", [a, b], threads=2)
    out = np.full((640, 640), np.nan)
    teir.einsum("ki,kj->ij", a, b, out=out, threads=2)
    np.testing.assert_allclose(out, a.T @ b, rtol=1e-12, atol=1e-12)
    einsum_module.clear_plans()


def test_relayout_copies_pay_over_a_long_k_for_a_kernel_that_packs_a_on_every_call():
    # Into an out of 2048² FP64, K 1024: the kernel that fits the operands as they lie packs
    # its A tile on every call and reads a transposed B (no room for a packed panel once the
    # output cuts K into steps); over a K of RELAID_LONG_K or more in0 copied once pays
    # (4096² x 2048: 748 -> 440 ms). The result is the oracle's.
    einsum_module.clear_plans()
    a, b = operands([(1024, 2048), (1024, 2048)])
    out = np.full((2048, 2048), np.nan)
    text = teir.einsum_plan("ki,kj->ij", a, b, out=out, threads=2).explain()
    assert "in0 is copied into the order ik" in text
    teir.einsum("ki,kj->ij", a, b, out=out, threads=2)
    np.testing.assert_allclose(out, a.T @ b, rtol=1e-12, atol=1e-10)
    einsum_module.clear_plans()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relayout_copies_may_give_the_outer_kernel_that_packs_its_a_tile(dtype, two_pipe_xeon):
    # As they lie, the operands fit a kernel that broadcasts from the rows of a transposed B.
    # The plain outer-product kernel needs the 4 MB result copied; in0 (288 KiB) copied
    # alone gives the outer-product kernel that packs its A tile once per call, and the
    # result is written in place (FP32: 0.84 -> 0.44 ms on 2 threads).
    sizes = {"g": 96, "c": 14, "h": 64, "d": 12, "f": 64}
    ops = operands([[sizes[x] for x in term] for term in ("ghd", "hcf")], dtype)
    text = teir.einsum_plan("ghd,hcf->gdcf", *ops, threads=2).explain()
    assert "(its A tile packed once per call): in0 is copied into the order gdh (" in text
    assert "computed in the order" not in text and "in1 is copied" not in text
    check("ghd,hcf->gdcf", ops, threads=2)
    out = np.ones([sizes[x] for x in "gdcf"], dtype)
    teir.einsum("ghd,hcf->gdcf", *ops, out=out, accumulate=True, relu=True, threads=2)
    wide = [np.asarray(op, dtype=np.float64) for op in ops]
    expected = np.maximum(1 + np.einsum("ghd,hcf->gdcf", *wide), 0)
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relayout_copies_are_paid_for_by_flops_per_element_copied(dtype, two_pipe_xeon):
    # Compute-bound in its inputs (1900 FLOPs per input element), but with K 12 the 3.9 M
    # element result, which the outer-product kernel would need copied, takes 24 per
    # element: the kernel that fits as the operands lie runs (FP32 0.88 ms, 1.15 copying).
    sizes = {"f": 50, "a": 100, "h": 12, "d": 25, "g": 31}
    ops = operands([[sizes[x] for x in term] for term in ("fhg", "hda")], dtype)
    text = teir.einsum_plan("fhg,hda->fadg", *ops, threads=2).explain()
    assert "copied" not in text and "computed in the order" not in text
    check("fhg,hda->fadg", ops, threads=2)


def test_a_result_copied_for_the_plain_kernel_pays_at_112_flops_per_element():
    # K 56: the 1.28 M element result, permuted into place, is still paid for
    # (FP32 1.07 -> 0.80 ms on 2 threads against the kernel that fits as it lies).
    a, b = operands([(3200, 56), (56, 400)], np.float32)
    text = teir.einsum_plan("gc,ca->ag", a, b, threads=2).explain()
    assert "the result is computed in the order ga and permuted into place" in text
    check("gc,ca->ag", [a, b], threads=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inputs_that_fit_with_a_result_that_does_not_copy_the_result(dtype):
    # The inputs lie as the kernel wants them (C, K, M and C, N, K); the result has its unit
    # stride on the batch label, which no kernel layout fits: only the result is permuted
    # (a new one of teir's layout, order K, is laid out acb and needs no copy at all).
    a, b = operands([(11, 9, 7), (11, 13, 9)], dtype)
    assert "copied" not in teir.einsum_plan("adb,acd->bca", a, b).explain()
    plan = teir.einsum_plan("adb,acd->bca", a, b, order="C")
    text = plan.explain()
    assert "the result is computed in the order acb and permuted into place" in text
    assert "generic" not in text
    check("adb,acd->bca", [a, b])
    out = np.ones((7, 13, 11), dtype)
    teir.einsum("adb,acd->bca", a, b, out=out, accumulate=True)
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    expected = 1 + np.einsum("adb,acd->bca", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    ("subscripts", "sizes", "moved", "dtype"),
    [
        # Only the result lies badly (its batch label innermost): the inputs are read in place.
        ("bik,bkj->ijb", {"b": 4, "i": 24, "j": 16, "k": 8}, ["the result"], np.float64),
        # in0's rows (label c) lie 576 KB apart: read in place all the same (0.33 ms; 1.07
        # with in0 copied too), as in1 is.
        (
            "cabe,abde->cdba",
            {"a": 3, "b": 40, "c": 16, "d": 8, "e": 600},
            ["the result"],
            np.float64,
        ),
        # The result has N's unit stride; with in1 copied it fits a kernel that writes it in
        # place. (At a 90 that kernel's tiles are 184 x 129 x 44 where copying all three
        # gives 920 x 129 x 44, large enough all the same: 11-13 ms, 24 ms with the copy.)
        ("aecb,eda->acbd", {"a": 2, "b": 23, "c": 40, "d": 129, "e": 44}, ["in1"], np.float64),
        # Copying in1 alone into the canonical order (K innermost) fits a kernel that
        # vectorizes along in0's unit-stride g of 6, filling 6 of 16 FP32 lanes (32 % of
        # peak at full size, 78 % with in0 copied too); into the transposed product's order
        # (N innermost) it fills whole vectors, as fast as copying both (1.09 ms at
        # a 256, c 80, d 16).
        (
            "febag,edgcf->cdba",
            {"a": 32, "b": 5, "c": 20, "d": 2, "e": 4, "f": 3, "g": 6},
            ["in1"],
            np.float32,
        ),
        # Both inputs copied fit a kernel that writes the result in place, with tiles of
        # 50 x 31 x 46, where copying all three gives far larger ones; copying the result
        # costs more than the smaller tiles (a 45, d 51: FP32 3.0 -> 2.4 ms, FP64 5.6-7.1 ->
        # 4.4-4.7 ms; NumPy 1.9-2.4 and 4.8-7.1).
        ("eba,ced->dacb", {"a": 3, "b": 50, "c": 31, "d": 4, "e": 46}, ["in0", "in1"], np.float32),
        # Both inputs copied would write the result in place with the kernel's rows on its c
        # of 12, 3/4 of 16 FP32 lanes; a compute-bound contraction pays for copying the
        # result instead of in1 (tiles of 144 rows): 2.19 -> 1.70 ms.
        (
            "jcl,jhd->lhdc",
            {"c": 12, "d": 8, "h": 200, "j": 200, "l": 48},
            ["in0", "the result"],
            np.float32,
        ),
        # Both inputs copied would write the result in place too, but with tiles of C of 12 x 6
        # (summed over 608 steps of K): copying the result as well is faster (2.1 ms to 2.6-3.4).
        # in0 is then read in place, its b rows 1 MB apart (1.4 ms, 2.2 ms copying it too).
        (
            "bcfag,defga->beadc",
            {"a": 18, "b": 13, "c": 12, "d": 6, "e": 5, "f": 19, "g": 32},
            ["in1", "the result"],
            np.float64,
        ),
        # in0 copied with its summed labels as in1 lies (dfeb: b innermost, then e, f) lets
        # the kernel read the large in1 as it lies, its K of b 64 unit-stride in both;
        # before, in1 was copied into the canonical order (e 512, in1 84 MB: 9.4 -> 2.5 ms,
        # NumPy 6.6)
        (
            "ebdf,cafeb->dca",
            {"a": 5, "b": 64, "c": 16, "d": 5, "e": 32, "f": 8},
            ["in0"],
            np.float32,
        ),
    ],
)
def test_the_fallback_copies_only_the_tensors_that_need_it(subscripts, sizes, moved, dtype):
    inputs, output = subscripts.split("->")
    a, b = operands([[sizes[x] for x in term] for term in inputs.split(",")], dtype)
    # a new result in the listed order (order="K" may lay it out so that a kernel fits)
    text = teir.einsum_plan(subscripts, a, b, order="C").explain()
    assert "# no kernel layout fits" in text
    for name in ("in0", "in1", "the result"):
        assert (f"{name} is c" in text) == (name in moved)
    expected = np.einsum(subscripts, a.astype(np.float64), b.astype(np.float64))
    # FP32: 1e-5 for 72 products summed per element, growing with the square root of the
    # count (random rounding errors)
    summed = np.prod([sizes[x] for x in set(inputs) - set(output) - {","}])
    bound = 1e-11 if dtype == np.float64 else 1e-5 * max(1.0, np.sqrt(summed / 72))
    tolerance = {"rtol": bound, "atol": bound}
    listed = teir.einsum(subscripts, a, b, order="C")
    np.testing.assert_allclose(listed, expected, **tolerance)
    assert listed.flags.c_contiguous
    np.testing.assert_allclose(teir.einsum(subscripts, a, b), expected, **tolerance)
    out = np.ones([sizes[x] for x in output], dtype)
    teir.einsum(subscripts, a, b, out=out, accumulate=True, relu=True)
    np.testing.assert_allclose(out, np.maximum(expected + 1, 0), **tolerance)
    # A result that cannot be written in place (negative strides) is computed in a copy.
    backwards = np.zeros([sizes[x] for x in output], dtype)[::-1]
    teir.einsum(subscripts, a, b, out=backwards)
    np.testing.assert_allclose(backwards, expected, **tolerance)


def test_kernels_that_fill_few_lanes_go_through_copies():
    # Both inputs have their unit stride on k (5): the kernel that fits them as they lie runs
    # dot products of 5 elements on 16-lane vectors. in0 copied with its M innermost fills
    # whole vectors instead (FP32 64 x 64 x 256, k 5: 468 -> 314 us).
    a, b = operands([(64, 64, 5), (256, 5)], np.float32)
    text = teir.einsum_plan("abk,ck->abc", a, b).explain()
    assert "the kernel that fits the operands as they lie fills" in text
    assert "in0 is copied" in text
    expected = np.einsum("abk,ck->abc", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(teir.einsum("abk,ck->abc", a, b), expected, rtol=1e-5, atol=1e-6)
    out = np.ones((64, 64, 256), np.float32)
    teir.einsum("abk,ck->abc", a, b, out=out, accumulate=True)
    np.testing.assert_allclose(out, expected + 1, rtol=1e-5, atol=1e-6)
    # Where the copies would fill no more lanes, the operands are used as they lie.
    x, y = operands([(20, 5), (30, 5)], np.float32)
    assert "copied" not in teir.einsum_plan("ik,jk->ij", x, y).explain()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_kernel_writing_few_columns_pages_apart_has_its_input_copied(dtype):
    # The only N that fits a kernel as in1 lies is its unit-stride h of 7, whose result
    # columns lie 917 KB apart (FP64); in1 copied with i innermost gives N 32, columns 4 KB
    # apart: FP64 1.99 -> 0.87 ms, FP32 0.70 -> 0.36 ms (NumPy 1.06 FP64).
    sizes = {"d": 512, "e": 7, "f": 48, "h": 7, "i": 32}
    a, b = operands([[sizes[x] for x in "efd"], [sizes[x] for x in "feih"]], dtype)
    out = np.ones([sizes[x] for x in "heid"], dtype)
    text = teir.einsum_plan("efd,feih->heid", a, b, out=out).explain()
    assert "writes 7 columns of C per call, a page or more apart" in text
    assert "in1 is copied into the order ehif" in text
    assert "in0 is copied" not in text
    if "permuted into place" in text:
        # (FP32 on 2 threads: the result computed as ehid in 14 tiles of 256 rows, 7 per
        # thread, is faster than 49 tiles as it lies: 195-207 -> 169-174 us)
        assert "the result is computed in the order ehid" in text
    check_accumulated_twice("efd,feih->heid", a, b, out, 1e-4 if dtype == np.float32 else 1e-11)
    # as many FLOPs into a result whose columns lie within a page (2 KB or 1 KB apart):
    # the kernel runs as the operands lie
    near = {**sizes, "d": 64, "e": 2, "f": 9600, "i": 2}
    x, y = operands([[near[x] for x in "efd"], [near[x] for x in "feih"]], dtype)
    assert "copied" not in teir.einsum_plan("efd,feih->heid", x, y).explain()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_memory_bound_result_written_by_few_lanes_comes_from_copied_inputs(dtype):
    # K (a) of 3, the result its largest tensor, listed with e (3) innermost: the kernel that
    # fits as they lie runs dot products of 3 elements. in0 copied lines b, d and e up along
    # the result's rows (FP32 3x31x3x200x128 into an out: 1.29 -> 0.41 ms).
    sizes = {"a": 3, "b": 20, "d": 16, "e": 3, "f": 31}
    a, b = operands([[sizes[x] for x in "ebda"], [sizes[x] for x in "fa"]], dtype)
    out = np.ones([sizes[x] for x in "fbde"], dtype)
    text = teir.einsum_plan("ebda,fa->fbde", a, b, out=out).explain()
    filled = "19%" if dtype == np.float32 else "38%"  # 3 of 16 or of 8 lanes
    assert f"fills {filled} of its vector lanes" in text
    assert "in0 is copied" in text and "permuted into place" not in text
    bound = 1e-5 if dtype == np.float32 else 1e-12
    check_accumulated_twice("ebda,fa->fbde", a, b, out, bound)
    # a memory-bound result is never copied itself: its copy would cost more than it saves
    sizes = {"a": 40, "d": 28, "f": 2, "g": 10, "h": 10}
    x, y = operands([[sizes[x] for x in "fd"], [sizes[x] for x in "gahf"]], dtype)
    text = teir.einsum_plan("fd,gahf->ahdg", x, y).explain()
    assert "permuted into place" not in text
    np.testing.assert_allclose(
        teir.einsum("fd,gahf->ahdg", x, y),
        np.einsum("fd,gahf->ahdg", x, y),
        rtol=bound,
        atol=bound,
    )


def test_a_large_input_with_far_apart_rows_is_read_where_it_lies():
    # in0's K steps lie 198 KB apart; copying its 29 MB would cost about as long as the
    # contraction: it is read in place (at 16x32x97x32x21x28 FP32: 9.7 ms, 32 ms through a
    # copy of in0).
    sizes = {"a": 4, "b": 32, "c": 97, "d": 32, "e": 21, "f": 28}
    rng = np.random.default_rng(11)
    a = rng.integers(-2, 3, [sizes[x] for x in "efacb"]).astype(np.float32)
    b = rng.integers(-2, 3, [sizes[x] for x in "defa"]).astype(np.float32)
    text = teir.einsum_plan("efacb,defa->dabc", a, b).explain()
    assert "# no kernel layout fits" in text and "in0 is copied" not in text
    expected = np.einsum("efacb,defa->dabc", a.astype(np.int64), b.astype(np.int64))
    np.testing.assert_array_equal(teir.einsum("efacb,defa->dabc", a, b), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_summing_short_runs_of_k_go_through_copies(dtype, monkeypatch):
    # e (9) has the unit stride in in1 and lies 32 KB apart in in0, d (131) the other way
    # round: the kernel that fits them as they lie takes one batch element at a time and
    # stores C after every 9 steps. A copy lines both up into one K of 1179 (FP32
    # 62x54x63x131x9: 8.0 -> 3.1 ms). The batch chunk follows L2: with 512 KiB per core the
    # whole batch does not fit (with 1 MiB it does for FP32, and the kernel sums all of K at
    # once). Planned for 2 threads: with 16, the copies' 6 parallel iterations would idle
    # most cores, and the kernel that fits as they lie runs in 36.
    import teir.codegen.brgemm as brgemm

    monkeypatch.setattr(brgemm, "cache_sizes", lambda: {"L1": 32768, "L2": 1 << 19, "L3": 1 << 25})
    einsum_module.clear_plans()
    sizes = {"a": 62, "b": 27, "c": 14, "d": 131, "e": 9}
    a, b = operands([[sizes[x] for x in "eda"], [sizes[x] for x in "cbde"]], dtype)
    text = teir.einsum_plan("eda,cbde->acb", a, b, threads=2).explain()
    assert "sums 9 steps of K between loads and stores of C" in text
    assert "K 9 " not in text.split("the contraction of the copies")[1]
    expected = np.einsum("eda,cbde->acb", a.astype(np.float64), b.astype(np.float64))
    bound = 1e-4 if dtype == np.float32 else 1e-11
    result = teir.einsum("eda,cbde->acb", a, b, threads=2)
    np.testing.assert_allclose(result, expected, rtol=bound, atol=bound)
    out = np.ones(expected.shape, dtype)
    teir.einsum("eda,cbde->acb", a, b, out=out, accumulate=True, threads=2)
    np.testing.assert_allclose(out, expected + 1, rtol=bound, atol=bound)
    einsum_module.clear_plans()  # planned for the smaller L2


@pytest.mark.parametrize(
    ("subscripts", "sizes", "label"),
    [
        # The batch labels: a has unit stride in in1, b rows of 8 elements -> chunks of b.
        ("afbec,efdba->cbda", {"a": 3, "b": 25, "c": 5, "d": 7, "e": 4, "f": 6}, "b"),
        # b and a have unit or short strides in the inputs; c (M) leaves out only in1, which
        # is small enough to be read again for every chunk.
        ("ceab,edab->cbad", {"a": 3, "b": 3, "c": 41, "d": 4, "e": 6}, "c"),
        # b is the result's unit-stride label, and i or j would read bkj or bik again per chunk.
        ("bik,bkj->ijb", {"b": 6, "i": 24, "j": 16, "k": 32}, None),
    ],
)
def test_large_fallback_copies_are_made_a_chunk_at_a_time(monkeypatch, subscripts, sizes, label):
    # The thresholds scaled down so that small operands take the path of large ones.
    monkeypatch.setattr(copy_fallback, "CHUNK_ABOVE_BYTES", 256)
    monkeypatch.setattr(copy_fallback, "CHUNK_BYTES", 512)
    monkeypatch.setattr(copy_fallback, "CHUNK_RUN_BYTES", 64)
    monkeypatch.setattr(copy_fallback, "CHUNK_REREAD_BYTES", 8 * 1024)
    monkeypatch.setattr(copy_fallback, "CHUNK_LEAST_TILE", 4)
    chosen = []
    real = copy_fallback.chunking

    def spy(*args):
        chosen.append(real(*args))
        return chosen[-1]

    monkeypatch.setattr(copy_fallback, "chunking", spy)
    inputs, output = subscripts.split("->")
    a, b = operands([[sizes[x] for x in term] for term in inputs.split(",")])
    expected = np.einsum(subscripts, a, b)
    tolerance = {"rtol": 1e-11, "atol": 1e-11}
    # C order: teir's own ("K") may lay the result out for a kernel, without copies
    result = teir.einsum(subscripts, a, b, order="C")
    np.testing.assert_allclose(result, expected, **tolerance)
    assert "# no kernel layout fits" in teir.einsum_plan(subscripts, a, b, order="C").explain()
    if label is None:
        assert chosen[-1] is None
        return
    chunked, chunk = chosen[-1]
    assert chunked == label and 1 <= chunk < sizes[label] and sizes[label] % chunk != 0
    out = np.ones([sizes[x] for x in output])
    for _ in range(2):
        teir.einsum(subscripts, a, b, out=out, accumulate=True)
    np.testing.assert_allclose(out, 2 * expected + 1, **tolerance)
    teir.einsum(subscripts, a, b, out=out, relu=True)
    np.testing.assert_allclose(out, np.maximum(expected, 0), **tolerance)
    backwards = np.zeros([sizes[x] for x in output])[::-1]
    teir.einsum(subscripts, a, b, out=backwards)
    np.testing.assert_allclose(backwards, expected, **tolerance)
    # Operands viewed with gaps, one of them broadcast along its first label.
    wide_a = np.repeat(a, 2, axis=-1)[..., ::2]
    thin_b = b[:1] if b.shape[0] > 1 else b
    expected = np.einsum(subscripts, wide_a, np.broadcast_to(thin_b, b.shape))
    np.testing.assert_allclose(teir.einsum(subscripts, wide_a, thin_b), expected, **tolerance)


@st.composite
def random_einsum(draw):
    letters = "abcdef"
    sizes = {c: draw(st.integers(1, 5)) for c in letters}
    count = draw(st.integers(1, 2))
    terms = []
    for _ in range(count):
        labels = draw(st.lists(st.sampled_from(letters), min_size=0, max_size=4))
        terms.append("".join(labels))
    used = sorted(set("".join(terms)))
    output = draw(st.permutations(used))
    output = "".join(output[: draw(st.integers(0, len(used)))])
    subscripts = ",".join(terms) + "->" + output
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    arrays = []
    for term in terms:
        shape = [sizes[c] for c in term]
        kind = draw(st.sampled_from(["plain", "transposed", "strided", "reversed"]))
        seed = draw(st.integers(0, 2**31))
        rng = np.random.default_rng(seed)
        if kind == "strided":
            big = rng.uniform(-1, 1, [2 * n for n in shape]).astype(dtype)
            array = big[tuple(slice(None, None, 2) for _ in shape)]
        elif kind == "transposed" and len(shape) > 1:
            array = rng.uniform(-1, 1, shape[::-1]).astype(dtype).T
        elif kind == "reversed" and shape:
            array = rng.uniform(-1, 1, shape).astype(dtype)[::-1]
        else:
            array = rng.uniform(-1, 1, shape).astype(dtype)
        arrays.append(array)
    return subscripts, arrays


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_einsum())
def test_generated_einsums_equal_numpy(case):
    subscripts, arrays = case
    check(subscripts, arrays)


@pytest.mark.parametrize(
    ("subscripts", "sizes"),
    [
        ("ik,kj->ij", {"i": 97, "j": 1601, "k": 30}),
        ("ik,kj->ji", {"i": 331, "j": 337, "k": 7}),
        ("bik,bkj->bij", {"b": 2, "i": 347, "j": 9, "k": 5}),
    ],
)
def test_sizes_without_good_divisors_run_in_regions(subscripts, sizes):
    shapes = [[sizes[c] for c in term] for term in subscripts.split("->")[0].split(",")]
    ops = operands(shapes, np.float32)
    plan = teir.einsum_plan(subscripts, *ops)
    assert len(plan.regions) >= 2 and "partial tiles" in plan.explain()
    check(subscripts, ops)
    out = RNG.uniform(-1, 1, np.shape(np.einsum(subscripts, *ops))).astype(np.float32)
    start = out.copy()
    teir.einsum(subscripts, *ops, out=out, accumulate=True, relu=True)
    expected = np.maximum(start + np.einsum(subscripts, *[o.astype(np.float64) for o in ops]), 0)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("subscripts", "sizes", "staged"),
    [
        # the rest's column of in1 (j = 336), 1000 elements 337 apart
        ("ik,kj->ij", {"i": 97, "j": 337, "k": 1000}, 1),
        # the rest's column of in0 (i = 336), alike; in1 stored transposed
        ("ki,jk->ij", {"i": 337, "j": 97, "k": 1000}, 0),
        ("jk,ki->ji", {"i": 337, "j": 97, "k": 1000}, 1),
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_thin_rests_read_a_dense_copy_of_a_strided_input(subscripts, sizes, staged, dtype, threads):
    """A rest region one column thin whose input lies one stride per element reads a dense
    copy of it, made on each call, instead of running a kernel on one vector lane; the
    result is the same with out=, accumulate and relu, on strided views too."""
    from teir.frontend.einsum import clear_plans

    clear_plans()
    shapes = [[sizes[c] for c in term] for term in subscripts.split("->")[0].split(",")]
    ops = operands(shapes, dtype)
    plan = teir.einsum_plan(subscripts, *ops, threads=threads)
    assert len(plan.regions) == 2
    assert plan.regions[0].stage is None
    stage = plan.regions[1].stage
    assert stage is not None and stage.operand == staged and stage.elements == sizes["k"]
    assert f"in{staged} ({sizes['k']} elements) copied densely first" in plan.explain()
    check(subscripts, ops, threads=threads)
    exact = np.einsum(subscripts, *[o.astype(np.float64) for o in ops])
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    for accumulate in (False, True):
        base = RNG.uniform(-1, 1, (2 * exact.shape[0], exact.shape[1])).astype(dtype)
        out = base[::2]
        start, between = out.copy(), base[1::2].copy()
        teir.einsum(subscripts, *ops, out=out, accumulate=accumulate, relu=True, threads=threads)
        expected = np.maximum(exact + (start if accumulate else 0), 0)
        np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)
        np.testing.assert_array_equal(base[1::2], between)
    # the staged input a strided view itself
    wide = RNG.uniform(-1, 1, (*ops[staged].shape[:-1], 2 * ops[staged].shape[-1]))
    views = list(ops)
    views[staged] = wide.astype(dtype)[..., ::2]
    check(subscripts, views, threads=threads)
    clear_plans()


def test_thin_rests_too_small_to_pay_for_a_copy_run_as_they_lie():
    """A rest of 33 x 1 x 33 runs faster as it lies than a copy's call costs (10.7 against 12
    us): no stage."""
    ops = operands([(33, 33), (33, 1009)], np.float32)
    plan = teir.einsum_plan("bc,ca->ba", *ops)
    assert len(plan.regions) == 2 and all(r.stage is None for r in plan.regions)
    check("bc,ca->ba", ops)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("subscripts", "sizes"),
    [
        ("ij,jk->ik", {"i": 37, "j": 1009, "k": 45}),
        ("ki,kj->ij", {"i": 19, "j": 33, "k": 1031}),
        ("ijl,jkl->ki", {"i": 6, "j": 1013, "k": 21, "l": 3}),
        ("ik,jk->ij", {"i": 23, "j": 17, "k": 1009}),
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_long_sums_without_good_divisors_run_in_regions_that_add_up(
    subscripts, sizes, dtype, threads
):
    """A long K with no good divisor is cut into a main part and a thin rest that adds into
    what the main part wrote: only the first part zeroes the output (unless accumulating) and
    only the last applies the ReLU, to the whole sum (a ReLU per part fails this: the parts'
    sums of values in [-1, 1] are often negative)."""
    from teir.frontend.einsum import clear_plans

    clear_plans()
    shapes = [[sizes[c] for c in term] for term in subscripts.split("->")[0].split(",")]
    ops = operands(shapes, dtype)
    plan = teir.einsum_plan(subscripts, *ops, threads=threads)
    assert len(plan.regions) == 2 and "partial tiles" in plan.explain()
    # the rest adds into the main part's output: only the main part zeroes it
    firsts = [r.operation.config.prim_first for r in plan.regions]
    assert firsts == [teir.PrimFirst.ZERO, teir.PrimFirst.NONE]
    check(subscripts, ops, threads=threads)
    exact = np.einsum(subscripts, *[o.astype(np.float64) for o in ops])
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    for accumulate in (False, True):
        base = RNG.uniform(-1, 1, (2 * exact.shape[0], exact.shape[1])).astype(dtype)
        out = base[::2]  # a strided view
        start, between = out.copy(), base[1::2].copy()
        got = teir.einsum(
            subscripts, *ops, out=out, accumulate=accumulate, relu=True, threads=threads
        )
        assert got is out
        expected = np.maximum(exact + (start if accumulate else 0), 0)
        np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)
        np.testing.assert_array_equal(base[1::2], between)
    clear_plans()


@pytest.mark.parametrize("in_memory", [False, True])
def test_permutations_in_memory_without_good_divisors_run_in_regions(
    monkeypatch, in_memory, two_pipe_xeon
):
    """A permutation between buffers in memory whose sizes have no good divisor (primes) is
    split into regions, so that its main part gets tiles and loops that threads share; one
    within the caches stays a single call."""
    import teir.lower.tiles as tiles
    from teir.frontend.einsum import clear_plans

    if in_memory:
        monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 2048, "L3": 4096})
    a = RNG.uniform(-1, 1, (401, 353)).astype(np.float32)
    clear_plans()  # plans made under either cache size stay out of other tests
    try:
        plan = teir.einsum_plan("ij->ji", a, threads=2)
        if not in_memory:
            assert len(plan.regions) == 1
            return
        assert len(plan.regions) == 4 and "partial tiles" in plan.explain()
        assert plan.operation is not None and plan.operation.nest.parallel_size > 1
        for accumulate in (False, True):
            out = RNG.uniform(-1, 1, (353, 401)).astype(np.float32)
            expected = a.T + (out if accumulate else 0)
            assert teir.einsum("ij->ji", a, out=out, accumulate=accumulate, threads=2) is out
            np.testing.assert_allclose(out, expected, rtol=1e-6)
    finally:
        clear_plans()


def test_numpy_keywords_and_array_likes():
    assert teir.einsum("i,i", [1.0, 2.0], [3.0, 4.0]) == 11.0
    result = teir.einsum(
        "ij,jk",
        np.ones((2, 3)),
        np.ones((3, 2)),
        dtype=np.float32,
        order="C",
        casting="same_kind",
        optimize=True,
    )
    assert result.dtype == np.float32 and np.all(result == 3)
    with pytest.raises(teir.EinsumError, match="dtype"):
        teir.einsum("i", np.ones(2), dtype=np.int32)


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [("f32", np.float32), ("FP64", np.float64), ("float32", np.float32), (np.float64, np.float64)],
)
def test_dtypes_may_be_spelled_as_teir_spells_them(spelling, expected):
    expr = teir.contract_expression("ij,jk->ik", (2, 3), (3, 4), dtype=spelling)
    assert expr(np.ones((2, 3)), np.ones((3, 4))).dtype == expected
    assert teir.einsum("ij->ji", np.ones((2, 3)), dtype=spelling).dtype == expected
    with pytest.raises(teir.EinsumError, match="names no data type"):
        teir.contract_expression("ij->ji", (2, 3), dtype="bogus")
    with pytest.raises(teir.EinsumError, match="float32 or float64, got int8"):
        teir.einsum("ij->ji", np.ones((2, 3)), dtype="int8")


def test_numpy_sublist_form():
    # NumPy's einsum(op0, sublist0, op1, sublist1, ..., [sublistout]): integers for labels
    rng = np.random.default_rng(7)
    a, b, c = rng.random((3, 4)), rng.random((4, 5)), rng.random((5, 2))
    calls = [
        ((a, [0, 1], b, [1, 2], [0, 2]), "two operands, explicit output"),
        ((a, [30, 1], b, [1, 25]), "implicit output: label 25 ('Z') sorts before 30 ('e')"),
        ((a, [Ellipsis, 1], b, [1, 2], [Ellipsis, 2]), "ellipsis"),
        ((a, [1, 0]), "one operand"),
        ((a, [0, 1], b, [1, 2], c, [2, 3], [3, 0]), "three operands"),
        ((a, (np.int64(0), 1), b, (1, 2), (0,)), "tuples and NumPy integers"),
    ]
    for arguments, what in calls:
        np.testing.assert_allclose(
            teir.einsum(*arguments), np.einsum(*arguments), rtol=1e-12, err_msg=what
        )
    np.testing.assert_allclose(teir.einsum(np.str_("ij,jk"), a, b), a @ b, rtol=1e-12)
    plan = teir.einsum_plan(a, [0, 1], b, [1, 2], [0, 2])
    assert plan.explain().startswith("# einsum AB,BC->AC")
    for arguments, match in [
        ((a, [0, 52]), r"subscript 52 is not within \[0, 52\)"),
        ((a, [0, "i"]), "'i' is not a subscript"),
        ((a, [0, True]), "True is not a subscript"),
        ((a, [0, 1], b, "jk"), "sublist 1 must be a list"),
        ((a, b), "subscripts must be a string, or operands and sublists"),
        ((a, [0, 1], b, [1, 2], 7), "the output sublist must be a list"),
    ]:
        with pytest.raises(teir.EinsumError, match=match):
            teir.einsum(*arguments)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    random_einsum(),
    st.sampled_from(["C", "F", "strided", "reversed"]),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_generated_einsums_into_out_views(case, layout, accumulate, relu, seed):
    subscripts, arrays = case
    expected = np.einsum(subscripts, *[a.astype(np.float64) for a in arrays])
    shape = np.shape(expected)
    dtype = np.result_type(*arrays)
    rng = np.random.default_rng(seed)
    start = rng.uniform(-1, 1, shape).astype(dtype)
    out = out_array(start, layout)
    result = teir.einsum(subscripts, *arrays, out=out, accumulate=accumulate, relu=relu)
    assert result is out
    if accumulate:
        expected = start + expected
    if relu:
        expected = np.maximum(expected, 0)
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)


ELEMENTWISE = [
    ("ij,j->ij", {"i": 37, "j": 1000}),
    ("ij,ij->ij", {"i": 19, "j": 67}),
    ("bij,bj->bij", {"b": 5, "i": 7, "j": 130}),
    ("ijk,ik->ijk", {"i": 3, "j": 9, "k": 33}),
    ("i,i->i", {"i": 1001}),
    ("ji,j->ij", {"i": 45, "j": 17}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("subscripts", "sizes"), ELEMENTWISE)
def test_elementwise_products(subscripts, sizes, dtype):
    """Products without summation whose output's unit stride is on a C axis run as loops
    around a one-element kernel; overwrite, accumulate, ReLU and strided views all hold."""
    rng = np.random.default_rng(7)
    inputs = subscripts.split("->")[0].split(",")
    arrays = [rng.standard_normal([sizes[c] for c in op]).astype(dtype) for op in inputs]
    expected = np.einsum(subscripts, *arrays)
    # atol: accumulating rounds once (a fused multiply-add), NumPy twice
    tolerance = (
        {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-14}
    )
    np.testing.assert_allclose(teir.einsum(subscripts, *arrays), expected, **tolerance)
    np.testing.assert_allclose(
        teir.einsum(subscripts, *arrays, relu=True), np.maximum(expected, 0), **tolerance
    )
    out = rng.standard_normal(expected.shape).astype(dtype)
    start = out.copy()
    teir.einsum(subscripts, *arrays, out=out, accumulate=True)
    np.testing.assert_allclose(out, start + expected, **tolerance)
    views = [np.flip(a, axis=-1)[..., ::1] if a.ndim > 1 else a[::-1] for a in arrays]
    wide = [np.repeat(v, 2, axis=-1)[..., ::2] for v in views]  # non-contiguous strides
    np.testing.assert_allclose(
        teir.einsum(subscripts, *wide), np.einsum(subscripts, *wide), **tolerance
    )


def test_elementwise_product_loops_over_the_unit_stride_axis():
    expression = teir.contract_expression("ij,j->ij", (64, 512), (512,), dtype=np.float32)
    assert "GEMM on one element" in expression.explain()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "subscripts, shapes, view",
    [
        ("i,i->", [(140_000,), (140_000,)], "plain"),
        ("ij,ji->", [(300, 470), (470, 300)], "plain"),
        ("ij,jk->ik", [(1, 140_000), (140_000, 1)], "plain"),
        ("...i,...i->...", [(1, 140_000), (1, 140_000)], "plain"),
        ("i,i->", [(280_000,), (280_000,)], "strided"),
        ("i,i->", [(140_000,), (140_000,)], "reversed"),
    ],
)
def test_reductions_with_no_output_to_share_are_split_between_threads(
    subscripts, shapes, view, dtype
):
    """A contraction whose output gives two threads nothing to share cuts a summed label into
    one part per thread; results equal NumPy into new arrays, out=, accumulate and relu
    (small integers, so every sum is exact and any lost or repeated term shows)."""
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-8, 9, shape).astype(dtype) for shape in shapes]
    if view == "strided":
        arrays = [a[::2] for a in arrays]
    elif view == "reversed":
        arrays = [a[::-1] for a in arrays]
    plan = teir.einsum_plan(subscripts, *arrays, threads=2)
    assert plan.split is not None
    # one part per thread, or more where the chain of additions is too long for accuracy
    # (FP32 ij,ji-> 300 x 470: 141000 in a row)
    parts = accuracy_parts(plan.split.chain, 2, arrays[0].itemsize) or 2
    assert plan.split.parts == parts
    assert f"cut into {parts} parts" in plan.explain()
    assert (teir.einsum_plan(subscripts, *arrays, threads=1).split is None) == (parts == 2)
    expected = np.einsum(subscripts, *[a.astype(np.int64) for a in arrays])
    np.testing.assert_array_equal(teir.einsum(subscripts, *arrays, threads=2), expected)
    start = rng.integers(-5, 6, np.shape(expected)).astype(dtype)
    out = np.array(start)
    teir.einsum(subscripts, *arrays, out=out, accumulate=True, relu=True, threads=2)
    np.testing.assert_array_equal(out, np.maximum(expected + start, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matrix_vector_products_with_short_rows_cut_k_instead(dtype):
    """x @ A with A row-major and few columns: shared between two threads, each row would give
    each thread a short run; K is cut instead so that every thread reads whole rows. Not
    where the threads share batches of whole rows, nor for the dot form (rows along K)."""
    rng = np.random.default_rng(5)
    x = rng.integers(-8, 9, 8192).astype(dtype)
    a = rng.integers(-8, 9, (8192, 512)).astype(dtype)
    plan = teir.einsum_plan("k,kj->j", x, a, threads=2)
    assert plan.split is not None and plan.split.label == "k"
    expected = x.astype(np.int64) @ a.astype(np.int64)
    np.testing.assert_array_equal(teir.einsum("k,kj->j", x, a, threads=2), expected)
    out = np.ones(512, dtype)
    teir.einsum("k,kj->j", x, a, out=out, accumulate=True, threads=2)
    np.testing.assert_array_equal(out, expected + 1)
    assert teir.einsum_plan("k,kj->j", x, a, threads=1).split is None
    vectors = rng.integers(-8, 9, (4, 4000)).astype(dtype)
    batched = rng.integers(-8, 9, (4, 4000, 500)).astype(dtype)
    assert teir.einsum_plan("bk,bkj->bj", vectors, batched, threads=2).split is None
    assert teir.einsum_plan("jk,k->j", a.T.copy(), x, threads=2).split is None  # dot form


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reductions_whose_output_tiles_split_unevenly_are_shared_instead(dtype):
    """A small output of 7 tiles along e (12 x 9 each, too small to cut into more tiles that
    split evenly) leaves one of two threads idle a quarter of the time; the summed labels are
    long, so the outermost one (a) is cut between the threads instead. With 8 tiles (an even
    share), or on one thread, the plan stays as it is. The results equal NumPy's exactly
    (small integers), into new arrays and with accumulate."""
    rng = np.random.default_rng(6)

    def operands(e: int) -> list[np.ndarray]:
        return [
            rng.integers(-4, 5, shape).astype(dtype) for shape in ((200, 200, 12), (200, e, 200, 9))
        ]

    arrays = operands(7)
    plan = teir.einsum_plan("agh,aegd->ehd", *arrays, threads=2)
    assert plan.split is not None and plan.split.label == "a"
    assert "threads idle in uneven shares" in plan.explain()
    expected = np.einsum("agh,aegd->ehd", *[a.astype(np.int64) for a in arrays])
    np.testing.assert_array_equal(teir.einsum("agh,aegd->ehd", *arrays, threads=2), expected)
    out = np.ones(expected.shape, dtype)
    teir.einsum("agh,aegd->ehd", *arrays, out=out, accumulate=True, threads=2)
    np.testing.assert_array_equal(out, expected + 1)
    assert teir.einsum_plan("agh,aegd->ehd", *arrays, threads=1).split is None
    assert teir.einsum_plan("agh,aegd->ehd", *operands(8), threads=2).split is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_results_whose_tiles_are_narrowed_for_threads_cut_k_instead(dtype, monkeypatch):
    """A 24 x 96 result summed over a long K is one tile for one thread; two threads would
    get tiles of a few columns, each reading all of in0 again, which (with this process's
    L3 share made small) lies beyond the caches: K is cut between the threads instead. Where
    one thread's schedule reads in0 as often (a loop over f, an output label in0 lacks, with
    one tile per f), the plan stays. Results equal NumPy's exactly (small integers)."""
    import teir.frontend.split_reduction as split_reduction

    monkeypatch.setattr(split_reduction, "l3_share", lambda: 256 << 10)
    monkeypatch.setattr(split_reduction, "SPLIT_IDLE_SECONDS", 0.0)
    rng = np.random.default_rng(9)
    a = rng.integers(-3, 4, (8, 24, 8, 101)).astype(dtype)
    b = rng.integers(-3, 4, (8, 8, 101, 96)).astype(dtype)
    plan = teir.einsum_plan("kbhd,khdg->bg", a, b, threads=2)
    assert plan.split is not None and plan.split.label in "khd"
    assert "narrower tiles than one thread takes" in plan.explain()
    expected = np.einsum("kbhd,khdg->bg", a.astype(np.int64), b.astype(np.int64))
    np.testing.assert_array_equal(teir.einsum("kbhd,khdg->bg", a, b, threads=2), expected)
    assert teir.einsum_plan("kbhd,khdg->bg", a, b, threads=1).split is None
    c = rng.integers(-3, 4, (203, 97, 100)).astype(dtype)
    d = rng.integers(-3, 4, (8, 203, 64, 97)).astype(dtype)
    assert teir.einsum_plan("dcj,fdic->jfi", c, d, threads=2).split is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "subscripts, shapes, threads, rest",
    [
        ("i,i->", [(140_001,), (140_001,)], 2, 1),
        ("i,i->", [(140_003,), (140_003,)], 3, 2),
        # cut along i, the outer label: each part is one contiguous run (its i and j fused)
        # of dot products, where a cut along the unit stride j would halve every row
        ("ij,ij->", [(301, 599), (301, 599)], 2, 1),
        ("k,kj->j", [(4099,), (4099, 1031)], 2, 1),
    ],
)
def test_reductions_with_no_label_dividing_between_threads_leave_a_rest(
    subscripts, shapes, threads, rest, dtype
):
    """A summed label that the threads do not divide is cut all the same: its last indices
    are contracted apart, as one more part (exact in small integers: no term lost or
    repeated)."""
    rng = np.random.default_rng(4)
    arrays = [rng.integers(-8, 9, shape).astype(dtype) for shape in shapes]
    plan = teir.einsum_plan(subscripts, *arrays, threads=threads)
    assert plan.split is not None and plan.split.rest == rest
    assert f"its last {rest} indices, left out of the cut" in plan.explain()
    expected = np.einsum(subscripts, *[a.astype(np.int64) for a in arrays])
    for _ in range(2):
        result = teir.einsum(subscripts, *arrays, threads=threads)
        np.testing.assert_array_equal(result, expected)
    start = rng.integers(-5, 6, np.shape(expected)).astype(dtype)
    out = np.array(start)
    teir.einsum(subscripts, *arrays, out=out, accumulate=True, relu=True, threads=threads)
    np.testing.assert_array_equal(out, np.maximum(expected + start, 0))
    if subscripts == "ij,ij->":  # the parts' kernels run along whole rows
        assert plan.split.label == "i"
        views = split_views(plan.split, plan.subscripts, arrays)
        part = teir.einsum_plan(plan.split.subscripts, *views, threads=threads).explain()
        assert "fused K150*599" in part and "dot form" in part


def test_fallback_result_is_resident_only_when_it_is_the_callers_out(monkeypatch):
    """The copying fallback's contraction that writes the result in place is planned for a
    result allocated per call when no out is given (its zeroed pages arrive through the
    caches: streaming past them doubled the writes) and for reused memory with out=."""
    import teir.lower.tiles as tiles
    from teir.frontend.einsum import clear_plans

    monkeypatch.setattr(tiles, "l3_share", lambda: 16 << 10)
    rng = np.random.default_rng(5)
    a = rng.random((8, 16, 64, 64))
    b = rng.random((16, 32, 8))
    expected = np.einsum("aecb,eda->acbd", a, b)
    for out in (None, np.zeros((8, 64, 64, 32))):
        clear_plans()
        result = teir.einsum("aecb,eda->acbd", a, b, out=out)
        again = teir.einsum("aecb,eda->acbd", a, b, out=out)  # the replay of the steps
        for r in (result, again):
            np.testing.assert_allclose(r, expected, rtol=1e-12)
        text = teir.einsum_plan("aecb,eda->acbd", a, b, out=out).explain()
        assert "in1 is copied into the order ade (innermost last)" in text
        kernel = next(line for line in text.splitlines() if "main_zero:" in line)
        assert ("_stream" in kernel) == (out is not None), kernel


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "subscripts, shapes",
    [
        # the trace of a product: 60000 kernel calls of 128 products each per thread
        ("ij,ji->", [(128, 60_000), (60_000, 128)]),
        # a kernel summing all of K in one call
        ("ik,kj->ij", [(4, 1_000_000), (1_000_000, 4)]),
        # a one-element kernel in a K loop of 200000: cut into parts (a batch of 16 fills a
        # vector: no batch_fold, which a batch of 4 would take)
        ("ij,ij->j", [(200_000, 16), (200_000, 16)]),
    ],
)
def test_long_sums_stay_accurate(subscripts, shapes, threads):
    """FP32 sums of hundreds of thousands to millions of products in [0, 1) stay within 5e-6
    of the exact sum, as NumPy's do (1e-8 to 4e-6): kernels add each chunk's sum to C rather
    than carrying C through every product, and a plan adding into one element more than
    LONGEST_CHAIN times in a row is cut into parts (before: 6e-3, 1.7e-4 and 1e-4; with
    chains of 2^18, 1.4e-5 on ij,ij->j)."""
    rng = np.random.default_rng(8)
    arrays = [rng.random(shape, dtype=np.float32) for shape in shapes]
    exact = np.einsum(subscripts, *[a.astype(np.float64) for a in arrays])
    result = teir.einsum(subscripts, *arrays, threads=threads)
    assert np.max(np.abs(result - exact) / exact) < 5e-6
    plan = teir.einsum_plan(subscripts, *arrays, threads=threads)
    if subscripts == "ij,ij->j":
        assert plan.split is not None and plan.split.chain > LONGEST_CHAIN[4]
        assert "rounding error grows" in plan.explain()
        views = split_views(plan.split, plan.subscripts, arrays)
        part = teir.einsum_plan(plan.split.subscripts, *views, threads=threads)
        assert 0 < chain_length(part) <= LONGEST_CHAIN[4]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_resident_output_keeps_rows_whose_tile_over_k_fits_the_kernel(dtype):
    # Into an out beyond the caches the row tiles grow (fewer lines split between tiles), but
    # not where the longer rows' tile over all of K would outgrow the packed panel while the
    # usual rows' does not: K would then be cut into steps outside the output's tile loops and
    # the whole 4096² output read and written again at every step (FP64 550 -> 371 ms).
    einsum_module.clear_plans()
    a = np.zeros((4096, 2048), dtype)
    b = np.zeros((2048, 4096), dtype)
    out = np.zeros((4096, 4096), dtype)
    text = teir.einsum_plan("ik,kj->ij", a, b, out=out, threads=2).explain()
    assert "K steps" not in text
    einsum_module.clear_plans()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("subscripts", ["km,nk->nm", "mk,kn->mn", "km,kn->nm", "ab,ca->bc"])
def test_one_thread_plans_split_an_output_axis_for_the_threads(subscripts, dtype):
    """A contraction whose output axes have no divisor that tiles (211 x 307) and whose K is
    not cut between the threads (its operands, under 1 MiB, too small for that) ran on one
    of them; an output axis is split into a main part the threads share and a rest. Equal
    to NumPy with out= views, accumulate and relu."""
    from teir.frontend.einsum import clear_plans

    clear_plans()
    sizes = {"m": 211, "n": 307, "k": 160, "a": 160, "b": 211, "c": 307}
    shapes = [[sizes[c] for c in term] for term in subscripts.split("->")[0].split(",")]
    ops = operands(shapes, dtype)
    plan = teir.einsum_plan(subscripts, *ops, threads=2)
    assert len(plan.regions) == 2 and len(plan.regions[0].operation.slices) == 2
    assert "threads share the main part" in plan.explain()
    assert len(teir.einsum_plan(subscripts, *ops, threads=1).regions) == 1
    exact = np.einsum(subscripts, *[o.astype(np.float64) for o in ops])
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(
        teir.einsum(subscripts, *ops, threads=2), exact, rtol=tolerance, atol=tolerance
    )
    for accumulate in (False, True):
        base = RNG.uniform(-1, 1, (2 * exact.shape[0], exact.shape[1])).astype(dtype)
        out = base[::2]
        start, between = out.copy(), base[1::2].copy()
        teir.einsum(subscripts, *ops, out=out, accumulate=accumulate, relu=True, threads=2)
        expected = np.maximum(exact + (start if accumulate else 0), 0)
        np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)
        np.testing.assert_array_equal(base[1::2], between)
    clear_plans()


def test_unevenly_shared_plans_split_an_output_axis_where_it_pays():
    """Three batch elements of 211 x 307 on two threads (a quarter of their time idle) get
    row tiles from a split; a split whose rest would be a column along the result's unit
    stride (``bdc,adb->ac``: c = 96 of 97, one lane of 16) costs more than it saves."""
    from teir.frontend.einsum import clear_plans

    clear_plans()
    ops = operands([(3, 211, 160), (3, 160, 307)], np.float32)
    plan = teir.einsum_plan("bik,bkj->bij", *ops, threads=2)
    assert len(plan.regions) == 2 and "share the main part evenly" in plan.explain()
    main = plan.regions[0].operation
    assert main.nest.parallel_size % 2 == 0
    check("bik,bkj->bij", ops, threads=2)
    kept = operands([(100, 64, 97), (24, 64, 100)], np.float32)
    assert len(teir.einsum_plan("bdc,adb->ac", *kept, threads=2).regions) == 1
    clear_plans()
