"""Planning an einsum of one or two operands: labels to TEIR axes, an optimized configuration,
and the steps that run it on the operands' memory.

Operands are used where they lie: any non-negative strides (views included), repeated labels
as diagonals (one axis whose stride is the sum), size-1 dimensions broadcast (stride 0). Copies
are made only where documented: an operand with negative strides or strides that are not a
whole number of elements is copied to a contiguous array; a label that appears in one input
only (and not in the output) is summed out of that input with NumPy first; a unary einsum that
sums labels away reduces with NumPy before its permutation runs on a Copy kernel; an output
that overlaps an input is computed into a temporary and copied back. Where no kernel layout
fits, a batch label of unit stride in all three tensors runs as the vector lanes of a
lane-batched contraction (:mod:`teir.frontend.lane_plan`); otherwise the operands are copied
into layouts that fit (:mod:`teir.frontend.copy_fallback`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from teir.codegen.brgemm import Blocking, choose_blocking
from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target
from teir.codegen.transpose import LINE_BYTES
from teir.frontend.copy_choice import kernel_fill
from teir.frontend.einsum_parse import EinsumError, Subscripts, numpy_subscripts
from teir.frontend.lane_plan import lane_spec
from teir.frontend.plan_cost import einsum_cost
from teir.frontend.result_layout import order_strides, result_order
from teir.frontend.split_reduction import SplitReduction
from teir.frontend.staged_region import Stage, stage_region
from teir.ir import Config, DataType, DimType
from teir.kernels.arrays import data_address
from teir.lower.nest import lower
from teir.lower.tiles import TileOp
from teir.optimizer import optimize_with_log
from teir.optimizer.partial import THREAD_SPLIT_IDLE, split_regions, thread_split_axes
from teir.optimizer.problem import problem_from
from teir.runtime.lane_operation import LaneOperation, compile_lanes
from teir.runtime.operation import Operation
from teir.runtime.operation import compile as compile_config
from teir.runtime.pool import default_threads

if TYPE_CHECKING:  # batch_diagonal and batch_fold build on this module
    from teir.frontend.batch_diagonal import Diagonal
    from teir.frontend.batch_fold import Fold


@dataclass
class Operand:
    """One input as labels with a size and an element stride each (after diagonals)."""

    array: np.ndarray
    labels: list[str]
    sizes: dict[str, int]
    strides: dict[str, int]


def label_view(op: Operand) -> np.ndarray:
    """``op`` as a read-only array over its labels, one axis each (a repeated label's
    diagonal as one axis; a size-1 dimension as it is)."""
    itemsize = op.array.itemsize
    return np.lib.stride_tricks.as_strided(
        op.array,
        shape=[op.sizes[x] for x in op.labels],
        strides=[op.strides[x] * itemsize for x in op.labels],
        writeable=False,
    )


def element_strides(array: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """``array`` (copied when a stride is negative or not a whole number of elements) and its
    element strides; a dimension of size 1 gets stride 0 (its stride means nothing)."""
    itemsize = array.itemsize
    if any(n > 1 and (s < 0 or s % itemsize) for n, s in zip(array.shape, array.strides)):
        array = np.ascontiguousarray(array)
    return array, [s // itemsize if n > 1 else 0 for n, s in zip(array.shape, array.strides)]


def operand(array: np.ndarray, labels: tuple[str, ...], index: int) -> Operand:
    array, strides = element_strides(array)
    sizes: dict[str, int] = {}
    merged: dict[str, int] = {}
    order: list[str] = []
    for label, size, stride in zip(labels, array.shape, strides):
        if label in sizes:
            if sizes[label] != size:
                raise EinsumError(
                    f"operand {index}: the repeated subscript {label!r} spans "
                    f"dimensions of different sizes ({sizes[label]} != {size})"
                )
            merged[label] += stride  # a diagonal: one index moves along both dimensions
        else:
            sizes[label] = size
            merged[label] = stride
            order.append(label)
    return Operand(array, order, sizes, merged)


def placeholder(shape: Sequence[int], strides: Sequence[int] | None, dtype: Any) -> Any:
    """An array of this shape and these element strides (C order when None) whose memory is
    never read: planning looks at shapes and strides only."""
    dtype = np.dtype(dtype)
    if strides is None:
        strides, step = [], 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= size
    return np.lib.stride_tricks.as_strided(
        np.empty(1, dtype), shape=tuple(shape), strides=tuple(s * dtype.itemsize for s in strides)
    )


def label_sizes(operands: list[Operand], output: tuple[str, ...]) -> dict[str, int]:
    """The size of every label; size-1 dimensions broadcast against larger ones."""
    sizes: dict[str, int] = {}
    for index, op in enumerate(operands):
        for label in op.labels:
            size = op.sizes[label]
            known = sizes.get(label)
            if known is None or known == 1:
                sizes[label] = size
            elif size not in (1, known):
                name = f"'...' dimension {label}" if label.isdigit() else f"subscript {label!r}"
                raise EinsumError(
                    f"operand {index}: {name} has size {size}, but another operand"
                    f" gives it size {known}; sizes must match or be 1"
                )
    for label in output:
        if label not in sizes:
            raise EinsumError(f"output subscript {label!r} does not appear in any input")
    return sizes


def sum_out(op: Operand, labels: list[str]) -> Operand:
    """``op`` with ``labels`` summed away (a NumPy reduction into a new array)."""
    array, itemsize = op.array, op.array.itemsize
    shape = tuple(op.sizes[label] for label in op.labels)
    strides = tuple(op.strides[label] * itemsize for label in op.labels)
    view = array
    if array.shape != shape or array.strides != strides:  # a diagonal, or size-1 strides
        view = np.lib.stride_tricks.as_strided(array, shape=shape, strides=strides)
    # NumPy's einsum sums in one pass over the operand as it lies; np.add.reduce over
    # several axes is 1.3-4x slower (bcaed->d on 10x24x29x26x12 FP64: 2.9 -> 1.2 ms,
    # abc->b on 50x40x30: 52 -> 13 us).
    kept = tuple(label for label in op.labels if label not in labels)
    summing = numpy_subscripts((tuple(op.labels),), kept)
    if summing is not None:
        reduced = np.einsum(summing, view)
    else:  # more dimensions than einsum has letters
        reduced = np.add.reduce(view, axis=tuple(op.labels.index(x) for x in labels))
    # summing every axis gives a NumPy scalar, which must become an array (its address)
    if not isinstance(reduced, np.ndarray) or not reduced.flags.c_contiguous:
        reduced = np.ascontiguousarray(reduced)
    _, kept_strides = element_strides(reduced)
    return Operand(
        reduced,
        list(kept),
        {label: op.sizes[label] for label in kept},
        dict(zip(kept, kept_strides)),
    )


@dataclass(frozen=True)
class Region:
    """One compiled piece of the operation: its offsets (in elements) into each tensor."""

    offsets: tuple[int, int, int]
    operation: Operation
    # an input the operation reads from a dense copy, made on each call (a thin rest)
    stage: Stage | None = None


@dataclass
class Plan:
    """What an einsum call does for operands of given shapes, strides and dtype."""

    subscripts: Subscripts
    dtype: np.dtype[Any]
    out_shape: tuple[int, ...]
    config: Config | None
    operation: Operation | None
    log: tuple[str, ...]
    reductions: list[list[str]] = field(default_factory=list)
    empty: bool = False
    # Set when no kernel layout fits the operands as they lie: label orders (in0, in1, out)
    # that do fit, for the documented fallback of copying into them (None: that tensor is
    # used as it lies).
    canonical: tuple[str | None, str | None, str | None] | None = None
    # The operation in pieces: output axes with no good block size are split into a part
    # that tiles well and a thin rest (partial tiles, run as a second operation).
    regions: list[Region] = field(default_factory=list)
    # Set when the operation runs on one thread only and a K label can be shared instead.
    split: SplitReduction | None = None
    # A new result's axes in memory, outermost first (None: C order): see result_layout.
    memory_order: tuple[int, ...] | None = None
    # With ``canonical``: the plan of the contraction that runs on the copies.
    product: Plan | None = None
    # Set when a batch axis of unit stride in all three tensors runs as the vector lanes
    # instead (no regions then).
    lanes: LaneOperation | None = None
    # With ``canonical``: the copies are made for an outer-product kernel on plain layouts
    # where the operands as they lie fit another (``relayout_pays``), and the steps that use
    # them are planned as they lie, never asking for copies of their own.
    steps_as_they_lie: bool = False
    # With ``canonical``: why an elementwise product's inputs are copied (see element_layout):
    # its three tensors have their unit strides on three labels, or small inputs run along
    # the result's unit stride a stride apart; "" where it is no such product.
    elementwise_copies: str = ""
    # With ``canonical``: considered only because the kernel's tiles are small
    # (``small_tile``) or few columns pages apart (``narrow_tile``); kept only where the
    # copies give tiles TILE_GAIN times larger.
    for_small_tiles: bool = False
    # The output's labels as its memory lies (``out``'s or a new result's), outermost first:
    # copies of inputs for a kernel order their result labels so (``canonical_orders``).
    out_memory: tuple[str, ...] = ()
    # The unscheduled configuration of the whole operation (one axis per label), and
    # whether its result is memory reused call after call: what the regions were made from.
    fields: dict[str, Any] | None = None
    resident_output: bool = False
    # Set when a batch label shorter than a vector on the result's unit stride is rewritten
    # as a summed label and a free one (:mod:`teir.frontend.batch_diagonal`): the rewrite,
    # and the plan of the rewritten contraction, which runs instead of this one.
    diagonal: Diagonal | None = None
    rewrite_product: Plan | None = None
    # Set when such a batch is folded with a summed label that steps over it in both inputs
    # (:mod:`teir.frontend.batch_fold`); rewrite_product is then the folded contraction's plan.
    fold: Fold | None = None

    def run(self, in0: int, in1: int, out: int) -> None:
        """Run every region on raw addresses (``in1`` 0 for a unary plan)."""
        if self.lanes is not None:
            self.lanes.run_addresses(in0, in1, out)
            return
        size = self.dtype.itemsize
        for region in self.regions:
            o0, o1, oo = region.offsets
            a0, a1 = in0 + o0 * size, in1 + o1 * size if in1 else 0
            stage = region.stage
            if stage is None:
                region.operation.run_addresses(a0, a1, out + oo * size)
                continue
            buffer = stage.run(a1 if stage.operand else a0)
            if stage.operand:
                a1 = data_address(buffer)
            else:
                a0 = data_address(buffer)
            region.operation.run_addresses(a0, a1, out + oo * size)

    def explain(self) -> str:
        lines = [
            f"# einsum {','.join(''.join(t) for t in self.subscripts.inputs)}->"
            f"{''.join(self.subscripts.output)} ({self.dtype.name})"
        ]
        for index, labels in enumerate(self.reductions):
            if labels:
                lines.append(f"# operand {index}: {''.join(labels)} summed out with NumPy first")
        if self.empty:
            lines.append("# a dimension of size 0: the result is zeros")
        rewrite = self.diagonal or self.fold
        if rewrite is not None and self.rewrite_product is not None:
            return "\n".join([*lines, rewrite.explain(), self.rewrite_product.explain()])
        if self.canonical is not None:
            names = ("in0", "in1", "the result")
            moves = [
                f"{name} is {'computed in' if name == names[2] else 'copied into'} the order "
                f"{order}" + (" and permuted into place" if name == names[2] else "")
                for name, order in zip(names, self.canonical)
                if order is not None
            ]
            if self.elementwise_copies:
                why = self.elementwise_copies
            elif self.for_small_tiles and not small_tile(self):
                why = (
                    "the kernel that fits the operands as they lie writes "
                    f"{kernel_columns(self)} columns of C per call, a page or more apart"
                )
            elif self.for_small_tiles:
                why = (
                    "the kernel that fits the operands as they lie computes "
                    f"{kernel_tile(self)} elements of C per call"
                )
            elif runs_kernels(self) and short_depth(self):
                why = (
                    "the kernel that fits the operands as they lie sums "
                    f"{kernel_depth(self)} steps of K between loads and stores of C"
                )
            elif self.product is not None and relaid(self, self.product):
                why = (
                    f"the kernel that fits the operands as they lie {kernel_shortfall(self)}; "
                    "copied once, they run the "
                    + (
                        "plain outer-product kernel"
                        if plain_outer(self.product)
                        else "outer-product kernel on plain layouts (its A tile packed "
                        "once per call)"
                    )
                )
            elif runs_kernels(self):
                why = (
                    "the kernel that fits the operands as they lie fills "
                    f"{vector_fill(self):.0%} of its vector lanes"
                )
            else:
                why = "no kernel layout fits the operands as they lie"
            lines.append(f"# {why}: " + "; ".join(moves) + " (innermost last)")
        if self.split is not None:
            why = (
                f"which adds {self.split.chain} times in a row into each output element, "
                "and rounding error grows with that"
                if self.split.chain
                else "one thread, threads sharing short rows of a matrix, threads idle "
                "in uneven shares, or threads given narrower tiles than one thread takes, "
                "each reading an input from memory again"
            )
            each = "" if self.split.chain else ", one per thread,"
            lines.append(
                f"# instead of the operation below ({why}), {self.split.label!r} is "
                f"cut into {self.split.parts} parts{each} as "
                f"{self.split.subscripts} into a temporary, and the parts are summed"
                + (
                    f" (its last {self.split.rest} indices, left out of the cut, are "
                    "contracted as one more part)"
                    if self.split.rest
                    else ""
                )
            )
        if self.product is not None:
            # The operation planned on the operands as they lie does not run: show the one
            # that does.
            return "\n".join([*lines, "# the contraction of the copies:", self.product.explain()])
        if self.lanes is not None:
            return "\n".join([*lines, self.lanes.explain()])
        lines += [f"# optimize: {line}" for line in self.log]
        if self.operation is not None:
            lines += ["", self.operation.explain()]
        return "\n".join(lines)


def build_config(
    dtype: np.dtype[Any],
    inputs: list[Operand],
    output: tuple[str, ...],
    out_strides: dict[str, int],
    sizes: dict[str, int],
    accumulate: bool,
    relu: bool,
) -> dict[str, Any]:
    """The flat fields of the (unscheduled) configuration: one axis per label."""
    data_type = "FP32" if dtype == np.float32 else "FP64"
    fields: dict[str, Any] = {
        "data_type": data_type,
        "dim_types": [],
        "exec_types": [],
        "dim_sizes": [],
        "strides_in0": [],
        "strides_in1": [],
        "strides_out": [],
    }
    labels = list(output)
    for op in inputs:
        labels += [label for label in op.labels if label not in labels]
    binary = len(inputs) == 2
    for label in labels:
        size = sizes[label]
        in0 = label in inputs[0].sizes
        in1 = binary and label in inputs[1].sizes
        out = label in output
        if binary:
            dim_type = {
                (True, True, True): "C",
                (True, False, True): "M",
                (False, True, True): "N",
                (True, True, False): "K",
            }[(in0, in1, out)]
        else:
            dim_type = "C"
        fields["dim_types"].append(dim_type)
        fields["exec_types"].append("seq")
        fields["dim_sizes"].append(size)

        fields["strides_in0"].append(_stride(inputs[0], in0, label, size))
        fields["strides_in1"].append(_stride(inputs[1], in1, label, size) if binary else 0)
        fields["strides_out"].append(out_strides.get(label, 0) if size > 1 else 0)
    if not labels:  # a scalar result of scalars: one axis of size 1
        for name, value in (
            ("dim_types", "C"),
            ("exec_types", "seq"),
            ("dim_sizes", 1),
            ("strides_in0", 0),
            ("strides_in1", 0),
            ("strides_out", 0),
        ):
            fields[name].append(value)
    if binary:
        fields.update(
            prim_first="None" if accumulate else "Zero",
            prim_main="GEMM",
            prim_last="ReLU" if relu else "None",
        )
    else:
        fields.update(prim_first="None", prim_main="ReLU" if relu else "Copy", prim_last="None")
    return fields


def unscheduled_fields(subscripts: Subscripts, arrays: list[np.ndarray]) -> dict[str, Any]:
    """The flat fields of the configuration of a one- or two-operand einsum on ``arrays``
    (output C-contiguous), before any scheduling: what another TEIR implementation is given
    to optimize and run (the benchmarks' etops baseline)."""
    inputs = [operand(a, labels, i) for i, (a, labels) in enumerate(zip(arrays, subscripts.inputs))]
    output = subscripts.output
    for index, op in enumerate(inputs):
        others = {label for j, other in enumerate(inputs) if j != index for label in other.labels}
        lonely = [label for label in op.labels if label not in output and label not in others]
        if lonely:
            raise EinsumError(
                f"operand {index}: {''.join(lonely)!r} appear in no other term, which a "
                "single TEIR operation cannot sum; sum them out of the operand first"
            )
    sizes = label_sizes(inputs, output)
    shape = tuple(sizes[label] for label in output)
    out_strides = result_strides(None, output, shape)
    return build_config(arrays[0].dtype, inputs, output, out_strides, sizes, False, False)


def _stride(op: Operand, present: bool, label: str, size: int) -> int:
    """The operand's stride for ``label``; a broadcast (size-1) dimension of a larger label
    repeats its one element (stride 0)."""
    return op.strides[label] if present and op.sizes[label] == size else 0


def make_plan(
    subscripts: Subscripts,
    arrays: list[np.ndarray],
    out: np.ndarray | None,
    accumulate: bool,
    relu: bool,
    threads: int | None,
    relayout: bool = True,
    resident_output: bool | None = None,
    order: str | tuple[int, ...] = "C",
    own_call: bool = False,
) -> tuple[Plan, list[Operand]]:
    """The plan for these operands (its operands are returned too: they may be new arrays).
    ``relayout=False``: copies are planned only where no kernel fits well as the operands
    lie, never to trade a fitting kernel for the plain outer-product one (an einsum tree,
    whose intermediates are planned in its arena, lays its nodes out itself).
    ``resident_output``: whether the result is written into memory reused call after call
    (default: when an ``out`` is given; a result allocated for each call is not).
    ``order``: the memory layout of a new result (without ``out``), as NumPy's einsum takes
    it: "C", "F", "A" or "K" (teir's choice, see :mod:`teir.frontend.result_layout`), or
    the memory order of its axes itself (outermost first).
    ``own_call``: einsum's own call, not the contraction of its copies; copies are then
    also planned for a memory-bound contraction whose result is its largest tensor, written
    by a kernel that fills few vector lanes, for gathered dot products (``gathered_dots``)
    and for compute-bound ones of small kernel tiles (``small_tile``)."""
    if resident_output is None:
        resident_output = out is not None
    dtype = arrays[0].dtype
    inputs = [operand(a, labels, i) for i, (a, labels) in enumerate(zip(arrays, subscripts.inputs))]
    output = subscripts.output
    sizes = label_sizes(inputs, output)
    out_shape = tuple(sizes[label] for label in output)
    plan = Plan(subscripts, dtype, out_shape, None, None, ())
    if any(size == 0 for size in sizes.values()):
        plan.empty = True
        return plan, inputs
    # Labels that appear in a single input and not in the output are summed out first.
    plan.reductions = []
    for index, op in enumerate(inputs):
        others = [label for j, other in enumerate(inputs) if j != index for label in other.labels]
        lonely = [label for label in op.labels if label not in output and label not in others]
        plan.reductions.append(lonely)
        if lonely:
            inputs[index] = sum_out(op, lonely)
    if out is None:

        def price(strides: dict[str, int]) -> tuple[float, bool]:
            fields = build_config(dtype, inputs, output, strides, sizes, accumulate, relu)
            return einsum_cost(fields, threads or default_threads())

        plan.memory_order = result_order(order, inputs, output, sizes, price)
    out_strides = result_strides(out, output, out_shape, plan.memory_order)
    plan.out_memory = labels_in_memory(output, out_strides, sizes)
    fields = build_config(dtype, inputs, output, out_strides, sizes, accumulate, relu)
    plan.fields, plan.resident_output = fields, resident_output
    _plan_regions(plan, regions(fields, len(inputs) == 2), threads, len(inputs) == 2)
    assert plan.operation is not None
    main = plan.operation.nest.main
    intense = compute_bound(plan, inputs)
    # a memory-bound contraction whose result is its largest tensor, written by a kernel
    # that fills few lanes: inputs copied into layouts whose kernel fills them write it
    # faster (see copy_fallback.choose's copy_result)
    result_bound = own_call and prod(out_shape) >= sum(op.array.size for op in inputs)
    poor = (
        main is not None
        and main.kind == "brgemm"
        and (
            intense
            or result_bound
            or (own_call and (gathered_dots(plan, inputs) or partner_copy(plan, inputs)))
        )
        and vector_fill(plan) < POOR_FILL
    )
    if len(inputs) != 2 or main is None:
        return plan, inputs
    unfit = main.kind == "generic" or poor
    # a batched product summing K in the loops around a one-element kernel, the batch
    # innermost (``ijb,jkb->ikb``). Not a batched outer product (no K): the nest's innermost
    # loop, vectorized whole, writes each output line at once where the lane-batched kernel
    # writes a vector per job (``ib,jb->ijb`` 512^2 x b into an out, one thread, FP32 b 32:
    # 2.6 ms against 7.7, 2 threads 1.4 against 4.2; FP64 b 32 4.6 against 18.6)
    if unfit or one_element(plan):
        count = threads or default_threads()
        spec = lane_spec(fields, count, Target.host())
        summing = spec is not None and spec.m > 1 and spec.n > 1 and spec.k > 1
        if spec is not None and (unfit or summing):
            plan.lanes = compile_lanes(spec, count)
            plan.regions, plan.operation = [], None
            return plan, inputs
    other_reasons = (
        unfit or (intense and short_depth(plan)) or (relayout and relayout_pays(plan, inputs))
    )
    tiny = own_call and intense and (small_tile(plan) or narrow_tile(plan))
    if other_reasons or tiny:
        orders = canonical_orders(inputs, plan.out_memory)
        # the result counts too: a batch label with the result's unit stride fits no kernel
        # (adb,acd->bca FP64 ran on the generic primitive at 0.13x NumPy)
        # (the result compares by its memory: a new one laid out in that order, listed in
        # another, is already a copy's layout)
        already = all(
            "".join(op.labels) == order and op.array.flags.c_contiguous
            for op, order in zip(inputs, orders)
        ) and dense_in(output, out_strides, sizes, orders[2])
        if not already:  # copies into these orders fit a kernel (and are not made twice)
            plan.canonical = orders
            plan.for_small_tiles = not other_reasons
            if plan.memory_order is not None and order == "K" and main.kind != "generic":
                # a layout chosen for the kernel that runs on the result as it lies, not for
                # copies: the listed one decides (heb,dhf->dfbe FP32, 7 x 50 x 31 x 31 x 24:
                # 0.18 ms as listed, 2.1 ms through copies into the chosen one). One that no
                # kernel fits as it lies was priced with its copies (``einsum_cost``).
                return make_plan(
                    subscripts,
                    arrays,
                    out,
                    accumulate,
                    relu,
                    threads,
                    relayout,
                    resident_output,
                    own_call=own_call,
                )
    return plan, inputs


def _plan_regions(
    plan: Plan,
    pieces: list[tuple[dict[str, Any], tuple[int, int, int]]],
    threads: int | None,
    binary: bool,
) -> None:
    """Compile the regions ``pieces`` (fields and offsets) into ``plan.regions``; the first
    is the plan's config, log and operation."""
    staged_lines = []
    plan.regions = []
    for index, (region_fields, offsets) in enumerate(pieces):
        config, log = optimize_with_log(
            region_fields, threads, resident_output=plan.resident_output, partial_tiles=False
        )
        stage = None
        if index > 0 and binary:  # a thin rest: its own inputs may be worth a copy
            fill = kernel_fill(lower(config).main)
            count = threads or default_threads()
            staged = stage_region(region_fields, count, fill, plan.resident_output)
            if staged is not None:
                config, stage, line = staged
                staged_lines.append(f"region {index}: {line}")
        operation = compile_config(config, threads, resident_output=plan.resident_output)
        plan.regions.append(Region(offsets, operation, stage))
        if index == 0:
            plan.config, plan.log, plan.operation = config, log, operation
    if len(plan.regions) > 1:
        plan.log += (
            f"partial tiles: {len(plan.regions)} regions "
            f"{[r.operation.config.dim_sizes for r in plan.regions]}",
            *staged_lines,
        )


def share_by_regions(plan: Plan, threads: int) -> bool:
    """Give the threads of a plan that leaves them idle a tenth of their time or more (its
    output axes have no divisor that tiles: 211 x 311 on one thread, 3 batch elements of 97 x
    97 on two; and no summed label is cut between them) loops they share evenly: an output
    axis split into a main part and its rest (``teir.optimizer.partial``'s
    ``thread_split_axes``), where the main part's operation idles them a tenth less, and
    less by more than the rest costs (``bdc,adb->ac`` 100 x 64 x 97 x 24: 3 tiles on 2
    threads, the rest the column c = 96 along the result's unit stride: 0.93x, not taken).
    Whether the plan changed. Random one-thread GEMM einsums of 37-311 x 37-311 x 300-700
    (2 threads, alternating in one process): 1.54-2.47x (FP32 ``km,kn->mn`` 211 x 311 x 300
    251 -> 454 GFLOP/s)."""
    if plan.fields is None or len(plan.regions) != 1 or plan.regions[0].stage is not None:
        return False
    idle = operation_idle(plan.regions[0].operation, threads)
    if idle < THREAD_SPLIT_IDLE:
        return False
    fields = plan.fields
    problem = problem_from(fields)  # one axis per field dimension: indices match
    for index, cost in thread_split_axes(problem, threads):
        pieces = regions(fields, True, forced=index)
        main, _ = optimize_with_log(
            pieces[0][0], threads, resident_output=plan.resident_output, partial_tiles=False
        )
        operation = compile_config(main, threads, resident_output=plan.resident_output)
        now = operation_idle(operation, threads)
        if now > idle - THREAD_SPLIT_IDLE or cost >= idle - now:
            continue
        _plan_regions(plan, pieces, threads, True)
        plan.log += ("partial tiles: split so that the threads share the main part evenly",)
        return True
    return False


def operation_idle(operation: Operation, threads: int) -> float:
    """The share of ``threads``' time idle while ``operation`` runs: its slices of the
    parallel index space against an even split (one slice: all threads but one idle)."""
    if len(operation.slices) < 2:
        return 1 - 1 / threads
    longest = max(hi - lo for lo, hi in operation.slices)
    return 1 - operation.nest.parallel_size / (threads * longest)


def gathered_dots(plan: Plan, inputs: list[Operand]) -> bool:
    """Whether the plan's kernel sums dot products into one element per call (a one-by-one
    tile over K) and an input of at least ``GATHERED_MIN_BYTES`` steps a line or more along
    every summed label: each of its K steps then reads one element of another line, which
    the next output element's dot reads again, often after the caches have lost it
    (``ij,ji->i``)."""
    main = _main(plan)
    spec = None if main is None else main.spec
    if len(inputs) != 2 or not isinstance(spec, BrgemmSpec):
        return False
    if not spec.m == spec.n == 1 < spec.k * spec.batch:
        return False
    line = LINE_BYTES // plan.dtype.itemsize
    output = plan.subscripts.output
    summed = [x for x in inputs[0].labels if x in inputs[1].labels and x not in output]
    return bool(summed) and any(
        op.array.nbytes >= GATHERED_MIN_BYTES
        and all(abs(op.strides[x]) >= line or op.sizes[x] == 1 for x in summed)
        for op in inputs
    )


def partner_copy(plan: Plan, inputs: list[Operand]) -> bool:
    """Whether the plan is a memory-bound contraction whose kernel fills few vector lanes,
    not of gathered dot products (those have their own copies), of a large input (at least
    ``PARTNER_MIN_BYTES``) beside one of at most ``1 / SMALL_PARTNER_PART`` of its elements,
    into a result of at most ``1 / PARTNER_RESULT_PART`` of them: a copy of the small input
    into a layout whose kernel fills the lanes adds little to the traffic (einsum._plan
    tries that copy alone)."""
    if len(inputs) != 2 or not runs_kernels(plan) or vector_fill(plan) >= POOR_FILL:
        return False
    if plan.memory_order is not None:
        # a new result laid out for the kernel as the operands lie: the copies would be
        # planned for the listed layout, which that kernel may serve worse (bhga,bgdh->dabg
        # FP64: 1.3x slower)
        return False
    small, large = sorted(op.array.size for op in inputs)
    if large * plan.dtype.itemsize < PARTNER_MIN_BYTES or small * SMALL_PARTNER_PART > large:
        return False
    if prod(plan.out_shape) * PARTNER_RESULT_PART > large:
        return False
    return not compute_bound(plan, inputs) and not gathered_dots(plan, inputs)


# A memory-bound contraction filling few lanes copies its smaller input where it has at most
# 1 / SMALL_PARTNER_PART of the other's elements: FP32 edgbf,feb->gd (in0 8.9 MB, in1 184 KB,
# a kernel of one lane along g; copied, dot products along the contiguous b, f):
# 4.3 -> 0.16 ms.
SMALL_PARTNER_PART = 16
# Smaller contractions lose more to the copy's call than the kernel gains (random einsums
# under 1 MiB: 1.2-5x slower, efd,ceaf->cda 1 -> 7 us), as do those whose result the kernel
# writes at a large part of their traffic (fgcedb,bg->fcegd FP32, result half of in0: 1.8x).
PARTNER_MIN_BYTES = 1 << 20
PARTNER_RESULT_PART = 4


# Gathered dot products copy the gathered input into the other's layout (one copy, see
# einsum._plan) where it has at least this many bytes. Random einsums whose plans changed
# (seeds 401-408, 2 of each 1000), 2 threads, alternating processes, into an out: 18 cases
# 0.47x the time by geometric mean; FP32 gc,cg->c 1536 x 8192 55 -> 5.5 ms, bd,db->d 46 ->
# 5.6 ms, cf,fc->c (12288 x 192) 6.8 -> 0.94 ms, ahf,fah->h (4 MB) 1.38 -> 0.49 ms; FP64
# ea,ae->e 11.4 -> 2.8 ms, edc,ced->ce 13.4 -> 3.3 ms; slower FP64 df,fd->d (4 MB, K 1552)
# 0.25 -> 0.50 ms and ha,ah->h (6 MB, K 192) 0.44 -> 0.64 ms, whose gathered lines the next
# dot still finds in the caches. Under 1 MB, 1.3-5.7x slower (ac,ca->c 64 x 34: 1 -> 8 us).
GATHERED_MIN_BYTES = 1 << 20


# A kernel that fills less than this fraction of its vector lanes (a dot form along a unit
# stride K of 7, FP32) has the copying fallback considered too, which is taken when its
# kernel fills at least twice as many: cafbe,dfae->abdc FP32 (K 7 along the unit stride)
# 3.05 -> 1.35 ms, same-process A/B.
POOR_FILL = 0.5
# ... when it does at least this many FLOPs per element of its operands and result: below,
# its memory traffic, which copies add to, bounds it (ij,ji-> on 300 x 470: 132 us as it
# lies, 289 us through copies).
COMPUTE_BOUND_INTENSITY = 8


def compute_bound(plan: Plan, inputs: list[Operand]) -> bool:
    """Whether the plan's contraction does at least ``COMPUTE_BOUND_INTENSITY`` FLOPs per
    element of its operands and result."""
    assert plan.operation is not None
    elements = sum(op.array.size for op in inputs) + prod(plan.out_shape)
    return plan.operation.config.flops >= COMPUTE_BOUND_INTENSITY * elements


def _main(plan: Plan) -> TileOp | None:
    """The main primitive of the plan's (first region's) operation, if it has one."""
    return None if plan.operation is None else plan.operation.nest.main


def one_element(plan: Plan) -> bool:
    """Whether the plan's kernel multiplies one element per K step (m = n = k = 1): an
    elementwise product's, its loops doing the rest."""
    main = _main(plan)
    spec = None if main is None else main.spec
    return isinstance(spec, BrgemmSpec) and (spec.m, spec.n, spec.k) == (1, 1, 1)


def runs_kernels(plan: Plan) -> bool:
    """Whether the operation planned on the operands as they lie runs kernels (not the
    generic scalar primitive)."""
    main = _main(plan)
    return main is not None and main.kind != "generic"


def vector_fill(plan: Plan) -> float:
    """The fraction of vector lanes the plan's kernel fills along the dimension it vectorizes
    (1 for kernels other than BRGEMM)."""
    return kernel_fill(_main(plan))


def kernel_tile(plan: Plan) -> int:
    """Elements of C the plan's BRGEMM kernel computes per call (0 for other kernels)."""
    main = _main(plan)
    if main is None or not isinstance(main.spec, BrgemmSpec):
        return 0
    return main.spec.m * main.spec.n


def small_tile(plan: Plan) -> bool:
    """Whether the plan's BRGEMM kernel computes a C tile of fewer than ``SMALL_TILE``
    elements per call (a register block of a few accumulators), summing K beyond one step."""
    main = _main(plan)
    if main is None or main.kind != "brgemm" or not isinstance(main.spec, BrgemmSpec):
        return False
    if plan.operation is None or plan.operation.config.flops < SMALL_TILE_MIN_FLOPS:
        return False
    return 0 < kernel_tile(plan) < SMALL_TILE and main.spec.k * main.spec.batch > 1


def kernel_columns(plan: Plan) -> int:
    """Columns of C the plan's BRGEMM kernel writes per call (0 for other kernels)."""
    main = _main(plan)
    return main.spec.n if main is not None and isinstance(main.spec, BrgemmSpec) else 0


def narrow_tile(plan: Plan) -> bool:
    """Whether the plan's BRGEMM kernel writes fewer than ``NARROW_COLUMNS`` columns of C per
    call, a page or more apart, summing K beyond one step (a short N that alone fits a
    kernel as the operands lie, each call's columns on as many pages)."""
    main = _main(plan)
    if main is None or main.kind != "brgemm" or not isinstance(main.spec, BrgemmSpec):
        return False
    if plan.operation is None or plan.operation.config.flops < SMALL_TILE_MIN_FLOPS:
        return False
    spec = main.spec
    far = spec.ldc * plan.dtype.itemsize >= PAGE_BYTES
    return kernel_columns(plan) < NARROW_COLUMNS and far and spec.k * spec.batch > 1


# A compute-bound contraction of at least SMALL_TILE_MIN_FLOPS whose layout leaves kernel
# tiles of fewer C elements than SMALL_TILE has the copying fallback considered, taken where
# its tiles are TILE_GAIN times larger. Below, the copies' calls cost more than the tiles
# lose (random einsums of 1-10 MFLOP: 1.6-6x slower).
SMALL_TILE = 64
TILE_GAIN = 4
SMALL_TILE_MIN_FLOPS = 32_000_000
# ... and so does one whose kernel writes fewer columns than this per call, a page or more
# apart (``narrow_tile``): FP64 efd,feih->heid (N h 7 as in1 lies, columns 917 KB apart),
# in1 copied for N i of 32: 1.99 -> 0.87 ms
NARROW_COLUMNS = 8
PAGE_BYTES = 4096


def kernel_depth(plan: Plan) -> int:
    """The K steps the plan's BRGEMM kernel sums between loading and storing its C tile
    (its K times its batch chunk; 0 for other kernels)."""
    main = _main(plan)
    if main is None or not isinstance(main.spec, BrgemmSpec):
        return 0
    return main.spec.k * choose_blocking(main.spec, Target.host()).chunk


def _brgemm_blocking(plan: Plan) -> tuple[BrgemmSpec, Blocking] | None:
    """The spec and register blocking of the plan's BRGEMM kernel (None for others)."""
    main = _main(plan)
    if main is None or main.kind != "brgemm" or not isinstance(main.spec, BrgemmSpec):
        return None
    return main.spec, choose_blocking(main.spec, Target.host())


def _outer_blocking(plan: Plan) -> Blocking | None:
    """The blocking of the plan's BRGEMM kernel if it runs the outer-product form on both
    operands in their plain layouts (A unit stride on M, B on K), reading B where it lies."""
    found = _brgemm_blocking(plan)
    if found is None:
        return None
    spec, blocking = found
    plain = not (spec.trans_a or spec.trans_b or blocking.pack_b)
    return blocking if plain and blocking.form == "outer" else None


def plain_outer(plan: Plan) -> bool:
    """Whether the plan's BRGEMM kernel runs the outer-product form on both operands in
    their plain layouts (A unit stride on M, B on K) as the nest hands them over, copying
    neither on its calls: the kernel that reaches the highest fraction of peak. The others
    copy an operand on every call (A with columns far apart, B a column block at a time),
    broadcast from rows of a transposed B, or run the mirror or dot forms."""
    blocking = _outer_blocking(plan)
    return blocking is not None and not blocking.pack_a


def outer_untransposed(plan: Plan) -> bool:
    """Whether the plan's BRGEMM kernel runs the outer-product form on both operands in
    their plain layouts, reading B where it lies: :func:`plain_outer`, or the kernel that
    packs its A tile (columns far apart) once per call, which it then reuses for every
    column of C."""
    return _outer_blocking(plan) is not None


def other_kernel(plan: Plan) -> bool:
    """Whether the plan runs a BRGEMM kernel that fills its vector lanes but is not the plain
    outer-product one (a kernel filling fewer lanes is the copying fallback's own case)."""
    main = _main(plan)
    if main is None or main.kind != "brgemm" or vector_fill(plan) < POOR_FILL:
        return False
    return not plain_outer(plan)


def relaid(plan: Plan, product: Plan) -> bool:
    """Whether ``product`` runs an outer-product kernel on plain layouts where ``plan``, which
    fills its vector lanes, runs a kernel further from the plain one: the plain kernel, or
    the one that copies its A tile once per call where ``plan``'s copies no A tile. A kernel
    that copies its A tile on every call and also reads a transposed B gains little from B
    copied once (2-D FP64 GEMMs with K of 14-128: 0.76x-1.37x, 0.95x by geometric mean),
    except over a long K (``RELAID_LONG_K``)."""
    if not (other_kernel(plan) and outer_untransposed(product)):
        return False
    found = _brgemm_blocking(plan)
    if plain_outer(product) or not (found is not None and found[1].pack_a):
        return True
    return plan.config is not None and summed_elements(plan.config) >= RELAID_LONG_K


# ... but over a K this long, copying B once pays for a kernel that copies its A tile on every
# call (with an out, where the output's size cuts K into steps and leaves no room for a
# packed panel): 2 threads, alternating processes, ki,kj->ij FP64 4096² x 2048 748 -> 440
# ms, x 512 123 -> 111 ms, 3000² x 1000 134 -> 117 ms; ki,jk->ij and FP32 unchanged.
RELAID_LONG_K = 512


def summed_elements(config: Config) -> int:
    """How many products each output element of ``config`` sums: its K axes' sizes."""
    return prod(s for t, s in zip(config.dim_types, config.dim_sizes) if t is DimType.K)


def kernel_shortfall(plan: Plan) -> str:
    """What keeps the plan's BRGEMM kernel from the plain outer-product form, in words."""
    main = _main(plan)
    assert main is not None and isinstance(main.spec, BrgemmSpec)
    blocking = choose_blocking(main.spec, Target.host())
    if blocking.form != "outer":
        return f"runs the {blocking.form} form"
    if blocking.pack_a:
        return "copies its A tile on every call"
    if blocking.pack_b:
        return "copies its B tile a column block at a time on every call"
    return "broadcasts from the rows of a transposed B"


def relayout_pays(plan: Plan, inputs: list[Operand]) -> bool:
    """Whether copying inputs once into layouts that give the plain outer-product kernel
    (:func:`plain_outer`) may pay: the plan runs another BRGEMM kernel, and the contraction
    does at least ``RELAYOUT_FLOPS_PER_ELEMENT`` FLOPs per element of its inputs."""
    if plan.operation is None or not other_kernel(plan):
        return False
    elements = sum(op.array.size for op in inputs)
    return plan.operation.config.flops >= RELAYOUT_FLOPS_PER_ELEMENT * elements


# A copy moves each element once, at a few nanoseconds; the contraction spends this many
# FLOPs on it, about 2 ns on two cores at peak. 1024^3 (1024 per element) on 2 threads:
# ki,kj->ij FP32 61-64 -> 71-73 % of peak, FP64 52-57 -> 68 %; with k 800, i 600, j 900
# (720 per element) FP64 55-56 -> 60-62 %.
RELAYOUT_FLOPS_PER_ELEMENT = 512


def short_depth(plan: Plan) -> bool:
    """Whether the plan's kernel loads and stores its C tile every few K steps
    (``SHORT_DEPTH``), many times over its batch: short K runs whose batch elements lie too
    far apart to be taken together."""
    main = _main(plan)
    if main is None or main.kind != "brgemm" or not isinstance(main.spec, BrgemmSpec):
        return False
    depth = kernel_depth(plan)
    return depth < SHORT_DEPTH and main.spec.k * main.spec.batch >= SHORT_DEPTH_GAIN * depth


# A BRGEMM kernel that sums fewer K steps than this between loading and storing its C tile,
# and does so several times per call, has the copying fallback considered (when it does at
# least COMPUTE_BOUND_INTENSITY FLOPs per element), taken when its kernel sums at least
# SHORT_DEPTH_GAIN times as many steps and fills as many lanes: FP32 eda,cbde->acb
# (62x54x63x131x9; e of 9 along in1's unit stride, 32 KB apart in in0: batch chunks of 1)
# 8.0 -> 3.1 ms with in1 copied (NumPy 3.9 ms). ebaf,cefd->cbda FP64 (K 8, batch chunk 42)
# keeps its kernel: 3.3 ms as it lies, 5.0 ms through copies.
SHORT_DEPTH = 16
SHORT_DEPTH_GAIN = 4


def regions(
    fields: dict[str, Any], binary: bool, forced: int | None = None
) -> list[tuple[dict[str, Any], tuple[int, int, int]]]:
    """The configuration's fields for each region (``teir.optimizer.partial``: an axis with
    no good tile size split into a main part and its thin rest; ``forced``: that axis
    alone), with its offsets into (in0, in1, out)."""
    shapes = split_regions(
        [DimType(t) for t in fields["dim_types"]],
        fields["dim_sizes"],
        list(zip(fields["strides_in0"], fields["strides_in1"], fields["strides_out"])),
        binary,
        DataType(fields["data_type"]).itemsize,
        forced,
    )
    result = []
    for shape in shapes:
        region = dict(fields, dim_sizes=list(shape.sizes))
        if not shape.keeps_first:
            region["prim_first"] = "None"
        if not shape.keeps_last:
            region["prim_last"] = "None"
        result.append((region, shape.offsets))
    return result


def canonical_orders(
    inputs: list[Operand],
    output: Sequence[str],
    mirrored: bool = False,
    summed: Sequence[str] | None = None,
) -> tuple[str, str, str]:
    """Label orders that give the GEMM kernel unit strides: in0 (C, K, M), in1 (C, N, K),
    out (C, N, M), innermost last; ``mirrored``: those of the transposed product
    (out^T = in1^T in0^T), in0 (C, M, K), in1 (C, K, N), out (C, M, N). C, M and N follow
    ``output``: pass the result's labels as its memory lies (``Plan.out_memory``), so that
    copies of inputs share its order and their labels fuse with its own (FP32
    dfbac,efd->edabc laid out edbac, in0 28 MB: copying in0 for the listed order, 10.5 ms).
    K follows in0's listed order, or ``summed`` (the summed labels as the input left in
    place lies, so that a copy of the other one fuses its K with that input's)."""
    in0, in1 = inputs[0].labels, inputs[1].labels
    c = [x for x in output if x in in0 and x in in1]
    m = [x for x in output if x in in0 and x not in in1]
    n = [x for x in output if x in in1 and x not in in0]
    k = [x for x in summed or in0 if x in in0 and x in in1 and x not in output]
    if mirrored:
        return "".join(c + m + k), "".join(c + k + n), "".join(c + m + n)
    return "".join(c + k + m), "".join(c + n + k), "".join(c + n + m)


def dense_in(
    labels: Sequence[str], strides: dict[str, int], sizes: dict[str, int], order: str
) -> bool:
    """Whether a tensor of ``labels`` with these element strides is laid out densely in
    ``order`` (outermost first), as a contiguous copy in that order would be."""
    dense = order_strides(tuple(labels.index(x) for x in order), labels, sizes)
    return all(strides[x] == dense[x] for x in labels if sizes[x] > 1)


def labels_in_memory(
    labels: Sequence[str], strides: dict[str, int], sizes: dict[str, int]
) -> tuple[str, ...]:
    """``labels`` as a tensor of these element strides lies in memory, outermost first
    (size-1 labels, which have no place, where they are listed)."""
    moving = sorted((x for x in labels if sizes[x] > 1), key=lambda x: -abs(strides[x]))
    order = iter(moving)
    return tuple(x if sizes[x] == 1 else next(order) for x in labels)


def result_strides(
    out: np.ndarray | None,
    output: tuple[str, ...],
    shape: tuple[int, ...],
    memory_order: tuple[int, ...] | None = None,
) -> dict[str, int]:
    """Element strides of the output: ``out``'s, or those of a new array whose axes lie in
    ``memory_order`` (None: C order)."""
    if out is not None:
        if out.shape != shape:  # before its strides are read as the result's
            raise EinsumError(f"out has shape {out.shape}, the result has shape {shape}")
        return dict(zip(output, element_strides(out)[1]))
    return order_strides(memory_order, output, dict(zip(output, shape)))


__all__ = ["Operand", "Plan", "Region", "labels_in_memory", "make_plan"]
