"""Einsum trees against a NumPy oracle: the course fixtures, generated trees, the rewrites,
compiled trees' argument checks and out=, and the intermediates' memory plan."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import teir
from teir.tree import rewrite
from teir.tree.memory import ALIGN, Arena, Lifetime, live_peak, plan_arena
from teir.tree.nodes import Node, NodeKind, post_order, to_string

_ROOT = Path(__file__).resolve().parents[1]
# the course fixtures: shared/ in the checkout, or beside it (/work/shared)
SPEC = (
    next(
        (p for p in (_ROOT / "shared", _ROOT.parent / "shared") if (p / "spec").is_dir()),
        _ROOT.parent / "shared",
    )
    / "spec"
    / "einsum_trees.json"
)
FIXTURES = json.loads(SPEC.read_text())
COURSE = FIXTURES["lowering"] + FIXTURES["optimization"]
SMALL = [e["tree"] for e in FIXTURES["small_tests"]]
LETTERS = string.ascii_letters
DTYPES = [np.float32, np.float64]


# ---- the oracle ------------------------------------------------------------------------------


def evaluate(node: Node, leaves) -> np.ndarray:
    """The tree evaluated node by node with np.einsum in float64 (einsum semantics: an id of
    one child that the node does not keep is summed)."""
    if node.kind is NodeKind.LEAF:
        return np.asarray(leaves[node.leaf], dtype=np.float64)
    inputs = [evaluate(child, leaves) for child in node.children]
    terms = ",".join("".join(LETTERS[i] for i in child.ids) for child in node.children)
    return np.einsum(f"{terms}->{''.join(LETTERS[i] for i in node.ids)}", *inputs)


def make_leaves(tree, seed=0, dtype=None):
    rng = np.random.default_rng(seed)
    dtype = tree.dtype if dtype is None else dtype
    return [rng.uniform(-1, 1, shape).astype(dtype) for shape in tree.leaf_shapes]


def tolerance(dtype, reduction=1):
    if np.dtype(dtype) == np.float32:
        return dict(rtol=2e-4, atol=2e-5 * max(1, reduction))
    return dict(rtol=1e-10, atol=1e-12 * max(1, reduction))


def check(tree, leaves, result, oracle_root=None):
    """``result`` equals the oracle of ``oracle_root`` (default: the tree's own root)."""
    expected = evaluate(tree.root if oracle_root is None else oracle_root, leaves)
    assert result.shape == expected.shape == tree.out_shape
    assert result.dtype == tree.dtype
    scale = max(1.0, float(np.abs(expected).max(initial=0)))
    np.testing.assert_allclose(result, expected, **tolerance(tree.dtype, scale))


def leaf_order(node: Node) -> list[tuple[int, ...]]:
    leaves = [n for n in post_order(node) if n.kind is NodeKind.LEAF]
    return [n.ids for n in sorted(leaves, key=lambda n: n.leaf)]


def nodes(node: Node) -> list[Node]:
    return list(post_order(node))


# ---- the course fixtures ---------------------------------------------------------------------


@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "optimized"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
@pytest.mark.parametrize("size", [3, 7, 19])
@pytest.mark.parametrize("text", SMALL)
def test_small_trees(text, size, dtype, optimized):
    original = teir.EinsumTree.parse(text, [size] * 4, dtype=dtype)
    tree = original.optimize() if optimized else original
    assert leaf_order(tree.root) == leaf_order(original.root)
    compiled = tree.compile()
    assert isinstance(compiled, teir.CompiledTree)
    leaves = make_leaves(original, seed=size)
    check(original, leaves, compiled(*leaves))
    # calling the tree itself compiles (and caches) it
    check(original, leaves, tree(*leaves))


def test_small_tree_values_by_hand():
    a = np.arange(6.0).reshape(2, 3)  # ids [0,2]: sizes 2, 3
    b = np.arange(12.0).reshape(4, 3)  # ids [1,2]: sizes 4, 3
    tree = teir.EinsumTree.parse("[[0,2]->[2,0]],[1,2]->[1,0]", [2, 4, 3], dtype=np.float64)
    np.testing.assert_array_equal(tree.compile()(a, b), b @ a.T)
    np.testing.assert_array_equal(tree.optimize().compile()(a, b), b @ a.T)
    x = np.arange(24.0).reshape(2, 3, 4, 1)  # "[3,2,1,0]->[3,1,2,0]"
    perm = teir.EinsumTree.parse("[3,2,1,0]->[3,1,2,0]", [1, 4, 3, 2], dtype=np.float64)
    np.testing.assert_array_equal(perm.compile()(x), x.transpose(0, 2, 1, 3))


def scaled(entry, limit):
    return [min(size, limit) for size in entry["sizes"]]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
@pytest.mark.parametrize("entry", COURSE, ids=[e["name"] for e in COURSE])
def test_course_trees_scaled_down(entry, dtype):
    for sizes in (scaled(entry, 5), [2 + (i % 3) for i in range(len(entry["sizes"]))]):
        tree = teir.EinsumTree.parse(entry["tree"], sizes, dtype=dtype)
        optimized = tree.optimize()
        assert leaf_order(optimized.root) == leaf_order(tree.root)
        assert optimized.leaf_shapes == tree.leaf_shapes
        assert optimized.out_shape == tree.out_shape
        assert optimized.root.ids == tree.root.ids
        leaves = make_leaves(tree, seed=len(sizes))
        check(tree, leaves, optimized.compile()(*leaves))
        check(tree, leaves, tree.compile()(*leaves))


@pytest.mark.parametrize("entry", COURSE, ids=[e["name"] for e in COURSE])
def test_course_trees_optimize_keeps_flops_leaves_and_result(entry):
    tree = teir.EinsumTree.parse(entry["tree"], entry["sizes"])
    optimized = tree.optimize()
    # same contractions (rewrites only permute), so the same FLOPs
    assert optimized.flops == tree.flops
    assert leaf_order(optimized.root) == leaf_order(tree.root)
    assert optimized.out_shape == tree.out_shape
    # optimizing again keeps a tree that evaluates the same
    twice = optimized.optimize()
    assert leaf_order(twice.root) == leaf_order(tree.root)


@pytest.mark.parametrize("entry", COURSE, ids=[e["name"] for e in COURSE])
def test_optimized_strings_reparse(entry):
    sizes = scaled(entry, 4)
    tree = teir.EinsumTree.parse(entry["tree"], sizes, dtype=np.float64)
    optimized = tree.optimize()
    text = optimized.to_string()
    again = teir.EinsumTree.parse(text, sizes, dtype=np.float64)
    assert again.to_string() == text
    assert again.flops == optimized.flops and again.out_shape == optimized.out_shape

    # the same tree up to leaf numbering (the string lists leaves in the order they appear)
    def shape_of(node):
        return (node.ids, tuple(shape_of(c) for c in node.children))

    assert shape_of(again.root) == shape_of(optimized.root)
    # re-parsed, its leaves are in string order: feed them so and the result is the same
    leaves = make_leaves(tree, seed=3)
    order = [n.leaf for n in post_order(optimized.root) if n.kind is NodeKind.LEAF]
    check(tree, leaves, again.compile()(*[leaves[i] for i in order]))


def test_to_string_of_an_unoptimized_tree_is_the_input():
    for entry in COURSE:
        assert teir.EinsumTree.parse(entry["tree"], entry["sizes"]).to_string() == entry["tree"]


def test_tree_properties():
    tree = teir.EinsumTree.parse(COURSE[0]["tree"], COURSE[0]["sizes"])
    assert tree.leaf_shapes == [(3, 3), (32, 128, 3), (128, 305, 32), (72, 71, 305), (100, 71)]
    assert tree.out_shape == (100, 72, 128, 128, 3)
    assert "tt_coil100" not in repr(tree) and COURSE[0]["tree"] in repr(tree)


# ---- generated trees -------------------------------------------------------------------------


@st.composite
def subtrees(draw, leaves: int, ids: list[int], counter: list[int], lonely: bool) -> Node:
    """A random subtree with this many leaves over ``ids``; leaves numbered left to right.

    Without ``lonely`` every id of one child only is kept by the contraction (only ids of
    both children are summed); with it, any id may be summed.
    """
    if leaves == 1:
        chosen = draw(st.lists(st.sampled_from(ids), unique=True, min_size=0, max_size=3))
        node = Node(tuple(chosen), leaf=counter[0])
        counter[0] += 1
    else:
        split = draw(st.integers(1, leaves - 1))
        left = draw(subtrees(split, ids, counter, lonely))
        right = draw(subtrees(leaves - split, ids, counter, lonely))
        union = list(dict.fromkeys(left.ids + right.ids))
        if lonely:
            out = draw(st.lists(st.sampled_from(union), unique=True, max_size=4)) if union else []
        else:
            shared = [i for i in union if i in left.ids and i in right.ids]
            kept = draw(st.lists(st.sampled_from(shared), unique=True)) if shared else []
            out = [i for i in union if i not in shared or i in kept]
            out = list(draw(st.permutations(out)))
        node = Node(tuple(out), (left, right))
    if draw(st.integers(0, 3)) == 0:  # now and then a permutation above the node
        node = Node(tuple(draw(st.permutations(node.ids))), (node,))
    return node


@st.composite
def random_trees(draw, lonely=False):
    count = draw(st.integers(4, 7))
    sizes = draw(st.lists(st.integers(1, 6 if lonely else 4), min_size=count, max_size=count))
    leaves = draw(st.integers(2, 6))
    root = draw(subtrees(leaves, list(range(count)), [0], lonely))
    dtype = draw(st.sampled_from(DTYPES))
    return root, sizes, dtype


def spell(node: Node) -> str:
    """The string form, written independently of teir's to_string."""
    ids = "[" + ",".join(map(str, node.ids)) + "]"
    if not node.children:
        return ids
    parts = [spell(c) if not c.children else "[" + spell(c) + "]" for c in node.children]
    return ",".join(parts) + "->" + ids


def check_generated(root, sizes, dtype, seed):
    text = spell(root)
    tree = teir.EinsumTree.parse(text, sizes, dtype=dtype)
    assert tree.root == root
    assert tree.to_string() == text
    leaves = make_leaves(tree, seed)
    check(tree, leaves, tree.compile()(*leaves))
    optimized = tree.optimize()
    assert leaf_order(optimized.root) == leaf_order(tree.root)
    assert optimized.flops == tree.flops
    check(tree, leaves, optimized.compile()(*leaves), oracle_root=tree.root)
    again = teir.EinsumTree.parse(optimized.to_string(), sizes, dtype=dtype)
    assert again.to_string() == optimized.to_string()
    assert optimized.to_string() in optimized.explain()


@settings(max_examples=35, deadline=None)
@given(random_trees(), st.integers(0, 2**31))
def test_generated_trees_equal_the_oracle(case, seed):
    check_generated(*case, seed)


@settings(max_examples=25, deadline=None)
@given(random_trees(lonely=True), st.integers(0, 2**31))
def test_generated_trees_summing_ids_of_one_child(case, seed):
    """Contractions that sum an id of one child only (einsum semantics; CompiledTree
    documents that it reduces such ids with NumPy first)."""
    check_generated(*case, seed)


# ---- rewrites --------------------------------------------------------------------------------

GETD = FIXTURES["optimization"][2]  # five leaves, interior nodes of 3-5 ids


def replace(node: Node, path: tuple[int, ...], new: Node) -> Node:
    if not path:
        return new
    children = list(node.children)
    children[path[0]] = replace(children[path[0]], path[1:], new)
    return node.with_children(children)


def at(node: Node, path: tuple[int, ...]) -> Node:
    for step in path:
        node = node.children[step]
    return node


def paths(node: Node, prefix=()):
    yield prefix, node
    for index, child in enumerate(node.children):
        yield from paths(child, (*prefix, index))


def run(root: Node, sizes, dtype, leaves):
    return teir.EinsumTree(root, sizes, dtype).compile()(*leaves)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
def test_swap_operands_everywhere(dtype):
    tree = teir.EinsumTree.parse(GETD["tree"], scaled(GETD, 4), dtype=dtype)
    leaves = make_leaves(tree, 11)
    for path, node in paths(tree.root):
        if node.kind is not NodeKind.CONTRACTION:
            continue
        swapped = rewrite.swap_operands(node)
        assert swapped.children == node.children[::-1] and swapped.ids == node.ids
        root = replace(tree.root, path, swapped)
        assert leaf_order(root) == leaf_order(tree.root)
        check(tree, leaves, run(root, tree.sizes, dtype, leaves))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
def test_reorder_interior_nodes(dtype):
    tree = teir.EinsumTree.parse(GETD["tree"], scaled(GETD, 4), dtype=dtype)
    leaves = make_leaves(tree, 12)
    rng = np.random.default_rng(0)
    interior = [(p, n) for p, n in paths(tree.root) if p and n.children]
    assert interior
    for path, node in interior:
        for _ in range(2):
            order = [int(i) for i in rng.permutation(node.ids)]
            reordered = rewrite.reorder(node, order)
            assert reordered.ids == tuple(order) and reordered.children == node.children
            check(tree, leaves, run(replace(tree.root, path, reordered), tree.sizes, dtype, leaves))
    # all interior nodes reordered at once (reversed)
    root = tree.root
    for path, _ in interior:
        root = replace(root, path, rewrite.reorder(at(root, path), at(root, path).ids[::-1]))
    check(tree, leaves, run(root, tree.sizes, dtype, leaves))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
def test_insert_permutation_everywhere(dtype):
    tree = teir.EinsumTree.parse(GETD["tree"], scaled(GETD, 4), dtype=dtype)
    leaves = make_leaves(tree, 13)
    for path, node in paths(tree.root):
        order = node.ids[1:] + node.ids[:1]
        inserted = rewrite.insert_permutation(node, order)
        assert inserted.kind is NodeKind.PERMUTATION and inserted.children == (node,)
        root = replace(tree.root, path, inserted)
        if not path:  # a permutation on top changes the result's layout
            expected = evaluate(tree.root, leaves)
            got = run(root, tree.sizes, dtype, leaves)
            moved = [node.ids.index(i) for i in order]
            np.testing.assert_allclose(
                got, expected.transpose(moved), **tolerance(dtype, np.abs(expected).max())
            )
            continue
        check(tree, leaves, run(root, tree.sizes, dtype, leaves))


def test_rewrite_errors():
    tree = teir.EinsumTree.parse("[[0,2]->[2,0]],[1,2]->[1,0]", [2, 3, 4])
    leaf = tree.root.children[1]
    with pytest.raises(ValueError, match="contraction"):
        rewrite.swap_operands(leaf)
    with pytest.raises(ValueError, match="contraction"):
        rewrite.swap_operands(tree.root.children[0])
    with pytest.raises(ValueError, match="leaf"):
        rewrite.reorder(leaf, [2, 1])
    with pytest.raises(ValueError, match="reordering"):
        rewrite.reorder(tree.root, [1, 2])
    with pytest.raises(ValueError, match="reordering"):
        rewrite.reorder(tree.root, [1, 0, 0])
    with pytest.raises(ValueError, match="reordering"):
        rewrite.insert_permutation(leaf, [1])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
@pytest.mark.parametrize("entry", COURSE, ids=[e["name"] for e in COURSE])
def test_optimize_tree_legalize_and_drop_identities(entry, dtype):
    sizes = scaled(entry, 4)
    tree = teir.EinsumTree.parse(entry["tree"], sizes, dtype=dtype)
    leaves = make_leaves(tree, 5)
    optimized = rewrite.optimize_tree(tree.root, sizes, dtype, 1)
    legal = rewrite.legalize(tree.root, sizes, dtype, 1)
    for root in (optimized, legal, rewrite.drop_identities(legal)):
        assert leaf_order(root) == leaf_order(tree.root) and root.ids == tree.root.ids
        check(tree, leaves, run(root, sizes, dtype, leaves), oracle_root=tree.root)


def test_getd_optimization_lays_out_both_operands_for_the_mirror_form():
    """GETD's last contraction writes a result whose unit-stride id has 25 elements; the
    optimizer lays out both operands jointly (A unit stride on K, B on the fused N) so the
    kernel vectorizes along N, permuting the operand its own kernel cannot write."""
    from teir.codegen.specs import BrgemmSpec
    from teir.lower.nest import lower
    from teir.tree.cost import kernel_efficiency, node_config, tree_cost

    entry = next(e for e in COURSE if e["name"] == "opt3_getd")
    sizes, dtype = entry["sizes"], np.float32
    tree = teir.EinsumTree.parse(entry["tree"], sizes, dtype=dtype)
    optimized = rewrite.optimize_tree(tree.root, sizes, dtype, 2)
    assert tree_cost(optimized, sizes, dtype, 2) < 0.85 * tree_cost(tree.root, sizes, dtype, 2)
    spec = lower(node_config(optimized, sizes, dtype, 2)).main.spec
    assert isinstance(spec, BrgemmSpec) and spec.trans_a and spec.trans_b  # the mirror form
    assert spec.n >= 64 and kernel_efficiency(spec, 16) > 0.9
    assert any(c.kind is NodeKind.PERMUTATION for c in optimized.children)


@pytest.mark.parametrize("sizes", [[30, 30, 10, 10, 4, 4, 4, 4, 4, 4], None])
def test_leaf_copies_keep_within_the_paths_peak_memory(sizes):
    """The course's opt2_fctn (and scaled down): copying its leaf [0,4,5,6] for the
    contraction at the memory peak makes an intermediate opt_einsum does not hold on the
    same path; the optimizer reads that leaf as it lies and lays the rest out around it,
    within the path's peak (``memory.path_peak``), and the compiled tree still equals the
    oracle."""
    from teir.tree.memory import path_peak

    entry = next(e for e in COURSE if e["name"] == "opt2_fctn")
    sizes = sizes or entry["sizes"]
    dtype = np.float32
    tree = teir.EinsumTree.parse(entry["tree"], sizes, dtype=dtype)
    limit = path_peak(tree.root, sizes, 4)
    copying = rewrite._layouts(rewrite._conditional_swap(tree.root), sizes, dtype, 2, frozenset())
    assert rewrite._arena_bytes(copying, sizes, 4) > limit  # what the rule is for
    compiled = tree.optimize().compile(threads=2)
    assert compiled.intermediate_bytes <= limit
    leaves = make_leaves(tree, 7)
    check(tree, leaves, compiled(*leaves))


def test_kernel_efficiency_follows_the_vectorized_extent():
    from teir.codegen.specs import BrgemmSpec
    from teir.tree.cost import kernel_efficiency

    outer = BrgemmSpec("f32", 25, 128, 64, 1)
    mirror = BrgemmSpec("f32", 25, 128, 64, 1, trans_a=True, trans_b=True)
    assert kernel_efficiency(outer, 16) < 0.8 < 0.95 < kernel_efficiency(mirror, 16)


def test_drop_identities():
    tree = teir.EinsumTree.parse("[[[0,1]->[0,1]],[1,2]->[0,2]]->[0,2]", [2, 3, 4])
    dropped = rewrite.drop_identities(tree.root)
    assert to_string(dropped) == "[0,1],[1,2]->[0,2]"
    # a root permutation copying a leaf into the result stays
    single = teir.EinsumTree.parse("[0,1]->[0,1]", [2, 3]).root
    assert rewrite.drop_identities(single) == single
    # a real permutation stays
    real = teir.EinsumTree.parse("[[0,1]->[1,0]],[1,2]->[0,2]", [2, 3, 4]).root
    assert rewrite.drop_identities(real) == real


# ---- compiled trees: arguments, out=, reuse, explain ----------------------------------------

CHAIN = "[[[0,1],[1,2]->[0,2]],[2,3]->[0,3]],[3,4]->[0,4]"


@pytest.fixture(scope="module")
def chain():
    tree = teir.EinsumTree.parse(CHAIN, [3, 4, 5, 6, 7], dtype=np.float64)
    return tree, tree.optimize().compile()


def test_wrong_number_of_leaves(chain):
    tree, compiled = chain
    leaves = make_leaves(tree)
    with pytest.raises(teir.TreeError, match="4 leaves but 3"):
        compiled(*leaves[:3])
    with pytest.raises(teir.TreeError, match="4 leaves but 5"):
        compiled(*leaves, leaves[0])
    with pytest.raises(teir.TreeError):
        compiled()


def test_wrong_shape(chain):
    tree, compiled = chain
    leaves = make_leaves(tree)
    with pytest.raises(teir.TreeError, match="shape"):
        compiled(leaves[0].T, *leaves[1:])
    with pytest.raises(teir.TreeError, match="leaf 2"):
        compiled(leaves[0], leaves[1], np.zeros((6, 5)), leaves[3])
    with pytest.raises(teir.TreeError, match="shape"):
        compiled(leaves[0], leaves[1].ravel(), *leaves[2:])
    with pytest.raises(teir.TreeError, match="shape"):
        compiled(*leaves[:3], leaves[3][None])


def test_wrong_dtype(chain):
    tree, compiled = chain
    leaves = make_leaves(tree)
    with pytest.raises(teir.TreeError, match="dtype"):
        compiled(leaves[0].astype(np.float32), *leaves[1:])
    with pytest.raises(teir.TreeError, match="dtype"):
        compiled(leaves[0], leaves[1].astype(np.int64), *leaves[2:])
    fp32 = teir.EinsumTree.parse(CHAIN, [3, 4, 5, 6, 7], dtype=np.float32).compile()
    with pytest.raises(teir.TreeError, match="dtype"):
        fp32(*leaves)


def test_non_contiguous_leaves(chain):
    tree, compiled = chain
    rng = np.random.default_rng(4)
    a = rng.uniform(-1, 1, (4, 3)).T  # transposed view, shape (3, 4)
    b = rng.uniform(-1, 1, (8, 10))[::2, ::2]  # strided, (4, 5)
    c = rng.uniform(-1, 1, (5, 6))[::-1, ::-1]  # negative strides
    d = np.asfortranarray(rng.uniform(-1, 1, (6, 7)))
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    check(tree, [a, b, c, d], compiled(a, b, c, d))
    e = np.broadcast_to(rng.uniform(-1, 1, (1, 6)), (5, 6))  # stride 0
    check(tree, [a, b, e, d], compiled(a, b, e, d))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
def test_out(dtype):
    tree = teir.EinsumTree.parse(CHAIN, [3, 4, 5, 6, 7], dtype=dtype)
    compiled = tree.optimize().compile()
    leaves = make_leaves(tree, 8)
    out = np.full(tree.out_shape, 7.0, dtype)
    assert compiled(*leaves, out=out) is out
    check(tree, leaves, out)
    big = np.full((6, 21), 5.0, dtype)
    view = big[::2, ::3]
    assert view.shape == tree.out_shape and not view.flags.c_contiguous
    assert compiled(*leaves, out=view) is view
    check(tree, leaves, view)
    untouched = big.copy()
    untouched[::2, ::3] = 5.0
    assert np.all(untouched == 5.0)  # nothing outside the view was written
    fortran = np.asfortranarray(np.zeros(tree.out_shape, dtype))
    assert compiled(*leaves, out=fortran) is fortran
    check(tree, leaves, fortran)
    reversed_out = np.zeros(tree.out_shape, dtype)[::-1]
    assert compiled(*leaves, out=reversed_out) is reversed_out
    check(tree, leaves, reversed_out)


def test_out_errors(chain):
    tree, compiled = chain
    leaves = make_leaves(tree)
    with pytest.raises(teir.TreeError, match="shape"):
        compiled(*leaves, out=np.zeros((7, 3)))
    with pytest.raises(teir.TreeError, match="dtype"):
        compiled(*leaves, out=np.zeros((3, 7), np.float32))
    assert compiled.out_shape == (3, 7)
    read_only = np.zeros((3, 7))
    read_only.flags.writeable = False
    with pytest.raises(teir.TreeError, match="read-only"):
        compiled(*leaves, out=read_only)


def test_out_overlapping_a_leaf():
    tree = teir.EinsumTree.parse("[0,1],[1,2]->[0,2]", [4, 4, 4], dtype=np.float64)
    compiled = tree.compile()
    a, b = make_leaves(tree, 9)
    expected = a @ b
    assert compiled(a, b, out=a) is a
    np.testing.assert_allclose(a, expected, rtol=1e-12)


def test_calling_twice_reuses_the_arena(chain):
    tree, compiled = chain
    first_leaves = make_leaves(tree, 1)
    second_leaves = make_leaves(tree, 2)
    first = compiled(*first_leaves)
    first_copy = first.copy()
    second = compiled(*second_leaves)
    assert first is not second
    np.testing.assert_array_equal(first, first_copy)  # results are never arena memory
    check(tree, second_leaves, second)
    again = compiled(*first_leaves)
    np.testing.assert_array_equal(again, first)


def test_concurrent_calls_share_the_arena_safely():
    import threading

    tree = teir.EinsumTree.parse(CHAIN, [6, 7, 8, 9, 5], dtype=np.float64)
    compiled = tree.optimize().compile()
    inputs = [make_leaves(tree, seed) for seed in range(4)]
    results: list = [None] * len(inputs)

    def work(index):
        for _ in range(10):
            results[index] = compiled(*inputs[index])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for leaves, result in zip(inputs, results):
        check(tree, leaves, result)


def test_explain_mentions_every_node():
    entry = GETD
    tree = teir.EinsumTree.parse(entry["tree"], scaled(entry, 4), dtype=np.float32)
    text = tree.explain()
    assert tree.to_string() in text
    for node in nodes(tree.root):
        assert f"{node.kind.value} {list(node.ids)}" in text
    compiled = tree.optimize().compile()
    text = compiled.explain()
    assert to_string(compiled.root) in text
    inner = [n for n in nodes(compiled.root) if n.children]
    assert text.count("## step") == len(inner)
    for node in inner:
        operands = " x ".join(str(list(c.ids)) for c in node.children)
        assert f"{operands} -> {list(node.ids)}" in text


def test_threads_argument():
    tree = teir.EinsumTree.parse(CHAIN, [3, 4, 5, 6, 7], dtype=np.float64)
    leaves = make_leaves(tree, 6)
    for threads in (1, 2):
        compiled = tree.compile(threads=threads)
        assert compiled.threads == threads
        check(tree, leaves, compiled(*leaves))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(teir.TreeError, match="threads"):
            tree.compile(threads=bad)


def test_single_leaf_and_permutation_trees():
    tree = teir.EinsumTree.parse("[0,1]", [3, 4], dtype=np.float64)
    a = make_leaves(tree)[0]
    result = tree.compile()(a)
    np.testing.assert_array_equal(result, a)
    assert not np.shares_memory(result, a)
    tree = teir.EinsumTree.parse("[[0,1,2]->[2,0,1]]->[1,2,0]", [2, 3, 4], dtype=np.float32)
    x = make_leaves(tree)[0]
    np.testing.assert_array_equal(tree.optimize().compile()(x), x.transpose(1, 2, 0))
    np.testing.assert_array_equal(tree.compile()(x), x.transpose(1, 2, 0))


def test_a_leaf_of_no_ids_takes_a_numpy_scalar():
    tree = teir.EinsumTree.parse("[],[0]->[0]", [4], dtype=np.float32)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(tree(np.float32(2.5), x), 2.5 * x)
    np.testing.assert_array_equal(tree(np.array(2.5, np.float32), x), 2.5 * x)
    with pytest.raises(teir.TreeError, match="dtype float64"):
        tree(np.float64(2.5), x)


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("[0,3,1],[4,1,2]->[0,2]", [3, 4, 5, 2, 6]),  # ids 3 and 4: one child each, summed
        ("[0,1],[1,2]->[0]", [2, 3, 4]),
        ("[0,1],[1]->[]", [2, 3]),
        ("[],[0]->[]", [2]),
    ],
)
def test_lonely_ids_are_summed(text, sizes):
    tree = teir.EinsumTree.parse(text, sizes, dtype=np.float64)
    leaves = make_leaves(tree, 2)
    check(tree, leaves, tree.compile()(*leaves))
    check(tree, leaves, tree.optimize().compile()(*leaves))


# ---- memory ----------------------------------------------------------------------------------


def lifetimes_of(compiled) -> tuple[list[Node], list[Lifetime]]:
    """The intermediates (post-order, the root excluded) and their lifetimes, computed here."""
    inner = [n for n in post_order(compiled.root) if n.children]
    step_of = {id(n): s for s, n in enumerate(inner)}
    last = dict(step_of)
    for node in inner:
        for child in node.children:
            if child.children:
                last[id(child)] = step_of[id(node)]
    itemsize = compiled.dtype.itemsize
    buffered = [n for n in inner if n is not compiled.root]
    return buffered, [
        Lifetime(n.elements(compiled.sizes) * itemsize, step_of[id(n)], last[id(n)])
        for n in buffered
    ]


def check_arena(arena: Arena, lifetimes: list[Lifetime]):
    assert len(arena.offsets) == len(lifetimes)
    assert arena.live_peak == live_peak(lifetimes)
    assert arena.nbytes >= arena.live_peak
    for offset, life in zip(arena.offsets, lifetimes):
        assert offset % ALIGN == 0
        assert offset >= 0 and offset + life.nbytes <= arena.nbytes
    for i, a in enumerate(lifetimes):
        for j, b in enumerate(lifetimes[:i]):
            if a.first <= b.last and b.first <= a.last and a.nbytes and b.nbytes:
                x, y = arena.offsets[i], arena.offsets[j]
                assert x + a.nbytes <= y or y + b.nbytes <= x, (a, b, x, y)


@pytest.mark.parametrize("optimize", [False, True])
def test_chain_arena(optimize):
    tree = teir.EinsumTree.parse(
        "[[[[0,1],[1,2]->[0,2]],[2,3]->[0,3]],[3,4]->[0,4]],[4,5]->[0,5]", [9, 8, 10, 9, 11, 3]
    )
    compiled = (tree.optimize() if optimize else tree).compile()
    buffered, lifetimes = lifetimes_of(compiled)
    assert len(buffered) >= 3
    arena = compiled.arena_plan
    check_arena(arena, lifetimes)
    assert compiled.intermediate_bytes == arena.nbytes
    # a chain needs at most two intermediates at once: memory is reused
    assert arena.nbytes < sum(-(-life.nbytes // ALIGN) * ALIGN for life in lifetimes)
    # the steps write where the plan says
    offsets = [s.output.index for s in compiled.steps if s.output.kind == "buffer"]
    assert offsets == list(arena.offsets)
    leaves = make_leaves(tree, 3)
    for _ in range(2):
        check(tree, leaves, compiled(*leaves))


@pytest.mark.parametrize("entry", COURSE, ids=[e["name"] for e in COURSE])
def test_course_tree_arenas(entry):
    tree = teir.EinsumTree.parse(entry["tree"], scaled(entry, 6), dtype=np.float64)
    for candidate in (tree, tree.optimize()):
        compiled = candidate.compile()
        _, lifetimes = lifetimes_of(compiled)
        check_arena(compiled.arena_plan, lifetimes)
        assert f"{compiled.arena_plan.nbytes / 2**20:.2f} MiB" in compiled.explain()


def test_plan_arena_disjoint_lifetimes_share_offset_zero():
    lifetimes = [Lifetime(100, 0, 1), Lifetime(300, 2, 3), Lifetime(50, 4, 4)]
    arena = plan_arena(lifetimes)
    assert arena.offsets == (0, 0, 0)
    assert arena.nbytes == 320  # the largest, aligned to 64 bytes
    assert arena.live_peak == 300


def test_plan_arena_overlapping_lifetimes_do_not_overlap():
    lifetimes = [Lifetime(100, 0, 2), Lifetime(200, 1, 3), Lifetime(64, 2, 2)]
    arena = plan_arena(lifetimes)
    check_arena(arena, lifetimes)
    assert arena.live_peak == 364
    assert len(set(arena.offsets)) == 3
    # touching at one step counts as overlapping (a node reads its child while writing)
    touching = [Lifetime(64, 0, 1), Lifetime(64, 1, 2)]
    assert sorted(plan_arena(touching).offsets) == [0, 64]


def test_plan_arena_edge_cases():
    assert plan_arena([]) == Arena((), 0, 0)
    one = plan_arena([Lifetime(1, 0, 0)])
    assert one.offsets == (0,) and one.nbytes == ALIGN and one.live_peak == 1
    zero = plan_arena([Lifetime(0, 0, 3), Lifetime(64, 1, 2)])
    assert zero.nbytes == 64


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 8), st.integers(0, 4)), max_size=12))
def test_plan_arena_generated(raw):
    lifetimes = [Lifetime(n, first, first + length) for n, first, length in raw]
    arena = plan_arena(lifetimes)
    check_arena(arena, lifetimes)
    total = sum(-(-life.nbytes // ALIGN) * ALIGN for life in lifetimes)
    assert arena.nbytes <= total


def test_tree_nodes_never_take_einsums_relayout_copies():
    """``[2,0],[2,1]->[0,1]`` (A^T B, 640 FLOPs per input element) would be relaid by
    teir.einsum (a copy of A into the scratch buffer, outside the tree's arena): a tree node
    runs its own plan on the tensors as they lie, so its memory is what explain() reports."""
    tree = teir.EinsumTree.parse("[2,0],[2,1]->[0,1]", [640, 640, 1024], dtype="float64")
    compiled = tree.compile(threads=2)
    assert "runs through teir.einsum" not in compiled.explain()
    assert compiled.intermediate_bytes == 0
    rng = np.random.default_rng(5)
    a, b = rng.uniform(-1, 1, (1024, 640)), rng.uniform(-1, 1, (1024, 640))
    np.testing.assert_allclose(compiled(a, b), a.T @ b, rtol=1e-11, atol=1e-11)


# ((L0 L1 -> P) L2 -> Q) L3 -> R: the root, ik,kj->ji on 512^3, runs the mirror form (FP32)
# or packs B a column block at a time (FP64) as its operands lie; in the order [0,4] it runs
# the outer-product kernel on untransposed operands. P (512 x 128) is dead by then: slabs of
# that order fit where it lay.
SLABBED = "[[[0,1],[1,2]->[0,2]],[2,3]->[0,3]],[3,4]->[4,0]"
SLABBED_SIZES = [512, 8, 128, 512, 512]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
@pytest.mark.parametrize("relu", [False, True], ids=["plain", "relu"])
def test_root_in_slabs_of_the_plain_kernels_order_within_free_arena_bytes(dtype, relu):
    from teir.tree.compiled import CompiledTree

    tree = teir.EinsumTree.parse(SLABBED, SLABBED_SIZES, dtype=dtype)
    compiled = CompiledTree(tree.root, tree.sizes, tree.dtype, 2, relu=relu)
    root = compiled.steps[-1]
    assert root.slabs is not None and root.slabs.order == (0, 4)
    assert root.slabs.scratch + root.slabs.nbytes <= compiled.intermediate_bytes
    assert len(root.slabs.offsets) > 1  # in slabs, not whole
    # the arena is what the intermediates need, no more
    itemsize = np.dtype(dtype).itemsize
    assert compiled.intermediate_bytes == compiled.arena_plan.live_peak
    assert compiled.arena_plan.live_peak == (512 * 128 + 512 * 512) * itemsize
    assert "computed in the order [0, 4]" in compiled.explain()
    leaves = make_leaves(tree, 11)
    expected = evaluate(tree.root, leaves)
    if relu:
        expected = np.maximum(expected, 0)
    scale = float(np.abs(expected).max())
    for _ in range(2):  # the arena's bytes are reused by the next call
        np.testing.assert_allclose(compiled(*leaves), expected, **tolerance(dtype, scale))
    out = np.full((1024, 1536), 3.0, dtype)
    view = out[::2, ::3]
    assert compiled(*leaves, out=view) is view
    np.testing.assert_allclose(view, expected, **tolerance(dtype, scale))
    out[::2, ::3] = 3.0
    assert np.all(out == 3.0)  # nothing outside the view was written


def test_root_that_accumulates_is_not_slabbed():
    from teir.tree.compiled import CompiledTree

    tree = teir.EinsumTree.parse(SLABBED, SLABBED_SIZES, dtype=np.float64)
    compiled = CompiledTree(tree.root, tree.sizes, tree.dtype, 2, accumulate=True)
    assert compiled.steps[-1].slabs is None  # a slab's permutation overwrites
    leaves = make_leaves(tree, 12)
    out = np.full(tree.out_shape, 0.5)
    compiled(*leaves, out=out)
    np.testing.assert_allclose(out, evaluate(tree.root, leaves) + 0.5, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
def test_slabs_in_every_order_of_a_batched_root(monkeypatch, dtype):
    """With the thresholds lowered so that small trees take slabs, every order of a batched
    root (batch id 5) and of its left operand gives the oracle's result, slabbed or not."""
    import itertools

    from teir.frontend import einsum_plan
    from teir.tree import compiled as compiled_module
    from teir.tree import slabs

    monkeypatch.setattr(einsum_plan, "RELAYOUT_FLOPS_PER_ELEMENT", 0)
    monkeypatch.setattr(slabs, "RELAYOUT_FLOPS_PER_ELEMENT", 0)
    monkeypatch.setattr(slabs, "SLAB_LEAST_ELEMENTS", 1)
    sizes = [48, 4, 40, 64, 40, 3]
    slabbed = 0
    for left in itertools.permutations([5, 0, 3]):
        for root in itertools.permutations([5, 0, 4]):
            text = (
                f"[[[0,1],[1,2]->[0,2]],[2,3,5]->[{','.join(map(str, left))}]],[5,3,4]->"
                f"[{','.join(map(str, root))}]"
            )
            tree = teir.EinsumTree.parse(text, sizes, dtype=dtype)
            compiled = compiled_module.CompiledTree(tree.root, tree.sizes, tree.dtype, 2)
            slabs_of_root = compiled.steps[-1].slabs
            if slabs_of_root is not None:
                slabbed += 1
                assert slabs_of_root.scratch + slabs_of_root.nbytes <= compiled.intermediate_bytes
            leaves = make_leaves(tree, len(text))
            check(tree, leaves, compiled(*leaves))
    assert slabbed > 0  # here: the orders [5,4,0] and [4,5,0], in slabs of each batch index


def test_intermediate_read_in_slabs_is_laid_out_slab_first(monkeypatch):
    """GETD's root runs in slabs of one index of id 5 at a time: the intermediate it reads
    is laid out with id 5 outermost ([5,4,9,6,2] where the layout rules alone give
    [4,9,5,6,2]), so that each slab reads one contiguous block of it; the result equals the
    oracle's. Without slabs (slab_ids finds none) the layout stays as the rules give it."""
    tree = teir.EinsumTree.parse(GETD["tree"], [24] * 5 + [16] * 5, dtype=np.float64)
    optimized = tree.optimize()
    compiled = optimized.compile(threads=2)
    if compiled.steps[-1].slabs is None:  # the kernels of this machine's vector width
        pytest.skip("GETD's root runs whole on this machine: no slabs to lay out for")
    assert compiled.steps[-1].slabs.order[0] == 5
    assert "->[5,4,9,6,2]]" in optimized.to_string()
    leaves = make_leaves(tree, 13)
    check(tree, leaves, compiled(*leaves))
    monkeypatch.setattr(rewrite, "slab_ids", lambda *args: ())
    assert "->[4,9,5,6,2]]" in tree.optimize().to_string()


def test_tree_nodes_with_long_sums_are_cut_for_accuracy():
    """A node adding into each element more times in a row than teir.einsum lets a binary
    einsum (LONGEST_CHAIN) runs through teir.einsum, which cuts the sum into parts: FP32
    ``ij,ij,j->j`` on 10^6 x 4 erred by 3.6e-4 as one chain (NumPy 3e-8)."""
    rng = np.random.default_rng(9)
    a, b = (  # a batch of 16 fills a vector: no batch_fold, which a batch of 4 would take
        rng.random((200_000, 16), dtype=np.float32),
        rng.random((200_000, 16), dtype=np.float32),
    )
    c = rng.random(16, dtype=np.float32)
    exact = np.einsum("ij,ij,j->j", a.astype(np.float64), b, c)
    result = teir.einsum("ij,ij,j->j", a, b, c, threads=2)
    assert np.max(np.abs(result - exact) / exact) < 1e-5
    expression = teir.contract_expression("ij,ij,j->j", a.shape, b.shape, c.shape, dtype=np.float32)
    assert "times in a row into each element; teir.einsum cuts" in expression.explain()
    np.testing.assert_allclose(expression(a, b, c), exact, rtol=1e-5)


def test_tree_steps_without_a_loop_for_the_threads_split_an_output_axis():
    """The step 307 x 211 x 500 of ``ij,jk,kl->il`` (its output axes have no divisor that
    tiles, its operands too small to cut the sum) ran on one thread: split like an einsum's."""
    rng = np.random.default_rng(6)
    a, b, c = (
        rng.uniform(-1, 1, shape).astype(np.float32)
        for shape in ((307, 500), (500, 400), (400, 211))
    )
    expression = teir.contract_expression(
        "ij,jk,kl->il", a.shape, b.shape, c.shape, dtype=np.float32, threads=2
    )
    assert "threads share the main part evenly" in expression.explain()
    exact = a.astype(np.float64) @ b.astype(np.float64) @ c.astype(np.float64)
    np.testing.assert_allclose(expression(a, b, c), exact, rtol=1e-3, atol=1e-3)
