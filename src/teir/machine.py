"""What this machine is and what it can do, measured in the same run as what is compared.

>>> from teir import machine
>>> info = machine.info()
>>> info.cores >= 1 and info.vector_bits in (128, 256, 512)
True

``peak_gflops`` runs a JIT-compiled loop of independent vector FMAs (no memory traffic) on one
or several threads; ``copy_bandwidth`` a JIT-compiled vector copy of a given size. Benchmarks
call them alongside their measurements, because a virtual machine's speed can change between
runs (its vCPUs may share a physical core for a while).
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from teir.buffers import aligned_empty
from teir.codegen.probes import copy_block_bytes, copy_probe, flops_per_iteration, fma_probe
from teir.codegen.target import Target, cache_sizes, l3_share
from teir.kernels.cache import CODE_CACHE


@dataclass(frozen=True)
class MachineInfo:
    """CPU name and features (as LLVM reports them), usable cores and cache sizes in bytes."""

    cpu: str
    llvm_cpu: str
    features: tuple[str, ...]
    vector_bits: int
    cores: int
    caches: dict[str, int] = field(default_factory=dict)


@cache
def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total), read once:
    every einsum call without ``threads=`` asks, and the system call took a microsecond."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@cache
def info() -> MachineInfo:
    target = Target.host()
    features = tuple(f[1:] for f in target.features.split(",") if f.startswith("+"))
    return MachineInfo(
        _cpu_model(), target.cpu, features, target.vector_bits, usable_cores(), cache_sizes()
    )


def _fma_function(itemsize: int) -> tuple[Any, int]:
    target = Target.host()
    loaded = CODE_CACHE.get(
        f"probe:fma:{itemsize}", target, [""], lambda prefix: fma_probe(target, itemsize, prefix)
    )
    restype = ctypes.c_float if itemsize == 4 else ctypes.c_double
    function = ctypes.CFUNCTYPE(restype, ctypes.c_int64)(loaded.symbols[""])
    return function, flops_per_iteration(target, itemsize)


PROBE_ROUNDS = 8
PROBE_SETTLED = 1.02  # the best rose by less than this factor over the last round
PROBE_SCALING = 0.75  # n threads reach at least this fraction of n single threads' peak
PROBE_PATIENCE = 3.0  # seconds of further rounds while they do not (cores shared with SMT never do)
PROBE_PAUSE = 0.05


def peak_gflops(dtype: str = "f32", threads: int = 1, seconds: float = 0.2) -> float:
    """Measured FMA peak in GFLOP/s of ``threads`` threads (the best of a few runs)."""
    function, flops = _fma_function(4 if dtype in ("f32", "fp32", "FP32") else 8)
    function(1000)
    iterations = 1_000_000
    start = time.perf_counter()
    function(iterations)
    per_iteration = (time.perf_counter() - start) / iterations
    iterations = max(1000, int(seconds / 3 / max(per_iteration, 1e-12)))
    # At least three rounds, and more (up to PROBE_ROUNDS) while the best still rises or
    # several threads fall well short of as many single threads: a core taken away for a
    # moment (a VM's vCPU descheduled) must not halve the peak that every "of peak" figure
    # of the run is measured against (a demo once showed 172 %).
    expected = threads * peak_gflops(dtype, 1, seconds) * PROBE_SCALING if threads > 1 else 0.0
    best = previous = 0.0
    round_ = 0
    deadline = time.perf_counter() + PROBE_PATIENCE
    # Past PROBE_ROUNDS, rounds go on (with a pause for whatever holds a core to finish)
    # only while several threads still fall short and the patience lasts: a bench course
    # once read 116 GFLOP/s on 2 cores for 8 rounds, 224 a few seconds later.
    while round_ < PROBE_ROUNDS or (best < expected and time.perf_counter() < deadline):
        if round_ >= PROBE_ROUNDS:
            time.sleep(PROBE_PAUSE)
        workers = [threading.Thread(target=function, args=(iterations,)) for _ in range(threads)]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - start
        best = max(best, threads * iterations * flops / elapsed / 1e9)
        if round_ >= 2 and best <= previous * PROBE_SETTLED and best >= expected:
            break
        previous = best
        round_ += 1
    return best


def copy_bandwidth(nbytes: int, seconds: float = 0.05, threads: int = 1) -> float:
    """Measured copy bandwidth in GB/s (bytes read plus bytes written per second) for copying
    ``nbytes`` from one buffer to another, repeatedly (so small sizes stay in cache), split
    between ``threads`` threads copying their shares at once: the rate to set an operation
    on as many threads against. Copies that outgrow this process's share of the last-level
    cache store around the caches, as teir's copies between buffers in memory do: regular
    stores would first read every destination line (a third more traffic)."""
    target = Target.host()
    streamed = 2 * nbytes >= l3_share()  # (at most L3 itself)
    loaded = CODE_CACHE.get(
        f"probe:copy{':streamed' if streamed else ''}",
        target,
        [""],
        lambda prefix: copy_probe(target, prefix, streamed),
    )
    function = ctypes.CFUNCTYPE(
        None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64
    )(loaded.symbols[""])
    threads = max(1, threads)
    block = copy_block_bytes(target)
    blocks = max(1, nbytes // block // threads)  # per thread
    buffers = []
    for _ in range(threads):
        source = np.ones(blocks * block // 4 + 16, dtype=np.float32)
        destination = aligned_empty(source.shape, np.float32)  # whole vectors: streamed
        destination[...] = 0
        buffers.append((source, destination))

    def copy_all(reps: int) -> float:
        """Seconds for every thread to copy its share ``reps`` times (ctypes releases the GIL)."""
        workers = [
            threading.Thread(target=function, args=(src.ctypes.data, dst.ctypes.data, blocks, reps))
            for src, dst in buffers
        ]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - start

    copy_all(1)
    per_rep = copy_all(10) / 10
    reps = max(1, int(seconds / 3 / max(per_rep, 1e-9)))
    best = 0.0
    for _ in range(3):
        elapsed = copy_all(reps)
        best = max(best, 2 * threads * blocks * block * reps / elapsed / 1e9)
    return best


@dataclass(frozen=True)
class Probe:
    """Peaks measured in one run: GFLOP/s per dtype on one core and on all usable cores."""

    single: dict[str, float]
    all_cores: dict[str, float]
    cores: int


def probe(dtypes: tuple[str, ...] = ("f32", "f64"), threads: int | None = None) -> Probe:
    """Measure the FMA peak of one core and of ``threads`` (default: all usable) cores."""
    threads = threads or usable_cores()
    return Probe(
        {d: peak_gflops(d, 1) for d in dtypes},
        {d: peak_gflops(d, threads) for d in dtypes},
        threads,
    )
