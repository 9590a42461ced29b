"""The thread pool that runs slices of a compiled nest on several cores.

Native nests release the GIL (ctypes drops it around foreign calls), so Python threads run them
in parallel. The pool is created on first use and grows (in place) to the largest thread count
asked for, up to :data:`MAX_WORKERS` workers.

Workers run their slices in native code and hand-offs go through 64-bit words that the other
side polls (GIL released) for about a millisecond before it sleeps (:mod:`teir.codegen.spin`):
waking a thread through the kernel, or handing it the GIL, took 20-60 us per direction here,
and a 2-thread matrix-vector product of 0.22 ms spent 75 us of it in submitting, starting and
joining through a ``ThreadPoolExecutor``.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from teir.codegen.spin import (
    BUSY_WORD,
    JOB_FIELDS,
    NEST_ARGUMENTS,
    control_words,
    done_word,
    spin_module,
    task_word,
)
from teir.codegen.target import Target
from teir.errors import TeirError
from teir.kernels.cache import CODE_CACHE
from teir.machine import usable_cores

_lock = threading.Lock()
_current: _Pool | None = None
# How long a thread polls before it sleeps: an idle worker (so that the next call of a
# sequence, a tree's next node, finds it awake), and the caller waiting for a slice.
IDLE_SPIN_SECONDS = 1e-3
JOIN_SPIN_SECONDS = 20e-3
JOIN_SLEEP_SECONDS = 50e-6


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


@dataclass(frozen=True)
class _Native:
    """The hand-off functions of :mod:`teir.codegen.spin` and the poll's rounds per second."""

    poll: Callable[[int, int, int], int]
    publish: Callable[[int, int], None]
    serve: Callable[[int, int, int, int], int]
    acquire: Callable[[int], int]
    dispatch: Callable[[int, int, int, int, int, int, int], int]
    dispatch_address: int
    rounds_per_second: float


@cache
def _native() -> _Native:
    target = Target.host()
    loaded = CODE_CACHE.get(
        "runtime:spin",
        target,
        ["_poll", "_publish", "_serve", "_acquire", "_dispatch"],
        lambda prefix: spin_module(target, prefix),
    )
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    poll = ctypes.CFUNCTYPE(i64, ptr, i64, i64)(loaded.symbols["_poll"])
    word = np.zeros(1, dtype=np.int64)
    rounds = 20_000
    start = time.perf_counter()
    poll(word.ctypes.data, 0, rounds)
    elapsed = max(time.perf_counter() - start, 1e-6)
    return _Native(
        poll,
        ctypes.CFUNCTYPE(None, ptr, i64)(loaded.symbols["_publish"]),
        ctypes.CFUNCTYPE(i64, ptr, i64, i64, i64)(loaded.symbols["_serve"]),
        ctypes.CFUNCTYPE(i64, ptr)(loaded.symbols["_acquire"]),
        ctypes.CFUNCTYPE(i64, ptr, i64, ptr, ptr, ptr, ptr, i64)(loaded.symbols["_dispatch"]),
        loaded.symbols["_dispatch"],
        rounds / elapsed,
    )


def dispatch_address() -> int:
    """The address of the native ``_dispatch`` (:mod:`teir.codegen.spin`)."""
    return _native().dispatch_address


@dataclass(frozen=True, eq=False)
class Job:
    """The fixed part of a compiled nest's parallel call: its function, index space and
    slice count, and its access-flag pointers, held as the words ``_dispatch`` reads
    (:data:`teir.codegen.spin.JOB_FIELDS`)."""

    function: int
    size: int
    count: int
    first: int
    last: int
    words: np.ndarray
    address: int  # of ``words``, read once: reading it from the array costs a microsecond


def parallel_job(function: int, size: int, count: int, first: int, last: int) -> Job:
    """The job of a nest at ``function`` run over [0, ``size``) in ``count`` slices."""
    rounds = max(1, int(_native().rounds_per_second * JOIN_SPIN_SECONDS))
    values = dict(fn=function, size=size, count=count, first=first, last=last, rounds=rounds)
    words = np.array([values[name] for name in JOB_FIELDS], dtype=np.int64)
    return Job(function, size, count, first, last, words, int(words.ctypes.data))


_ARGUMENT_TYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64}
# ``void nest(ptr in0, ptr in1, ptr out, i64 lo, i64 hi, ptr first, ptr last)``
NEST_SIGNATURE = ctypes.CFUNCTYPE(None, *[_ARGUMENT_TYPES[kind] for kind in NEST_ARGUMENTS])


# The least stack a worker thread gets (the platform's default where that is larger).
WORKER_STACK_BYTES = 8 << 20
# The most workers a pool can have: its control block is allocated once, for all of them,
# so that it never moves (checked calls find it through :data:`checked_state`).
MAX_WORKERS = 255
# [control block address (0 while there is no usable pool), workers]: what a checked call
# (:mod:`teir.runtime.checked_call`) reads to dispatch without Python.
checked_state = np.zeros(2, dtype=np.int64)


class _Pool:
    """Worker threads that run slices of nest functions in native code (see
    :mod:`teir.codegen.spin` for the control block). It grows in place."""

    def __init__(self, workers: int) -> None:
        self.workers = 0
        self._control = np.zeros(control_words(MAX_WORKERS), dtype=np.int64)
        self._address = int(self._control.ctypes.data)
        self._wake = threading.Condition()
        self._running = threading.Lock()  # one Python caller at a time waits for the workers
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self.grow(workers)

    def grow(self, workers: int) -> None:
        """Start workers up to ``workers`` (at most :data:`MAX_WORKERS`)."""
        workers = min(workers, MAX_WORKERS)
        with self._running:
            if workers <= self.workers or self._stopped:
                return
            self._acquire()  # no call is running while the count changes
            # Kernels keep packing buffers on the stack (up to about 0.75 MiB): workers get
            # at least WORKER_STACK_BYTES even where the process asked for smaller threads.
            requested = threading.stack_size()
            try:
                if requested and requested < WORKER_STACK_BYTES:
                    threading.stack_size(WORKER_STACK_BYTES)
                for index in range(self.workers, workers):
                    thread = threading.Thread(
                        target=self._serve, args=(index,), name=f"teir-{index}", daemon=True
                    )
                    self._threads.append(thread)
                    thread.start()
                self.workers = workers
                checked_state[:] = (self._address, workers)
            finally:
                if requested and requested < WORKER_STACK_BYTES:
                    threading.stack_size(requested)
                self._release()

    def _serve(self, worker: int) -> None:
        native = _native()
        idle_rounds = max(1, int(native.rounds_per_second * IDLE_SPIN_SECONDS))
        control, seen = self._control, 0
        while True:
            seen = native.serve(self._address, worker, seen, idle_rounds)
            with self._wake:
                while int(control[0]) == seen and not self._stopped:
                    self._wake.wait()
            if self._stopped:
                return

    def _acquire(self) -> None:
        """Take the busy word; a checked call holds it while its wake-up or join is pending."""
        native = _native()
        while not native.acquire(self._address):
            time.sleep(JOIN_SLEEP_SECONDS)

    def _release(self) -> None:
        _native().publish(self._address + 8 * BUSY_WORD, 0)

    def run(self, job: Job, in0: int, in1: int, out: int) -> None:
        """``job`` on these tensors: its first slice here, the others on workers."""
        with self._running:
            if self._stopped:  # at exit: the workers are gone
                nest = NEST_SIGNATURE(job.function)
                size, count = job.size, job.count
                for index in range(count):
                    lo, hi = index * size // count, (index + 1) * size // count
                    nest(in0, in1, out, lo, hi, job.first, job.last)
                return
            self._acquire()
            status = _native().dispatch(self._address, self.workers, job.address, in0, in1, out, 0)
            self.complete(job, in0, in1, out, status)

    def complete(self, job: Job, in0: int, in1: int, out: int, status: int) -> None:
        """Finish a dispatch of ``job`` that returned ``status`` (1: a worker sleeps; 2: the
        native join gave up), then release the busy word."""
        try:
            if status == 1:  # a worker sleeps: wake it, then run this slice and join
                with self._wake:
                    self._wake.notify_all()
                call = (self._address, self.workers, job.address, in0, in1, out, 1)
                status = _native().dispatch(*call)
            if status == 2:  # a worker is still busy after the native join's polls
                generation = int(self._control[0])
                for worker in range(job.count - 1):
                    while int(self._control[done_word(worker)]) != generation:
                        time.sleep(JOIN_SLEEP_SECONDS)
        finally:
            self._release()

    def stop(self, wait: bool = False) -> None:
        """Let the workers end (they are idle: no call is running); ``wait`` for them to
        leave native code, as at exit, before the JIT's memory goes away."""
        with self._running:
            self._acquire()
            self._stopped = True
            checked_state[:] = 0
            for worker in range(self.workers):
                self._control[task_word(worker)] = 0
            _native().publish(self._address, int(self._control[0]) + 1)
            with self._wake:
                self._wake.notify_all()
            self._release()
        if wait:
            for thread in self._threads:
                thread.join(timeout=1.0)


def _pool(workers: int) -> _Pool:
    global _current
    with _lock:
        if _current is None:
            _current = _Pool(workers)
        elif _current.workers < min(workers, MAX_WORKERS):
            _current.grow(workers)
        return _current


def current() -> _Pool | None:
    """The pool, if one was started (in this process)."""
    return _current


def _forget_pool() -> None:
    """In a forked child the workers are gone: start a new pool on next use."""
    global _current, _lock
    _current, _lock = None, threading.Lock()
    checked_state[:] = 0


def _stop_at_exit() -> None:
    if _current is not None:
        _current.stop(wait=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
atexit.register(_stop_at_exit)


def run_parallel(job: Job, in0: int, in1: int, out: int) -> None:
    """Run ``job``'s nest on these tensors in its slices, [s * size // count, (s + 1) * size
    // count) for slice s, the first on the calling thread and the others on pool threads;
    returns when all have finished."""
    _pool(job.count - 1).run(job, in0, in1, out)
