"""The fallback for binary einsums that no kernel layout fits as their operands lie: copy the
tensors that need it into label orders that do fit (Copy kernels), contract, and copy the
result into place if it needed a copy too.

Copying fewer bytes is better, but a layout that merely fits a kernel can still make a poor
one. So each subset of (in0, in1, result) is planned, the cheapest first, and taken when its
kernel tiles span at least half of what copying all three gives and fill at least half as
many vector lanes, and the lanes they leave empty cost no more than the further copies
would (``copy_choice.costs_no_more``). A tensor left in place is read (or written) there
however far apart its tile rows lie: copying it costs more than the rows do (see
``choose``).

Large copies are made a chunk at a time along one result label (see ``chunking``): each chunk
is copied, contracted and copied back while it is in the caches.

The same copies serve compute-bound einsums whose kernel fits the operands as they lie but is
not the plain outer-product one (``einsum_plan.relayout_pays``): copied once, within the
scratch buffer, they give that kernel, or one nearer to it (``einsum_plan.relaid``).

The planner and the runner are passed in (``einsum``'s), so this module never calls up.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from math import prod

import numpy as np

from teir.buffers import new_strides
from teir.frontend.copy_choice import KernelShape, as_good, costs_no_more, kernel_shape
from teir.frontend.einsum_parse import LETTERS
from teir.frontend.einsum_plan import (
    Operand,
    Plan,
    canonical_orders,
    label_sizes,
    label_view,
    labels_in_memory,
    placeholder,
    relaid,
    runs_kernels,
)
from teir.runtime.scratch import SCRATCH_LIMIT_BYTES, scratch

# Label orders (in0, in1, result) of the copies; None: that tensor is used as it lies.
Orders = tuple[str | None, str | None, str | None]
# (subscripts, operands, output, last step: the call's accumulate and ReLU apply) -> a plan
# that never falls back itself, or the same call run.
PlanStep = Callable[[str, list[np.ndarray], np.ndarray, bool], Plan]
RunStep = Callable[[str, list[np.ndarray], np.ndarray, bool], None]


def _own_labels(plan: Plan, inputs: list[Operand]) -> list[str]:
    """Each tensor's labels as it lies (in0, in1, result)."""
    return ["".join(op.labels) for op in inputs] + ["".join(plan.subscripts.output)]


def terms(orders: Orders, own: list[str]) -> tuple[list[str], dict[str, str]]:
    """The contraction's terms (in0, in1, out) in letters, each tensor in its copy's order or,
    when it is not copied, in its own; and the letter of every label ('...' dimensions have
    digit labels, which einsum strings do not take)."""
    labels = [order if order is not None else mine for order, mine in zip(orders, own)]
    letters: dict[str, str] = {}
    for label in "".join(labels):
        letters.setdefault(label, LETTERS[len(letters)])
    return ["".join(letters[x] for x in term) for term in labels], letters


def operand_view(prepared: Operand, sizes: dict[str, int]) -> np.ndarray:
    """An operand as an array over its labels (broadcast dimensions at their full size)."""
    return np.broadcast_to(label_view(prepared), [sizes[x] for x in prepared.labels])


def _shape(plan: Plan) -> KernelShape:
    assert plan.config is not None and plan.operation is not None
    return kernel_shape(plan.config, plan.operation.nest.main)


def fits(plan: Plan) -> bool:
    """Whether ``plan`` runs kernels (not the generic primitive) on the operands as given."""
    return plan.canonical is None and runs_kernels(plan)


def copied_bytes(plan: Plan, inputs: list[Operand], orders: Orders) -> int:
    """Bytes of the copies ``orders`` makes (inputs and result)."""
    sizes = label_sizes(inputs, plan.subscripts.output)
    elements = sum(prod(sizes[x] for x in order) for order in orders if order is not None)
    return elements * plan.dtype.itemsize


# Copies made for another kernel are paid for by this many FLOPs per element copied (the
# contraction's RELAYOUT_FLOPS_PER_ELEMENT per input element decides that they are
# considered at all). A result copied for the plain outer-product kernel pays at 112-128
# FLOPs per element (FP32 gc,ca->ag 3200 x 400 x 56: 1.07 -> 0.80 ms, ea,be->ab alike);
# at 24 it costs more than the kernel gains (FP32 fhg,hda->fadg, K 12, its 15.5 MB result
# copied: 0.88 -> 1.15 ms).
RELAYOUT_FLOPS_PER_COPIED = 64


def relayout_affordable(
    plan: Plan, inputs: list[Operand], orders: Orders, out: np.ndarray | None
) -> bool:
    """Whether the copies ``orders`` makes for another kernel (``relayout`` in ``choose``) fit
    the scratch buffer, a chunk at a time where ``run`` makes them so (``scratch_bytes``;
    ``out``: the call's), and are paid for: the contraction does at least
    ``RELAYOUT_FLOPS_PER_COPIED`` FLOPs per element copied, the result's included."""
    assert plan.operation is not None
    elements = copied_bytes(plan, inputs, orders) // plan.dtype.itemsize
    flops = plan.operation.config.flops
    fits = scratch_bytes(plan, inputs, orders, out) <= SCRATCH_LIMIT_BYTES
    heavy = flops >= RELAYOUT_FLOPS_PER_TEMPORARY * elements
    return (fits or heavy) and flops >= RELAYOUT_FLOPS_PER_COPIED * elements


# Copies beyond the scratch buffer's size that no chunking makes smaller go into a buffer of
# their own, allocated for the call (its pages faulted in on first touch, about a
# nanosecond per element) and freed after it: only for contractions that spend this many
# FLOPs per element copied. The last step of GETD as one einsum, FP64 (every label of its
# 78 MB result missing from one input, so no chunk avoids rereading 8-200 MB): 0.52 s in
# the mirror form on the tensors as they lie (A's rows 200 KB apart), 0.21 s with the
# result computed in the outer-product kernel's order and permuted; mk,kn->nm 4096² x 1024
# FP64 226 -> 220 ms, bhqk,bhkd->bhdq 8 x 16 x 512² x 64 FP32 14.8 -> 13.7 ms.
RELAYOUT_FLOPS_PER_TEMPORARY = 1024


def scratch_bytes(plan: Plan, inputs: list[Operand], orders: Orders, out: np.ndarray | None) -> int:
    """Bytes of the scratch buffers ``run`` takes for the copies ``orders`` makes: one chunk's
    where it makes them a chunk at a time (``chunking``), all of them otherwise."""
    sizes = label_sizes(inputs, plan.subscripts.output)
    target = _uncopied_target(plan, out)
    label, chunk = ("", 1) if target is None else _chunk(plan, inputs, orders, target, sizes)
    elements = sum(prod(_copy_shape(order, sizes, label, chunk)) for order in orders if order)
    return elements * plan.dtype.itemsize


def _chunk(
    plan: Plan, inputs: list[Operand], orders: Orders, result: np.ndarray, sizes: dict[str, int]
) -> tuple[str, int]:
    """(label, chunk size) ``run`` copies ``orders`` in, writing ``result``: ("", 1) whole."""
    views = [operand_view(prepared, sizes) for prepared in inputs]
    return chunking(orders, _own_labels(plan, inputs), [*views, result], sizes) or ("", 1)


def _copy_shape(order: str, sizes: dict[str, int], label: str, count: int) -> tuple[int, ...]:
    """The shape of a copy in ``order`` holding ``count`` of ``label`` (all of the others)."""
    return tuple(count if x == label else sizes[x] for x in order)


def _uncopied_target(plan: Plan, out: np.ndarray | None) -> np.ndarray | None:
    """Where a result that is not copied is written: ``out``, or a stand-in for a new
    result; None where it cannot be (an out with negative strides)."""
    if out is None:
        strides = new_strides(plan.out_shape, 1, plan.memory_order)
        stand_in: np.ndarray = placeholder(plan.out_shape, strides, plan.dtype)
        return stand_in
    return out if all(s >= 0 for s in out.strides) else None


def _contraction(
    plan: Plan,
    inputs: list[Operand],
    orders: Orders,
    target: np.ndarray | None,
    plan_step: PlanStep,
) -> Plan | None:
    """The plan of the contraction on the copies ``orders`` makes (None: its result would
    go where it cannot, see ``_uncopied_target``)."""
    sizes = label_sizes(inputs, plan.subscripts.output)
    letters, _ = terms(orders, _own_labels(plan, inputs))
    subscripts = f"{letters[0]},{letters[1]}->{letters[2]}"
    arrays = [
        operand_view(op, sizes)
        if order is None
        else placeholder([sizes[x] for x in order], None, plan.dtype)
        for op, order in zip(inputs, orders[:2])
    ]
    if orders[2] is not None:
        copy = placeholder([sizes[x] for x in orders[2]], None, plan.dtype)
        return plan_step(subscripts, arrays, copy, False)
    return None if target is None else plan_step(subscripts, arrays, target, True)


def copies_planned(
    plan: Plan, inputs: list[Operand], out: np.ndarray | None, plan_step: PlanStep, orders: Orders
) -> Plan | None:
    """The plan of the contraction on the copies ``orders`` makes, chosen elsewhere
    (``element_layout``); None where its result cannot be written in place."""
    return _contraction(plan, inputs, orders, _uncopied_target(plan, out), plan_step)


def choose(
    plan: Plan,
    inputs: list[Operand],
    out: np.ndarray | None,
    plan_step: PlanStep,
    relayout: bool = False,
    copy_result: bool = True,
    accept: Callable[[Orders, Plan], bool] | None = None,
) -> tuple[Orders, Plan]:
    """Which tensors to copy (``plan.canonical`` holds the orders of copying all three), and
    the plan of the contraction that then runs. ``relayout``: the copies are for an
    outer-product kernel on plain layouts closer to the plain one than ``plan``'s
    (``einsum_plan.relayout_pays``, ``relaid``), within the scratch buffer; ``plan_step``
    then plans the steps as they lie (a step that would ask for copies of its own is no
    candidate otherwise).
    ``copy_result``: copies of the result may be chosen; without, only those of inputs are
    tried (and failing them, all three). ``accept``: the caller's own test of a candidate
    (orders, its plan); one it refuses is passed over for the next."""
    assert plan.canonical is not None
    full = plan.canonical
    sizes = label_sizes(inputs, plan.subscripts.output)
    target = _uncopied_target(plan, out)

    def contraction(orders: Orders) -> Plan | None:
        return _contraction(plan, inputs, orders, target, plan_step)

    everything = contraction(full)
    assert everything is not None
    if not fits(everything):
        return full, everything
    bytes_of = [prod(sizes[x] for x in order or "") for order in full]
    subsets = [s for r in (1, 2) for s in combinations(range(3), r) if copy_result or 2 not in s]
    # Each subset is tried in the canonical orders, then in the transposed product's: a
    # result with N's unit stride fits a kernel once in1 has it too (FP64 aecb,eda->acbd
    # with in1 copied N-innermost, the result written in place: 24 -> 11 ms).
    # The tensors left in place may have their tile rows far apart (each row a TLB entry
    # and a prefetch stream of the kernel's): copying the larger tensor instead costs more.
    # Random binary einsums whose choice changed (2 threads, alternating, same
    # process), where rows were kept within 64 KiB before: FP32 12 of 150 changed, geometric
    # mean 1.47x faster (fdgh,dhbg->dfb 48x16x50x100x14 2.1 -> 0.74 ms with in1 copied
    # instead of its three times larger in0; gea,fag->ef 3.3x), two slower (0.86x, 0.96x);
    # another 13 of 150, 1.23x, three slower (0.68x, 0.93x, 0.98x); FP64 13 of 150, 1.46x
    # (dfga,hagc->fdcah 15.4 -> 3.9 ms), three slower (0.70x, 0.88x, 0.99x).
    # cabe,abde->cdba (16x3x40x600, 8, FP64), the case the limit was set for, now runs in
    # 1.07 ms copying in0 and 0.33 ms reading it in place.
    mirrored = canonical_orders(inputs, plan.out_memory, mirrored=True)
    # A single input copied also takes the summed labels in the order the other one lies, so
    # that the kernel reads that one's K as it lies (FP32 ebdf,cafeb->dca, in1 84 MB: in1
    # copied 9.4 ms, in0 copied as dfeb 2.5 ms).
    beside: dict[tuple[int, ...], list[Orders]] = {
        (i,): [
            canonical_orders(
                inputs, plan.out_memory, flip, labels_in_memory(o.labels, o.strides, sizes)
            )
            for flip in (False, True)
        ]
        for i, o in ((0, inputs[1]), (1, inputs[0]))
    }
    whole = _shape(everything)
    assert plan.operation is not None
    flops = float(plan.operation.config.flops)
    all_bytes = copied_bytes(plan, inputs, full)
    result_bytes = prod(sizes[x] for x in plan.subscripts.output) * plan.dtype.itemsize
    tried: set[Orders] = set()
    for subset in sorted(subsets, key=lambda s: sum(bytes_of[i] for i in s)):
        for chosen in (full, mirrored, *beside.get(subset, [])):
            orders = (
                chosen[0] if 0 in subset else None,
                chosen[1] if 1 in subset else None,
                chosen[2] if 2 in subset else None,
            )
            if orders in tried:
                continue
            tried.add(orders)
            product = contraction(orders)
            if relayout:
                # the tensors left in place are read as the plan's kernel reads them
                if not relayout_affordable(plan, inputs, orders, out):
                    continue
                if product is None or not fits(product):
                    continue
                if not relaid(plan, product):
                    continue
            elif product is None or not fits(product):
                continue
            # a memory-bound contraction bound by writing its result (left in place), beside
            # copies of a quarter of its size or less, is bound by those bytes, not by how
            # large a tile its kernel computes per call: where the kernel writes its tile of
            # the result as one run, the lanes it fills decide (FP32 abe,cdfe->fadcb, K 2,
            # 10 MB result: the tiny in0 copied for the outer form, tiles of 8 x 22 against
            # 712 x 8 with all three copied: 451 -> 88 us; a tile of columns 300 KB apart,
            # ebda,fa->fbde with in1 copied: 254 -> 2360 us)
            shape = _shape(product)
            copied = copied_bytes(plan, inputs, orders)
            writing = not copy_result and 4 * copied <= result_bytes and _tile_in_one_run(product)
            if (
                (2 * shape.fill >= whole.fill if writing else as_good(shape, whole))
                and costs_no_more(flops, shape, copied, whole, all_bytes)
                and (accept is None or accept(orders, product))
            ):
                return orders, product
    # All three copied: in the orders that keep more of them as they lie, since a copy that
    # keeps a tensor's order moves runs where one that reorders it moves single elements
    # (FP32 ik,kj->ij 1024^3 on stride-2 views: all three transposed 10.5 ms, kept 6.2 ms).
    if _reordered(plan, inputs, sizes, mirrored) < _reordered(plan, inputs, sizes, full):
        product = contraction(mirrored)
        if product is not None and fits(product) and (accept is None or accept(mirrored, product)):
            return mirrored, product
    return full, everything


def _tile_in_one_run(plan: Plan) -> bool:
    """Whether the kernel of ``plan`` writes its tile of the result as one run: the tile
    spans at most twice its elements."""
    config = plan.config
    if config is None:
        return False
    tile = [
        (config.dim_sizes[a], abs(config.strides_out[a]))
        for a in config.prim_axes
        if config.strides_out[a] != 0
    ]
    span = 1 + sum((size - 1) * stride for size, stride in tile)
    return span <= 2 * prod(size for size, _ in tile)


def _reordered(plan: Plan, inputs: list[Operand], sizes: dict[str, int], orders: Orders) -> int:
    """Elements of the tensors whose copies in ``orders`` lay their labels out in another
    order than the tensor's own (input or result, as it lies in memory)."""
    lying = [labels_in_memory(o.labels, o.strides, sizes) for o in inputs]
    lying.append(tuple(plan.out_memory))
    total = 0
    for order, lies in zip(orders, lying):
        if order is not None:
            moving = [x for x in order if sizes[x] > 1]
            if moving != [x for x in lies if sizes[x] > 1]:
                total += prod(sizes[x] for x in order)
    return total


# Copies larger than this are made and consumed a chunk at a time: a chunk's copies are read
# back by the contraction while they are still in the caches instead of from memory, and
# the scratch buffer stays small (FP64 afbec,efdba->cbda with a 180 MB in1: 42 -> 28 ms).
CHUNK_ABOVE_BYTES = 16 << 20
CHUNK_BYTES = 8 << 20
# A chunk must keep the runs it reads and writes in each tensor as it lies at least this long:
# chunks along a label of short stride turn whole rows into scattered pieces of lines
# (FP32 ceab,edab->cbad chunked along b, which has unit stride: 23 -> 37-106 ms).
CHUNK_RUN_BYTES = 1024
# Chunks along a label that one input lacks read that input again for every chunk: only
# when it is at most this large (and the chunks at least CHUNK_LEAST_TILE long, since the
# label is then a tile dimension of the kernels). bik,bkj->ijb FP64 in chunks of i, each
# reading all 33 MB of bkj: 25 -> 34 ms.
CHUNK_REREAD_BYTES = 1 << 20
CHUNK_LEAST_TILE = 16


def chunking(
    orders: Orders, own: list[str], arrays: list[np.ndarray], sizes: dict[str, int]
) -> tuple[str, int] | None:
    """The result label the fallback runs in chunks along, and the chunk size; None when the
    copies are small or no label can be sliced without breaking up rows. ``arrays`` are the
    tensors as they lie (in0, in1, result), over the labels ``own``."""
    itemsize = arrays[0].itemsize
    best: tuple[int, int, str, int] | None = None
    for label in own[2]:
        size = sizes[label]
        sliced = itemsize * sum(
            prod(sizes[x] for x in order) for order in orders if order and label in order
        )
        strides = [
            abs(array.strides[labels.index(label)])
            for array, labels in zip(arrays, own)
            if label in labels and array.strides[labels.index(label)]
        ]
        reread = sum(a.nbytes for a, labels in zip(arrays[:2], own) if label not in labels)
        if sliced <= CHUNK_ABOVE_BYTES or size < 2 or reread > CHUNK_REREAD_BYTES:
            continue
        chunk = -(-size // min(size, -(-sliced // CHUNK_BYTES)))
        if strides:
            chunk = max(chunk, -(-CHUNK_RUN_BYTES // min(strides)))
        if reread:
            chunk = max(chunk, CHUNK_LEAST_TILE)
        if chunk >= size:
            continue
        candidate = (sliced, min(strides, default=0), label, chunk)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    return None if best is None else (best[2], best[3])


def _part(array: np.ndarray, labels: str, label: str, start: int, stop: int) -> np.ndarray:
    """``array`` (over ``labels``) with ``label`` restricted to ``start:stop``."""
    if not label or label not in labels:
        return array
    index: list[slice] = [slice(None)] * array.ndim
    index[labels.index(label)] = slice(start, stop)
    return array[tuple(index)]


def _first(buffer: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The first elements of the contiguous ``buffer`` as an array of ``shape``."""
    if buffer.shape == shape:
        return buffer
    return buffer.reshape(-1)[: prod(shape)].reshape(shape)


def run(
    plan: Plan,
    inputs: list[Operand],
    result: np.ndarray,
    step: RunStep,
    buffers_used: list[np.ndarray] | None = None,
) -> None:
    """Copy, contract and copy back into ``result`` as ``plan.canonical`` says, through
    scratch buffers (appended to ``buffers_used``, for a replay of the steps); where the
    copies are large, a chunk of one result label at a time."""
    assert plan.canonical is not None
    sizes = label_sizes(inputs, plan.subscripts.output)
    orders = plan.canonical
    own = _own_labels(plan, inputs)
    letters, names = terms(orders, own)
    mine = ["".join(names[x] for x in labels) for labels in own]
    views = [operand_view(prepared, sizes) for prepared in inputs]
    label, chunk = _chunk(plan, inputs, orders, result, sizes)
    total = sizes[label] if label else 1

    def shape(index: int, count: int) -> tuple[int, ...]:
        return _copy_shape(orders[index] or "", sizes, label, count)

    copied = [i for i, order in enumerate(orders) if order is not None]
    with scratch([shape(i, chunk) for i in copied], plan.dtype) as buffers:
        if buffers_used is not None:
            buffers_used.extend(buffers)
        buffer_of = dict(zip(copied, buffers))
        for index in copied:  # the inputs the chunks do not slice are copied once
            if index < 2 and not (label and label in own[index]):
                step(f"{mine[index]}->{letters[index]}", [views[index]], buffer_of[index], False)
        for start in range(0, total, chunk):
            count = min(chunk, total - start)
            pieces = {i: _first(buffer_of[i], shape(i, count)) for i in copied}
            operands: list[np.ndarray] = []
            for index in range(2):
                view = _part(views[index], own[index], label, start, start + count)
                if orders[index] is None:
                    operands.append(view)
                    continue
                copy = pieces[index]
                if label and label in own[index]:
                    step(f"{mine[index]}->{letters[index]}", [view], copy, False)
                operands.append(copy)
            contraction = f"{letters[0]},{letters[1]}->{letters[2]}"
            target = _part(result, own[2], label, start, start + count)
            if orders[2] is None:
                step(contraction, operands, target, True)
                continue
            product = pieces[2]
            step(contraction, operands, product, False)
            step(f"{letters[2]}->{mine[2]}", [product], target, True)
