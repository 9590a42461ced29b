"""Elementwise products whose three tensors each have their unit stride on another label:
one input copied into the result's layout (or the other input's).

A binary einsum that sums no label (``bac,bca->cab``) runs as a nest of one-element
kernels whose loops serve two tensors' unit strides: the larger input's next elements
innermost, the output's next outside them (``optimizer.schedule._element_order``). Where
the other input is large too and has its unit stride on a third label, the nest reads one
of its lines per element, and beyond the caches reads every line again for each of its
elements: FP32 ``bac,bca->cab`` (a 1089, b 108, c 360, 169 MB a tensor) took 168 ms.
With that input copied into the other's layout (Copy kernels, the copying fallback's
steps, a chunk at a time), the nest serves all three: 66 ms.

Results within the caches keep their one nest: its lines are still there when it reads
them again (FP64 ``adbc,acdb->cdba``, 6 MB a tensor, 0.46 ms as it lies).

Where the other input has every label of the result, the copy takes the result's layout
instead: the product then writes that input transposed, scaled along the result's rows by
the copy, on the transposing kernel (``teir.lower.products``). 16 three-way products of
10-200 MB into an ``out`` (2 threads, alternating processes, against copies into the other
input's layout): 0.78x the time by geometric mean, ``bac,cba->cab`` FP32 111 MB 48 -> 23
ms, ``cbda,bcad->acdb`` FP64 37 MB 13.5 -> 6.6 ms, none slower beyond 1.05x.

Small inputs of a large result (outer and broadcast products, whatever kernel runs them) are
copied into the result's layout where they lie a stride apart along its unit-stride label
(:func:`small_copies`): the copy costs an eighth of the result's traffic at most, and the
product then reads them along its rows (2 threads, FP32 ``bc,ca->bac`` 1.4 -> 4.0 GFLOP/s,
``cb,a->bac`` 3.7 -> 13.5, FP64 ``ac,ab->bca`` 1.5 -> 4.0; NumPy 3.2-4.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from teir.frontend.copy_fallback import Orders
from teir.frontend.result_layout import memory_order

# The input copied must have at least this many bytes. Three-way products, 2 threads,
# alternating processes, as they lie -> one input copied: 20-340 MB a tensor 0.39-0.88x the
# time (FP32 abcd,dabc->cdab 16 MB 8.2 -> 3.4 ms); at 8 MB 0.43x to 1.33x, at 4 MB 0.97x.
MIN_COPY_BYTES = 16 << 20
# Tensors with fewer elements than this fraction of the largest are read in whatever layout
# they have: they stay in the caches while the nest sweeps the large ones.
LARGE_SHARE = 1 / 8
# Inputs of at most this fraction of the result's elements, strided along its unit-stride
# label, are copied into its layout where it has at least MIN_SMALL_COPY_RESULT elements.
SMALL_SHARE = 1 / 8
MIN_SMALL_COPY_RESULT = 1 << 16


def _elements_in_memory(
    tensors: Sequence[tuple[Sequence[str], dict[str, int]]], sizes: dict[str, int]
) -> list[int]:
    """Each tensor's elements in memory: a broadcast label (stride 0) adds none."""
    return [prod(sizes[x] for x in labels if strides.get(x, 0) != 0) for labels, strides in tensors]


def copy_orders(
    tensors: Sequence[tuple[Sequence[str], dict[str, int]]],
    sizes: dict[str, int],
    itemsize: int,
) -> Orders | None:
    """The copy for an elementwise product of in0, in1 and the result, each given as
    (labels, element strides): the smaller input (in1 on ties) into the result's layout
    (the other input's where that one lacks a label of the result), where all three are
    large and their unit strides lie on three labels; else None."""
    assert len(tensors) == 3
    elements = _elements_in_memory(tensors, sizes)
    orders = [memory_order(labels, strides, sizes) for labels, strides in tensors]
    if min(elements) < 2 or min(elements) < LARGE_SHARE * max(elements):
        return None
    if len({order[-1] for order in orders}) < 3:
        return None
    copied = 0 if elements[0] < elements[1] else 1
    if elements[copied] * itemsize < MIN_COPY_BYTES:
        return None
    kept, result = tensors[1 - copied], tensors[2]
    if all(x in kept[0] for x in result[0] if sizes[x] > 1):
        # the other input has every label of the result: the copy takes the result's
        # layout, and the product's tiles run on the transposing kernel (other^T scaled by
        # the copy along the result's rows: teir.lower.products)
        layout = orders[2]
    else:
        layout = orders[1 - copied]
    mine = orders[copied]
    inside = sorted((x for x in mine if x in layout), key=layout.index)
    found: list[str | None] = [None, None, None]
    found[copied] = "".join([x for x in mine if x not in layout] + inside)
    return found[0], found[1], found[2]


def small_copies(
    tensors: Sequence[tuple[Sequence[str], dict[str, int]]], sizes: dict[str, int]
) -> Orders | None:
    """Copies of the small inputs (at most SMALL_SHARE of the result's elements) that run
    along the result's unit-stride label a stride apart, into the result's layout; None
    where there are none. The nest's innermost loop runs along that label, and reads such
    an input an element per line there, its copy a vector at a time (outer and broadcast
    products: FP32 bc,ca->bac, a 1024, b 62, c 256, 2 threads: 24 -> 8 ms)."""
    assert len(tensors) == 3
    elements = _elements_in_memory(tensors, sizes)
    if elements[2] < MIN_SMALL_COPY_RESULT:
        return None
    result = memory_order(*tensors[2], sizes)
    unit = result[-1:]
    found: list[str | None] = [None, None, None]
    for index, (labels, strides) in enumerate(tensors[:2]):
        strided = unit in labels and abs(strides.get(unit, 0)) > 1
        if unit and strided and elements[index] <= SMALL_SHARE * elements[2]:
            found[index] = "".join(x for x in result if x in labels)
    return None if found == [None, None, None] else (found[0], found[1], found[2])


__all__ = [
    "LARGE_SHARE",
    "MIN_COPY_BYTES",
    "MIN_SMALL_COPY_RESULT",
    "SMALL_SHARE",
    "Orders",
    "copy_orders",
    "memory_order",
    "small_copies",
]
