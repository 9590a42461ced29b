"""Sharing a reduction between threads when the output gives them nothing to share.

A contraction whose output is a scalar or a few elements (a dot product, ``ij,ij->``) has
no C/M/N loop for the threads, and K loops never run in parallel (their iterations update
the same output). Such an einsum is rewritten: one K label ``k`` of size ``n`` is cut into
``(p, n / p)`` with ``p`` the thread count, ``p`` leads the output, the rewritten einsum runs
with one part per thread into a small temporary, and NumPy adds the ``p`` partial results.
Where ``p`` does not divide ``n``, the last ``n % p`` indices are contracted apart as one
more partial result.
The operands are only viewed with other strides, never copied. Measured: ``i,i->`` 2M on 2
cores, FP32 0.21 -> 0.14 ms, FP64 0.55 -> 0.27-0.34 ms (NumPy's threaded ddot: 0.20-0.28 ms).

A plan that adds into each output element more than ``LONGEST_CHAIN`` times in a row (a
one-element kernel inside a K loop of millions) is cut alike, on one thread too, into enough
parts that each part's chain is at most that long: rounding error grows with the length of
a chain of additions (``ij,ij->j`` 10^6 x 8 FP32: relative error 4.8e-5 in two parts,
NumPy's pairwise sums 3e-8).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from teir.codegen.brgemm import choose_blocking
from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target, l3_share
from teir.frontend.einsum_parse import LETTERS, Subscripts
from teir.ir import DimType, Tensor
from teir.lower.nest import LoopNest, lower
from teir.optimizer import optimize

# Below this much work the temporary and the final sum cost more than a thread saves.
SPLIT_MIN_BYTES = 1 << 20
# ... and than a matrix-vector product's whole rows save, below this size of its matrix
# (1000² FP64 on 2 threads: 64 us with rows shared, 92 us with K cut).
SHORT_ROWS_MIN_BYTES = 16 << 20
# ... and when the threads' shares of a row would be shorter than this.
SHORT_ROWS_RUN_BYTES = 8 << 10
# The label cut must give each part at least this many indices.
SPLIT_LEAST_PARTS = 2
# The most additions into one output element in a row that a plan may make uncut (FP32
# chains of products in [0, 1), worst of 8: 2^16 additions relative error 4e-6, 2^18 1.7e-5,
# 2^20 1.6e-4). Each cut costs: FP32 fd,df-> 3104 x 2048 on 2 threads (a chain of 6.4M)
# 4.2-4.5 ms whole (error 1.4e-3), 4.6-5.5 ms in 26 parts (1e-5), 5.0-5.7 in 98 (2e-6).
# 2^16 against 2^18 (alternating processes, 3 rounds): ij,ij->j 10^6 x 4 error 4.9e-5 ->
# 7e-6 at the same time, fd,df-> 1.3e-5 -> 1.1e-6 and 4.5-4.9 -> 3.8-4.3 ms, abe,eba->a
# (12 x 1000 x 1000) 13.0-13.6 -> 16.6-16.7 ms (NumPy 50). FP64 chains of 2^18 err by about
# 1e-14, where cuts would only cost time. By the element size in bytes:
LONGEST_CHAIN = {4: 1 << 16, 8: 1 << 18}


@dataclass(frozen=True)
class SplitReduction:
    """``label`` (a K label) cut into ``parts`` x ``size // parts``; ``subscripts`` is the
    rewritten einsum, whose output leads with the parts. Where ``parts`` does not divide the
    label's size, the last ``rest`` indices are left out of the cut and contracted apart."""

    label: str
    parts: int
    subscripts: str
    rest: int = 0
    # the chain of additions into each output element (:func:`chain_length`) that the cut
    # shortens; 0 where it shares the work between threads
    chain: int = 0


def short_rows(plan: Any, threads: int) -> bool:
    """Whether the plan is a matrix-vector product streaming its matrix (a kernel with one
    column, not the dot form) whose rows, shared between the threads, give each a run of
    fewer than ``SHORT_ROWS_RUN_BYTES`` per K step: cutting K instead lets every thread read
    whole rows (``k,kj->j`` 4100 x 1031 FP64
    on 2 threads: 0.98 -> 0.39 ms; 8192 x 512: 0.68 -> 0.38 ms; FP32 0.34 -> 0.22 ms)."""
    if threads < 2 or not plan.regions:
        return False
    nest = plan.regions[0].operation.nest  # the main region (a thin rest may follow)
    main = nest.main_zero or nest.main
    if main is None or not isinstance(main.spec, BrgemmSpec):
        return False
    spec = main.spec
    one_column = (spec.n == 1) != (spec.m == 1) and spec.k * spec.batch > 1
    if not one_column or choose_blocking(spec, Target.host()).form == "dot":
        return False  # (a dot form reads whole rows already)
    shared = [loop for loop in nest.loops if loop.parallel]
    if not shared or any(loop.dim_type is DimType.C for loop in shared):
        return False  # the threads share batches of whole rows, or nothing
    matrix = plan.regions[0].operation.flops // 2 * spec.itemsize  # bytes, about
    run = (spec.m if spec.n == 1 else spec.n) * spec.itemsize  # a kernel's rows
    return matrix >= SHORT_ROWS_MIN_BYTES and run < SHORT_ROWS_RUN_BYTES


def chain_length(plan: Any) -> int:
    """The most additions into one output element in a row that the plan's main region
    makes: each iteration of its K loops calls the kernel, which adds one sum per batch chunk
    (:data:`teir.codegen.brgemm.SUM_CHAIN` products at most) to each element of C, or, where
    it sweeps K in pieces, each of its products."""
    if not plan.regions:
        return 0
    nest = plan.regions[0].operation.nest  # the main region (a thin rest may follow)
    calls: int = prod(loop.size for loop in nest.loops if loop.dim_type is DimType.K)
    main = nest.main_zero or nest.main
    if main is None or not isinstance(main.spec, BrgemmSpec):
        return calls
    spec = main.spec
    if spec.one_element:
        return calls  # the one-element kernel, inlined into the loops
    blocking = choose_blocking(spec, Target.host())
    if not blocking.k_piece:
        return calls * spec.batch // blocking.chunk
    if blocking.form == "mirror":  # each piece's sum added to C
        return calls * spec.batch * -(-spec.k // blocking.k_piece)
    return calls * spec.batch * spec.k  # C carried through the pieces' products


def chain_too_long(chain: int, itemsize: int) -> bool:
    """Whether ``chain`` additions in a row of ``itemsize``-byte elements must be cut into
    parts (``LONGEST_CHAIN``)."""
    return chain > LONGEST_CHAIN[itemsize]


def accuracy_parts(chain: int, threads: int, itemsize: int) -> int:
    """How many parts a reduction of ``chain`` additions in a row of ``itemsize``-byte
    elements must be cut into for none to be longer than ``LONGEST_CHAIN`` (a multiple of
    ``threads``), or 0 if it need not be."""
    if not chain_too_long(chain, itemsize):
        return 0
    return threads * -(-chain // (threads * LONGEST_CHAIN[itemsize]))


def unbalanced(plan: Any, threads: int) -> bool:
    """Whether the plan's threads share its parallel loops so unevenly that at least
    ``SPLIT_IDLE`` of their time goes idle (7 output tiles on 2 threads: 4 and 3), while its
    result is small beside its operands, so that a partial result per thread and their sum
    cost little (``SPLIT_RESULT_PART``), and it works long enough for the idle time to outweigh
    the split's own cost (``SPLIT_IDLE_SECONDS`` on one core, as the operation estimates
    it), with at least one FLOP per byte it reads (where memory bounds it, the threads wait
    on memory alike)."""
    operation = _shared_main(plan, threads)
    if operation is None:
        return False
    size = operation.nest.parallel_size
    longest = max(hi - lo for lo, hi in operation.slices)
    idle = 1 - size / (threads * longest)
    return idle >= SPLIT_IDLE and _small_result(plan, operation, threads)


def _shared_main(plan: Any, threads: int) -> Any:
    """The plan's main operation (a thin rest region may follow it) where the threads share
    it, else None (one thread, or too little work to share at all)."""
    if threads < 2 or not plan.regions or plan.operation is None:
        return None
    operation = plan.regions[0].operation
    return operation if len(operation.slices) >= 2 else None


def _small_result(plan: Any, operation: Any, threads: int) -> bool:
    """Whether the result is small beside the operands, so that a partial result per thread
    and their sum cost little (``SPLIT_RESULT_PART``), the operation works long enough for a
    split to pay (``SPLIT_IDLE_SECONDS`` on one core, as it estimates itself), with at least
    one FLOP per byte it reads (where memory bounds it, the threads wait on memory alike)."""
    config = operation.config
    inputs = config.extent(Tensor.IN0) + config.extent(Tensor.IN1)
    return bool(
        threads * prod(plan.out_shape) * SPLIT_RESULT_PART <= inputs
        and operation.estimated_seconds >= SPLIT_IDLE_SECONDS
        and config.flops >= inputs * config.dtype.itemsize
    )


# A reduction is shared where threads would idle this much of the time in their parallel
# loops, a result per thread is at most this part of the operands' elements, and the
# operation is estimated to take this long on one core. Random binary einsums of small
# results that this cuts (2 threads, alternating): FP32 agh,aegd->ehd (h 64, d 40, a 100,
# e 7, g 100; 7 tiles) 2.15 -> 1.80 ms (the optimizer now cuts its h into 14 tiles that
# split evenly instead: FP32 the same time as this cut, FP64 1.75-1.82 -> 1.81-1.85 ms), 8
# more 1.0-1.5x; FP64 gbef,ebag->af 4.4 -> 1.6 ms,
# cgb,cdg->bd 2.8 -> 1.4 ms, hcfb,chef->eb 0.69 -> 0.42 ms, 3 more 1.2-1.5x, dbfe,bae->fda
# 0.39 -> 0.41-0.45. Left out: FP32 adh,dhec->cea (0.7 ms estimated, 0.14 -> 0.16 ms
# measured: the temporary and the sum cost more than the idle thread), FP64
# defch,cgefd->chg (0.6 FLOP per byte: 60 -> 77 ms).
SPLIT_IDLE = 0.1
SPLIT_RESULT_PART = 8
SPLIT_IDLE_SECONDS = 1e-3


def _rereads(nest: LoopNest, tensor: Tensor) -> int:
    """How many times the nest reads ``tensor`` whole: the iterations of its loops over
    output labels that do not index it."""
    return prod(
        loop.size
        for loop in nest.loops
        if loop.strides[tensor.value] == 0 and loop.dim_type is not DimType.K
    )


def rereading(plan: Any, threads: int) -> bool:
    """Whether the plan's threads were given tiles of a result small beside its operands (as
    :func:`unbalanced` takes it) narrower than one thread would take, so that an input larger
    than this process's share of the last level (``l3_share``) is read from memory again for
    each of them: cut along K instead, each thread reads its part of both inputs once, in
    tiles as wide as the result. 2 threads, alternating processes, best of 4: FP32
    kbhd,khdg->bg (24 x 96 summed over 204800; in0, 20 MB, read for each of 4 tiles of 24
    columns where one thread takes one tile) 13.2 -> 6.5 ms, FP64 lhk,hil->ki 17.0 -> 14.4
    ms; ten random small-result einsums this rule flips 1.00x by geometric mean (0.85-1.18x:
    FP64 dfjh,jhfg->dg 28.1 -> 23.9 ms, jdlk,gkj->gdl 1.7 -> 2.0 ms). Where one thread reads
    the input as often (its own loops over output labels: dcj,fdic->jfi, 8 tiles of f), a
    cut reads it alike: without this comparison the rule flipped 18 of 40 random einsums,
    nine of them 5-17 % slower."""
    operation = _shared_main(plan, threads)
    if operation is None or not _small_result(plan, operation, threads):
        return False
    config = operation.config
    itemsize = config.dtype.itemsize
    large = [t for t in (Tensor.IN0, Tensor.IN1) if config.extent(t) * itemsize > l3_share()]
    if not large:
        return False
    # one thread's schedule (optimizing fuses the axes cut for the threads back first)
    alone = lower(optimize(config, threads=1, partial_tiles=False))
    return any(_rereads(operation.nest, t) > _rereads(alone, t) for t in large)


def plan_split(
    subscripts: Subscripts, arrays: list[np.ndarray], threads: int, chain: int = 0
) -> SplitReduction | None:
    """The split for a binary einsum whose compiled plan leaves threads idle, or None when
    no K label divides between ``threads`` or the work is too small to share. ``chain``
    (the plan's :func:`chain_length`), where :func:`accuracy_parts` asks for parts: into
    those, whatever the work and the threads."""
    if len(arrays) != 2:
        return None
    parts = accuracy_parts(chain, threads, arrays[0].itemsize)
    accuracy = parts > 0
    if threads < 2 and not accuracy:
        return None
    parts = parts or threads
    sizes: dict[str, int] = {}
    nearest: dict[str, int] = {}  # each label's smaller stride of the two operands
    for labels, array in zip(subscripts.inputs, arrays):
        if len(set(labels)) != len(labels):
            return None  # a diagonal: left to the plan as it is
        for label, size, stride in zip(labels, array.shape, array.strides):
            if sizes.setdefault(label, size) != size:
                return None  # a broadcast dimension
            nearest[label] = min(nearest.get(label, abs(stride)), abs(stride))
    if sum(array.nbytes for array in arrays) < SPLIT_MIN_BYTES and not accuracy:
        return None
    first, second = subscripts.inputs
    reduced = [label for label in first if label in second and label not in subscripts.output]
    if not reduced:
        return None
    # a label that divides between the threads first, then one long enough to cut, then the
    # outermost (whose parts leave the runs along the unit strides whole); an odd one leaves
    # its last indices out of the cut (FP64 on 2 threads, k,kj->j 4099 x 1031: 680-816 ->
    # 417-640 us; i,i-> 2000003: 568-605 -> 228-325 us; ij,ij-> 1001 x 1999: 564-626 ->
    # 354-573 us). Cutting h of dbh,fedh->fbe (d 200, h 300 along both unit strides) into
    # runs of 150: FP32 2.9 ms, against 1.9-2.1 uncut; cutting d: 1.7 ms.
    least = SPLIT_LEAST_PARTS * parts
    label = max(
        reduced,
        key=lambda name: (sizes[name] % parts == 0, sizes[name] >= least, nearest[name]),
    )
    if sizes[label] < least:
        return None
    used = set(first) | set(second) | set(subscripts.output)
    free = iter(letter for letter in LETTERS if letter not in used)
    letters = {name: (name if name in LETTERS else next(free)) for name in sorted(used)}
    part = next(free)

    def term(labels: tuple[str, ...]) -> str:
        return "".join(part + letters[n] if n == label else letters[n] for n in labels)

    text = f"{term(first)},{term(second)}->{part}{term(subscripts.output)}"
    return SplitReduction(label, parts, text, sizes[label] % parts, chain if accuracy else 0)


def _along(array: np.ndarray, labels: tuple[str, ...], label: str, part: slice) -> np.ndarray:
    """``array`` (over ``labels``) with ``label`` restricted to ``part``."""
    index: list[slice] = [slice(None)] * array.ndim
    index[labels.index(label)] = part
    return array[tuple(index)]


def rest_views(
    split: SplitReduction, subscripts: Subscripts, arrays: list[np.ndarray]
) -> list[np.ndarray]:
    """The operands restricted to the split label's last ``split.rest`` indices."""
    return [
        _along(array, labels, split.label, slice(-split.rest, None))
        for labels, array in zip(subscripts.inputs, arrays)
    ]


def split_views(
    split: SplitReduction, subscripts: Subscripts, arrays: list[np.ndarray]
) -> list[np.ndarray]:
    """The operands with the split label's dimension (but its last ``split.rest`` indices)
    viewed as (parts, size // parts)."""
    views = []
    for labels, array in zip(subscripts.inputs, arrays):
        if split.rest:
            array = _along(array, labels, split.label, slice(0, -split.rest))
        shape, strides = [], []
        for name, size, stride in zip(labels, array.shape, array.strides):
            if name == split.label:
                shape += [split.parts, size // split.parts]
                strides += [stride * (size // split.parts), stride]
            else:
                shape.append(size)
                strides.append(stride)
        # Cutting one dimension in two is a view whatever the strides; reshape makes it in a
        # fraction of as_strided's time (which is kept for safety should NumPy copy).
        view = array.reshape(shape)
        if view.strides != tuple(strides) or not np.may_share_memory(view, array):
            view = np.lib.stride_tricks.as_strided(array, shape=shape, strides=strides)
        views.append(view)
    return views
