"""The direct path of cached einsum plans: a repeated call with the same shapes and strides
runs on the addresses alone, and everything a cache key does not fix is still checked."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import teir
from teir.frontend import einsum as einsum_module
from teir.kernels.arrays import _interface_address, data_address


def _calls(subscripts, *operands, **options):
    """Two calls (the second one hits the cache) and their results."""
    first = teir.einsum(subscripts, *operands, **options)
    first = first.copy() if isinstance(first, np.ndarray) else first
    return first, teir.einsum(subscripts, *operands, **options)


def test_repeated_calls_take_the_direct_path(monkeypatch):
    rng = np.random.default_rng(0)
    a, b = rng.random((6, 5)), rng.random((5, 7))
    out = np.empty((6, 7))
    teir.einsum("ij,jk->ik", a, b, out=out, threads=1)
    key = einsum_module._key("ij,jk->ik", (a, b), out, False, False, 1)
    call = einsum_module._plans[key][2]
    assert call is not None
    # the direct path alone answers: the full path is not reached
    monkeypatch.setattr(einsum_module, "_arrays", None)
    a2, b2 = rng.random((6, 5)), rng.random((5, 7))
    assert teir.einsum("ij,jk->ik", a2, b2, out=out, threads=1) is out
    np.testing.assert_allclose(out, a2 @ b2)


def test_threads_none_finds_its_plan_directly(monkeypatch):
    a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    expected = teir.einsum("ij,jk->ik", a, b)
    monkeypatch.setattr(einsum_module, "_arrays", None)
    np.testing.assert_array_equal(teir.einsum("ij,jk->ik", a, b), expected)


def test_a_second_call_still_checks_what_the_key_does_not_fix():
    a, b = np.ones((4, 3)), np.ones((3, 2))
    out = np.empty((4, 2))
    teir.einsum("ij,jk->ik", a, b, out=out)
    with pytest.raises(teir.TeirError, match="dtype"):
        teir.einsum("ij,jk->ik", a, b, out=np.empty((4, 2), np.float32))
    frozen = np.empty((4, 2))
    frozen.flags.writeable = False
    with pytest.raises(teir.TeirError, match="read-only"):
        teir.einsum("ij,jk->ik", a, b, out=frozen)
    # the same shapes and strides with an operand of another dtype: promoted, as NumPy does
    result = teir.einsum("ij,jk->ik", a, b.astype(np.float32))
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, a @ b)


def test_an_out_overlapping_an_input_on_the_second_call():
    # the first call's out is separate; the second one's, of the same strides, is the input
    square = np.arange(64.0 * 64).reshape(64, 64)
    teir.einsum("ij->ji", square, out=np.empty((64, 64)))
    expected = square.T.copy()
    teir.einsum("ij->ji", square, out=square)
    np.testing.assert_array_equal(square, expected)
    a = np.arange(1.0, 96.0 * 96 + 1).reshape(96, 96) / 1e4
    teir.einsum("ij,jk->ik", a, a.copy(), out=np.empty((96, 96)), threads=1)
    expected = a @ a
    teir.einsum("ij,jk->ik", a, a.copy(), out=a, threads=1)
    np.testing.assert_allclose(a, expected, rtol=1e-12)


def test_scalars_and_permutations_on_the_direct_path():
    x = np.arange(5.0)
    first, second = _calls("i,i->", x, x)
    assert first == second == 30.0 and isinstance(second, np.float64)
    t = np.arange(24.0).reshape(2, 3, 4)
    first, second = _calls("ijk->kji", t)
    np.testing.assert_array_equal(second, t.transpose(2, 1, 0))
    out = np.ones((4, 3, 2))
    teir.einsum("ijk->kji", t, out=out, accumulate=True)
    teir.einsum("ijk->kji", t, out=out, accumulate=True)
    np.testing.assert_array_equal(out, 1 + 2 * t.transpose(2, 1, 0))


def test_data_address_reads_the_array_object():
    base = np.zeros((8, 8), np.float32)
    for array in (base, base[2:, 3:], base.T, base[::2], np.zeros(()), np.empty(0)):
        assert data_address(array) == _interface_address(array)
    assert data_address(base[1:]) == base.ctypes.data + 32


def test_flags_read_from_the_array_object_match_numpys():
    """The contiguity, writability and alignment bits read from the array object equal
    what ``array.flags`` reports, on views that differ in each (where this interpreter's
    layout checked out at import)."""
    from teir.kernels import arrays

    reader = arrays._flags_reader
    if reader is None:  # CPython lays NumPy's array object out as the reader expects
        assert sys.implementation.name != "cpython"
        pytest.skip("the array object's flags field did not check out here")
    base = np.zeros((8, 8), np.float64)
    frozen = base.copy()
    frozen.setflags(write=False)
    views = [base, base.T, base[:, 1:], base[::2], base[1:], frozen, frozen.T[2:], np.empty(0)]
    views.append(np.frombuffer(bytearray(70), np.float64, 8, 3))  # unaligned, read-only
    views.append(np.ndarray((4,), np.float32, bytearray(21), offset=1))  # unaligned, writable
    for view in views:
        assert reader(view) & arrays._CHECKED_FLAGS == arrays._flag_bits(view)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("ii", [(7, 7)]),
        ("ij->", [(5, 9)]),
        ("iij->j", [(4, 4, 6)]),
        ("adecb->bcd", [(3, 4, 5, 2, 6)]),
        ("...ij->j...", [(2, 3, 4, 5)]),
        ("ijk,jl->il", [(5, 6, 3), (6, 4)]),
        ("ij,klj->ik", [(5, 6), (2, 7, 6)]),
    ],
)
def test_repeated_calls_summing_an_operand_first_stay_direct(dtype, subscripts, shapes):
    rng = np.random.default_rng(7)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for _ in range(3):  # new arrays of the same layout every call
        operands = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
        expected = np.einsum(subscripts, *operands)
        result = teir.einsum(subscripts, *operands, threads=1)
        np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
        relu = teir.einsum(subscripts, *operands, threads=1, relu=True)
        np.testing.assert_allclose(relu, np.maximum(expected, 0), rtol=tolerance, atol=tolerance)
    key = einsum_module._key(subscripts, operands, None, False, False, 1)
    call = einsum_module._plans[key][2]
    assert call is not None and call.reduced and call.checked is None
    # a unary plan is NumPy's sum alone, straight into the result (with out too)
    assert (call.numpy_sum is not None) == (len(shapes) == 1)
    if len(shapes) == 1:
        target = np.empty(np.shape(expected), dtype)
        teir.einsum(subscripts, *operands, out=target, threads=1)
        np.testing.assert_allclose(target, expected, rtol=tolerance, atol=tolerance)
    # out= and accumulate on the same path
    out = np.asarray(rng.standard_normal(np.shape(expected)).astype(dtype))
    before = out.copy()
    teir.einsum(subscripts, *operands, out=out, accumulate=True, threads=1)
    np.testing.assert_allclose(out, before + expected, rtol=tolerance, atol=tolerance)


def _unaligned(shape, dtype, fill=None):
    """An array of ``shape`` whose data starts one byte past an element boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    view = np.zeros(count * dtype.itemsize + 1, np.uint8)[1:].view(dtype).reshape(shape)
    assert not view.flags.aligned
    if fill is not None:
        view[...] = fill
    return view


def test_arrays_off_their_element_boundaries_are_copied_or_computed_aside():
    # A transpose between buffers in memory stores around the caches on vectors it finds by
    # shifting whole elements: an output one byte off them once crashed the interpreter.
    rng = np.random.default_rng(3)
    n = 2048
    a = rng.random((n, n), dtype=np.float32)
    for _ in range(2):  # the second call runs from the plan cache
        out = _unaligned((n, n), np.float32)
        assert teir.einsum("ij->ji", a, out=out, threads=2) is out
        np.testing.assert_array_equal(out, a.T)
        np.testing.assert_array_equal(teir.einsum("ij->ji", _unaligned((n, n), np.float32, a)), a.T)
    small_a, small_b = rng.random((8, 5)), rng.random((5, 6))
    for _ in range(2):  # small products take the checked native call
        out = _unaligned((8, 6), np.float64)
        left = _unaligned((8, 5), np.float64, small_a)
        assert teir.einsum("ij,jk->ik", left, small_b, out=out) is out
        np.testing.assert_allclose(out, small_a @ small_b)
        teir.einsum("ij,jk->ik", small_a, small_b, out=out, accumulate=True)
        np.testing.assert_allclose(out, 2 * small_a @ small_b)


def test_a_tree_and_an_operation_with_arrays_off_their_element_boundaries():
    rng = np.random.default_rng(4)
    tree = teir.EinsumTree.parse("[[0,1],[1,2]->[0,2]]", [6, 5, 7], dtype="float64").compile(
        threads=1
    )
    a, b = rng.random((6, 5)), rng.random((5, 7))
    out = _unaligned((6, 7), np.float64)
    assert tree(_unaligned((6, 5), np.float64, a), b, out=out) is out
    np.testing.assert_allclose(out, a @ b)
    operation = teir.compile(
        teir.Config.from_dict(
            dict(
                data_type="FP64",
                prim_first="None",
                prim_main="Copy",
                prim_last="None",
                dim_types=["C", "C"],
                exec_types=["prim", "prim"],
                dim_sizes=[4, 3],
                strides_in0=[3, 1],
                strides_in1=[0, 0],
                strides_out=[1, 4],
            )
        ),
        threads=1,
    )
    with pytest.raises(teir.ExecutionError, match="not aligned to its 8-byte elements"):
        operation(rng.random(12), None, _unaligned((12,), np.float64))
