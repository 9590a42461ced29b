"""A compiled einsum tree: every node planned and compiled once, intermediates in one arena.

Calling it checks the leaves, then runs the nodes in post-order on raw addresses: no
allocation but the result (none with ``out=``). A node may run in slabs of another order
through arena bytes free at its step (:mod:`teir.tree.slabs`). Documented exceptions: a leaf
that is not laid out as compiled is copied first, a node that sums an id of one operand
only (einsum semantics) reduces it with NumPy first, and a node that would add into each
element more than ``LONGEST_CHAIN`` times in a row runs through ``teir.einsum``, which cuts
the sum into parts in its scratch buffer (semantics decision 8).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from teir.buffers import aligned_empty
from teir.frontend import batch_diagonal, batch_fold
from teir.frontend.einsum_plan import (
    Plan,
    kernel_shortfall,
    make_plan,
    placeholder,
    share_by_regions,
)
from teir.frontend.split_reduction import chain_length, chain_too_long
from teir.ir.layout import is_injective
from teir.kernels.arrays import data_address
from teir.runtime.arguments import as_array
from teir.tree.layout import einsum_text, lonely_ids, row_major_strides, subscripts
from teir.tree.memory import Arena, free_room, plan_arena, tree_lifetimes
from teir.tree.nodes import Node, NodeKind, leaves, to_string, total_flops
from teir.tree.parse import TreeError
from teir.tree.slabs import Slabs, plan_slabs, worth_slabs

LEAF, BUFFER, RESULT = "leaf", "buffer", "result"


@dataclass(frozen=True)
class Slot:
    """Where a node's tensor lives: a leaf argument, the arena (at a byte offset) or the
    result."""

    kind: str
    index: int = 0  # the leaf's position, or the byte offset in the arena


@dataclass
class Step:
    node: Node
    inputs: tuple[Slot, ...]
    output: Slot
    plan: Plan | None  # None: run through teir.einsum, for the reason below
    slabs: Slabs | None = None  # set: runs in slabs of another order instead of ``plan``
    reason: str = ""  # why teir.einsum runs it (plan None)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


class CompiledTree:
    """An einsum tree ready to run: ``tree(*leaves, out=None)`` returns the root's tensor.

    Leaves are passed in the order of their ``leaf`` index (the order they appear in the
    string that was parsed), each shaped by its ids' sizes, row-major.
    """

    def __init__(
        self,
        root: Node,
        sizes: Sequence[int],
        dtype: Any,
        threads: int,
        leaf_strides: Sequence[Sequence[int]] | None = None,
        accumulate: bool = False,
        relu: bool = False,
    ) -> None:
        self.root = root
        self.sizes = tuple(sizes)
        self.dtype = np.dtype(dtype)
        self.threads = threads
        self.accumulate = accumulate
        self.relu = relu
        leaf_nodes = leaves(root)
        if [n.leaf for n in leaf_nodes] != list(range(len(leaf_nodes))):
            raise TreeError("the leaves of a tree must be numbered 0, 1, ... without gaps")
        self.leaf_ids = [n.ids for n in leaf_nodes]
        self.leaf_shapes = [n.shape(self.sizes) for n in leaf_nodes]
        if leaf_strides is None:
            leaf_strides = [
                [row_major_strides(ids, self.sizes)[i] for i in ids] for ids in self.leaf_ids
            ]
        self.leaf_strides = [tuple(s) for s in leaf_strides]
        self.out_shape = root.shape(self.sizes)
        self.flops = total_flops(root, self.sizes)
        self._lock = threading.Lock()
        self._build()

    # ---- planning ------------------------------------------------------------------------
    def _build(self) -> None:
        inner, buffered, lifetimes = tree_lifetimes(self.root, self.sizes, self.dtype.itemsize)
        self.arena_plan: Arena = plan_arena(lifetimes)
        offsets = {id(n): o for n, o in zip(buffered, self.arena_plan.offsets)}
        self._arena = aligned_empty((self.arena_plan.nbytes,), np.uint8)
        self._arena_address = data_address(self._arena) if self.arena_plan.nbytes else 0

        def slot(node: Node) -> Slot:
            if node.kind is NodeKind.LEAF:
                return Slot(LEAF, node.leaf)
            if node is self.root:
                return Slot(RESULT)
            return Slot(BUFFER, offsets[id(node)])

        self.steps: list[Step] = []
        for number, node in enumerate(inner):
            inputs = tuple(slot(c) for c in node.children)
            output = slot(node)
            room = free_room(lifetimes, self.arena_plan, number)
            self.steps.append(self._step(node, inputs, output, room))

    def _view(self, node: Node, where: Slot) -> Any:
        shape = node.shape(self.sizes)
        if where.kind == LEAF:
            return placeholder(shape, self.leaf_strides[where.index], self.dtype)
        strides = row_major_strides(node.ids, self.sizes)
        if where.kind == RESULT:
            return placeholder(shape, [strides[i] for i in node.ids], self.dtype)
        return self._buffer_view(node, where.index)

    def _buffer_view(self, node: Node, offset: int) -> np.ndarray:
        count = node.elements(self.sizes)
        flat = self._arena[offset : offset + count * self.dtype.itemsize].view(self.dtype)
        view: np.ndarray = flat.reshape(node.shape(self.sizes))
        return view

    def _strides(self, node: Node, where: Slot) -> dict[int, int]:
        """Element strides of the node's tensor, per id."""
        if where.kind == LEAF:
            return dict(zip(node.ids, self.leaf_strides[where.index]))
        return row_major_strides(node.ids, self.sizes)

    def _step(
        self, node: Node, inputs: tuple[Slot, ...], output: Slot, room: tuple[int, int]
    ) -> Step:
        if lonely_ids(node):
            return Step(node, inputs, output, None, reason="it sums an id of one operand")
        root = output.kind == RESULT
        if root and self.accumulate and len(node.children) == 1:
            # A Copy overwrites its output: teir.einsum adds the permuted root through a
            # temporary instead.
            return Step(node, inputs, output, None, reason="a Copy would overwrite out=")
        arrays = [self._view(c, s) for c, s in zip(node.children, inputs)]
        plan, prepared = make_plan(
            subscripts(node),
            arrays,
            self._view(node, output),
            self.accumulate and root,
            self.relu and root,
            self.threads,
            relayout=False,
            resident_output=output.kind == BUFFER,  # the root's result is allocated per call
        )
        if plan.canonical is not None or plan.empty or any(plan.reductions):
            # not expected after legalize; teir.einsum handles it correctly
            return Step(node, inputs, output, None, reason="it has a size 0 or needs copies")
        rewrite = batch_diagonal.choose(plan, prepared) or batch_fold.choose(plan, prepared)
        if rewrite is not None:
            how = (
                "expands an operand along a diagonal"
                if isinstance(rewrite, batch_diagonal.Diagonal)
                else "folds it with the summed label over it"
            )
            why = f"its short batch is the result's unit stride: teir.einsum {how}"
            return Step(node, inputs, output, None, reason=why)
        chain = chain_length(plan)
        if chain_too_long(chain, self.dtype.itemsize):
            # teir.einsum cuts the sum into parts (semantics decision 8), through its scratch
            # buffer: ij,ij,j->j 10^6 x 4 FP32 erred by 3.6e-4 in one chain
            return Step(
                node,
                inputs,
                output,
                None,
                reason=f"it adds {chain} times in a row into each element; teir.einsum cuts "
                "that into parts, for accuracy",
            )
        if self.threads > 1:  # output axes that give the threads nothing to share evenly
            share_by_regions(plan, self.threads)
        slabs = None
        if not (root and self.accumulate) and worth_slabs(node, plan, self.sizes):
            # (not when accumulating into the root: the permutation of a slab overwrites)
            strides = [self._strides(c, s) for c, s in zip(node.children, inputs)]
            strides.append(self._strides(node, output))
            slabs = plan_slabs(
                node, self.sizes, strides, self.dtype, self.threads, self.relu and root, room
            )
        return Step(node, inputs, output, plan, slabs)

    # ---- running -------------------------------------------------------------------------
    def _leaves(self, tensors: Sequence[Any]) -> list[np.ndarray]:
        if len(tensors) != len(self.leaf_shapes):
            raise TreeError(
                f"the tree has {len(self.leaf_shapes)} leaves but {len(tensors)} tensors were "
                "given (one per leaf, in the order the leaves appear in the tree string)"
            )
        arrays = []
        for index, value in enumerate(tensors):
            if isinstance(value, np.generic):
                value = np.asarray(value)  # a NumPy scalar: a leaf of no ids
            array = value if isinstance(value, np.ndarray) else as_array(f"leaf {index}", value)
            shape = self.leaf_shapes[index]
            if array.shape != shape:
                raise TreeError(
                    f"leaf {index} (ids {list(self.leaf_ids[index])}) has shape {array.shape}, "
                    f"the tree needs {shape} (the sizes of its ids, in its order)"
                )
            if array.dtype != self.dtype:
                raise TreeError(
                    f"leaf {index} has dtype {array.dtype}, the tree was compiled for "
                    f"{self.dtype}: convert it with .astype(np.{self.dtype})"
                )
            expected = self.leaf_strides[index]
            strides = tuple(
                s // array.itemsize if n > 1 else 0 for n, s in zip(array.shape, array.strides)
            )
            if strides != tuple(s if n > 1 else 0 for n, s in zip(shape, expected)):
                array = _laid_out(array, expected)  # documented: copied as compiled
            if not array.flags.aligned:  # kernels assume whole elements: a copy
                array = np.require(array, requirements="A")
            arrays.append(array)
        return arrays

    def _result(self, out: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """(where the root is computed, the user's ``out`` if that is somewhere else)."""
        if out is None:
            if self.accumulate:  # (an empty array holds whatever memory held before)
                raise TreeError(
                    "the tree was compiled with accumulate=True, which adds the result to out: "
                    "pass out=, or compile it without accumulate"
                )
            return aligned_empty(self.out_shape, self.dtype), None
        array = out if isinstance(out, np.ndarray) else as_array("out", out)
        if array.shape != self.out_shape or array.dtype != self.dtype:
            raise TreeError(
                f"out has shape {array.shape} and dtype {array.dtype}; the result has shape "
                f"{self.out_shape} and dtype {self.dtype}"
            )
        if not array.flags.writeable:
            raise TreeError("out is read-only")
        if array.flags.c_contiguous and array.flags.aligned:
            return array, None
        target = aligned_empty(self.out_shape, self.dtype)
        if self.accumulate:
            target[...] = array
        return target, array

    def __call__(self, *leaves: Any, out: Any = None) -> np.ndarray:
        arrays = self._leaves(leaves)
        result, user_out = self._result(out)
        if any(np.may_share_memory(result, a) for a in arrays):
            target = aligned_empty(self.out_shape, self.dtype)
            if self.accumulate:
                target[...] = result
            self._run(arrays, target)
            result[...] = target
        else:
            self._run(arrays, result)
        if user_out is not None:
            user_out[...] = result
            return user_out
        return result

    def _run(self, arrays: list[np.ndarray], result: np.ndarray) -> None:
        if not self.steps:  # the tree is one leaf: its copy
            result[...] = arrays[0] if not self.accumulate else result + arrays[0]
            if self.relu:
                np.maximum(result, 0, out=result)
            return
        leaf_addresses = [data_address(a) for a in arrays]
        result_address = data_address(result)

        def address(where: Slot) -> int:
            if where.kind == LEAF:
                return leaf_addresses[where.index]
            if where.kind == RESULT:
                return result_address
            return self._arena_address + where.index

        with self._lock:  # the arena is shared by every call
            for step in self.steps:
                if step.plan is None:
                    self._run_einsum(step, arrays, result)
                    continue
                a1 = address(step.inputs[1]) if len(step.inputs) == 2 else 0
                if step.slabs is not None:
                    step.slabs.run(
                        address(step.inputs[0]), a1, address(step.output), self._arena_address
                    )
                    continue
                step.plan.run(address(step.inputs[0]), a1, address(step.output))

    def _run_einsum(self, step: Step, arrays: list[np.ndarray], result: np.ndarray) -> None:
        from teir.frontend.einsum import einsum

        def array(node: Node, where: Slot) -> np.ndarray:
            if where.kind == LEAF:
                return arrays[where.index]
            if where.kind == RESULT:
                return result
            return self._buffer_view(node, where.index)

        root = step.output.kind == RESULT
        einsum(
            einsum_text(step.node),
            *(array(c, s) for c, s in zip(step.node.children, step.inputs)),
            out=array(step.node, step.output),
            threads=self.threads,
            accumulate=self.accumulate and root,
            relu=self.relu and root,
        )

    # ---- reporting -----------------------------------------------------------------------
    @property
    def intermediate_bytes(self) -> int:
        """The arena's size: the peak memory of the intermediates."""
        return self.arena_plan.nbytes

    def explain(self) -> str:
        """The tree, each node with its FLOPs, its tensor's size and where it lives, and the
        TEIR configuration it runs."""
        lines = [
            f"# einsum tree {to_string(self.root)}",
            f"# {self.dtype.name}, {self.threads} thread(s), {self.flops / 1e9:.4g} GFLOP per "
            f"call; intermediates: arena {_mib(self.arena_plan.nbytes)} (live peak "
            f"{_mib(self.arena_plan.live_peak)}), result {_mib(result_bytes(self))}",
        ]
        for number, step in enumerate(self.steps):
            node = step.node
            kind = node.kind.value
            operands = " x ".join(str(list(c.ids)) for c in node.children)
            where = "result" if step.output.kind == RESULT else f"arena @ {step.output.index} B"
            lines.append("")
            lines.append(
                f"## step {number}: {kind} {operands} -> {list(node.ids)}: "
                f"{node.flops(self.sizes) / 1e9:.4g} GFLOP, "
                f"{_mib(node.elements(self.sizes) * self.dtype.itemsize)} in {where}"
            )
            if step.plan is None:
                lines.append(f"# runs through teir.einsum: {step.reason}")
            elif step.slabs is not None:
                identified = [x for x in step.plan.log if x.startswith("identify primitive")]
                lines.append(
                    f"# in its own order: {'; '.join(identified)}, whose kernel "
                    f"{kernel_shortfall(step.plan)}"
                )
                lines += step.slabs.explain().splitlines()
            else:
                lines += [line for line in step.plan.explain().splitlines()[1:]]
        return "\n".join(lines)


def result_bytes(tree: CompiledTree) -> int:
    return prod(tree.out_shape) * int(tree.dtype.itemsize)


def _laid_out(array: np.ndarray, strides: Sequence[int]) -> np.ndarray:
    """A copy of ``array`` with the element ``strides`` the tree was compiled for (a leaf
    compiled as a diagonal of a square operand lies n + 1 elements apart, not 1)."""
    shape = array.shape
    if not is_injective(list(shape), list(strides)) or any(s < 0 for s in strides):
        raise TreeError(
            f"a leaf of shape {shape} with strides {array.strides} cannot be laid out as the "
            f"tree was compiled (element strides {tuple(strides)}, which repeat elements): "
            "pass it laid out as when compiled, or compile the tree for this layout"
        )
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)
    if 0 in shape:
        extent = 1
    buffer = aligned_empty((extent,), array.dtype)
    copy = np.lib.stride_tricks.as_strided(
        buffer, shape, tuple(s * array.itemsize for s in strides), writeable=True
    )
    copy[...] = array
    return copy


__all__ = ["CompiledTree"]
