"""``teir.einsum`` and ``teir.contract_expression``: NumPy's einsum, compiled through TEIR.

>>> import numpy as np, teir
>>> a, b = np.random.rand(30, 40), np.random.rand(40, 20)
>>> bool(np.allclose(teir.einsum("ij,jk->ik", a, b), a @ b))
True
>>> expr = teir.contract_expression("bij,bjk->bik", (8, 30, 40), (8, 40, 20))
>>> x, y = np.random.rand(8, 30, 40), np.random.rand(8, 40, 20)
>>> bool(np.allclose(expr(x, y), x @ y))
True
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from teir.buffers import check_memory, new_result
from teir.frontend import batch_diagonal, batch_fold, copy_fallback, element_layout
from teir.frontend.batch_diagonal import DiagonalCall
from teir.frontend.batch_fold import FoldCall
from teir.frontend.direct_call import DirectCall, direct_call
from teir.frontend.einsum_parse import EinsumError, from_sublists, parse
from teir.frontend.einsum_plan import (
    POOR_FILL,
    SHORT_DEPTH_GAIN,
    TILE_GAIN,
    Operand,
    Plan,
    canonical_orders,
    compute_bound,
    gathered_dots,
    kernel_depth,
    kernel_tile,
    label_sizes,
    make_plan,
    narrow_tile,
    one_element,
    operand,
    partner_copy,
    placeholder,
    relaid,
    relayout_pays,
    result_strides,
    runs_kernels,
    share_by_regions,
    short_depth,
    small_tile,
    sum_out,
    vector_fill,
)
from teir.frontend.fallback_call import FallbackCall, RecordedStep, fallback_call
from teir.frontend.result_layout import check_order, fortran_ordered, streaming_order
from teir.frontend.split_call import SplitCall, add_parts, split_call
from teir.frontend.split_reduction import (
    chain_length,
    chain_too_long,
    plan_split,
    rereading,
    rest_views,
    short_rows,
    split_views,
    unbalanced,
)
from teir.ir.enums import DataType
from teir.kernels.arrays import data_address
from teir.runtime.arguments import as_array
from teir.runtime.pool import default_threads
from teir.runtime.scratch import scratch

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
PLAN_CACHE_SIZE = 4096
# Each plan with its per-call path: a direct call, a fallback's or split's replay, a
# rewritten batch's call, or None (full path).
PerCall = DirectCall | FallbackCall | SplitCall | DiagonalCall | FoldCall
_plans: dict[tuple[Any, ...], tuple[Plan, tuple[bool, ...], PerCall | None]] = {}
# The last direct call with a checked call per (subscripts, operand count, out given or not,
# accumulate, relu, threads): tried before the full key is built; the checked call itself
# checks everything else.
_recent: dict[tuple[Any, ...], DirectCall] = {}
_lock = threading.Lock()


def clear_plans() -> None:
    """Forget every cached einsum plan (compiled operations stay in their own cache)."""
    with _lock:
        _plans.clear()
        _recent.clear()


def _remember(recent: tuple[Any, ...], call: PerCall) -> None:
    if isinstance(call, DirectCall) and call.checked is not None:
        with _lock:
            if len(_recent) >= PLAN_CACHE_SIZE:
                _recent.pop(next(iter(_recent)))
            _recent[recent] = call


def float_dtype(dtype: Any) -> np.dtype[Any]:
    """The NumPy dtype ``dtype`` names: float32 or float64, as NumPy spells them or as teir
    does ("f32", "FP64", ...).

    >>> float_dtype("f32"), float_dtype(np.float64)
    (dtype('float32'), dtype('float64'))
    """
    named = DataType.parse(dtype)
    if named is not None:
        return np.dtype(named.numpy)
    try:
        wanted: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        raise EinsumError(
            f"dtype {dtype!r} names no data type; use np.float32 or np.float64 (or 'f32', 'f64')"
        ) from None
    if wanted not in _FLOATS:
        raise EinsumError(f"dtype must be float32 or float64, got {wanted}")
    return wanted


def _arrays(operands: Sequence[Any]) -> list[np.ndarray]:
    """The operands as float32/float64 arrays of one dtype (NumPy's promotion)."""
    arrays = []
    for index, value in enumerate(operands):
        if isinstance(value, np.ndarray):
            array = value
        elif isinstance(value, np.generic):
            array = np.asarray(value)  # a NumPy scalar keeps its dtype
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            array = np.asarray(value, dtype=np.float64)
        elif hasattr(value, "__dlpack__"):
            array = as_array(f"operand {index}", value)
        else:  # lists and other array-likes, as NumPy converts them
            try:
                array = np.asarray(value)
            except (TypeError, ValueError) as error:
                raise EinsumError(f"operand {index} is not an array: {error}") from None
        if array.dtype not in _FLOATS:
            raise EinsumError(
                f"operand {index} has dtype {array.dtype}; teir.einsum supports float32 and "
                f"float64: convert it with .astype(np.float64) (or np.float32)"
            )
        if not array.flags.aligned:
            # kernels assume whole elements (and shift onto vectors by elements): a copy
            array = np.require(array, requirements="A")
        arrays.append(array)
    if not arrays:
        raise EinsumError("einsum needs at least one operand")
    dtype = np.result_type(*arrays)
    return [a if a.dtype == dtype else a.astype(dtype) for a in arrays]


def _key(
    subscripts: str,
    arrays: Sequence[np.ndarray],
    out: np.ndarray | None,
    accumulate: bool,
    relu: bool,
    threads: int | None,
    split: bool = True,
    fresh: bool = False,
    order: str | tuple[int, ...] = "K",
    fallback: bool = True,
    relayout: bool = True,
) -> tuple[Any, ...]:
    first, last = arrays[0], arrays[-1]
    if len(arrays) <= 2:  # spelled out: every call of the direct path builds this key
        layout: tuple[Any, ...] = (first.shape, first.strides, last.shape, last.strides)
    else:
        layout = tuple((a.shape, a.strides) for a in arrays)
    return (
        subscripts,
        len(arrays),
        layout,
        first.dtype.char,
        order if out is None else (out.shape, out.strides),
        accumulate,
        relu,
        threads,
        split,
        fresh,
        fallback,
        relayout,
    )


def _plan(
    subscripts: str,
    arrays: list[np.ndarray],
    out: np.ndarray | None,
    accumulate: bool,
    relu: bool,
    threads: int,
    split: bool = True,
    fallback: bool = True,
    fresh: bool = False,
    order: str | tuple[int, ...] = "K",
    relayout: bool = True,
) -> tuple[Plan, tuple[bool, ...]]:
    """The cached plan for these operands (``fallback=False``: a plan that would need the
    copying fallback is returned without one). ``fresh``: ``out`` stands for
    a result allocated for the call, written once (see ``make_plan``'s resident_output).
    ``order``: the layout of a new result (without ``out``), see ``make_plan``.
    ``relayout=False``: no copies for another kernel than the one that fits as the operands
    lie (the steps of copies made for that, see ``copy_fallback.choose``)."""
    key = _key(
        subscripts, arrays, out, accumulate, relu, threads, split, fresh, order, fallback, relayout
    )
    found = _plans.get(key)
    if found is not None:
        return found[0], found[1]
    parsed = parse(subscripts, [a.ndim for a in arrays])
    resident = False if fresh else None
    plan, inputs = make_plan(
        parsed,
        arrays,
        out,
        accumulate,
        relu,
        threads,
        relayout,
        resident_output=resident,
        order=order,
        own_call=fallback,
    )
    # Operands used in place need only their address per call; the others are prepared again.
    direct = tuple(
        op.array is a and not labels
        for op, a, labels in zip(inputs, arrays, plan.reductions or [[]] * len(arrays))
    )
    diagonal = batch_diagonal.choose(plan, inputs) if fallback else None
    if diagonal is not None:  # a short batch no kernel vectorizes as it lies, rewritten
        views = batch_diagonal.operands(diagonal, parsed.inputs, arrays)
        plan.diagonal = diagonal
        plan.rewrite_product = _plan(
            diagonal.subscripts,
            views,
            out,
            accumulate,
            relu,
            threads,
            split=split,
            fresh=fresh,
            order=order,
            relayout=relayout,
        )[0]
        _cache(key, (plan, direct, None))
        return plan, direct
    fold = batch_fold.choose(plan, inputs) if fallback else None
    if fold is not None:  # a short batch next to a summed label in both inputs, folded
        views = batch_fold.operands(fold, inputs)
        plan.fold = fold
        plan.rewrite_product = _plan(
            fold.subscripts, views, None, False, False, threads, split=split, fresh=True
        )[0]
        _cache(key, (plan, direct, None))
        return plan, direct
    relaying = plan.canonical is not None and relayout and relayout_pays(plan, inputs)

    def contraction(
        subscripts: str, operands: list[np.ndarray], target: np.ndarray, last: bool
    ) -> Plan:
        options, planned = _step_options(accumulate, relu, last, out, relaying)
        return _plan(subscripts, operands, target, *options, threads, **planned)[0]

    copies = _elementwise_copies(plan, inputs, out) if fallback else None
    if copies is None and fallback:
        copies = _streaming_result(plan, inputs, out)
    product = None
    if copies is not None:
        product = copy_fallback.copies_planned(plan, inputs, out, contraction, copies[0])
    if copies is not None and product is not None:
        plan.canonical, plan.product, plan.elementwise_copies = copies[0], product, copies[1]
    elif plan.canonical is not None:
        if not fallback:  # cached as planned: the key holds fallback
            _cache(key, (plan, direct, None))
            return plan, direct

        # A memory-bound contraction that runs kernels as it lies is not worth its result
        # copied (random memory-bound einsums, K of 2-8: with the result's copies allowed,
        # cdebh,ehdbf->hfdbc 0.43 -> 1.05 ms, fd,gahf->ahdg 0.07 -> 0.21 ms).
        intense = compute_bound(plan, inputs)
        copy_result = not runs_kernels(plan) or intense

        # A plan that runs kernels as the operands lie, filling few vector lanes or summing
        # short runs of K: the copies pay only when their kernel fills at least twice as
        # many lanes, or sums several times as many steps with as many lanes; one running
        # another kernel than the plain outer-product one, when they give that kernel (or
        # one nearer to it: ``relaid``) within the scratch buffer's size.
        def pays(orders: copy_fallback.Orders, product: Plan) -> bool:
            fuller = vector_fill(product) >= 2 * vector_fill(plan)
            deeper = (
                short_depth(plan)
                and kernel_depth(product) >= SHORT_DEPTH_GAIN * kernel_depth(plan)
                and vector_fill(product) >= vector_fill(plan)
            )
            relaying_pays = (
                relaying
                and relaid(plan, product)
                and copy_fallback.relayout_affordable(plan, inputs, orders, out)
            )
            # tiles a few accumulators wide, the copies paid for as a relayout's are (FP64
            # eafb,bahcf->ceh, 32 FLOPs per element copied: 3.8 -> 4.6 ms)
            wider = (
                intense
                and (small_tile(plan) or narrow_tile(plan))
                and kernel_tile(product) >= TILE_GAIN * kernel_tile(plan)
                and vector_fill(product) >= vector_fill(plan)
                and copy_fallback.relayout_affordable(plan, inputs, orders, out)
            )
            # gathered dot products gain from one input copied into the other's layout;
            # copies of both cost more than they save (FP64 bdc,cdb->c 39 MB: 15.5 -> 18.5 ms)
            both = orders[0] is not None and orders[1] is not None
            gathered = both and not intense and gathered_dots(plan, inputs)
            return (
                (wider if plan.for_small_tiles else fuller or deeper or relaying_pays or wider)
                and (copy_result or orders[2] is None)
                and not gathered
            )

        as_they_lie = runs_kernels(plan)
        # (only contractions of PASS_OVER_FLOPS or more look further: below, the steps of
        # the copies cost more than the lanes they fill save)
        flops = plan.operation.config.flops if plan.operation is not None else 0
        searching = as_they_lie and flops >= PASS_OVER_FLOPS
        if partner_copy(plan, inputs):
            plan.canonical, plan.product = _partner_copy(plan, inputs, out, contraction)
        else:
            # candidates that would not pay are passed over for the next (FP32 abe,dce->badc,
            # K 5 along in1's unit stride, 63 MB result: in0 alone copied fills half the lanes
            # of the dot form's 5/16 and was dropped, in1 copied K-outermost never tried)
            plan.canonical, plan.product = copy_fallback.choose(
                plan, inputs, out, contraction, relaying, copy_result, pays if searching else None
            )
        if as_they_lie and plan.product is not None:
            assert plan.canonical is not None
            if not pays(plan.canonical, plan.product):
                plan.canonical, plan.product = None, None
        plan.steps_as_they_lie = relaying and plan.canonical is not None
    if (
        out is None
        and order == "K"
        and plan.canonical is not None
        and plan.canonical[2]
        and not relaying
    ):
        # a new result that the copies compute in another order and then permute into
        # place is laid out in that order instead (a view in the listed one; not for copies
        # made for the plain outer-product kernel, a relayout chosen with its result): FP32
        # aebd,efbc->fcade, K 5, 79 MB result, computed as eadfc: 9.0 -> 3.9 ms (NumPy 7.5);
        # FP64 bcdf,dae->cfaeb 62 MB 0.87x -> 1.6x NumPy. With the passing over of copies
        # that would not pay, 16 of 300 random einsums (2 threads) changed plans: 1.34x by
        # geometric mean, the slowest 0.89x and 0.92x (5.8x and 36x NumPy)
        computed = tuple(parsed.output.index(label) for label in plan.canonical[2])
        options = {"split": split, "fallback": fallback, "fresh": fresh, "relayout": relayout}
        replanned = _plan(
            subscripts, arrays, out, accumulate, relu, threads, **options, order=computed
        )
        entry = _plans.get(
            _key(subscripts, arrays, out, accumulate, relu, threads, **options, order=computed)
        )
        if entry is not None:  # this call's key finds the same plan next time
            _cache(key, entry)
        return replanned
    one_thread = bool(plan.regions) and all(len(r.operation.slices) == 1 for r in plan.regions)
    if split and plan.canonical is None and not any(plan.reductions):
        chain = chain_length(plan)
        idle = (
            one_thread
            or short_rows(plan, threads)
            or unbalanced(plan, threads)
            or rereading(plan, threads)
        )
        if chain_too_long(chain, arrays[0].itemsize) or idle:
            plan.split = plan_split(parsed, arrays, threads, chain)
    if plan.split is None and plan.canonical is None and threads > 1:
        share_by_regions(plan, threads)
    _cache(key, (plan, direct, direct_call(plan, inputs, arrays, out, accumulate, relu)))
    return plan, direct


# A contraction that runs kernels as its operands lie has the copying fallback pass over
# copies that would not pay for later candidates only from this many FLOPs on: FP32
# ik,jk->ij, K 5-7 along both unit strides, one thread, in1 copied kj against as they lie:
# 20 x 30 x 5 1.0 -> 5.5 us, 64 x 64 x 7 2.2 -> 5.8, 128 x 128 x 7 6.3 -> 6.9, 100 x 128 x
# 5 6.2 -> 6.2, 128 x 256 x 5 11.7 -> 7.2, 200 x 300 x 5 20.9 -> 8.8.
PASS_OVER_FLOPS = 1 << 18


def _partner_copy(
    plan: Plan,
    inputs: list[Operand],
    out: np.ndarray | None,
    contraction: copy_fallback.PlanStep,
) -> tuple[element_layout.Orders | None, Plan | None]:
    """(orders, product) of the copy of the small input alone (``partner_copy``): in the
    kernel's order or the transposed product's, the first whose kernel fills at least twice
    as many lanes and no longer few (``POOR_FILL``); (None, None) where neither does (a dot
    form along a K of 3 after the copy, FP32 edb,gehabd->ahgb: 1.4x slower)."""
    assert plan.canonical is not None
    small = 0 if inputs[0].array.size <= inputs[1].array.size else 1
    mirrored = canonical_orders(inputs, plan.out_memory, mirrored=True)
    # the large input's order as it lies: the labels it shares with the small one then run
    # alike in both (FP32 bc,acb->a, the large one's K (c, b) 28672 steps along its rows)
    large = inputs[1 - small]
    lying = element_layout.memory_order(large.labels, large.strides, large.sizes)
    own = element_layout.memory_order(
        inputs[small].labels, inputs[small].strides, inputs[small].sizes
    )
    along = "".join([x for x in own if x not in lying] + [x for x in lying if x in own])
    along_large = (along, None, None) if small == 0 else (None, along, None)
    found: list[tuple[element_layout.Orders, Plan]] = []
    for chosen in (plan.canonical, mirrored, along_large):
        orders: element_layout.Orders = (
            chosen[0] if small == 0 else None,
            chosen[1] if small == 1 else None,
            None,
        )
        product = copy_fallback.copies_planned(plan, inputs, out, contraction, orders)
        if product is not None and vector_fill(product) >= max(POOR_FILL, 2 * vector_fill(plan)):
            if copy_fallback.fits(product):
                return orders, product
            found.append((orders, product))
    # a product that needs copies of its own only where none runs on this copy as it lies
    # (FP32 dab,cad->cb, in0 a stride-2 view: copied with K as in0 lists it, unlike in1,
    # whose K the product then copied again, 246 us against NumPy's 75)
    return found[0] if found else (None, None)


def _keep_replay(
    key: tuple[Any, ...],
    plan: Plan,
    direct: tuple[bool, ...],
    replay: FallbackCall | SplitCall | DiagonalCall | FoldCall,
) -> None:
    """Cache ``replay`` as the per-call path of ``plan``'s entry (unless the entry changed)."""
    with _lock:
        if key in _plans and _plans[key][0] is plan:
            _plans[key] = (plan, direct, replay)


def _part_step(
    subscripts: str, views: list[np.ndarray], target: np.ndarray, threads: int
) -> tuple[DirectCall | None, list[np.ndarray], np.ndarray]:
    """Run one part of a split reduction (never split again); its direct call (None: it
    has none), views and target, for the split's replay."""
    _one_or_two(subscripts, views, target, threads, False, False, split=False)
    key = _key(subscripts, views, target, False, False, threads, False)
    return _direct_call_of(key), views, target


def _direct_call_of(key: tuple[Any, ...]) -> DirectCall | None:
    """The direct call cached under ``key`` (None: none, or another kind of per-call path),
    for a replay of the steps that ran it."""
    found = _plans.get(key)
    call = found[2] if found is not None else None
    return call if isinstance(call, DirectCall) else None


# Why an elementwise product's inputs are copied (Plan.elementwise_copies, for explain()).
SMALL_COPIES = (
    "the nest runs along the result's unit-stride label, along which a small input lies a "
    "stride apart (an element per line)"
)
THREE_LABELS = (
    "the nest of an elementwise product whose three tensors have their unit strides on three "
    "labels reads one of them a line per element"
)


STREAMING_RESULT = (
    "the result is small beside a large input whose unit stride it does not run along: "
    "computed along it, that input streams in long runs"
)


def _streaming_result(
    plan: Plan, inputs: list[Operand], out: np.ndarray | None
) -> tuple[element_layout.Orders, str] | None:
    """For a memory-bound contraction of a large input beside a small one into a much
    smaller result (``result_layout.streaming_label``) that runs kernels as the tensors lie
    but whose result (``out``, or a new one in C order) does not have the large input's
    unit-stride label innermost: the result computed in the large input's order and
    permuted into place, a copy of a small result (FP32 abc,a->cb, a 128, b 12, c 8192,
    into a C-ordered out, one thread: 5.1 -> 1.4 ms, NumPy 1.5; its kernel read A in runs
    of 256 bytes 393 KB apart). None where that does not apply."""
    if len(inputs) != 2 or plan.lanes is not None or plan.canonical is not None:
        return None
    if plan.memory_order is not None or not runs_kernels(plan):
        return None
    output = plan.subscripts.output
    sizes = label_sizes(inputs, output)
    order = streaming_order(inputs, output, sizes)
    if order is None:
        return None
    result = result_strides(out, output, plan.out_shape)
    if abs(result[order[-1]]) == 1:
        return None  # it runs along that label already
    return (None, None, order), STREAMING_RESULT


def _elementwise_copies(
    plan: Plan, inputs: list[Operand], out: np.ndarray | None
) -> tuple[element_layout.Orders, str] | None:
    """The copies that give an elementwise product of one-element kernels one layout
    (:mod:`element_layout`) and why; None where the plan is no such product or needs none.
    Small inputs are copied whatever the kernel: one that reads them a stride apart along
    the result's rows is a product with K of 1 read transposed (FP32 cb,a->bac, a 64, b 1024,
    c 192, one thread: 11.9 -> 1.9 ms)."""
    if len(inputs) != 2 or plan.lanes is not None:
        return None
    output = plan.subscripts.output
    if any(label not in output for op in inputs for label in op.labels):
        return None  # a label is summed
    shape = dict(zip(output, plan.out_shape))
    result = result_strides(out, output, plan.out_shape, plan.memory_order)
    tensors = [(op.labels, op.strides) for op in inputs] + [(list(output), result)]
    small = element_layout.small_copies(tensors, shape)
    if small is not None:
        return small, SMALL_COPIES
    if plan.canonical is not None or not one_element(plan):
        return None
    orders = element_layout.copy_orders(tensors, shape, plan.dtype.itemsize)
    return None if orders is None else (orders, THREE_LABELS)


def _step_options(
    accumulate: bool, relu: bool, last: bool, out: np.ndarray | None, as_they_lie: bool
) -> tuple[tuple[bool, bool], dict[str, Any]]:
    """How the copying fallback plans (and keys) a step: (accumulate, relu), then the keyword
    options. Only the last step takes the call's accumulate and ReLU; copies go to scratch
    reused call after call, while the result, without an out, is allocated for each call;
    the steps of copies made for another kernel (``as_they_lie``) are planned as they lie."""
    options = (accumulate and last, relu and last)
    planned = {"fresh": last and out is None, "fallback": False, "relayout": not as_they_lie}
    return options, planned


def _cache(key: tuple[Any, ...], entry: tuple[Plan, tuple[bool, ...], Any]) -> None:
    with _lock:
        if len(_plans) >= PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))
        _plans[key] = entry


def _returned(result: np.ndarray, out: Any) -> Any:
    """``result``, or its element as a NumPy scalar for a 0-d result the caller did not pass."""
    return result[()] if out is None and result.ndim == 0 else result


def _check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    if not isinstance(out, np.ndarray):
        out = as_array("out", out)
    if out.shape != shape:
        raise EinsumError(f"out has shape {out.shape}, the result has shape {shape}")
    if out.dtype != dtype:
        raise EinsumError(f"out has dtype {out.dtype}, the result has dtype {dtype}")
    _check_writable(out)
    checked: np.ndarray = out
    return checked


def _check_writable(out: np.ndarray) -> None:
    """``out`` can take a result: checked before planning, which would otherwise see an
    aliasing output and refuse to schedule it."""
    if not out.flags.writeable:
        raise EinsumError("out is read-only: pass a writable array")
    for size, stride in zip(out.shape, out.strides):
        if size > 1 and stride == 0 and out.size:
            raise EinsumError("out repeats elements (a broadcast view): pass a real array")


def einsum(
    subscripts: Any,
    *operands: Any,
    out: Any = None,
    threads: int | None = None,
    accumulate: bool = False,
    relu: bool = False,
    optimize: Any = None,
    dtype: Any = None,
    order: str = "K",
    casting: str = "safe",
) -> Any:
    """NumPy's ``einsum`` for any number of float32/float64 operands, run through TEIR.

    Binary contractions are classified into C/M/N/K axes, scheduled by :func:`teir.optimize`
    and compiled, so GEMM/BRGEMM kernels run directly on the operands' strided memory.
    Unary einsums (permutations, transposes, diagonals) run on Copy kernels. Three or more
    operands become an einsum tree along opt_einsum's contraction path (``optimize=`` is
    passed to it: ``"auto"`` by default, ``"greedy"``, ``"optimal"``, ``"dp"``, an explicit
    path, or ``False`` for left to right), optimized and compiled with planned intermediates.

    NumPy's sublist form, ``einsum(op0, sublist0, op1, sublist1, ..., [sublistout])`` with
    integers for labels (0-25 are 'A'-'Z', 26-51 'a'-'z', ``Ellipsis`` is '...'), is
    accepted too.

    ``out=`` is written in place (``accumulate=True`` adds the result to it instead);
    ``relu=True`` applies ``max(., 0)`` to the result. ``dtype`` (float32 or float64, also
    spelled "f32", "FP64", ...) casts the operands first; ``casting`` is accepted for
    compatibility.

    ``order`` lays out a new result (without ``out``) as NumPy's does: ``"C"``, ``"F"``,
    ``"A"`` (F where every operand is F- and not C-contiguous, else C) or ``"K"``, the
    default: where two operands contract into a result of at least 4096 elements, the
    layout teir's kernels write fastest (a result axis of the operands' unit stride
    innermost, say), returned as a view in the listed axis order, else C. Pass
    ``order="C"`` for a C-contiguous result. Three or more operands give C-ordered results
    (``"F"``: F-ordered). Unlike NumPy, the result never shares memory with an operand.

    >>> import numpy as np, teir
    >>> a, b = np.ones((3, 200, 128, 3), np.float32), np.ones((31, 3), np.float32)
    >>> r = teir.einsum("ebda,fa->fbde", a, b)   # listed, e (3) would be its unit stride
    >>> r.shape, r.strides[3] > 4, float(r[0, 0, 0, 0])
    ((31, 200, 128, 3), True, 3.0)
    >>> teir.einsum("ebda,fa->fbde", a, b, order="C").flags.c_contiguous
    True
    """
    if not isinstance(subscripts, str):
        subscripts, operands = from_sublists((subscripts, *operands))
    check_order(order)
    if type(accumulate) is not bool or type(relu) is not bool or (accumulate and out is None):
        _check_flags(accumulate, relu)
        _check_accumulate_target(accumulate, out)
    # The direct path of a cached plan; with threads=None its key has None, which the
    # entry's alias below answers (the thread count is read when shapes are first planned).
    key = None
    if dtype is None and 0 < len(operands) <= 2:
        recent = (subscripts, len(operands), out is None, accumulate, relu, threads, order)
        call = _recent.get(recent)
        if call is not None:
            result = call.fast(operands, out)
            if result is not None:
                return result
        if (
            (out is None or type(out) is np.ndarray)
            and type(operands[0]) is np.ndarray
            and type(operands[-1]) is np.ndarray
        ):
            key = _key(subscripts, operands, out, accumulate, relu, threads, order=order)
            found = _plans.get(key)
            if found is not None and found[2] is not None:
                result = found[2](operands, out)
                if result is not None:
                    _remember(recent, found[2])
                    return result
    arrays = _arrays(operands)
    if dtype is not None:
        wanted = float_dtype(dtype)
        arrays = [a if a.dtype == wanted else a.astype(wanted) for a in arrays]
    _check_threads(threads)
    if len(arrays) > 2:
        result = _multi_operand(subscripts, arrays, out, threads, accumulate, relu, optimize)
        return _in_order(result, order, arrays) if out is None else result
    count = threads or default_threads()
    result = _one_or_two(subscripts, arrays, out, count, accumulate, relu, order=order)
    if key is not None and threads is None:
        planned = _plans.get(_key(subscripts, arrays, out, accumulate, relu, count, order=order))
        if planned is not None:
            with _lock:
                _plans[key] = planned
    return result


def _in_order(result: Any, order: str, arrays: Sequence[np.ndarray]) -> Any:
    """A tree's C-ordered new ``result`` in the layout ``order`` asks for ("K": as it is)."""
    fortran = order == "F" or (order == "A" and fortran_ordered(arrays))
    return np.asfortranarray(result) if fortran and isinstance(result, np.ndarray) else result


def _check_flags(accumulate: Any, relu: Any) -> None:
    """``accumulate`` and ``relu`` are booleans."""
    for name, value in (("accumulate", accumulate), ("relu", relu)):
        if not isinstance(value, (bool, np.bool_)):
            raise EinsumError(f"{name} must be True or False, got {value!r}")


def _check_accumulate_target(accumulate: Any, out: Any) -> None:
    """``accumulate`` has an ``out`` to add to."""
    if accumulate and out is None:
        raise EinsumError(
            "accumulate=True adds the result to out: pass out= (NumPy's einsum has no "
            "accumulate; without out, leave it False)"
        )


def _check_threads(threads: Any) -> None:
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise EinsumError(f"threads must be a positive integer or None, got {threads!r}")


def _one_or_two(
    subscripts: str,
    arrays: list[np.ndarray],
    out: Any,
    threads: int,
    accumulate: bool,
    relu: bool,
    split: bool = True,
    fresh: bool = False,
    order: str = "K",
    fallback: bool = True,
    relayout: bool = True,
) -> Any:
    """:func:`einsum` of one or two operands (``split=False``: never share a reduction;
    ``fresh``: ``out`` is a result allocated for this call, see :func:`_plan`; ``order``:
    the layout of a new result; ``fallback=False``, ``relayout``: planned as the copying
    fallback plans its steps, see :func:`_plan`)."""
    out_array = None
    if out is not None:
        out_array = out if isinstance(out, np.ndarray) else as_array("out", out)
        _check_writable(out_array)
    options = (accumulate, relu, threads, split)
    plan, direct = _plan(subscripts, arrays, out_array, *options, fallback, fresh, order, relayout)
    if plan.canonical is not None and plan.product is None:  # a step that needs copies itself
        fallback = True
        plan, direct = _plan(
            subscripts, arrays, out_array, *options, fallback, fresh, order, relayout
        )
    dtype = plan.dtype
    if out_array is not None:
        out_array = _check_out(out_array, plan.out_shape, dtype)
    if plan.diagonal is not None or plan.fold is not None:
        call = _rewritten_call(plan, threads, accumulate, relu, split, fresh, order)
        key = _key(subscripts, arrays, out_array, *options, fresh, order, fallback, relayout)
        _keep_replay(key, plan, direct, call)
        return call(tuple(arrays), out_array)
    result = (
        out_array if out_array is not None else new_result(plan.out_shape, dtype, plan.memory_order)
    )
    if plan.canonical is not None:
        replay = _through_canonical(plan, arrays, out_array, result, threads, accumulate, relu)
        if replay is not None:
            key = _key(subscripts, arrays, out_array, *options, fresh, order, fallback, relayout)
            _keep_replay(key, plan, direct, replay)
        return _returned(result, out)
    if plan.empty:
        if not accumulate:
            result[...] = 0
        elif relu:
            np.maximum(result, 0, out=result)
        return _returned(result, out)
    if plan.split is not None:
        # One part of the reduction per thread into a temporary, then their sum.
        views = split_views(plan.split, plan.subscripts, arrays)
        count = plan.split.parts + (1 if plan.split.rest else 0)
        steps = []
        with scratch([(count, *plan.out_shape)], dtype) as (parts,):
            cut = parts[: plan.split.parts]
            steps.append(_part_step(plan.split.subscripts, views, cut, threads))
            if plan.split.rest:  # the indices left out of the cut, as one more part
                rest = rest_views(plan.split, plan.subscripts, arrays)
                steps.append(_part_step(subscripts, rest, parts[-1, ...], threads))
            add_parts(parts, result, accumulate)
            split_replay = split_call(
                dtype,
                plan.out_shape,
                arrays,
                out_array,
                parts,
                steps,
                accumulate,
                relu,
                plan.memory_order,
            )
        if relu:
            np.maximum(result, 0, out=result)
        if split_replay is not None:
            key = _key(subscripts, arrays, out_array, *options, fresh, order, fallback, relayout)
            _keep_replay(key, plan, direct, split_replay)
        return _returned(result, out)
    inputs: list[Operand | np.ndarray] = []
    for index, array in enumerate(arrays):
        if direct[index]:
            inputs.append(array)
        else:
            prepared = operand(array, plan.subscripts.inputs[index], index)
            labels = plan.reductions[index]
            inputs.append(sum_out(prepared, labels) if labels else prepared)
    addresses = [data_address(a if isinstance(a, np.ndarray) else a.array) for a in inputs]
    if len(addresses) == 1:
        addresses.append(0)
    unary_accumulate = accumulate and len(arrays) == 1
    overlapping = out_array is not None and any(
        np.shares_memory(out_array, a if isinstance(a, np.ndarray) else a.array) for a in inputs
    )
    negative = any(s < 0 for s in result.strides)
    if not (unary_accumulate or overlapping or negative or not result.flags.aligned):
        plan.run(addresses[0], addresses[1], data_address(result))
        return _returned(result, out)
    # Computed into a temporary, then added or copied (and ReLU applied) into place.
    with scratch([plan.out_shape], dtype) as (target,):
        plan, direct = _plan(subscripts, arrays, target, False, False, threads)
        plan.run(addresses[0], addresses[1], data_address(target))
        if accumulate:
            result += target
        else:
            result[...] = target
    if relu:
        np.maximum(result, 0, out=result)
    return _returned(result, out)


def _cached(
    subscripts: str,
    arrays: list[np.ndarray],
    target: np.ndarray | None,
    threads: int,
    accumulate: bool,
    relu: bool,
    split: bool,
    fresh: bool,
    order: str,
) -> Any:
    """:func:`_one_or_two`, through the per-call path its plan has cached if any."""
    options = (accumulate, relu, threads, split, fresh, order)
    found = _plans.get(_key(subscripts, arrays, target, *options))
    if found is not None and found[2] is not None:
        result = found[2](tuple(arrays), target)
        if result is not None:
            return result
    return _one_or_two(subscripts, arrays, target, threads, accumulate, relu, split, fresh, order)


def _rewritten_call(
    plan: Plan,
    threads: int,
    accumulate: bool,
    relu: bool,
    split: bool,
    fresh: bool,
    order: str,
) -> DiagonalCall | FoldCall:
    """The per-call path of a plan rewritten by batch_diagonal or folded by batch_fold."""
    options = (threads, accumulate, relu, split, fresh, order)
    if plan.diagonal is not None:
        diagonal = plan.diagonal

        def expanded(views: list[np.ndarray], target: np.ndarray | None) -> Any:
            return _cached(diagonal.subscripts, views, target, *options)

        return DiagonalCall(diagonal, plan.subscripts.inputs, expanded)
    fold = plan.fold
    assert fold is not None
    labels = plan.subscripts.inputs
    axis = plan.subscripts.output.index(fold.label)

    def folded(arrays: tuple[np.ndarray, ...], target: np.ndarray | None) -> Any:
        inputs = [operand(a, labels[i], i) for i, a in enumerate(arrays)]
        views = batch_fold.operands(fold, inputs)
        partial = _cached(fold.subscripts, views, None, threads, False, False, split, True, "K")
        grouped = batch_fold.grouped(fold, partial, axis)
        if not fold.rest:
            return _cached(fold.reduce, [grouped], target, *options)
        # the rest of the summed label added last, with the call's ReLU
        result = _cached(fold.reduce, [grouped], target, threads, accumulate, False, *options[3:])
        rest = batch_fold.rest_operands(fold, inputs)
        return _cached(fold.subscripts, rest, result, threads, True, relu, split, False, order)

    return FoldCall(folded)


def _through_canonical(
    plan: Plan,
    arrays: list[np.ndarray],
    out: np.ndarray | None,
    result: np.ndarray,
    threads: int,
    accumulate: bool,
    relu: bool,
) -> FallbackCall | None:
    """The documented fallback when no kernel layout fits (:mod:`copy_fallback`); returns
    the replay of its steps for later calls with the same key, or None if it has none."""
    prepared_operands = []
    for index, array in enumerate(arrays):
        prepared = operand(array, plan.subscripts.inputs[index], index)
        labels = plan.reductions[index]
        prepared_operands.append(sum_out(prepared, labels) if labels else prepared)

    steps: list[RecordedStep] = []
    record = not any(plan.reductions)  # a NumPy sum first is no step a replay could run

    def step(subscripts: str, operands: list[np.ndarray], target: np.ndarray, last: bool) -> None:
        # planned as choose() planned it
        options, planned = _step_options(accumulate, relu, last, out, plan.steps_as_they_lie)
        _one_or_two(subscripts, operands, target, threads, *options, **planned)
        if record:
            key = _key(subscripts, operands, target, *options, threads, **planned)
            steps.append(RecordedStep(_direct_call_of(key), tuple(operands), target))

    buffers: list[np.ndarray] = []
    copy_fallback.run(plan, prepared_operands, result, step, buffers)
    if not record:
        return None
    return fallback_call(
        plan.dtype, plan.out_shape, arrays, out, result, buffers, steps, plan.memory_order
    )


TREE_CACHE_SIZE = 64
_trees: dict[tuple[Any, ...], Any] = {}


def _multi_operand(
    subscripts: str,
    arrays: list[np.ndarray],
    out: Any,
    threads: int | None,
    accumulate: bool,
    relu: bool,
    optimize: Any,
) -> Any:
    """Three or more operands: an einsum tree along opt_einsum's path, optimized, compiled
    once per shapes/strides/dtype (cached) with its intermediates in one arena."""
    from teir.tree.from_einsum import compile_einsum, permuted_views, prepare

    if threads is None:
        threads = default_threads()
    path_key = optimize if isinstance(optimize, (str, bool, type(None))) else repr(optimize)
    key = (*_key(subscripts, arrays, None, accumulate, relu, threads), path_key)
    found = _trees.get(key)
    if found is None:
        parsed = parse(subscripts, [a.ndim for a in arrays])
        tree, prepared = compile_einsum(parsed, arrays, optimize, threads, accumulate, relu)
        views = prepared.views
        with _lock:
            if len(_trees) >= TREE_CACHE_SIZE:
                _trees.pop(next(iter(_trees)))
            _trees[key] = (tree, prepared.axes)
    else:  # the same shapes and strides: the same views, as transposes where they are
        tree, axes = found
        views = (
            permuted_views(arrays, axes)
            or prepare(parse(subscripts, [a.ndim for a in arrays]), arrays).views
        )
    if out is not None:
        out = _check_out(
            out if isinstance(out, np.ndarray) else as_array("out", out),
            tree.out_shape,
            tree.dtype,
        )
    result = tree(*views, out=out)
    return _returned(result, out)


def _shape(index: int, shape: Any) -> tuple[int, ...]:
    """``shape`` (contract_expression's operand ``index``) as a tuple of sizes of at least 0."""
    if isinstance(shape, np.ndarray) and shape.ndim != 1:
        raise EinsumError(
            f"shape {index} is an array of shape {shape.shape}: contract_expression takes the "
            f"operands' shapes (here {shape.shape}), not the operands"
        )
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise EinsumError(
            f"shape {index} ({shape!r}) is not a sequence of sizes: give a tuple such as "
            f"({shape!r},) for one dimension"
        )
    sizes = list(shape)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise EinsumError(f"shape {index} {tuple(sizes)!r} holds {size!r}, not an integer size")
        if size < 0:
            raise EinsumError(f"shape {index} {tuple(sizes)!r} holds a negative size ({size})")
    return tuple(int(size) for size in sizes)


class ContractExpression:
    """A compiled einsum for operands of fixed shapes (the opt_einsum convention)."""

    def __init__(
        self,
        subscripts: str,
        shapes: Sequence[Sequence[int]],
        dtype: Any,
        threads: int | None,
        accumulate: bool,
        relu: bool,
        optimize: Any = None,
        order: str = "K",
    ) -> None:
        check_order(order)
        self.order = order
        self.subscripts = subscripts
        self.shapes = tuple(_shape(index, shape) for index, shape in enumerate(shapes))
        self.dtype = float_dtype(dtype)
        self.threads = threads
        self.accumulate = accumulate
        self.relu = relu
        self.optimize = optimize
        self.plan: Plan | None = None
        self.tree: Any = None
        # a tree's operands' strides at the last call and their views' axes (prepare's)
        self._view_axes: tuple[Any, list[tuple[int, ...] | None]] | None = None
        _check_threads(threads)
        _check_flags(accumulate, relu)
        count = threads or default_threads()
        check_memory(
            sum(prod(shape) for shape in self.shapes) * self.dtype.itemsize,
            "operands of these shapes need {size}",
            "give smaller shapes",
        )
        if len(self.shapes) <= 2:  # plan now, for C-contiguous operands
            arrays = [np.zeros(shape, self.dtype) for shape in self.shapes]
            self.plan = _plan(subscripts, arrays, None, accumulate, relu, count, order=order)[0]
        else:  # compile the tree now, for C-contiguous operands (placeholders: never read)
            from teir.tree.from_einsum import compile_einsum

            arrays = [placeholder(shape, None, self.dtype) for shape in self.shapes]
            self.parsed = parse(subscripts, [len(shape) for shape in self.shapes])
            self.tree = compile_einsum(self.parsed, arrays, optimize, count, accumulate, relu)[0]

    def __call__(self, *operands: Any, out: Any = None) -> Any:
        _check_accumulate_target(self.accumulate, out)
        if not all(type(value) is np.ndarray and value.dtype == self.dtype for value in operands):
            # compiled for one dtype: operands of another are converted to it, as a tree's are
            operands = tuple(
                a if a.dtype == self.dtype else a.astype(self.dtype) for a in _arrays(operands)
            )
        if self.tree is None:  # the checked call einsum would try first
            options = (out is None, self.accumulate, self.relu, self.threads, self.order)
            call = _recent.get((self.subscripts, len(operands), *options))
            if call is not None:
                result = call.fast(operands, out)
                if result is not None:
                    return result
        if len(operands) != len(self.shapes):
            raise EinsumError(f"expected {len(self.shapes)} operands, got {len(operands)}")
        first, last = operands[0], operands[-1]
        expected = (  # one or two arrays of the expected shapes: straight to einsum's direct path
            self.tree is None
            and type(first) is np.ndarray
            and type(last) is np.ndarray
            and first.shape == self.shapes[0]
            and last.shape == self.shapes[-1]
        )
        for index, (value, shape) in enumerate([] if expected else zip(operands, self.shapes)):
            actual = value.shape if isinstance(value, np.ndarray) else tuple(np.shape(value))
            if actual != shape:
                raise EinsumError(
                    f"operand {index} has shape {actual}, the expression was built for {shape}"
                )
        if self.tree is not None:
            from teir.tree.from_einsum import permuted_views, prepare

            arrays = [
                a if a.dtype == self.dtype else a.astype(self.dtype) for a in _arrays(operands)
            ]
            if out is not None:
                out = _check_out(
                    out if isinstance(out, np.ndarray) else as_array("out", out),
                    self.tree.out_shape,
                    self.dtype,
                )
            layout = tuple(a.strides for a in arrays)
            known = self._view_axes
            views = permuted_views(arrays, known[1]) if known and known[0] == layout else None
            if views is None:
                prepared = prepare(self.parsed, arrays, self.tree.leaf_ids)
                self._view_axes = (layout, prepared.axes)
                views = prepared.views
            result = self.tree(*views, out=out)
            if out is None:
                result = _in_order(result, self.order, arrays)
            return _returned(result, out)
        return einsum(
            self.subscripts,
            *operands,
            out=out,
            threads=self.threads,
            accumulate=self.accumulate,
            relu=self.relu,
            order=self.order,
        )

    def explain(self) -> str:
        if self.tree is not None:
            return f"# einsum {self.subscripts}\n{self.tree.explain()}"
        assert self.plan is not None
        return self.plan.explain()


def contract_expression(
    subscripts: str,
    *shapes: Sequence[int],
    dtype: Any = np.float64,
    threads: int | None = None,
    accumulate: bool = False,
    relu: bool = False,
    optimize: Any = None,
    order: str = "K",
) -> ContractExpression:
    """A reusable compiled einsum for operands of the given shapes (any number of operands;
    three or more are compiled as an einsum tree along opt_einsum's path ``optimize``).
    Operands of another dtype than ``dtype`` are converted to it: the result has ``dtype``;
    ``order`` lays out new results as :func:`einsum`'s does."""
    return ContractExpression(subscripts, shapes, dtype, threads, accumulate, relu, optimize, order)


def einsum_plan(
    subscripts: Any,
    *operands: Any,
    out: Any = None,
    threads: int | None = None,
    accumulate: bool = False,
    relu: bool = False,
    order: str = "K",
) -> Plan:
    """The plan ``einsum`` uses for these operands (for ``plan.explain()``)."""
    if not isinstance(subscripts, str):
        subscripts, operands = from_sublists((subscripts, *operands))
    check_order(order)
    arrays = _arrays(operands)
    if len(arrays) > 2:
        raise EinsumError("plans are per pair of operands; see teir.einsum for more")
    out_array = None if out is None else as_array("out", out)
    count = threads or default_threads()
    return _plan(subscripts, arrays, out_array, accumulate, relu, count, order=order)[0]
