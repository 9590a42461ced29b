"""LLVM IR for a whole loop nest: one function with the tile primitives inlined.

The function is ``void nest(ptr in0, ptr in1, ptr out, i64 lo, i64 hi, ptr first, ptr last)``.
The parallel loops of the nest form one flattened index space (row-major in nest order); a call
runs the whole nest for the part ``[lo, hi)`` of it, so threads can share the work while every
output tile keeps its order of K accesses. ``first``/``last`` are per-iteration flag arrays,
used only when first/last accesses are tracked (otherwise they may be null).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

from teir.codegen.brgemm import Prefetch, brgemm_function, kernel_stack_bytes
from teir.codegen.generic import GenericSpec, generic_function
from teir.codegen.irtext import FunctionBuilder, Module, scalar_type
from teir.codegen.specs import BrgemmSpec, UnarySpec
from teir.codegen.target import Target, probe_attribute
from teir.codegen.unary import unary_function
from teir.ir import DimType, Tensor
from teir.lower.nest import Access, LoopNest
from teir.lower.tiles import TileOp

# The innermost loop of a one-element nest that steps every tensor by one element (or not at
# all) is the one to vectorize: LLVM otherwise unrolls a short one fully (32 or 48 FP32
# elements) and vectorizes the loop around it with gathers and scatters. FP32 ib,jb->ijb
# 512 x 512 x b into an out, one thread: b 32 11.5 -> 2.7 ms, 48 20.3 -> 3.5 ms; FP64 b 16
# 8.1 -> 1.9 ms; 24 random elementwise products into out views 0.99-15.7x (one 0.69x on a
# 0.1 ms case). Loops with other strides keep LLVM's choice: unrolled, it vectorizes a loop
# along which a large input lies contiguously (dab,adcbe->ecdba 3.1 -> 6.2 ms without).
ELEMENT_LOOP_PROPERTIES = ('!"llvm.loop.unroll.disable"',)

Offsets = tuple[str | int, str | int, str | int]


def _tile_op_function(
    op: TileOp, target: Target, module: Module, name: str, prefetch: Prefetch | None = None
) -> None:
    """``void name(ptr in0, ptr in1, ptr out)``: the op's kernel inside its tile loops. With
    ``prefetch`` (a BRGEMM without tile loops), ``void name(ptr in0, ptr in1, ptr out, ptr
    next_in0, ptr next_in1)``: the kernel prefetches the next call's tiles."""
    kernel = f"{name}.kernel"
    spec = op.spec
    linkage, inline = "internal", "alwaysinline"
    if isinstance(spec, BrgemmSpec):
        brgemm_function(spec, target, module, kernel, linkage, attributes=inline, prefetch=prefetch)
    elif isinstance(spec, UnarySpec):
        # measured on the permutation suite: in a nest, half-width blocks and diagonal block
        # orders (tuned for data hot in cache) cost 10-25 % (ij->ji 2048²: 1.3 -> 1.6 ms)
        unary_function(spec, target, module, kernel, linkage, attributes=inline, streamed=True)
    else:
        assert isinstance(spec, GenericSpec)
        generic_function(spec, module, kernel, linkage, attributes=inline)
    t = scalar_type(spec.itemsize)
    joined = _joined(op)
    assert not (joined and (op.loops or prefetch is not None))
    following = ""
    if joined:
        following = ", ptr %next_in0, i64 %joins"
    elif prefetch is not None:
        following = ", ptr %next_in0, ptr %next_in1"
    f = FunctionBuilder(
        module,
        f"define internal void @{name}(ptr %in0, ptr %in1, ptr %out{following}) "
        "alwaysinline nounwind",
    )
    bases = ("%in0", "%in1", "%out")

    def call(offsets: Offsets) -> None:
        pointers = [f.gep(t, bases[tensor.value], offsets[tensor.value]) for tensor in op.operands]
        if prefetch is not None:
            assert not op.loops
            pointers += [("%next_in0", "%next_in1")[tensor.value] for tensor in op.operands[:2]]
        arguments = [f"ptr {p}" for p in pointers]
        if joined:
            arguments += ["ptr %next_in0", "i64 %joins"]
        f.emit(f"call void @{kernel}({', '.join(arguments)})")

    def nested(level: int, offsets: Offsets) -> None:
        if level == len(op.loops):
            call(offsets)
            return
        loop = op.loops[level]

        def body(index: str, _: list[str]) -> list[str]:
            nested(
                level + 1,
                tuple(
                    f.add_i64(o, f.mul_i64(index, s))  # type: ignore[arg-type]
                    for o, s in zip(offsets, loop.strides)
                ),
            )
            return []

        f.loop(loop.size, [], body, "tl")

    nested(0, (0, 0, 0))
    f.finish()


def nest_stack_bytes(nest: LoopNest, target: Target) -> int:
    """The stack the nest function needs for its buffers: the packed panel and the packing
    buffers of the kernels inlined into it."""
    itemsize = nest.config.data_type.itemsize
    total = 0 if nest.panel is None else nest.panel.elements * itemsize
    for op in (nest.first, nest.main, nest.main_zero, nest.last):
        if op is not None and isinstance(op.spec, BrgemmSpec):
            total += kernel_stack_bytes(op.spec, target)
    return total


def prefetch_for(nest: LoopNest, role: str) -> Prefetch | None:
    """Which of the kernel's inputs the op in ``role`` prefetches for the next iteration of
    the innermost loop: those that move with it, for a main BRGEMM called straight on the
    tensors (no tile loops), but not a packed panel's (it reads that from the buffer).

    The other input of a panel nest is the one its loops sweep past the panel, tile by tile,
    from beyond L2: prefetched, its tiles arrive before the kernel waits for them (one thread,
    alternating, ``abcd,dbef->acef`` 32^6, whose in0 tiles are 32 x 32 blocks of 128-256
    byte columns: FP64 median 32-50 -> 53-55 GFLOP/s, FP32 96-107 -> 109-112)."""
    op: TileOp | None = getattr(nest, role)
    if role not in ("main", "main_zero") or op is None:
        return None
    if not isinstance(op.spec, BrgemmSpec) or op.loops:
        return None
    if not nest.loops:
        return None
    strides = nest.loops[-1].strides
    packed = nest.panel.tensor if nest.panel is not None else None
    a, b = (strides[t.value] != 0 and t is not packed for t in op.operands[:2])
    return Prefetch(a, b) if a or b else None


def _joined(op: TileOp) -> bool:
    return isinstance(op.spec, UnarySpec) and op.spec.joined


def joined_loops(nest: LoopNest, op: TileOp) -> list[int]:
    """The loops (innermost first) that continue the columns of ``op``, a joined
    transposed Copy or ReLU of ``nest`` (``UnarySpec.joined``): the first one steps the output
    by a column's length, each next one by the span of those before it, so that the tile
    after this one (in the output's memory) is this one with the innermost of them that is
    not at its end stepped, those inside it back at 0."""
    assert isinstance(op.spec, UnarySpec) and op.spec.joined
    out = Tensor.OUT.value
    chain: list[int] = []
    span = op.spec.m
    while True:
        found = [i for i, loop in enumerate(nest.loops) if loop.strides[out] == span]
        if len(found) != 1 or found[0] in chain:
            return chain
        chain.append(found[0])
        span *= nest.loops[found[0]].size


def nest_function(nest: LoopNest, target: Target, module: Module, name: str) -> None:
    """Add the nest function ``name`` (and its tile primitives) to ``module``."""
    ops: dict[str, str] = {}
    prefetching: set[str] = set()  # the roles whose kernels take the next iteration's tiles
    transposed = nest.transposed
    # a transposing kernel's tile takes the place of the innermost loops and their ops
    roles: list[tuple[str, TileOp | None]] = (
        [("transposed", transposed.op)]
        if transposed is not None
        else [(role, getattr(nest, role)) for role in ("first", "main", "main_zero", "last")]
    )
    for role, op in roles:
        if op is not None:
            ops[role] = f"{name}.{role}"
            prefetch = prefetch_for(nest, role)
            if prefetch is not None:
                prefetching.add(role)
            _tile_op_function(op, target, module, ops[role], prefetch)
    panel = nest.panel
    if panel is not None:
        _tile_op_function(panel.copy, target, module, f"{name}.pack")
    t = scalar_type(nest.config.data_type.itemsize)
    probes = probe_attribute(target, nest_stack_bytes(nest, target))
    f = FunctionBuilder(
        module,
        f"define void @{name}(ptr noalias %in0, ptr noalias %in1, "
        f"ptr noalias %out, i64 %lo, i64 %hi, ptr %first, ptr %last) nounwind{probes}",
    )
    if panel is not None:
        f.entry_alloca(f"%panel = alloca {t}, i64 {panel.elements}, align 64")
    loops = nest.loops
    main_spec = nest.main.spec if nest.main is not None else None
    one_element = isinstance(main_spec, BrgemmSpec) and main_spec.one_element
    sizes_after = [prod(loop.size for loop in loops[i + 1 :]) for i in range(len(loops))]
    parallel_after = [
        prod(loop.size for loop in loops[i + 1 :] if loop.parallel) for i in range(len(loops))
    ]

    joins = {role: joined_loops(nest, op) for role, op in roles if op is not None and _joined(op)}

    def joined_arguments(role: str, offsets: Offsets, indices: list[str | int]) -> list[str]:
        """``ptr next_in0, i64 joins`` for a joined op (see ``joined_loops``)."""
        chain = joins[role]
        step: str | int = 0
        before: str | int = 0
        after: str | int = 0
        for position, i in reversed(list(enumerate(chain))):
            loop, index = loops[i], indices[i]
            # stepping loop i resets the ones inside it (chain[:position]) to 0
            delta = loop.strides[0] - sum(
                (loops[j].size - 1) * loops[j].strides[0] for j in chain[:position]
            )
            room = f.assign(f"icmp slt i64 {index}, {loop.size - 1}", "c")
            step = f.assign(f"select i1 {room}, i64 {delta}, i64 {step}", "i")
            more = f.assign(f"zext i1 {room} to i64", "i")
            after = f.assign(f"or i64 {after}, {more}", "i")
            started = f.assign(f"icmp sgt i64 {index}, 0", "c")
            less = f.assign(f"zext i1 {started} to i64", "i")
            before = f.assign(f"or i64 {before}, {less}", "i")
        flags: str | int = 0
        if chain:
            flags = f.assign(f"or i64 {f.assign(f'shl i64 {after}, 1', 'i')}, {before}", "i")
        following = f.gep(t, "%in0", f.add_i64(offsets[0], step))
        return [f"ptr {following}", f"i64 {flags}"]

    def call(
        role: str,
        offsets: Offsets,
        following: Offsets | None = None,
        indices: list[str | int] | None = None,
    ) -> None:
        pointers = [f.gep(t, base, offsets[i]) for i, base in enumerate(("%in0", "%in1", "%out"))]
        if panel is not None and role in ("main", "main_zero"):
            pointers[panel.tensor.value] = "%panel"  # the packed operand comes from the buffer
        if role in prefetching:
            assert following is not None
            pointers += [f.gep(t, base, following[i]) for i, base in enumerate(("%in0", "%in1"))]
        arguments = [f"ptr {p}" for p in pointers]
        if role in joins:
            assert indices is not None
            arguments += joined_arguments(role, offsets, indices)
        f.emit(f"call void @{ops[role]}({', '.join(arguments)})")

    def pack(offsets: Offsets) -> None:
        pointers = [f.gep(t, base, offsets[i]) for i, base in enumerate(("%in0", "%in1"))]
        f.emit(f"call void @{name}.pack(ptr {pointers[0]}, ptr {pointers[1]}, ptr %panel)")

    def k_condition(indices: list[str | int], at_end: bool) -> str | None:
        """i1 that is true when every K loop index is 0 (or maximal); None if no K loop."""
        terms = []
        for loop, index in zip(loops, indices):
            if loop.dim_type is DimType.K:
                bound = loop.size - 1 if at_end else 0
                terms.append(f.assign(f"icmp eq i64 {index}, {bound}", "c"))
        if not terms:
            return None
        result = terms[0]
        for term in terms[1:]:
            result = f.assign(f"and i1 {result}, {term}", "c")
        return result

    def flag(array: str, iteration: str | int) -> str:
        pointer = f.gep("i8", array, iteration)
        value = f.assign(f"load i8, ptr {pointer}, align 1", "s")
        return f.assign(f"icmp ne i8 {value}, 0", "c")

    def guarded(
        condition: str | None, body: Callable[[], None], otherwise: Callable[[], None] | None = None
    ) -> None:
        if condition is None:  # always true
            body()
        else:
            f.when(condition, body, otherwise)

    def innermost(offsets: Offsets, indices: list[str | int], following: Offsets | None) -> None:
        first_condition = last_condition = None
        if nest.access is Access.K_INDICES:
            first_condition = k_condition(indices, at_end=False)
            last_condition = k_condition(indices, at_end=True)
        elif nest.access is Access.TRACKED:
            iteration: str | int = 0
            for index, stride in zip(indices, sizes_after):
                iteration = f.add_i64(iteration, f.mul_i64(index, stride))
            first_condition = flag("%first", iteration)
            last_condition = flag("%last", iteration)
        if "main_zero" in ops:
            guarded(
                first_condition,
                lambda: call("main_zero", offsets, following),
                (lambda: call("main", offsets, following)) if first_condition is not None else None,
            )
        else:
            if "first" in ops:
                guarded(first_condition, lambda: call("first", offsets))
            if "main" in ops:
                call("main", offsets, following, indices)
        if "last" in ops:
            guarded(last_condition, lambda: call("last", offsets))

    def level(
        depth: int,
        offsets: Offsets,
        indices: list[str | int],
        prefix: str | int,
        following: Offsets | None = None,
    ) -> None:
        if panel is not None and depth == panel.depth:
            pack(offsets)
        if transposed is not None and depth == transposed.depth:
            call("transposed", offsets)
            return
        if depth == len(loops):
            innermost(offsets, indices, following)
            return
        loop = loops[depth]
        end: str | int = loop.size  # of this thread's part of the loop

        def descend(index: str, prefix: str | int) -> None:
            moved = tuple(f.add_i64(o, f.mul_i64(index, s)) for o, s in zip(offsets, loop.strides))
            following = None
            if prefetching and depth == len(loops) - 1:
                # the next iteration's tiles; the last iteration's own (already in cache)
                after = f.assign(f"add i64 {index}, 1", "i")
                more = f.assign(f"icmp slt i64 {after}, {end}", "c")
                following = tuple(
                    f.assign(f"select i1 {more}, i64 {f.add_i64(o, s)}, i64 {o}", "i") if s else o
                    for o, s in zip(moved, loop.strides)
                )
            level(depth + 1, moved, [*indices, index], prefix, following)  # type: ignore[arg-type]

        if not loop.parallel:

            def body(index: str, _: list[str]) -> list[str]:
                descend(index, prefix)
                return []

            properties = None
            unit = all(stride in (0, 1) for stride in loop.strides)
            if depth == len(loops) - 1 and one_element and unit:
                properties = module.loop_properties(*ELEMENT_LOOP_PROPERTIES)
            f.loop(loop.size, [], body, f"l{loop.axis}", properties)
            return
        # The part of this loop's range whose flattened block intersects [lo, hi).
        inner = parallel_after[depth]
        base = f.mul_i64(prefix, loop.size)
        low = f.assign(f"udiv i64 %lo, {inner}", "i") if inner > 1 else "%lo"
        low = f.assign(f"sub i64 {low}, {base}", "i") if base != 0 else low
        low = f.assign(f"call i64 @llvm.smax.i64(i64 {low}, i64 0)", "i")
        high = f.assign(f"add i64 %hi, {inner - 1}", "i") if inner > 1 else "%hi"
        high = f.assign(f"udiv i64 {high}, {inner}", "i") if inner > 1 else high
        high = f.assign(f"sub i64 {high}, {base}", "i") if base != 0 else high
        high = f.assign(f"call i64 @llvm.smin.i64(i64 {high}, i64 {loop.size})", "i")
        end = high
        f.range_loop(
            low, high, lambda index: descend(index, f.add_i64(base, index)), f"p{loop.axis}"
        )

    module.declare("smax", "declare i64 @llvm.smax.i64(i64, i64)")
    module.declare("smin", "declare i64 @llvm.smin.i64(i64, i64)")
    level(0, (0, 0, 0), [], 0)
    f.finish()
