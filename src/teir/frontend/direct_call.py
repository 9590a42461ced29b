"""The per-call path of a cached einsum plan that runs on its operands where they lie.

Such a plan needs nothing from a call but the data addresses: the cache key already fixes
every shape and stride. What a key does not fix is checked here (each operand's dtype, that
out is writable and of the result's dtype, that out does not overlap an input); anything else
goes back to the full path, which raises the error or makes the copies. This path takes about
2 us where the full one took 7 (a 64^3 GEMM's kernels take 4).

An operand that the plan sums over a label of its own first (``ii``, ``ij->``) is summed here
with NumPy, as the full path does, and the plan runs on the sum (``ij->`` on 16x16: 22 us
through the full path, 11 here).

A plan of one operation and no such sums also gets a checked call
(:mod:`teir.runtime.checked_call`), which checks every shape, stride, dtype, writability and
overlap in native code: ``einsum`` tries it first, before building its cache key (0.3 us in
all, against 2.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from teir.buffers import new_result, new_strides
from teir.frontend.einsum_parse import numpy_subscripts
from teir.frontend.einsum_plan import Operand, Plan, operand, sum_out
from teir.kernels.arrays import data_address, overlaps
from teir.runtime.checked_call import DONE, FALLBACK, ArrayLayout, CheckedCall, checked_call

# Results up to this size are allocated with np.empty (16-byte aligned) on the checked path:
# only large outputs gain from 64-byte alignment (streaming stores), and aligning costs 1 us.
SMALL_RESULT_BYTES = 1 << 18


@dataclass(frozen=True)
class DirectCall:
    """A plan run on the operands' and out's addresses, for the shapes and strides of its key."""

    plan: Plan
    dtype: np.dtype[Any]
    spans: tuple[tuple[int, int], ...]
    out_span: tuple[int, int]
    # plan.run, or its one operation's run_addresses where there is nothing to offset
    run: Callable[[int, int, int], None]
    checked: CheckedCall | None = None
    aligned: bool = False  # new results 64-byte aligned (else np.empty, on the checked path)
    # Operands first summed over labels with NumPy: (index, the operand's labels, sizes and
    # element strides as planned, the labels summed); the plan runs on the sums. (Not the
    # planned Operand itself: the cache would keep its array alive.)
    reduced: tuple[tuple[int, list[str], dict[str, int], dict[str, int], list[str]], ...] = ()
    # A unary plan that only sums and copies: NumPy's einsum sums straight into the result
    # (``ba->a`` FP32 264 x 201: 18 us through the sum and a copy, NumPy alone 7.5).
    numpy_sum: str | None = None

    def new_result(self) -> np.ndarray:
        """A result for a call without out, laid out as planned."""
        return new_result(self.plan.out_shape, self.dtype, self.plan.memory_order, self.aligned)

    def fast(self, operands: tuple[np.ndarray, ...], out: np.ndarray | None) -> Any:
        """The result through the checked call, or None where it fell back (any array not
        exactly of the planned layout and dtype, out read-only or overlapping an input)."""
        checked = self.checked
        if checked is None:
            return None
        target = self.new_result() if out is None else out
        code = checked.call(*operands, target)
        if code != DONE:
            if code == FALLBACK:
                return None
            checked.finish(code, *operands, target)
        return target[()] if out is None and target.ndim == 0 else target

    def __call__(self, operands: tuple[np.ndarray, ...], out: np.ndarray | None) -> Any:
        """The result (a new array, or ``out``), or None where the full path must run."""
        dtype = self.dtype
        first, last = operands[0], operands[-1]
        for array in (first, last) if out is None else (first, last, out):
            if (array.dtype is not dtype and array.dtype != dtype) or not array.flags.aligned:
                return None
        address = data_address(first)
        other = data_address(last) if len(operands) == 2 else 0
        if out is None:
            result = self.new_result()
            out_address = data_address(result)
        else:
            if not out.flags.writeable:
                return None
            out_address = data_address(out)
            out_start = out_address + self.out_span[0]
            for input_address, (offset, count) in zip((address, other), self.spans):
                if overlaps(out_start, self.out_span[1], input_address + offset, count):
                    return None  # computed into a temporary by the full path
            result = out
        if self.numpy_sum is not None:
            # not einsum(out=result): iterating in the result's order instead of the
            # operand's costs NumPy up to 7x (adecb->bcd FP32 10x5x6x7x13: 50 us, 7.5 us)
            np.copyto(result, np.einsum(self.numpy_sum, first))
            return result[()] if out is None and result.ndim == 0 else result
        sums = []  # kept until the run has read them
        for index, labels, sizes, strides, summed in self.reduced:
            sums.append(sum_out(Operand(operands[index], labels, sizes, strides), summed).array)
            if index == 0:
                address = data_address(sums[-1])
            else:
                other = data_address(sums[-1])
        self.run(address, other, out_address)
        if out is None:
            return result[()] if result.ndim == 0 else result
        return out


def direct_call(
    plan: Plan,
    inputs: list[Operand],
    arrays: list[np.ndarray],
    out: np.ndarray | None,
    accumulate: bool,
    relu: bool = False,
) -> DirectCall | None:
    """The direct path for calls that hit ``plan``'s cache entry (made for ``arrays``, as
    ``inputs`` once prepared, and ``out``), or None where calls need more than addresses and
    NumPy sums: copies, a split reduction, an empty result, a unary plan accumulating, an
    output with negative or zero strides (a temporary, or an error)."""
    if plan.canonical is not None or plan.empty or plan.split is not None:
        return None
    reductions = plan.reductions or [[]] * len(arrays)
    # the operands as prepared before their sums (``inputs`` holds the sums)
    prepared = [
        operand(a, plan.subscripts.inputs[index], index) if labels else op
        for index, (a, op, labels) in enumerate(zip(arrays, inputs, reductions))
    ]
    if any(op.array is not a for op, a in zip(prepared, arrays)):  # copied when prepared
        return None
    if accumulate and len(arrays) == 1:
        return None
    if not (plan.regions or plan.lanes) or any(a.dtype != plan.dtype for a in arrays):
        return None
    if out is not None:
        repeats = any(n > 1 and s <= 0 for n, s in zip(out.shape, out.strides))
        if repeats or out.shape != plan.out_shape:
            return None
    layouts = [ArrayLayout(a.shape, a.strides) for a in arrays]
    itemsize = plan.dtype.itemsize
    run = plan.run
    checked = None
    reduced = tuple(
        (index, op.labels, op.sizes, op.strides, list(labels))
        for index, (op, labels) in enumerate(zip(prepared, reductions))
        if labels
    )
    if len(plan.regions) == 1 and plan.regions[0].offsets == (0, 0, 0):
        operation = plan.regions[0].operation
        run = operation.run_addresses
        if out is None:
            strides = new_strides(plan.out_shape, plan.dtype.itemsize, plan.memory_order)
            result = ArrayLayout(plan.out_shape, strides, True)
        else:
            result = ArrayLayout(out.shape, out.strides, True)
        # the native call runs the operation on its arguments: never on unsummed operands
        checked = None if reduced else checked_call(operation, [*layouts, result])
    numpy_sum = None
    if len(arrays) == 1 and reduced and not relu:
        numpy_sum = numpy_subscripts(plan.subscripts.inputs, plan.subscripts.output)
    return DirectCall(
        plan,
        plan.dtype,
        tuple(layout.span(itemsize) for layout in layouts),
        (0, 0) if out is None else ArrayLayout(out.shape, out.strides).span(itemsize),
        run,
        checked,
        math.prod(plan.out_shape) * plan.dtype.itemsize > SMALL_RESULT_BYTES,
        reduced,
        numpy_sum,
    )
