"""Memory for a tree's intermediates: one arena, each intermediate at an offset, reused by
intermediates whose lifetimes do not overlap.

A lifetime is the range of steps (inclusive) from the step that writes a tensor to the last
step that reads it. The lower bound on any arena is the largest total of tensors live at one
step; that is also what a library freeing each intermediate right after its last use (as
opt_einsum does) holds at its peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from teir.tree.nodes import Node, NodeKind, post_order

ALIGN = 64


@dataclass(frozen=True)
class Lifetime:
    nbytes: int
    first: int  # the step that writes it
    last: int  # the last step that reads it


@dataclass(frozen=True)
class Arena:
    offsets: tuple[int, ...]  # bytes, one per lifetime
    nbytes: int  # the arena's size
    live_peak: int  # the lower bound: most bytes live at one step


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def live_peak(lifetimes: Sequence[Lifetime]) -> int:
    steps = {t for life in lifetimes for t in (life.first, life.last)}
    return max(
        (sum(x.nbytes for x in lifetimes if x.first <= t <= x.last) for t in steps), default=0
    )


def _first_fit(lifetimes: Sequence[Lifetime], order: Sequence[int]) -> tuple[list[int], int]:
    offsets = [0] * len(lifetimes)
    placed: list[int] = []
    end = 0
    for index in order:
        life = lifetimes[index]
        size = _aligned(life.nbytes)
        busy = sorted(
            (offsets[j], offsets[j] + _aligned(lifetimes[j].nbytes))
            for j in placed
            if lifetimes[j].first <= life.last and life.first <= lifetimes[j].last
        )
        offset = 0
        for start, stop in busy:
            if offset + size <= start:
                break
            offset = max(offset, stop)
        offsets[index] = offset
        placed.append(index)
        end = max(end, offset + size)
    return offsets, end


def plan_arena(lifetimes: Sequence[Lifetime]) -> Arena:
    """Offsets for every lifetime: the better of first-fit in step order and first-fit
    largest first (both reuse memory across disjoint lifetimes)."""
    n = len(lifetimes)
    candidates = [
        _first_fit(lifetimes, sorted(range(n), key=lambda i: (lifetimes[i].first, i))),
        _first_fit(lifetimes, sorted(range(n), key=lambda i: (-lifetimes[i].nbytes, i))),
    ]
    offsets, nbytes = min(candidates, key=lambda c: c[1])
    return Arena(tuple(offsets), nbytes, live_peak(lifetimes))


def free_room(lifetimes: Sequence[Lifetime], arena: Arena, step: int) -> tuple[int, int]:
    """The longest run of arena bytes no tensor live at ``step`` occupies: (offset, bytes).
    A step may use it as scratch: what lies there was last read before it, or is written
    after it."""
    busy = sorted(
        (offset, offset + _aligned(life.nbytes))
        for life, offset in zip(lifetimes, arena.offsets)
        if life.first <= step <= life.last
    )
    best, start = (0, 0), 0
    for begin, end in [*busy, (arena.nbytes, arena.nbytes)]:
        if begin - start > best[1]:
            best = (start, begin - start)
        start = max(start, end)
    return best


def tree_lifetimes(
    root: Node, sizes: Sequence[int], itemsize: int
) -> tuple[list[Node], list[Node], list[Lifetime]]:
    """The tree's steps (its inner nodes, in the order they are computed: post-order), its
    intermediates (those steps but the root, which is the result) and their lifetimes."""
    inner = [n for n in post_order(root) if n.kind is not NodeKind.LEAF]
    position = {id(n): s for s, n in enumerate(inner)}
    last_use = {id(n): position[id(n)] for n in inner}
    for s, node in enumerate(inner):
        for child in node.children:
            if child.kind is not NodeKind.LEAF:
                last_use[id(child)] = s
    buffered = [n for n in inner if n is not root]
    lifetimes = [
        Lifetime(n.elements(sizes) * itemsize, position[id(n)], last_use[id(n)]) for n in buffered
    ]
    return inner, buffered, lifetimes


def path_peak(root: Node, sizes: Sequence[int], itemsize: int) -> int:
    """Peak intermediate bytes of a library that runs the tree's contractions in its order
    and frees each result after the step that consumes it (opt_einsum on the same path):
    permutations are views there, so only contraction results count."""
    contractions = [n for n in post_order(root) if n.kind is NodeKind.CONTRACTION]
    step = {id(n): s for s, n in enumerate(contractions)}

    def consumer(node: Node, parent: Node | None) -> dict[int, int]:
        found: dict[int, int] = {}
        for child in node.children:
            target = node if node.kind is NodeKind.CONTRACTION else parent
            if child.kind is NodeKind.CONTRACTION and target is not None:
                found[id(child)] = step[id(target)]
            found.update(consumer(child, target))
        return found

    last = consumer(root, None)
    lifetimes = [
        Lifetime(n.elements(sizes) * itemsize, step[id(n)], last[id(n)])
        for n in contractions
        if n is not root and id(n) in last
    ]
    return live_peak(lifetimes)


__all__ = [
    "Arena",
    "Lifetime",
    "free_room",
    "live_peak",
    "path_peak",
    "plan_arena",
    "tree_lifetimes",
]
