"""The thread pool that runs slices of a compiled nest on several cores.

Native nests release the GIL (ctypes drops it around foreign calls), so Python threads run them
in parallel. The pool is created on first use and grows to the largest thread count asked for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from teir.errors import TeirError
from teir.machine import usable_cores

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_workers = 0


def default_threads() -> int:
    """``TEIR_NUM_THREADS`` if set, else the cores this process may use."""
    configured = os.environ.get("TEIR_NUM_THREADS", "").strip()
    if configured:
        try:
            value = int(configured)
        except ValueError:
            raise TeirError(
                f"TEIR_NUM_THREADS must be a positive integer, got {configured!r}"
            ) from None
        if value < 1:
            raise TeirError(f"TEIR_NUM_THREADS must be a positive integer, got {value}")
        return value
    return usable_cores()


def _pool(workers: int) -> ThreadPoolExecutor:
    global _executor, _workers
    with _lock:
        if _executor is None or _workers < workers:
            old = _executor
            _executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="teir")
            _workers = workers
            if old is not None:
                old.shutdown(wait=False)
        return _executor


def run_all(tasks: Sequence[Callable[[], None]]) -> None:
    """Run the tasks concurrently: all but the first on pool threads, the first here."""
    if len(tasks) == 1:
        tasks[0]()
        return
    pool = _pool(len(tasks) - 1)
    futures: list[Future[None]] = [pool.submit(task) for task in tasks[1:]]
    error: BaseException | None = None
    try:
        tasks[0]()
    except BaseException as caught:
        error = caught
    for future in futures:
        try:
            future.result()
        except BaseException as caught:
            error = error or caught
    if error is not None:
        raise error
