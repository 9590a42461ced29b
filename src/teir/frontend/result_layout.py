"""The memory layout of a new einsum result: NumPy's ``order`` argument.

NumPy's einsum lays a new result out as ``order`` says, "K" by default: as close to the
operands' layout as it can, axes permuted arbitrarily (its ``optimize=True`` path returns
whatever layout its BLAS call produced, as a transposed view). teir's "K" is the layout its
kernels write fastest: the order of the output's labels is chosen among the listed one and
the orders that group them by role (batch C, then M, then N, or any order of the three
groups; each group in its operand's memory order), by the cost model of
:mod:`teir.frontend.plan_cost`, and the result is a view of that array in the listed axis
order. A listed order whose unit stride is a short axis, or lies along neither operand's
unit stride, otherwise forces kernels onto a few vector lanes (``ebda,fa->fbde`` with e 3,
FP32: 1.38 ms as listed, 0.75 ms laid out as ``ebdf``; NumPy 0.42 ms into its own layout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import permutations
from math import prod
from typing import Any, Protocol

from teir.buffers import new_strides
from teir.codegen.target import Target, l3_share
from teir.codegen.transpose import LINE_BYTES
from teir.frontend.einsum_parse import EinsumError

ORDERS = ("C", "F", "A", "K")
# Another layout than the listed one is taken only where the cost model expects it to cost at
# most this fraction of the listed one's: its estimates are coarse. Random binary einsums
# (2 threads, listed against chosen, one process): of 26 relaid at 0.7, the 24 faster
# (1.03-4.7x) had estimated 0.03-0.19 of the listed cost, the two slower (0.92-0.93x) 0.38
# and 0.44.
LAYOUT_GAIN = 0.3
# ... and saves at least this many (FLOP-equivalents, about 1.5 us of two cores): a result laid
# out in another order costs its view's creation on every call, and the estimates of calls of
# a few microseconds are coarsest (a,afch->hcf FP32, 4.5 K elements, 1.3x the time relaid).
LAYOUT_MIN_SAVING = 700_000
# Contractions of fewer elements (operands and result) keep the listed order: their time is
# mostly the call's own. A small result of large operands does not (abg,gbch->hca FP64, its
# 1020 elements summed over 482 K of in1: 0.23 ms as listed, 0.12 ms as the chosen cha).
MIN_ELEMENTS = 4096


class _Operand(Protocol):
    array: Any
    labels: list[str]
    strides: dict[str, int]


def check_order(order: Any) -> None:
    """``order`` is one NumPy's einsum takes."""
    if order not in ORDERS:
        raise EinsumError(f"order must be 'C', 'F', 'A' or 'K', got {order!r}")


def fortran_ordered(arrays: Sequence[Any]) -> bool:
    """Whether every array is F- and not C-contiguous (NumPy's "A" then means "F")."""
    return all(a.flags.f_contiguous and not a.flags.c_contiguous for a in arrays)


def order_strides(
    memory_order: Sequence[int] | None, output: Sequence[str], sizes: dict[str, int]
) -> dict[str, int]:
    """Element strides of the output labels for an array whose axes lie in ``memory_order``
    (outermost first; None: the listed order)."""
    shape = [sizes[label] for label in output]
    return dict(zip(output, new_strides(shape, 1, memory_order)))


def candidate_orders(inputs: Sequence[_Operand], output: Sequence[str]) -> list[tuple[int, ...]]:
    """The listed order first, then the role-grouped orders (without repeats)."""
    first, second = inputs

    def outermost_first(labels: list[str], operand: _Operand) -> list[str]:
        return sorted(labels, key=lambda label: -abs(operand.strides.get(label, 0)))

    batch = [x for x in output if x in first.labels and x in second.labels]
    rows = [x for x in output if x in first.labels and x not in second.labels]
    columns = [x for x in output if x in second.labels and x not in first.labels]
    groups = (
        outermost_first(batch, first),
        outermost_first(rows, first),
        outermost_first(columns, second),
    )
    orders = [tuple(range(len(output)))]
    for arrangement in permutations(groups):
        labels = [label for group in arrangement for label in group]
        candidate = tuple(output.index(label) for label in labels)
        if candidate not in orders:
            orders.append(candidate)
    return orders


def streaming_label(
    inputs: Sequence[_Operand], output: Sequence[str], sizes: dict[str, int]
) -> str | None:
    """For a memory-bound contraction of a large input beside a small one, into a result
    much smaller than the large input: the output label of the large input's unit stride,
    which a new result is then laid out with innermost, so that the kernel streams that
    input along its rows (``heb,h->be`` laid out ``eb``: a vector-matrix product). None
    where there is no such case or label. The cost model prices kernels, not the memory
    traffic that bounds these: it priced ``eb`` at 3.6x the listed order, which ran at 0.43x
    its time."""
    small, large = sorted(inputs, key=lambda op: op.array.size)
    if (
        large.array.nbytes < STREAMING_MIN_BYTES
        or small.array.size * STREAMING_PART > large.array.size
        or prod(sizes[x] for x in output) * STREAMING_PART > large.array.size
    ):
        return None
    flops = 2 * prod(sizes.values())
    elements = sum(op.array.size for op in inputs) + prod(sizes[x] for x in output)
    if flops >= STREAMING_INTENSITY * elements:
        return None
    unit = _unit_label(large, sizes)
    if unit is None or unit not in output:
        return None
    # (a run shorter than a line streams nothing: cd,adgecf->acefg with f 3, FP64, 1.8x)
    return unit if sizes[unit] * large.array.itemsize >= LINE_BYTES else None


def memory_order(labels: Sequence[str], strides: dict[str, int], sizes: dict[str, int]) -> str:
    """``labels`` ordered as they lie in memory, outermost first (size-1 and broadcast
    labels, stride 0, outermost)."""
    moving = [x for x in labels if sizes[x] > 1 and strides.get(x, 0) != 0]
    still = [x for x in labels if x not in moving]
    return "".join(still + sorted(moving, key=lambda x: -abs(strides[x])))


def _unit_label(operand: _Operand, sizes: dict[str, int]) -> str | None:
    """The label of the operand's unit stride (of size 2 or more), if any."""
    unit = [x for x in operand.labels if abs(operand.strides.get(x, 0)) == 1 and sizes[x] > 1]
    return unit[0] if unit else None


def _large_input_order(
    inputs: Sequence[_Operand], output: Sequence[str], sizes: dict[str, int]
) -> tuple[int, ...] | None:
    """For an elementwise product (no label summed) whose larger input has every label of
    the output and at least ``FOLLOW_MIN_BYTES``: the output's axes in that input's memory
    order, as NumPy's order "K" lays them out. Memory bounds such products, and a result in
    another order is written transposed: FP32 on 2 cores, ag,g->ga 640 x 12288 1.9 ms
    transposed, 1.2 ms in the input's order; cgbha,h->acbgh FP64 26 MB laid out for a kernel
    the cost model priced by its FLOPs, 12.5 ms against 1.3. A product that sums a few
    elements is decided by :func:`_few_summed_order`. None where there is no such product
    (the cost model decides)."""
    large = max(inputs, key=lambda op: op.array.size)
    summed = {label for op in inputs for label in op.labels if label not in output}
    if summed:
        return _few_summed_order(large, summed, output, sizes)
    if large.array.nbytes < FOLLOW_MIN_BYTES:
        return None
    if any(label not in large.labels for label in output if sizes[label] > 1):
        return None
    # the product in that order runs along the input's unit stride: a short one fills few
    # lanes (edhgb,ge->bdhge with b 2, FP32 12 MB: 0.49-0.68 ms as listed, 0.74 ms so), which
    # matters less than reading the input in order once it outgrows half this process's L3
    # share: 26 random products of 7-61 MB into out views, unit labels of 4-31 elements, one
    # thread, 24 ran 1.1-17x faster in the input's order (FP32 bc,ebadc->bdcae 17 MB 12.5 ->
    # 0.74 ms, FP64 b,cdab->cbad 26 MB 5.8 -> 1.2), the two slower ones (0.44x, 0.62x) with
    # the other input gathered along the unit label and as large (excluded below); of
    # 0.2-5 MB, 13 of 27 ran slower (0.33-0.97x, ones of 0.02-0.34 ms)
    unit = _unit_label(large, sizes)
    if unit is None:
        return None
    short = sizes[unit] < 2 * Target.host().lanes(large.array.itemsize)
    if short and (sizes[unit] < SHORT_UNIT_LEAST or 2 * large.array.nbytes <= l3_share()):
        return None
    # ... and reads the other input along it: one that steps further is gathered, unless
    # it is small (gaecb,cbga->bcega FP32, in1 1/6 of in0: 0.13 ms listed, 0.37 ms so)
    other = inputs[1] if large is inputs[0] else inputs[0]
    gathered = abs(other.strides.get(unit, 0)) > 1
    if gathered and other.array.size * STREAMING_PART > large.array.size:
        return None
    labels = sorted(output, key=lambda label: -abs(large.strides.get(label, 0)))
    return tuple(output.index(label) for label in labels)


def _few_summed_order(
    large: _Operand, summed: set[str], output: Sequence[str], sizes: dict[str, int]
) -> tuple[int, ...] | None:
    """A product that sums only a few elements (``FEW_SUMMED``) per result element, all of
    them in its larger input, which has every output label and outgrows half this process's
    L3 share: the output's axes in that input's memory order, as for an elementwise product.
    Memory bounds it; listed in another order, the input is read across its rows, a page or
    more apart, on every step of the output's unit stride (FP64 dacb,b->cda, 100 MB: 17.4 ms
    as listed, 6.9 ms laid out dac; NumPy 4.0 ms into its own layout). 17 random such
    products of 8-160 MB, 2 threads, alternating processes: 2.9x by geometric mean (FP32
    dabc,b->cda 40.5 -> 1.1 ms), slowest bacde,eac->cbd FP64 0.80x and ceabd,ba->ecd FP32
    0.77x (now left as listed, below). None otherwise."""
    if prod(sizes[label] for label in summed) > FEW_SUMMED or not summed <= set(large.labels):
        return None
    if 2 * large.array.nbytes <= l3_share():
        return None
    if any(label not in large.labels for label in output if sizes[label] > 1):
        return None
    # (a listed order that runs along the input's unit stride already streams it:
    # ceabd,ba->ecd FP32 0.70 ms as listed, 0.90 ms laid out ced)
    if _unit_label(large, sizes) == output[-1]:
        return None
    labels = sorted(output, key=lambda label: -abs(large.strides.get(label, 0)))
    return tuple(output.index(label) for label in labels)


# ... and where that input's unit-stride label is shorter than two vectors, from this many
# elements of it on (and beyond half the L3 share)
SHORT_UNIT_LEAST = 4
# An elementwise product's new result follows its larger input's order from this size on:
# below it a result in another order costs more to create per call than its layout saves.
FOLLOW_MIN_BYTES = 256 << 10
# A product summing at most this many elements per result element, all in its larger input,
# follows that input's order beyond half the L3 share (_few_summed_order).
FEW_SUMMED = 8

# The streaming layout is taken for a large input of at least STREAMING_MIN_BYTES beside one
# of at most 1 / STREAMING_PART of its elements, a result of at most as many, and fewer than
# STREAMING_INTENSITY FLOPs per element moved.
STREAMING_MIN_BYTES = 1 << 20
STREAMING_PART = 16
STREAMING_INTENSITY = 8


def result_order(
    order: str | tuple[int, ...],
    inputs: Sequence[_Operand],
    output: Sequence[str],
    sizes: dict[str, int],
    price: Callable[[dict[str, int]], tuple[float, bool]],
) -> tuple[int, ...] | None:
    """The memory order of a new result's axes (None: the listed, C order). ``price`` gives
    the expected cost of the contraction writing an output of the given label strides, and
    whether a kernel runs it as the tensors lie (else it runs on copies or the generic
    primitive, and is priced so). ``order`` may also name the memory order itself (the
    output's axes, outermost first)."""
    if isinstance(order, tuple):
        return None if order == tuple(range(len(output))) else order
    if order == "C" or len(output) < 2:
        return None
    reverse = tuple(reversed(range(len(output))))
    if order == "F":
        return reverse
    if order == "A":
        return reverse if fortran_ordered([op.array for op in inputs]) else None
    if len(inputs) != 2:
        return None
    terms = [*(op.labels for op in inputs), output]
    if sum(prod(sizes[x] for x in labels) for labels in terms) < MIN_ELEMENTS:
        return None
    listed, *others = candidate_orders(inputs, output)
    if not others:
        return None
    streaming = streaming_label(inputs, output, sizes)
    if streaming is not None:
        # only orders with that label innermost compete; the cheapest where the listed
        # one has another
        others = [o for o in others if output[o[-1]] == streaming]
        if output[listed[-1]] != streaming and others:
            return min(others, key=lambda o: price(order_strides(o, output, sizes))[0])
        if not others:
            return None
    follow = _large_input_order(inputs, output, sizes)
    if follow is not None:
        return None if follow == listed else follow
    listed_cost, listed_fits = price(order_strides(listed, output, sizes))
    costs = [(price(order_strides(o, output, sizes))[0], o) for o in others]
    cost, best = min(costs)
    # a listed order that no kernel fits runs on copies (or the generic primitive): as
    # coarse an estimate as any other's, so the cheapest wins (FP32 dfbac,efd->edabc,
    # in0 28 MB: 10.5 ms copying in0 for the listed order, 2.8 ms laid out edbac)
    gain = LAYOUT_GAIN if listed_fits else 1.0
    pays = cost <= gain * listed_cost and listed_cost - cost >= LAYOUT_MIN_SAVING
    return best if pays else None


def streaming_order(
    inputs: Sequence[_Operand], output: Sequence[str], sizes: dict[str, int]
) -> str | None:
    """The output's labels in the order a ``streaming_label`` contraction writes fastest: as
    its large input lies (labels it lacks, or that do not move in it, outermost), that
    label innermost; None where there is no such label."""
    label = streaming_label(inputs, output, sizes)
    if label is None:
        return None
    large = max(inputs, key=lambda op: op.array.size)
    lying = memory_order(output, large.strides, sizes)
    return lying if lying[-1] == label else None


__all__ = [
    "ORDERS",
    "candidate_orders",
    "check_order",
    "fortran_ordered",
    "memory_order",
    "order_strides",
    "result_order",
    "streaming_label",
    "streaming_order",
]
