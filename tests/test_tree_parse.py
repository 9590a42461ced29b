"""Parsing einsum-tree strings: the course fixtures round-trip, malformed strings and bad sizes
raise teir.TreeError pointing at the problem."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import teir
from teir.tree.nodes import Node, NodeKind, post_order

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
ALL_TREES = [(e["name"], e["tree"]) for e in COURSE] + [
    (f"small{i}", e["tree"]) for i, e in enumerate(FIXTURES["small_tests"])
]


@pytest.mark.parametrize(("name", "text"), ALL_TREES, ids=[n for n, _ in ALL_TREES])
def test_fixture_trees_round_trip(name, text):
    tree = teir.EinsumTree.parse(text, [2] * 16)
    assert tree.to_string() == text
    assert str(tree) == text
    again = teir.EinsumTree.parse(tree.to_string(), [2] * 16)
    assert again.root == tree.root
    # leaves are numbered in the order they appear in the string
    leaves = [n for n in post_order(tree.root) if n.kind is NodeKind.LEAF]
    assert [n.leaf for n in leaves] == list(range(len(leaves)))


@pytest.mark.parametrize("entry", COURSE, ids=[e["name"] for e in COURSE])
def test_fixture_flops_match_the_spec(entry):
    tree = teir.EinsumTree.parse(entry["tree"], entry["sizes"])
    assert tree.flops / 1e9 == pytest.approx(entry["gflop"], rel=2e-3)
    # the result's shape: the sizes of the root's ids
    out_ids = [int(i) for i in re.findall(r"\d+", entry["tree"].rsplit("->", 1)[1])]
    assert tree.out_shape == tuple(entry["sizes"][i] for i in out_ids)


def test_fixture_structure_of_a_small_tree():
    tree = teir.EinsumTree.parse("[[0,2]->[2,0]],[1,2]->[1,0]", [3, 7, 19])
    root = tree.root
    assert root.kind is NodeKind.CONTRACTION and root.ids == (1, 0)
    left, right = root.children
    assert left.kind is NodeKind.PERMUTATION and left.ids == (2, 0)
    assert left.children[0] == Node((0, 2), leaf=0)
    assert right == Node((1, 2), leaf=1)
    assert tree.leaf_shapes == [(3, 19), (7, 19)]
    assert tree.out_shape == (7, 3)
    assert tree.flops == 2 * 7 * 3 * 19


def test_whitespace_is_ignored_and_normalised():
    tree = teir.EinsumTree.parse(" [ [ 0 , 2 ] -> [ 2 , 0 ] ] , [1,2]\n->[1, 0] ", [3, 7, 19])
    assert tree.to_string() == "[[0,2]->[2,0]],[1,2]->[1,0]"


@pytest.mark.parametrize(
    "text",
    ["[0,1]", "[]", "[0],[1]->[0,1]", "[0,1],[1]->[]", "[[]->[]],[0]->[0]", "[10,2]->[2,10]"],
)
def test_other_valid_trees_round_trip(text):
    tree = teir.EinsumTree.parse(text, [2] * 11)
    assert tree.to_string() == text


def position_of(error: teir.TreeError, text: str) -> int:
    """The position the error names; checks that the string is quoted on its own line with a
    caret under that position."""
    message = str(error)
    match = re.search(r"position (\d+)", message)
    assert match, message
    position = int(match.group(1))
    assert message.endswith(f"\n  {text}\n  {' ' * position}^"), message
    return position


# (string, position the error names, a piece of the message)
MALFORMED = [
    ("[0,1]->[1,0", 11, "']'"),  # unclosed output list
    ("[0,1", 4, "']'"),
    ("[[0,1]->[1,0]", 13, "closing a subtree"),  # unbalanced: missing ']'
    ("[[0,1]->[1,0]],[2]->[0,1,2]]", 27, "unexpected ']'"),  # unbalanced: extra ']'
    ("[0,1]]", 5, "unexpected ']'"),
    ("[0],[1]", 7, "'->'"),  # missing '->'
    ("[0],[1]-[0]", 7, "'->'"),
    ("[0],[1]>[0]", 7, "'->'"),
    ("[0],[1]->", 9, "'['"),  # missing output list
    ("->[0]", 0, "'['"),
    ("[[]]", 0, "'->'"),  # a bracketed subtree that is only an (empty) ids list
    ("[[0,1]]", 0, "'->'"),
    ("[0],,[1]->[0]", 4, "'['"),  # an empty operand
    ("[0,]", 3, "id"),  # empty id in a list
    ("[,0]", 1, "id"),
    ("[0,,1]->[1,0]", 3, "id"),
    ("[0,0]", 3, "twice"),  # duplicate ids in a leaf
    ("[0,1]->[1,0,0]", 12, "twice"),  # ... in a permutation
    ("[0,1],[1,2]->[2,0,2]", 18, "twice"),  # ... in a contraction
    ("[a]", 1, "'a'"),  # letters
    ("[0,1],[1,k]->[0]", 9, "'k'"),
    ("[-1]", 1, "'-'"),
    ("[0,1]x", 5, "unexpected 'x'"),  # trailing garbage
    ("[0],[1]->[0,1]abc", 14, "unexpected 'a'"),
    ("[0],[1]->[0]->[0]", 12, "unexpected '-'"),
    ("[0] [1]->[0]", 4, "unexpected '['"),
    ("[0],[1],[2]->[0]", 7, "'->'"),  # three operands
    ("[0,1]->[1]", 7, "missing [0]"),  # permutation dropping an id
    ("[0,1]->[0,1,2]", 7, "not in its child [2]"),  # permutation adding an id
    ("[0,1]->[1,2]", 7, "permutation"),
    ("[[0,2]->[2]],[1,2]->[1,0]", 8, "permutation"),  # nested permutation dropping an id
    ("[0],[1]->[2]", 9, "neither operand"),  # contraction output id in neither child
    ("[[1,2],[2,3]->[1,3]],[3,4]->[5]", 28, "[5]"),
    ("[[1,2],[2,3]->[1,4]],[3,4]->[1]", 14, "[4]"),
    ("[\u00b2]", 1, "id"),  # digits other than ASCII's (int() refused '2' as superscript)
    ("[0,\u0661]", 3, "id"),  # (an Arabic-Indic one was read as id 1)
    ("[1114111]", 1, "at most 50000"),  # ids become characters
    ("[0,50001]->[50001,0]", 3, "larger than 50000"),
    ("[" * 300 + "0]->[0]" + "]->[0]" * 299, 200, "nest more than 200"),  # RecursionError
]


@pytest.mark.parametrize(("text", "position", "fragment"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_strings_point_at_the_error(text, position, fragment):
    with pytest.raises(teir.TreeError) as caught:
        teir.EinsumTree.parse(text, [2] * 8)
    message = str(caught.value)
    assert "position" in message
    assert fragment in message, message
    assert text in message  # the string is quoted on its own line
    assert position_of(caught.value, text) == position


def test_a_chain_of_200_nested_permutations_runs():
    text = "[0,1]->[1,0]"
    for depth in range(199):
        text = f"[{text}]->" + ("[0,1]" if depth % 2 == 0 else "[1,0]")
    tree = teir.EinsumTree.parse(text, [3, 4])
    assert tree.to_string() == text
    tree.optimize()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(tree.compile(threads=1)(x), x)  # its root lists [0,1]


def test_tree_error_is_a_teir_error_and_a_value_error():
    assert issubclass(teir.TreeError, teir.TeirError)
    assert issubclass(teir.TreeError, ValueError)
    assert teir.tree.TreeError is teir.TreeError


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_strings(text):
    with pytest.raises(teir.TreeError, match="empty"):
        teir.EinsumTree.parse(text, [2])


@pytest.mark.parametrize("value", [None, 5, b"[0]->[0]", ["[0]"], Node((0,), leaf=0)])
def test_non_strings(value):
    with pytest.raises(teir.TreeError, match="string"):
        teir.EinsumTree.parse(value, [2])


@pytest.mark.parametrize(
    ("sizes", "fragment"),
    [
        ([2, 2], "ids [2] but only 2 sizes"),  # too few
        ([], "ids [0, 1, 2] but only 0 sizes"),
        ([2, 2.5, 2], "sizes[1] = 2.5 is not an integer"),
        ([2, "3", 2], "sizes[1] = '3' is not an integer"),
        ([2, 3, None], "sizes[2] = None is not an integer"),
        ([True, 2, 2], "sizes[0] = True is not an integer"),
        ([2, 0, 2], "sizes[1] = 0 must be at least 1"),
        ([2, 3, -4], "sizes[2] = -4 must be at least 1"),
        ("222", "sequence of integers"),
        (5, "sequence of integers"),
        (None, "sequence of integers"),
        ({0: 2, 1: 3}, "uses ids [2], which sizes does not give"),
        ({0: 2, 1: 0, 2: 4}, "sizes[1] = 0 must be at least 1"),
        ({0: 2, 1: 3, 2: 4.0}, "sizes[2] = 4.0 is not an integer"),
        ({0: 2, 1: 3, 2: 4, "x": 5}, "sizes has the key 'x'"),
        ({0: 2, 1: 3, 2: 4, -1: 5}, "sizes has the key -1"),
    ],
)
def test_bad_sizes_name_the_problem(sizes, fragment):
    with pytest.raises(teir.TreeError) as caught:
        teir.EinsumTree.parse("[0,1],[1,2]->[0,2]", sizes)
    assert fragment in str(caught.value)


def test_sizes_may_be_any_integer_sequence_and_extra_sizes_are_fine():
    for sizes in ([2, 3, 4], (2, 3, 4), np.array([2, 3, 4]), [np.int64(2), 3, np.int32(4)]):
        tree = teir.EinsumTree.parse("[0,1],[1,2]->[0,2]", sizes)
        assert tree.sizes == (2, 3, 4)
        assert all(type(s) is int for s in tree.sizes)
    tree = teir.EinsumTree.parse("[0,1],[1,2]->[0,2]", [2, 3, 4, 99, 100])
    assert tree.leaf_shapes == [(2, 3), (3, 4)] and tree.out_shape == (2, 4)


def test_sizes_may_map_ids_to_sizes():
    tree = teir.EinsumTree.parse("[0,1],[1,3]->[0,3]", {3: 4, 0: 2, 1: np.int64(3), 7: 9})
    assert tree.leaf_shapes == [(2, 3), (3, 4)] and tree.out_shape == (2, 4)
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    np.testing.assert_allclose(
        teir.EinsumTree.parse("[0,1],[1,3]->[0,3]", {0: 2, 1: 3, 3: 4}, dtype=np.float64).compile()(
            a, b
        ),
        a @ b,
    )


@pytest.mark.parametrize("dtype", ["float32", "FP32", "fp64", np.float64, np.dtype(np.float32)])
def test_dtypes(dtype):
    tree = teir.EinsumTree.parse("[0,1],[1,2]->[0,2]", [2, 3, 4], dtype=dtype)
    assert tree.dtype in (np.dtype(np.float32), np.dtype(np.float64))


@pytest.mark.parametrize("dtype", [np.int32, "int64", "float16", np.complex128, "nope"])
def test_bad_dtypes(dtype):
    with pytest.raises(teir.TreeError, match="dtype"):
        teir.EinsumTree.parse("[0,1],[1,2]->[0,2]", [2, 3, 4], dtype=dtype)


# ---- generated strings ----------------------------------------------------------------------


@st.composite
def tree_strings(draw, depth=0):
    """A valid tree string (as a test-independent writer spells it) and its leaf ids."""
    kind = draw(st.sampled_from(["leaf", "leaf", "perm", "contract"] if depth < 3 else ["leaf"]))
    if kind == "leaf":
        ids = draw(st.lists(st.integers(0, 12), unique=True, max_size=4))
        return "[" + ",".join(map(str, ids)) + "]", ids, [ids]
    if kind == "perm":
        text, ids, leaves = draw(tree_strings(depth + 1))
        out = draw(st.permutations(ids))
        inner = text if "->" not in text else f"[{text}]"
        return f"{inner}->[{','.join(map(str, out))}]", list(out), leaves
    left, lids, lleaves = draw(tree_strings(depth + 1))
    right, rids, rleaves = draw(tree_strings(depth + 1))
    union = list(dict.fromkeys(lids + rids))
    out = draw(st.lists(st.sampled_from(union), unique=True) if union else st.just([]))
    wrap = [t if "->" not in t else f"[{t}]" for t in (left, right)]
    return f"{wrap[0]},{wrap[1]}->[{','.join(map(str, out))}]", out, lleaves + rleaves


@settings(max_examples=40, deadline=None)
@given(tree_strings(), st.data())
def test_generated_strings_round_trip(case, data):
    text, out, leaf_ids = case
    tree = teir.EinsumTree.parse(text, [1] * 13)
    assert tree.to_string() == text
    assert tree.root.ids == tuple(out)
    assert [n.ids for n in sorted(_leaves(tree.root), key=lambda n: n.leaf)] == [
        tuple(ids) for ids in leaf_ids
    ]
    # spaces anywhere between tokens change nothing
    spaced = data.draw(st.sampled_from([" ", "\t", "  \n"])).join(re.findall(r"\d+|->|.", text))
    assert teir.EinsumTree.parse(spaced, [1] * 13).root == tree.root


@settings(max_examples=40, deadline=None)
@given(tree_strings(), st.data())
def test_truncated_strings_fail_with_a_position(case, data):
    text, _, _ = case
    cut = data.draw(st.integers(0, len(text) - 1))
    broken = text[:cut]
    if not broken.strip():
        with pytest.raises(teir.TreeError, match="empty"):
            teir.EinsumTree.parse(broken, [1] * 13)
        return
    try:
        teir.EinsumTree.parse(broken, [1] * 13)
    except teir.TreeError as error:
        assert 0 <= position_of(error, broken) <= len(broken)
    else:  # only a prefix that is itself a complete tree may parse
        assert broken.endswith("]")


def _leaves(node):
    return [n for n in post_order(node) if n.kind is NodeKind.LEAF]
