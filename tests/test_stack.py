"""Kernels with packing buffers on the stack never run on a thread too small for them: the
caller gets a clear error, and the pool's workers get stacks large enough even when the
process asked for small threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import teir
from teir.runtime.stack import thread_stack_bytes


def _on_thread(stack_bytes: int, function):  # type: ignore[no-untyped-def]
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(function())
        except Exception as error:  # handed to the test thread
            outcome.append(error)

    previous = threading.stack_size(stack_bytes)
    try:
        thread = threading.Thread(target=run)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    return outcome[0]


def _error_on_a_small_thread(call):  # type: ignore[no-untyped-def]
    """What ``call`` raises (or returns) on a thread with a 256 KiB stack; skips the test
    where no such thread can be made."""

    def small_call():  # type: ignore[no-untyped-def]
        # glibc may hand a new thread the larger stack of one that ended
        size = thread_stack_bytes()
        if size is None or size >= 512 << 10:
            return size, None
        try:
            return size, call()
        except teir.ExecutionError as error:
            return size, error

    size, outcome = _on_thread(256 << 10, small_call)
    if size is None or size >= 512 << 10:
        pytest.skip(f"no small thread stack to test on (got {size})")
    return outcome


def test_thread_stack_size_is_read():
    size = _on_thread(64 << 20, thread_stack_bytes)  # above any stack glibc keeps for reuse
    if size is None:
        pytest.skip("this platform does not report thread stack sizes")
    assert 64 << 20 <= size < 65 << 20


@pytest.mark.parametrize(
    ("subscripts", "shapes", "dtype"),
    [
        ("ijb,jkb->ikb", [(96, 96, 32), (96, 96, 32)], np.float32),  # lane packing buffers
        ("ik,kj->ij", [(1000, 1000), (1000, 1000)], np.float64),  # a packed panel
        ("ik,kj->ij", [(97, 1000), (1000, 1601)], np.float64),  # the kernel packs A
    ],
)
def test_a_thread_too_small_for_the_buffers_gets_an_error(subscripts, shapes, dtype):
    rng = np.random.default_rng(0)
    arrays = [rng.random(shape).astype(dtype) for shape in shapes]
    expected = np.einsum(subscripts, *arrays)

    def call():  # type: ignore[no-untyped-def]
        return teir.einsum(subscripts, *arrays, threads=1)

    error = _error_on_a_small_thread(call)
    assert isinstance(error, teir.ExecutionError)
    assert "stack" in str(error) and "threading.stack_size" in str(error)
    result = _on_thread(8 << 20, call)
    np.testing.assert_allclose(result, expected, rtol=1e-4)


def test_pool_workers_get_large_stacks_where_the_process_asks_for_small_ones():
    script = textwrap.dedent(
        """
        import threading
        threading.stack_size(256 * 1024)
        import numpy as np, teir
        a = np.random.default_rng(0).random((96, 96, 32)).astype(np.float32)
        r = teir.einsum("ijb,jkb->ikb", a, a, threads=2)
        assert np.allclose(r, np.einsum("ijb,jkb->ikb", a, a), rtol=1e-4)
        assert threading.stack_size() == 256 * 1024  # the process's setting is kept
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_small_stack_buffers_keep_the_native_checked_call():
    # a 64^3 GEMM packs a 16 KiB panel: too small to need the thread's stack checked, so its
    # repeated calls keep the checked call (3 us against 6 through Python)
    from teir.frontend import einsum as einsum_module
    from teir.runtime.stack import UNCHECKED_BYTES

    rng = np.random.default_rng(1)
    a, b = rng.random((64, 64)).astype(np.float32), rng.random((64, 64)).astype(np.float32)
    plan = teir.einsum_plan("ab,cb->ac", a, b, threads=2)
    assert 0 < plan.regions[0].operation.stack_bytes <= UNCHECKED_BYTES
    teir.einsum("ab,cb->ac", a, b, threads=2)
    key = einsum_module._key("ab,cb->ac", (a, b), None, False, False, 2)
    call = einsum_module._plans[key][2]
    assert call is not None and call.checked is not None


def test_a_kernel_with_a_packing_buffer_checks_the_thread_stack():
    from teir import kernels
    from teir.runtime.stack import UNCHECKED_BYTES

    # A's columns far apart: the kernel copies A's tile into a stack buffer before its sweep
    spec = kernels.BrgemmSpec(
        "f64", 64, 97, 100, 2, lda=1601, ldb=1000, ldc=1601, stride_a=160100, stride_b=100
    )
    kernel = kernels.brgemm_kernel(spec)
    assert kernel.stack_bytes > UNCHECKED_BYTES
    rng = np.random.default_rng(2)
    a = rng.random(spec.extent_a())
    b = rng.random(spec.extent_b())

    def call():  # type: ignore[no-untyped-def]
        c = np.zeros(spec.extent_c())
        kernel(a, b, c)
        return c

    error = _error_on_a_small_thread(call)
    assert isinstance(error, teir.ExecutionError) and "stack" in str(error)
    # column-major tiles: A_i[m, k] at i * stride_a + m + k * lda, and so on
    view = np.lib.stride_tricks.as_strided
    a_tiles = view(a, (2, 64, 100), (8 * 160100, 8, 8 * 1601))
    b_tiles = view(b, (2, 100, 97), (8 * 100, 8, 8 * 1000))
    result = _on_thread(8 << 20, call)
    c = view(result, (64, 97), (8, 8 * 1601))
    np.testing.assert_allclose(c, np.einsum("imk,ikn->mn", a_tiles, b_tiles), rtol=1e-12)
