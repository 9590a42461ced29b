"""Checked calls: repeated einsums checked and run in one native call, which falls back to the
full path for anything not exactly as planned and leaves the interpreter's state intact."""

from __future__ import annotations

import multiprocessing
import sys
import threading

import numpy as np
import pytest

import teir
from helpers import forked_child_result
from teir.codegen.checked_call import DONE, FALLBACK
from teir.codegen.spin import JOB_FIELDS
from teir.frontend import direct_call
from teir.frontend import einsum as einsum_module
from teir.runtime import checked_call, pool

pytestmark = pytest.mark.skipif(
    checked_call._native() is None, reason="array objects laid out unlike CPython's"
)


def _warm(subscripts, *operands, **options):
    """Three calls: planned, then direct (which remembers it), then checked."""
    for _ in range(3):
        result = teir.einsum(subscripts, *operands, **options)
    return result


def _checked_only(monkeypatch):
    """From here on, einsum answers only through a checked call."""
    monkeypatch.setattr(einsum_module, "_key", None)
    monkeypatch.setattr(einsum_module, "_arrays", None)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_repeated_calls_are_answered_by_the_checked_call(monkeypatch, threads, dtype):
    rng = np.random.default_rng(1)
    a, b = rng.random((64, 48)).astype(dtype), rng.random((40, 48)).astype(dtype)
    out = np.empty((64, 40), dtype)
    _warm("ab,cb->ac", a, b, out=out, threads=threads)
    _warm("ab,cb->ac", a, b, threads=threads)
    _checked_only(monkeypatch)
    for _ in range(3):
        a[...], b[...] = rng.random(a.shape), rng.random(b.shape)
        assert teir.einsum("ab,cb->ac", a, b, out=out, threads=threads) is out
        np.testing.assert_allclose(out, a @ b.T, rtol=1e-5)
        fresh = teir.einsum("ab,cb->ac", a, b, threads=threads)
        assert fresh.dtype == dtype and fresh.flags.c_contiguous
        np.testing.assert_allclose(fresh, a @ b.T, rtol=1e-5)


def test_a_contract_expression_call_is_checked(monkeypatch):
    expression = teir.contract_expression("ij,jk->ik", (20, 30), (30, 10), threads=1)
    a, b = np.random.rand(20, 30), np.random.rand(30, 10)
    out = np.empty((20, 10))
    for _ in range(3):
        expression(a, b)
        expression(a, b, out=out)
    _checked_only(monkeypatch)
    monkeypatch.setattr(einsum_module, "einsum", None)
    np.testing.assert_allclose(expression(a, b), a @ b, rtol=1e-12)
    out[...] = 0
    assert expression(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)


def test_scalar_results_and_permutations(monkeypatch):
    x = np.arange(7.0)
    t = np.arange(24.0).reshape(2, 3, 4)
    _warm("i,i->", x, x, threads=1)
    _warm("ijk->kji", t, threads=1)
    _checked_only(monkeypatch)
    result = teir.einsum("i,i->", x, x, threads=1)
    assert result == 91.0 and isinstance(result, np.float64)
    np.testing.assert_array_equal(teir.einsum("ijk->kji", t, threads=1), t.transpose(2, 1, 0))


class _Subclass(np.ndarray):
    pass


def test_everything_not_as_planned_falls_back_to_the_full_path():
    """Each mismatch goes through the full path: the right result, or its error."""
    rng = np.random.default_rng(2)
    a, b = rng.random((32, 24)), rng.random((24, 16))
    out = np.empty((32, 16))
    _warm("ij,jk->ik", a, b, out=out, threads=1)
    recent = ("ij,jk->ik", 2, False, False, False, 1, "K")  # order: the default
    call = einsum_module._recent[recent]
    assert call.checked is not None
    fallbacks = 0

    def fast(operands, target):
        nonlocal fallbacks
        result = original(operands, target)
        fallbacks += result is None
        return result

    original = call.fast
    object.__setattr__(call, "fast", fast)
    try:
        cases = [
            ((a, b), np.empty((16, 32)).T),  # out with other strides
            ((np.asfortranarray(a), b), np.empty((32, 16))),  # an operand with other strides
            ((a.astype(np.float32), b), np.empty((32, 16))),  # an operand of another dtype
            ((a[:, :23], b[:23]), np.empty((32, 16))),  # other shapes
            ((a.view(_Subclass), b), np.empty((32, 16))),
            ((a.tolist(), b), np.empty((32, 16))),  # not an array
        ]
        for operands, target in cases:
            teir.einsum("ij,jk->ik", *operands, out=target, threads=1)
            expected = np.asarray(operands[0], dtype=np.float64) @ operands[1]
            np.testing.assert_allclose(target, expected, rtol=1e-12)
        with pytest.raises(teir.TeirError, match="dtype"):
            teir.einsum("ij,jk->ik", a, b, out=np.empty((32, 16), np.float32), threads=1)
        with pytest.raises(teir.TeirError, match=">f8"):  # a float64 of the other byte order
            teir.einsum("ij,jk->ik", a.astype(">f8"), b, out=out, threads=1)
        frozen = np.empty((32, 16))
        frozen.flags.writeable = False
        with pytest.raises(teir.TeirError, match="read-only"):
            teir.einsum("ij,jk->ik", a, b, out=frozen, threads=1)
        with pytest.raises(teir.TeirError):
            teir.einsum("ij,jk->ik", a, b, np.ones(3), out=out, threads=1)
        assert fallbacks == len(cases) + 3
    finally:
        object.__setattr__(call, "fast", original)


def test_an_out_overlapping_an_input_is_computed_through_a_temporary():
    a = np.arange(1.0, 48.0 * 48 + 1).reshape(48, 48) / 1e3
    out = np.empty((48, 48))
    _warm("ij,jk->ik", a, a.copy(), out=out, threads=1)
    expected = a @ a
    teir.einsum("ij,jk->ik", a, a.copy(), out=a, threads=1)
    np.testing.assert_allclose(a, expected, rtol=1e-12)
    square = np.arange(40.0 * 40).reshape(40, 40)
    _warm("ij->ji", square, out=np.empty((40, 40)), threads=1)
    expected = square.T.copy()
    teir.einsum("ij->ji", square, out=square[:, :], threads=1)  # a view of the input
    np.testing.assert_array_equal(square, expected)


def _parallel_gemm(rows: int = 128):
    a, b = np.random.rand(rows, 64), np.random.rand(64, 64)
    out = np.empty((rows, 64))
    _warm("ij,jk->ik", a, b, out=out, threads=2)
    call = einsum_module._recent[("ij,jk->ik", 2, False, False, False, 2, "K")]
    assert call.checked is not None and call.checked.operation._job is not None
    return a, b, out, call


def test_sleeping_workers_are_woken_and_slow_ones_joined(monkeypatch):
    a, b, out, call = _parallel_gemm()
    codes: list[int] = []
    native = call.checked.call
    monkeypatch.setattr(
        call.checked, "call", lambda *args: codes.append(native(*args)) or codes[-1]
    )
    for _ in range(3):
        threading.Event().wait(5 * pool.IDLE_SPIN_SECONDS)  # the worker falls asleep
        out[...] = np.nan
        teir.einsum("ij,jk->ik", a, b, out=out, threads=2)
        np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    assert checked_call.WAKE in codes
    job = call.checked.operation._job
    rounds = int(job.words[JOB_FIELDS.index("rounds")])
    job.words[JOB_FIELDS.index("rounds")] = 1  # the native join gives up at once
    try:
        codes.clear()
        for _ in range(20):
            out[...] = np.nan
            teir.einsum("ij,jk->ik", a, b, out=out, threads=2)
            np.testing.assert_allclose(out, a @ b, rtol=1e-12)
        assert set(codes) <= {DONE, checked_call.WAKE, checked_call.JOIN} and codes
    finally:
        job.words[JOB_FIELDS.index("rounds")] = rounds
    # the busy word was released every time: the Python path still gets the workers
    big = np.random.rand(1024, 256)
    np.testing.assert_allclose(teir.einsum("ij,jk->ik", big, big.T, threads=2), big @ big.T)


def test_checked_and_python_callers_in_threads_each_get_their_result():
    small = [np.random.rand(96, 64), np.random.rand(64, 80)]
    large = [np.random.rand(512, 512), np.random.rand(512, 256)]
    failures: list[BaseException] = []

    def caller(operands: list[np.ndarray]) -> None:
        try:
            out = np.empty((operands[0].shape[0], operands[1].shape[1]))
            for _ in range(40):
                out[...] = np.nan
                teir.einsum("ij,jk->ik", *operands, out=out, threads=2)
                np.testing.assert_allclose(out, operands[0] @ operands[1], rtol=1e-12)
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=caller, args=(ops,)) for ops in (small, small, large)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


def test_returned_codes_keep_their_reference_counts():
    a, b, out, call = _parallel_gemm(64)
    before = sys.getrefcount(DONE), sys.getrefcount(FALLBACK)
    for _ in range(2000):
        code = call.checked.call(a, b, out)
        if code not in (DONE, FALLBACK):
            call.checked.finish(code, a, b, out)
        assert call.checked.call(a, b) == FALLBACK  # too few arguments
    after = sys.getrefcount(DONE), sys.getrefcount(FALLBACK)
    assert abs(after[0] - before[0]) < 50 and abs(after[1] - before[1]) < 50


def test_long_operations_keep_the_python_path():
    a = np.random.rand(1024, 1024)
    _warm("ij,jk->ik", a, a, threads=1)
    key = einsum_module._key("ij,jk->ik", (a, a), None, False, False, 1)
    call = einsum_module._plans[key][2]
    assert call is not None and call.checked is None  # it would hold the GIL for ms


def test_results_above_the_small_size_are_aligned():
    rows = direct_call.SMALL_RESULT_BYTES // (8 * 64) + 1
    a, b = np.random.rand(rows, 8), np.random.rand(8, 64)
    result = _warm("ij,jk->ik", a, b, threads=1)
    assert result.ctypes.data % 64 == 0
    np.testing.assert_allclose(result, a @ b, rtol=1e-12)


def _in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    a, b, out, _ = _parallel_gemm()
    for _ in range(3):
        teir.einsum("ij,jk->ik", a, b, out=out, threads=2)
    queue.put(bool(np.allclose(out, a @ b)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_falls_back_until_it_has_workers():
    _parallel_gemm()  # the parent's pool and checked calls exist before the fork
    assert forked_child_result(_in_child) is True
