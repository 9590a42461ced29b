"""The thread pool: native workers that run nest slices, across growth, concurrent callers
and fork."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

import teir
from helpers import forked_child_result
from teir.runtime import pool


def _gemm(rows: int, threads: int) -> tuple[teir.Operation, np.ndarray, np.ndarray]:
    """A GEMM with enough work (33 MFLOP at 1024 rows) for every thread to get a slice."""
    config = teir.optimize(
        {
            "data_type": "FP64",
            "prim_first": "Zero",
            "prim_main": "GEMM",
            "dim_types": ["M", "N", "K"],
            "exec_types": ["seq"] * 3,
            "dim_sizes": [rows, 64, 256],
            "strides_in0": [256, 0, 1],
            "strides_in1": [0, 1, 64],
            "strides_out": [64, 1, 0],
        },
        threads=threads,
    )
    rng = np.random.default_rng(rows)
    a, b = rng.standard_normal(rows * 256), rng.standard_normal(256 * 64)
    return teir.compile(config, threads=threads), a, b


def _check(op: teir.Operation, a: np.ndarray, b: np.ndarray, calls: int = 20) -> None:
    expected = a.reshape(-1, 256) @ b.reshape(256, 64)
    for _ in range(calls):
        out = np.full(expected.shape, np.nan)
        op(a, b, out)
        np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_every_slice_runs_on_every_call(threads):
    """Back-to-back calls (workers still polling) and calls after they fell asleep."""
    op, a, x = _gemm(1024, threads)
    assert len(op.slices) == threads
    _check(op, a, x)
    threading.Event().wait(5 * pool.IDLE_SPIN_SECONDS)  # let the workers sleep
    _check(op, a, x, calls=3)


def test_the_pool_grows_in_place():
    """A larger thread count starts more workers on the same control block, whose address
    direct calls keep reading."""
    small, a2, x2 = _gemm(1024, 2)
    _check(small, a2, x2, calls=2)
    before = pool._current
    assert before is not None
    address = int(pool.checked_state[0])
    big, a6, x6 = _gemm(1024, 6)
    _check(big, a6, x6, calls=2)
    assert pool._current is before and before.workers >= 5
    assert tuple(pool.checked_state) == (address, before.workers)
    _check(small, a2, x2, calls=2)  # smaller calls use the grown pool


def test_thread_counts_beyond_the_largest_pool_are_capped(monkeypatch):
    from teir.runtime import operation

    monkeypatch.setattr(operation, "MAX_WORKERS", 3)  # the pool's real cap is 255
    op, a, x = _gemm(1152, 7)  # a configuration no other test compiles
    assert len(op.slices) == 4
    _check(op, a, x, calls=2)


def test_a_stopped_pool_runs_the_slices_in_the_caller():
    """A call after the pool stopped (at exit) still gets every slice computed."""
    op, a, b = _gemm(1024, 2)
    _check(op, a, b, calls=1)
    retired = pool._Pool(1)
    retired.stop(wait=True)
    original = pool._pool
    pool._pool = lambda workers: retired
    try:
        _check(op, a, b, calls=2)
    finally:
        pool._pool = original


def test_concurrent_callers_each_get_their_result():
    ops = [_gemm(1024 + 64 * i, 2) for i in range(4)]
    failures: list[BaseException] = []

    def caller(op: teir.Operation, a: np.ndarray, x: np.ndarray) -> None:
        try:
            _check(op, a, x, calls=30)
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=caller, args=entry) for entry in ops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


def _in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    op, a, b = _gemm(1024, 2)
    out = np.empty((1024, 64))
    op(a, b, out)
    queue.put(
        len(op.slices) == 2 and bool(np.allclose(out, a.reshape(-1, 256) @ b.reshape(256, 64)))
    )


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_starts_its_own_workers():
    op, a, x = _gemm(1024, 2)
    _check(op, a, x, calls=2)  # the parent's pool exists before the fork
    assert forked_child_result(_in_child) is True


def test_a_slice_outlasting_the_native_join_is_waited_for():
    """With one poll before the native join gives up, the caller waits in Python."""
    from teir.codegen.spin import JOB_FIELDS

    op, a, x = _gemm(4096, 2)
    assert op._job is not None
    op._job.words[JOB_FIELDS.index("rounds")] = 1
    _check(op, a, x, calls=5)


def test_jobs_of_fewer_slices_than_workers():
    """Workers beyond a job's slices get no task, and the next larger job runs them all."""
    big, a6, x6 = _gemm(1024, 6)
    _check(big, a6, x6, calls=2)
    for threads in (2, 3, 6, 2):
        op, a, x = _gemm(1024, threads)
        _check(op, a, x, calls=3)


def test_small_contractions_share_threads_where_a_parallel_call_pays():
    """A parallel call costs about a microsecond: a 64^3 GEMM is split between two threads,
    a 40^3 one is not."""
    for size, slices in ((40, 1), (64, 2)):
        a = np.ones((size, size), np.float32)
        plan = teir.einsum_plan("ik,kj->ij", a, a, threads=2)
        assert plan.operation is not None and len(plan.operation.slices) == slices
        np.testing.assert_array_equal(teir.einsum("ik,kj->ij", a, a, threads=2), a @ a)


@pytest.mark.parametrize(
    "triple, drain",
    [
        ("x86_64-unknown-linux-gnu", "call void @llvm.x86.sse.sfence()"),
        ("aarch64-unknown-linux-gnu", "fence seq_cst"),
    ],
)
def test_streamed_stores_are_drained_before_a_slice_or_a_call_is_published(triple, drain):
    """Non-temporal stores are not ordered by the release stores that say a slice finished
    (or that publish the next call): a worker must drain them after its slice, and the caller
    before it hands work to the workers, or a reader may see stale lines of the output."""
    from teir.codegen.spin import spin_module
    from teir.codegen.target import Target

    lines = [line.strip() for line in spin_module(Target(triple, "generic", ""), "p").splitlines()]
    call = next(i for i, line in enumerate(lines) if line.startswith("call void %fn(ptr %a0"))
    done = next(i for i, line in enumerate(lines) if "ptr %done release" in line)
    assert call < done and drain in lines[call + 1 : done]
    publish = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("store atomic i64 %generation, ptr %control")
    )
    assert lines[publish - 1] == drain
