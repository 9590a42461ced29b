"""A compiled lane-batched contraction (:mod:`teir.codegen.lanes`), run on addresses with the
thread pool: what an einsum plan runs when a batch axis has unit stride in all three tensors
and no GEMM layout fits.

This goes beyond flat TEIR (a C axis is never part of a primitive there), so it is an
internal extension of the einsum front end, shown by ``explain()``, not a configuration.
"""

from __future__ import annotations

import threading
from math import prod

from teir.codegen.irtext import Module
from teir.codegen.lanes import MR, NR, LaneSpec, lane_function
from teir.codegen.target import Target
from teir.kernels.cache import CODE_CACHE
from teir.runtime.operation import built_once
from teir.runtime.pool import MAX_WORKERS, NEST_SIGNATURE, Job, parallel_job, run_parallel
from teir.runtime.stack import UNCHECKED_BYTES, check_stack

# Below this many multiply-adds per thread, a parallel call costs more than it saves (a
# parallel call costs about a microsecond; the kernel does some 30 vector FMAs per ns).
MIN_FMAS_PER_THREAD = 100_000


class LaneOperation:
    """``spec`` compiled for ``threads``; ``run_addresses(in0, in1, out)`` runs it."""

    def __init__(self, spec: LaneSpec, threads: int, target: Target) -> None:
        self.spec = spec
        self.threads = threads

        def generate(prefix: str) -> str:
            module = Module()
            lane_function(spec, target, module, prefix)
            return module.text()

        loaded = CODE_CACHE.get("lanes\n" + spec.name, target, [""], generate)
        self.origin = loaded.origin
        self._function = loaded.symbols[""]
        self._native = NEST_SIGNATURE(self._function)
        fmas = prod(size for size, *_ in spec.outer) * spec.groups * spec.m * spec.n * spec.k
        most = min(threads, spec.jobs, MAX_WORKERS + 1)
        count = max(1, min(most, fmas // MIN_FMAS_PER_THREAD))
        jobs = spec.jobs
        self.slices = [(i * jobs // count, (i + 1) * jobs // count) for i in range(count)]
        self._job: Job | None = None
        if count > 1:
            self._job = parallel_job(self._function, jobs, count, 0, 0)
        self.stack_bytes = spec.stack_bytes()  # its packing buffers, on the calling thread

    def run_addresses(self, in0: int, in1: int, out: int) -> None:
        """Run on element-buffer addresses. Nothing is checked: the caller guarantees that
        the spec's strides stay inside each buffer and that out overlaps no input."""
        if self.stack_bytes > UNCHECKED_BYTES:
            check_stack(self.stack_bytes, "this lane-batched contraction")
        if self._job is None:
            self._native(in0, in1, out, 0, self.spec.jobs, None, None)
            return
        run_parallel(self._job, in0, in1, out)

    def explain(self) -> str:
        spec = self.spec
        outer = "".join(f" x outer C {size}" for size, *_ in spec.outer)
        a, b = ("in1", "in0") if spec.swapped else ("in0", "in1")
        lines = [
            f"# lane-batched contraction: a batch axis of {spec.batch} with unit stride in "
            f"in0, in1 and out runs as the vector lanes ({spec.groups} vector(s) of "
            f"{spec.lanes}){outer}",
            f"#   out[m, n, c] {'+' if spec.beta else ''}= sum_k {a}[m, k, c] * {b}[k, n, c]"
            f"{' then ReLU' if spec.relu else ''}: M {spec.m} (strides {a} {spec.m_in0}, "
            f"out {spec.m_out}), N {spec.n} ({b} {spec.n_in1}, out {spec.n_out}), "
            f"K {spec.k} ({a} {spec.k_in0}, {b} {spec.k_in1})",
            f"#   register block {MR} x {NR} vectors; {a} packed in blocks of {spec.mc} x "
            f"{spec.kc}, {b} in blocks of {spec.kc} x {spec.nc} (aligned, on the stack: "
            f"{spec.stack_bytes() // 1024} KiB)",
            f"#   jobs: {spec.jobs} (batch vector x block of {spec.mc} rows"
            f"{' x outer index' if spec.outer else ''})",
        ]
        if len(self.slices) > 1:
            parts = ", ".join(f"[{lo}, {hi})" for lo, hi in self.slices)
            lines.append(f"#   threads: {len(self.slices)} slices of the jobs: {parts}")
        else:
            why = "threads=1" if self.threads == 1 else "one job, or too little work"
            lines.append(f"#   threads: 1 (the calling thread; {why})")
        lines.append(f"#   code: {self.origin}")
        return "\n".join(lines)


_lane_operations: dict[tuple[LaneSpec, int], LaneOperation] = {}
_lock = threading.Lock()


def compile_lanes(spec: LaneSpec, threads: int) -> LaneOperation:
    """The (cached) lane operation for ``spec`` on ``threads``."""

    def build() -> LaneOperation:
        return LaneOperation(spec, threads, Target.host())

    return built_once(_lane_operations, _lock, (spec, threads), build)
