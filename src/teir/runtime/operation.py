"""``teir.compile``: a configuration as one native function, called on NumPy arrays.

>>> import numpy as np, teir
>>> cfg = teir.Config(
...     data_type="FP32", prim_first="Zero", prim_main="GEMM", prim_last="ReLU",
...     dim_types=["M", "N", "K"], exec_types=["prim"] * 3, dim_sizes=[64, 48, 32],
...     strides_in0=[1, 0, 64], strides_in1=[0, 32, 1], strides_out=[1, 64, 0])
>>> op = teir.compile(cfg)
>>> a, b = np.random.rand(2048).astype(np.float32), np.random.rand(1536).astype(np.float32)
>>> c = np.empty(3072, dtype=np.float32)
>>> op(a, b, c)
>>> expected = np.maximum(a.reshape(32, 64).T @ b.reshape(48, 32).T, 0)
>>> bool(np.allclose(c.reshape(48, 64).T, expected, rtol=1e-5))
True
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

from teir.codegen.brgemm import c_shifts, choose_blocking, prefetched_lines
from teir.codegen.checked_call import DONE, FALLBACK
from teir.codegen.irtext import Module
from teir.codegen.nest import joined_loops, nest_function, nest_stack_bytes, prefetch_for
from teir.codegen.specs import BrgemmSpec, UnarySpec
from teir.codegen.target import Target
from teir.errors import ExecutionError, TeirError
from teir.explain import explain as explain_config
from teir.ir import Config, Tensor
from teir.kernels.arrays import checked_address, overlaps
from teir.kernels.cache import CODE_CACHE
from teir.lower.nest import Access, LoopNest, access_flags, lower
from teir.lower.tiles import TileOp
from teir.runtime.arguments import as_array
from teir.runtime.pool import (
    MAX_WORKERS,
    NEST_SIGNATURE,
    Job,
    default_threads,
    parallel_job,
    run_parallel,
)
from teir.runtime.stack import UNCHECKED_BYTES, check_stack

_VOID_P = ctypes.c_void_p
_NAMES = ("in0", "in1", "out")
# Below this much estimated work per thread, a parallel call costs more than it saves. The
# estimate runs 3-15x above the time measured in cache; a parallel call costs about a
# microsecond (FP32 on 2 threads: 64^3 GEMM, estimate 15 us, 5.6 -> 4.9 us; 48^3, 7 us,
# would lose 2.9 -> 3.7; 256 x 256 gemv, 29 us, 3.6 -> 3.3).
MIN_SECONDS_PER_THREAD = 6e-6


class Operation:
    """A compiled configuration. Call it as ``op(in0, in1, out)``; it writes ``out`` in place.

    ``in1`` (for unary operations) and both inputs (for prim_main None) may be ``None``.
    Arguments are NumPy arrays, or CPU tensors that export DLPack, of the configuration's
    dtype, C- or F-contiguous, holding at least ``config.extents`` elements; the output must be
    writable and must not overlap an input. Anything else raises :class:`teir.ExecutionError`
    before native code runs.
    """

    def __init__(
        self,
        config: Config,
        threads: int,
        nest: LoopNest,
        target: Target,
        rests: tuple[tuple[tuple[int, int, int], Operation], ...] = (),
    ) -> None:
        self._describe_operands(config, threads, nest, target, rests)
        loaded = CODE_CACHE.get("nest\n" + nest.key, target, [""], self._generate)
        self.origin = loaded.origin
        self._function = loaded.symbols[""]
        self._native = NEST_SIGNATURE(self._function)
        self._flags: tuple[np.ndarray, np.ndarray] | None = None
        self._flag_addresses = (0, 0)
        if nest.access is Access.TRACKED:
            self._flags = access_flags(nest)
            self._flag_addresses = (self._flags[0].ctypes.data, self._flags[1].ctypes.data)
        self.slices = self._slices()
        self._parallel_size = nest.parallel_size
        self._job: Job | None = None
        if len(self.slices) > 1:
            self._job = parallel_job(
                self._function, self._parallel_size, len(self.slices), *self._flag_addresses
            )
        # the packed panel's and the kernels' packing buffers, which the calling thread's
        # stack must have room for
        self.stack_bytes = nest_stack_bytes(nest, target)
        # the native checked call for the layouts of the first NumPy arguments that pass
        # the checks (``_checked_for``); tried once
        self._checked: Any = None
        self._checked_tried = bool(rests)  # the checked call runs one nest, not the rests

    def _describe_operands(
        self,
        config: Config,
        threads: int,
        nest: LoopNest,
        target: Target,
        rests: tuple[tuple[tuple[int, int, int], Operation], ...],
    ) -> None:
        """What every operation keeps of its configuration: its tensors' dtype, extents and
        use (the argument checks), work, and rests."""
        self.config = config
        # the partial tiles' rest regions (``Config.rests``), each compiled on its own and run
        # after this nest on the tensors advanced by its element offsets
        self.rests = rests
        self.threads = threads
        self.nest = nest
        self.target = target
        self.flops = config.flops
        self._dtype = config.dtype
        self._extents = config.extents
        self._uses = tuple(config.uses(t) for t in Tensor)
        self.estimated_seconds = self._estimate()

    def _generate(self, prefix: str) -> str:
        module = Module()
        nest_function(self.nest, self.target, module, prefix)
        return module.text()

    def _estimate(self) -> float:
        """Seconds on one core, roughly: FLOPs at the kernels' rate plus every byte at a
        memory-bound rate (a dot product of 2M FP64 does 4 MFLOP but reads 32 MB)."""
        own = self.config.own  # the rests have operations of their own
        touched = sum(own.extent(t) for t in Tensor)
        return float(own.flops / 50e9 + touched * self._dtype.itemsize / 10e9)

    def _slices(self) -> list[tuple[int, int]]:
        """Balanced parts of the parallel index space, one per thread used."""
        size = self.nest.parallel_size
        most = min(self.threads, size, MAX_WORKERS + 1)
        count = max(1, min(most, int(self.estimated_seconds / MIN_SECONDS_PER_THREAD)))
        return [(i * size // count, (i + 1) * size // count) for i in range(count)]

    # ---- calling ---------------------------------------------------------------------------
    def _address(self, index: int, value: Any) -> tuple[int, int]:
        """(data address, byte size) of a checked argument; (0, 0) for an unused input."""
        name = _NAMES[index]
        if not self._uses[index]:
            if value is not None and not isinstance(value, np.ndarray):
                as_array(name, value)  # still reject what is not a tensor at all
            return 0, 0
        if value is None:
            raise ExecutionError(
                f"{name} is needed ({self._extents[index]} elements of "
                f"{self._dtype.name}) but None was given"
            )
        array = value if type(value) is np.ndarray else as_array(name, value)
        address = checked_address(name, array, self._dtype, self._extents[index], index == 2)
        return address, array.nbytes

    def _native_arguments(self, tensors: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The arguments of a checked call (in0, [in1,] out), or None where it takes none of
        these: an operation without in0, or a unary one given an in1 all the same."""
        in0, in1, out = tensors
        if self._uses[1]:
            return tensors if self._uses[0] else None
        return (in0, out) if self._uses[0] and in1 is None else None

    def _checked_for(self, tensors: tuple[Any, ...]) -> None:
        """Make the checked call for the layouts of these arguments, which passed the Python
        checks: later calls with arrays of the same layouts are checked and run in one
        native call (a 32^3 GEMM called with arrays: 4.9 -> 0.9 us; its nest through
        ctypes alone, 1.5)."""
        arguments = self._native_arguments(tensors)
        if arguments is None or any(type(a) is not np.ndarray for a in arguments):
            return  # (tensors that export DLPack: tried again with NumPy arrays)
        self._checked_tried = True
        from teir.runtime.checked_call import ArrayLayout, checked_call  # imports this module

        layouts = [ArrayLayout(a.shape, a.strides) for a in arguments[:-1]]
        out = arguments[-1]
        self._checked = checked_call(self, [*layouts, ArrayLayout(out.shape, out.strides, True)])

    def __call__(self, *tensors: Any, **named: Any) -> None:
        checked = self._checked
        if checked is not None and not named and len(tensors) == 3:
            arguments = self._native_arguments(tensors)
            if arguments is not None:
                code = checked.call(*arguments)
                if code != FALLBACK:
                    if code != DONE:
                        checked.finish(code, *arguments)
                    return
        if named:
            tensors = _by_name(tensors, named)
        if len(tensors) != 3:
            raise ExecutionError(
                f"expected 3 tensors (in0, in1, out), got {len(tensors)}; pass "
                "None for an input the operation does not use"
            )
        in0, in1, out = tensors
        p0, n0 = self._address(0, in0)
        p1, n1 = self._address(1, in1)
        po, no = self._address(2, out)
        if (n0 and po < p0 + n0 and p0 < po + no) or (n1 and po < p1 + n1 and p1 < po + no):
            name = "in0" if n0 and overlaps(po, no, p0, n0) else "in1"
            raise ExecutionError(f"out overlaps {name} in memory; pass a separate output array")
        self.run_addresses(p0, p1, po)
        if not self._checked_tried:
            self._checked_for((in0, in1, out))

    def run_addresses(self, in0: int, in1: int, out: int) -> None:
        """Run on element-buffer addresses (0 for unused inputs). Nothing is checked: the
        caller guarantees that the configuration's strides stay inside each buffer, that out
        is writable and that it does not overlap an input."""
        if self.stack_bytes > UNCHECKED_BYTES:
            check_stack(self.stack_bytes, "this operation")
        if self._job is None:
            first, last = self._flag_addresses
            self._native(in0, in1, out, 0, self._parallel_size, first, last)
        else:
            run_parallel(self._job, in0, in1, out)
        size = self._dtype.itemsize
        for (o0, o1, oo), rest in self.rests:
            rest.run_addresses(in0 and in0 + o0 * size, in1 and in1 + o1 * size, out + oo * size)

    # ---- reporting -------------------------------------------------------------------------
    def explain(self, name: str | None = None) -> str:
        """The loop nest as compiled: loops, kernels with their parameters, the thread split,
        and every fallback taken with its reason."""
        lines = [explain_config(self.config.own, name), "", "# compiled:"]
        for loop in self.nest.loops:
            kind = "parallel" if loop.parallel else "sequential"
            lines.append(
                f"#   loop axis {loop.axis} ({loop.dim_type.value}, size {loop.size}): {kind}"
            )
        lines.append(f"#   first/last access: {self.nest.access.value}")
        always_first = self.nest.access is Access.ALWAYS
        for role in ("first", "main_zero", "main", "last"):
            op: TileOp | None = getattr(self.nest, role)
            if role == "main" and always_first and self.nest.main_zero is not None:
                continue  # never called: every iteration is a first access
            if op is not None:
                lines.append(f"#   {role}: {self._describe(op, role)}")
        size = self.nest.parallel_size
        if len(self.slices) > 1:
            parts = ", ".join(f"[{lo}, {hi})" for lo, hi in self.slices)
            lines.append(
                f"#   threads: {len(self.slices)} slices of the parallel index space "
                f"(size {size}): {parts}"
            )
        else:
            if not any(loop.parallel for loop in self.nest.loops):
                why = "no parallel loop"
            elif self.threads == 1:
                why = "threads=1"
            else:
                why = "too little work to pay for threads"
            lines.append(f"#   threads: 1 (the calling thread; {why})")
        lines += [f"#   note: {note}" for note in self.nest.notes]
        lines.append(f"#   code: {self.origin}")
        return "\n".join(lines + self._rests_explained())

    def _rests_explained(self) -> list[str]:
        """The partial-tile rests' explanations, each under a heading."""
        lines = []
        for index, ((o0, o1, oo), rest) in enumerate(self.rests):
            lines += [
                "",
                f"# partial tiles: rest {index}, run after the parts before it on in0 + {o0}, "
                f"in1 + {o1}, out + {oo} (elements):",
                rest.explain(f"rest {index}"),
            ]
        return lines

    def _describe(self, op: TileOp, role: str) -> str:
        text = op.describe()
        if isinstance(op.spec, BrgemmSpec):
            b = choose_blocking(op.spec, self.target)
            text += (
                f"; {b.form} form, register block {b.vectors}x{b.lanes} x {b.columns}, "
                f"batch chunk {b.chunk}"
            )
            if b.k_piece:
                text += f", K swept {b.k_piece} steps at a time"
            if b.pack_a:
                what = "the whole tile at once" if b.pack_whole else "row block by row block"
                text += (
                    f"; A packed {what} into a {b.a_buffer_bytes(op.spec) // 1024} KiB stack buffer"
                )
            if b.pack_b:
                text += (
                    f"; B packed column block by column block into a "
                    f"{b.b_buffer_bytes(op.spec) // 1024} KiB stack buffer"
                )
            prefetch = prefetch_for(self.nest, role)
            lines = prefetched_lines(op.spec, b, prefetch)
            if any(lines):
                tiles = " and ".join(n for n, count in zip(("A", "B"), lines) if count)
                size = sum(lines) * 64
                amount = f"{size // 1024} KiB" if size >= 1024 else f"{size} bytes"
                text += f"; prefetches the next iteration's {tiles} ({amount}) into L2"
            if op.spec.stream_c:
                shifted = " or shifted" if c_shifts(op.spec, b) else ""
                text += f"; stores C around the caches where it is vector-aligned{shifted}"
        elif isinstance(op.spec, UnarySpec) and op.spec.stream_b:
            text += "; stores the output around the caches in whole lines"
            chain = joined_loops(self.nest, op) if op.spec.joined else []
            if chain:
                axes = ", ".join(str(self.nest.loops[i].axis) for i in chain)
                text += (
                    f"; joined to the next tile along loop axis {axes} (the line their "
                    "columns share stored once, whole, by the tile before it)"
                )
        return text

    def __repr__(self) -> str:
        return (
            f"<teir.Operation {self.config.prim_main.value} {self.config.dim_sizes}"
            + (f" + {len(self.rests)} rest(s)" if self.rests else "")
            + f", {len(self.slices)} thread(s)>"
        )


def _by_name(tensors: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, ...]:
    unknown = sorted(set(named) - {"in0", "in1", "out"})
    if unknown:
        raise ExecutionError(f"unknown tensor names {unknown}; use in0, in1, out")
    values = list(tensors) + [None] * (3 - len(tensors)) if len(tensors) <= 3 else list(tensors)
    for index, name in enumerate(("in0", "in1", "out")):
        if name in named:
            if index < len(tensors):
                raise ExecutionError(f"{name} was given twice")
            values[index] = named[name]
    return tuple(values)


Key = TypeVar("Key", bound=Hashable)
Built = TypeVar("Built")

_operations: dict[tuple[Config, int, bool], Operation] = {}
_operations_lock = threading.Lock()


def compile(
    config: Config, threads: int | None = None, *, resident_output: bool = False
) -> Operation:
    """``config`` as one compiled loop nest, cached by its arguments: ``teir.compile``
    (:func:`teir.frontend.config_views.compile`, whose docstring says what the arguments
    mean) but for the contractions it runs as einsums."""
    threads = checked_arguments(config, threads)
    key = (config, threads, resident_output)
    found = _operations.get(key)
    if found is not None:
        return found
    # compiled before the lock is taken: each takes it for itself
    rests = tuple(
        (rest.offsets, compile(rest.config, threads, resident_output=resident_output))
        for rest in config.rests
    )
    return built_once(
        _operations,
        _operations_lock,
        key,
        lambda: Operation(
            config, threads, lower(config.own, resident_output), Target.host(), rests
        ),
    )


def checked_arguments(config: Any, threads: Any) -> int:
    """The thread count ``compile`` runs ``config`` with (``threads``, or the default where
    None), once both are what it takes."""
    if not isinstance(config, Config):
        raise TeirError(f"expected a teir.Config, got {type(config).__name__}")
    count = default_threads() if threads is None else threads
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TeirError(f"threads must be a positive integer, got {threads!r}")
    return count


def built_once(
    cache: dict[Key, Built], lock: threading.Lock, key: Key, build: Callable[[], Built]
) -> Built:
    """``cache[key]``, built by ``build`` on a miss: one thread builds (compiles) a key while
    the others wait for it, and lookups of built keys take no lock."""
    found = cache.get(key)
    if found is None:
        with lock:
            found = cache.get(key)
            if found is None:
                found = build()
                cache[key] = found
    return found
