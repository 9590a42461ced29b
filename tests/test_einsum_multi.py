"""teir.einsum with three or more operands (einsum trees along opt_einsum's path) against
np.einsum: generated einsums, every optimize option, explicit paths, out=/accumulate/relu,
views, diagonals, scalars, contract_expression and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import teir
from helpers import out_array

RNG = np.random.default_rng(11)
OPTIMIZE = [None, "auto", "greedy", "optimal", "dp", False, True]
DTYPES = [np.float32, np.float64]


def operands(shapes, dtype=np.float64, seed=None):
    rng = RNG if seed is None else np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype(dtype) for shape in shapes]


def expected_of(subscripts, ops):
    """np.einsum in float64, and the same einsum of the absolute values (an error scale)."""
    wide = [np.asarray(o, dtype=np.float64) for o in ops]
    return np.einsum(subscripts, *wide), np.einsum(subscripts, *[np.abs(w) for w in wide])


def assert_close(got, subscripts, ops, dtype=None, start=None, relu=False):
    expected, scale = expected_of(subscripts, ops)
    if start is not None:
        expected = expected + start
        scale = scale + np.abs(start)
    if relu:
        expected = np.maximum(expected, 0)
    dtype = np.result_type(*ops) if dtype is None else np.dtype(dtype)
    assert np.shape(got) == np.shape(expected)
    assert np.asarray(got).dtype == dtype
    # rounding errors grow with the magnitudes summed: bound them by the einsum of |x|
    eps = 1e-4 if dtype == np.float32 else 1e-11
    error = np.abs(np.asarray(got, np.float64) - expected)
    bound = eps * (1 + scale)
    worst = np.unravel_index(np.argmax(error - bound), np.shape(error)) if np.ndim(error) else ()
    assert np.all(error <= bound), (subscripts, worst, np.max(error))


def check(subscripts, ops, **options):
    got = teir.einsum(subscripts, *ops, **options)
    assert_close(got, subscripts, ops, dtype=options.get("dtype"))
    return got


# ---- generated einsums -----------------------------------------------------------------------


@st.composite
def view_of(draw, shape, dtype):
    """A random array of this shape: contiguous, transposed, strided, reversed or Fortran."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    kind = draw(st.sampled_from(["plain", "plain", "transposed", "strided", "reversed", "F"]))
    shape = tuple(shape)
    if kind == "strided" and shape:
        big = rng.uniform(-1, 1, [2 * n + 1 for n in shape]).astype(dtype)
        return big[tuple(slice(1, None, 2) for _ in shape)]
    if kind == "transposed" and len(shape) > 1:
        order = draw(st.permutations(range(len(shape))))
        base = rng.uniform(-1, 1, [shape[i] for i in order]).astype(dtype)
        return base.transpose(np.argsort(order))
    if kind == "reversed" and shape:
        return rng.uniform(-1, 1, shape).astype(dtype)[..., ::-1]
    if kind == "F" and shape:  # (asfortranarray makes a 0-d array 1-d)
        return np.asfortranarray(rng.uniform(-1, 1, shape).astype(dtype))
    return rng.uniform(-1, 1, shape).astype(dtype)


@st.composite
def multi_einsums(draw, lonely=False, ellipsis=None, min_ops=3, max_ops=8):
    """(subscripts, operands, dtype): 3..8 operands over a small alphabet, sizes 1..5.

    Labels are drawn from a pool smaller than the operands' total so they repeat across
    operands; some dimensions broadcast (size 1 against a larger size), some terms repeat a
    label (a diagonal), some use '...'. Without ``lonely`` every summed label is met by at
    least two operands at its full size (a label one operand alone sums is added to the
    output).
    """
    count = draw(st.integers(min_ops, max_ops))
    alphabet = "abcdefgh"[: draw(st.integers(3, 8))]
    sizes = {c: draw(st.integers(1, 5)) for c in alphabet}
    for c in alphabet:  # keep NumPy's one-loop einsum quick: at most ~2000 index tuples
        if np.prod(list(sizes.values())) <= 2000:
            break
        sizes[c] = min(sizes[c], 2)
    use_ellipsis = draw(st.booleans()) if ellipsis is None else ellipsis
    ell_shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)) if use_ellipsis else []
    dtype = draw(st.sampled_from(DTYPES))
    terms, shapes, full = [], [], []  # full[k]: labels of operand k at their full size
    for _ in range(count):
        labels = draw(st.lists(st.sampled_from(alphabet), min_size=0, max_size=3))
        if labels and draw(st.integers(0, 7)) == 0:
            labels.insert(draw(st.integers(0, len(labels))), labels[0])  # a diagonal
        shape, kept = [], set()
        for label in labels:
            broadcast = (
                sizes[label] > 1 and labels.count(label) == 1 and draw(st.integers(0, 6)) == 0
            )
            shape.append(1 if broadcast else sizes[label])
            if not broadcast:
                kept.add(label)
        term = "".join(labels)
        if use_ellipsis and draw(st.booleans()):
            extra = draw(st.integers(0, len(ell_shape)))
            dims = ell_shape[len(ell_shape) - extra :]
            dims = [1 if n > 1 and draw(st.integers(0, 3)) == 0 else n for n in dims]
            position = draw(st.integers(0, len(labels)))
            term = term[:position] + "..." + term[position:]
            shape = shape[:position] + dims + shape[position:]
        terms.append(term)
        shapes.append(shape)
        full.append(kept)
    used = sorted({c for t in terms for c in t if c.isalpha()})
    has_dots = any("..." in t for t in terms)
    explicit = draw(st.booleans())
    if explicit:
        out = list(draw(st.permutations(used)))[: draw(st.integers(0, len(used)))]
    else:
        every = [c for t in terms for c in t if c.isalpha()]
        out = sorted(c for c in used if every.count(c) == 1)
    if not lonely:
        for c in used:
            if c not in out and sum(c in kept for kept in full) < 2:
                out.append(c)
                explicit = True
    if explicit:
        output = "".join(out)
        if has_dots:
            at = draw(st.integers(0, len(output)))
            output = output[:at] + "..." + output[at:]
        subscripts = ",".join(terms) + "->" + output
    else:
        subscripts = ",".join(terms)
    arrays = [draw(view_of(shape, dtype)) for shape in shapes]
    return subscripts, arrays, dtype


def optimize_for(draw, count):
    choices = ["auto", "greedy", "dp", False, None]
    if count <= 5:
        choices.append("optimal")
    return draw(st.sampled_from(choices))


@settings(max_examples=40, deadline=None)
@given(multi_einsums(), st.data())
def test_generated_einsums_equal_numpy(case, data):
    subscripts, arrays, dtype = case
    optimize = optimize_for(data.draw, len(arrays))
    got = teir.einsum(subscripts, *arrays, optimize=optimize)
    assert_close(got, subscripts, arrays, dtype)
    if np.ndim(got) == 0:
        assert isinstance(got, np.generic)


@settings(max_examples=25, deadline=None)
@given(multi_einsums(lonely=True, ellipsis=False, max_ops=5), st.data())
def test_generated_einsums_summing_labels_of_one_operand(case, data):
    """Labels that one operand alone has and the output does not (summed within a step)."""
    subscripts, arrays, dtype = case
    optimize = optimize_for(data.draw, len(arrays))
    assert_close(teir.einsum(subscripts, *arrays, optimize=optimize), subscripts, arrays, dtype)


@settings(max_examples=30, deadline=None)
@given(
    multi_einsums(ellipsis=False, max_ops=5),
    st.sampled_from(["C", "F", "strided", "reversed"]),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_generated_einsums_into_out(case, layout, accumulate, relu, seed):
    subscripts, arrays, dtype = case
    shape = np.shape(np.einsum(subscripts, *arrays))
    start = np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)
    out = out_array(start, layout)
    result = teir.einsum(subscripts, *arrays, out=out, accumulate=accumulate, relu=relu)
    assert result is out
    assert_close(out, subscripts, arrays, dtype, start if accumulate else None, relu)


# ---- fixed cases -----------------------------------------------------------------------------

CASES = [
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("ij,jk,kl", [(3, 4), (4, 5), (5, 2)]),
    ("ij,jk,kl,lm->mi", [(2, 3), (3, 4), (4, 5), (5, 3)]),
    ("abc,cd,dbe->ae", [(2, 3, 4), (4, 5), (5, 3, 2)]),
    ("ea,fb,abcd,gc,hd->efgh", [(3, 2), (3, 2), (2, 2, 2, 2), (3, 2), (3, 2)]),
    (
        "ab,bc,cd,de,ef,fg,gh,hi->ai",
        [(2, 3), (3, 2), (2, 4), (4, 2), (2, 3), (3, 2), (2, 3), (3, 2)],
    ),
    ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 3)]),
    ("i,i,i->i", [(5,), (5,), (5,)]),
    ("i,j,k->ijk", [(2,), (3,), (4,)]),
    ("ij,ij,ij->", [(3, 4), (3, 4), (3, 4)]),
    ("ijk,jkl,lmi,m->", [(2, 3, 4), (3, 4, 2), (2, 3, 2), (3,)]),
    ("pqrs,tuqr,sp,ut->", [(2, 3, 4, 2), (3, 2, 3, 4), (2, 2), (2, 3)]),
]


@pytest.mark.parametrize("optimize", OPTIMIZE, ids=[repr(o) for o in OPTIMIZE])
@pytest.mark.parametrize(("subscripts", "shapes"), CASES, ids=[c[0] for c in CASES])
def test_every_optimize_option(subscripts, shapes, optimize):
    for dtype in DTYPES:
        ops = operands(shapes, dtype)
        got = check(subscripts, ops, optimize=optimize)
        np.testing.assert_array_equal(teir.einsum(subscripts, *ops, optimize=optimize), got)


@pytest.mark.parametrize(
    "path",
    [
        [(0, 1), (0, 1), (0, 1)],
        [(2, 3), (0, 1), (0, 1)],
        [(1, 2), (1, 2), (0, 1)],
        [(0, 3), (0, 2), (0, 1)],
        [(0, 1, 2, 3)],
        [(1, 2, 3), (0, 1)],
        [(np.int64(2), np.int64(3)), (0, 1), (0, 1)],  # NumPy integers (a path in an array)
        [(0,), (0, 1), (0, 1), (0, 1)],  # a one-operand step moves its operand last
        [(3,), (1, 2), (0, 1), (0, 1)],
    ],
)
def test_explicit_paths(path):
    subscripts = "ij,jk,kl,lm->im"
    ops = operands([(3, 4), (4, 5), (5, 6), (6, 2)])
    check(subscripts, ops, optimize=path)


def test_numpy_einsum_path_format():
    """np.einsum accepts the path np.einsum_path returns (a list starting 'einsum_path')."""
    subscripts = "ij,jk,kl,lm->im"
    ops = operands([(3, 4), (4, 5), (5, 6), (6, 2)])
    path, _ = np.einsum_path(subscripts, *ops, optimize="greedy")
    assert path[0] == "einsum_path"
    np.testing.assert_allclose(
        np.einsum(subscripts, *ops, optimize=path), ops[0] @ ops[1] @ ops[2] @ ops[3]
    )
    check(subscripts, ops, optimize=path)


def test_paths_from_opt_einsum_and_numpy_agree():
    import opt_einsum

    subscripts = "abc,cd,dbe,ea->"
    ops = operands([(2, 3, 4), (4, 5), (5, 3, 2), (2, 2)])
    path, _ = opt_einsum.contract_path(subscripts, *ops, optimize="optimal")
    check(subscripts, ops, optimize=path)
    numpy_path, _ = np.einsum_path(subscripts, *ops, optimize="optimal")
    check(subscripts, ops, optimize=numpy_path[1:])


def test_out_accumulate_relu():
    subscripts = "ij,jk,kl->il"
    ops = operands([(4, 5), (5, 6), (6, 3)])
    expected = ops[0] @ ops[1] @ ops[2]
    start = RNG.uniform(-1, 1, (4, 3))
    out = start.copy()
    assert teir.einsum(subscripts, *ops, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    out = start.copy()
    assert teir.einsum(subscripts, *ops, out=out, accumulate=True) is out
    np.testing.assert_allclose(out, start + expected, rtol=1e-12, atol=1e-12)
    relu = teir.einsum(subscripts, *ops, relu=True)
    np.testing.assert_allclose(relu, np.maximum(expected, 0), rtol=1e-12, atol=1e-12)
    out = start.copy()
    teir.einsum(subscripts, *ops, out=out, accumulate=True, relu=True)
    np.testing.assert_allclose(out, np.maximum(start + expected, 0), rtol=1e-12, atol=1e-12)
    # the intermediates must never get ReLU or accumulation: only the result does
    a, b, c = np.ones((2, 2)), -np.eye(2), -np.eye(2)
    np.testing.assert_array_equal(teir.einsum("ij,jk,kl->il", a, b, c, relu=True), a)
    acc = np.ones((2, 2))
    teir.einsum("ij,jk,kl->il", a, b, c, out=acc, accumulate=True)
    np.testing.assert_array_equal(acc, 2 * a)


def test_out_views_and_errors():
    subscripts = "ij,jk,kl->il"
    ops = operands([(4, 5), (5, 6), (6, 3)])
    expected = ops[0] @ ops[1] @ ops[2]
    big = np.zeros((8, 9))
    view = big[::2, ::3]
    assert teir.einsum(subscripts, *ops, out=view) is view
    np.testing.assert_allclose(view, expected, rtol=1e-12)
    big[::2, ::3] = 0
    assert not big.any()  # nothing outside the view was written
    reversed_out = np.zeros((4, 3))[::-1, ::-1]
    teir.einsum(subscripts, *ops, out=reversed_out)
    np.testing.assert_allclose(reversed_out, expected, rtol=1e-12)
    with pytest.raises(teir.TeirError, match="shape"):
        teir.einsum(subscripts, *ops, out=np.zeros((3, 4)))
    with pytest.raises(teir.TeirError, match="dtype"):
        teir.einsum(subscripts, *ops, out=np.zeros((4, 3), np.float32))
    read_only = np.zeros((4, 3))
    read_only.flags.writeable = False
    with pytest.raises(teir.TeirError, match="read-only"):
        teir.einsum(subscripts, *ops, out=read_only)
    with pytest.raises(teir.TeirError, match=r"read-only|broadcast"):
        teir.einsum(subscripts, *ops, out=np.broadcast_to(np.zeros((1, 3)), (4, 3)))


def test_out_overlapping_an_operand():
    a, b, c = operands([(4, 4), (4, 4), (4, 4)])
    expected = a @ b @ c
    assert teir.einsum("ij,jk,kl->il", a, b, c, out=a) is a
    np.testing.assert_allclose(a, expected, rtol=1e-12)


def test_views_of_every_kind():
    base = RNG.uniform(-1, 1, (12, 14))
    a = base[1:7:2, ::-3]  # (3, 5), negative and non-unit strides
    b = RNG.uniform(-1, 1, (6, 5)).T  # (5, 6), transposed
    c = np.asfortranarray(RNG.uniform(-1, 1, (6, 4)))
    d = np.broadcast_to(RNG.uniform(-1, 1, (1, 2)), (4, 2))  # stride 0
    e = RNG.uniform(-1, 1, (2, 3))[::-1, ::-1]
    check("ij,jk,kl,lm,mi->", [a, b, c, d, e])
    check("ij,jk,kl,lm->im", [a, b, c, d])
    check("ij,jk,kl->li", [a[::-1], b[:, ::-1], c[::-1, ::-1]])
    for dtype in DTYPES:
        x = base.astype(dtype)
        check("ij,jk,kl->il", [x[:4, :5], x[::-1][:5, :6], x[:, ::-2][:6, :3]])


def test_same_shapes_other_strides_reuse_no_stale_plan():
    subscripts = "ij,jk,kl->il"
    a, b, c = operands([(5, 5), (5, 5), (5, 5)])
    for first, second in [(a, a.T), (b[::-1], b), (c.T, np.asfortranarray(c))]:
        check(subscripts, [first, b, c])
        check(subscripts, [second, b, c])
        check(subscripts, [a, second, c])
        check(subscripts, [a, b, first])
    # the same shapes and strides, other values: the cached tree gives the new result
    for seed in range(3):
        check(subscripts, operands([(5, 5), (5, 5), (5, 5)], seed=seed))


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("iij,jk,kl->il", [(3, 3, 4), (4, 5), (5, 2)]),
        ("ii,ij,jk->ik", [(3, 3), (3, 4), (4, 2)]),
        ("ij,jj,jk->ik", [(3, 4), (4, 4), (4, 2)]),
        ("iii,ij,jk->k", [(3, 3, 3), (3, 4), (4, 2)]),
        ("ijij,jk,ki->", [(2, 3, 2, 3), (3, 4), (4, 2)]),
        ("ii,ii,ii->i", [(4, 4), (4, 4), (4, 4)]),
        ("ii,jj,ij->ij", [(3, 3), (2, 2), (3, 2)]),
    ],
)
def test_diagonals(subscripts, shapes):
    for dtype in DTYPES:
        check(subscripts, operands(shapes, dtype))


@pytest.mark.parametrize(
    ("subscripts", "values"),
    [
        (",ij,jk->ik", [np.float64(2.5), (3, 4), (4, 2)]),
        ("ij,,jk->ik", [(3, 4), 3.0, (4, 2)]),
        ("ij,ji,->", [(3, 4), (4, 3), np.array(-1.5)]),
        (",,ij->ij", [np.array(2.0), np.array(0.5), (2, 3)]),
        (",,", [np.array(2.0), np.array(3.0), np.array(4.0)]),
        (",,->", [np.array(2.0), 3.0, np.float64(4.0)]),
        ("i,,i->", [(4,), np.array(2.0), (4,)]),
        (",ij,jk,", [np.array(2.0), (3, 4), (4, 2), np.array(-1.0)]),
    ],
)
def test_scalar_operands(subscripts, values):
    ops = [RNG.uniform(-1, 1, v) if isinstance(v, tuple) else v for v in values]
    got = check(subscripts, ops)
    if np.ndim(got) == 0:
        assert isinstance(got, np.float64)
    np.testing.assert_allclose(got, np.einsum(subscripts, *ops), rtol=1e-12)


def test_scalar_fp32_operands_keep_fp32():
    ops = [np.float32(2.0), np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)]
    got = teir.einsum(",ij,jk->ik", *ops)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.full((3, 2), 8.0, np.float32))


def test_mixed_precision_promotes_like_numpy():
    a, b, c = operands([(2, 3), (3, 4), (4, 2)])
    got = check("ij,jk,kl->il", [a.astype(np.float32), b, c.astype(np.float32)])
    assert got.dtype == np.float64
    got = teir.einsum("ij,jk,kl->il", a, b, c, dtype=np.float32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, a @ b @ c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("...ij,jk,kl->...il", [(2, 3, 4), (4, 5), (5, 2)]),
        ("...ij,...jk,...kl->...il", [(2, 1, 3, 4), (3, 4, 5), (1, 5, 2)]),
        ("i...,i...,i...->...", [(3, 2), (3, 1), (3, 2)]),
        ("...,...,...", [(2, 3), (3,), (1, 3)]),
        ("a...,b...,ab->...", [(2, 4), (3, 4), (2, 3)]),
        ("ij...,jk,kl...->il...", [(2, 3, 4), (3, 2), (2, 2, 4)]),
    ],
)
def test_ellipsis(subscripts, shapes):
    for dtype in DTYPES:
        check(subscripts, operands(shapes, dtype))


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("ij,jk,kl->il", [(3, 1), (4, 5), (5, 2)]),  # j broadcast in the first operand
        ("ij,jk,kl->il", [(3, 4), (1, 5), (5, 2)]),
        ("ij,ij,ij->ij", [(3, 1), (1, 4), (3, 4)]),
        ("ij,jk,kl", [(1, 1), (1, 1), (1, 1)]),
    ],
)
def test_broadcast_size_one(subscripts, shapes):
    check(subscripts, operands(shapes))


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("ij,jk,kl->il", [(3, 0), (0, 4), (4, 2)]),  # a summed size 0: zeros
        ("ij,jk,kl->il", [(0, 4), (4, 5), (5, 2)]),  # an output size 0: empty
        ("ij,jk,kl->il", [(3, 4), (4, 0), (0, 2)]),
    ],
)
def test_zero_sized_dimensions(subscripts, shapes):
    ops = [np.ones(shape) for shape in shapes]
    got = teir.einsum(subscripts, *ops)
    expected = np.einsum(subscripts, *ops)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


# ---- contract_expression ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("optimize", [None, "greedy", "optimal", False])
def test_contract_expression_three_or_more(dtype, optimize):
    subscripts = "ab,bc,cd,de->ae"
    shapes = [(3, 4), (4, 5), (5, 6), (6, 2)]
    expr = teir.contract_expression(subscripts, *shapes, dtype=dtype, optimize=optimize)
    for seed in range(2):  # calling twice reuses the compiled tree and its arena
        ops = operands(shapes, dtype, seed=seed)
        assert_close(expr(*ops), subscripts, ops, dtype)
    # the same operands again give the same result
    ops = operands(shapes, dtype, seed=0)
    np.testing.assert_array_equal(expr(*ops), expr(*ops))
    out = np.zeros((3, 2), dtype)
    assert expr(*ops, out=out) is out
    assert_close(out, subscripts, ops, dtype)
    text = expr.explain()
    assert subscripts in text and "step" in text


@pytest.mark.parametrize("optimize", [None, False])
def test_contract_expression_accepts_views(optimize):
    """Operands of the right shapes in any layout (as teir.einsum takes them)."""
    subscripts = "ab,bc,cd,de->ae"
    shapes = [(3, 4), (4, 5), (5, 6), (6, 2)]
    expr = teir.contract_expression(subscripts, *shapes, optimize=optimize)
    ops = operands(shapes, seed=4)
    kinds = {
        "fortran": lambda x: np.asfortranarray(x),
        "transposed": lambda x: x.T.copy().T,
        "reversed": lambda x: x[::-1].copy()[::-1],
        "strided": lambda x: np.repeat(x, 2, axis=1)[:, ::2],
    }
    for make in kinds.values():
        for index in range(len(ops)):
            views = list(ops)
            views[index] = make(ops[index])
            np.testing.assert_array_equal(views[index], ops[index])
            assert_close(expr(*views), subscripts, views)
            # back to C order, twice: the views remade from the last layout's are not reused
            assert_close(expr(*ops), subscripts, ops)
            assert_close(expr(*ops), subscripts, ops)


def test_repeated_calls_remake_the_leaves_views():
    # C-ordered operands are permuted views on later calls; a diagonal stays prepared anew
    for subscripts, shapes in [
        ("ab,cb,cd->ad", [(3, 4), (5, 4), (5, 2)]),
        ("iij,jk,kl->il", [(3, 3, 4), (4, 5), (5, 2)]),
        ("abc,b,ca->c", [(2, 3, 4), (1,), (4, 2)]),  # b of size 1 broadcasts
    ]:
        expr = teir.contract_expression(subscripts, *shapes)
        for seed in range(3):
            ops = operands(shapes, seed=seed)
            assert_close(expr(*ops), subscripts, ops)
            assert_close(teir.einsum(subscripts, *ops), subscripts, ops)


def test_contract_expression_scalar_result_and_options():
    expr = teir.contract_expression("i,i,i->", (4,), (4,), (4,))
    value = expr(np.ones(4), np.full(4, 2.0), np.full(4, 0.5))
    assert isinstance(value, np.float64) and value == 4.0
    relu = teir.contract_expression("ij,jk,kl->il", (2, 2), (2, 2), (2, 2), relu=True)
    np.testing.assert_array_equal(relu(np.ones((2, 2)), -np.eye(2), np.eye(2)), np.zeros((2, 2)))
    acc = teir.contract_expression("ij,jk,kl->il", (2, 2), (2, 2), (2, 2), accumulate=True)
    out = np.ones((2, 2))
    acc(np.eye(2), np.eye(2), np.eye(2), out=out)
    np.testing.assert_array_equal(out, np.ones((2, 2)) + np.eye(2))


def test_contract_expression_errors():
    expr = teir.contract_expression("ab,bc,cd->ad", (3, 4), (4, 5), (5, 2))
    a, b, c = operands([(3, 4), (4, 5), (5, 2)])
    with pytest.raises(teir.EinsumError, match="shape"):
        expr(a, b, c.T)
    with pytest.raises(teir.EinsumError, match="expected 3 operands"):
        expr(a, b)
    with pytest.raises(teir.EinsumError, match="shape"):
        expr(a, b, c, out=np.zeros((2, 3)))
    with pytest.raises(teir.TeirError):
        teir.contract_expression("ab,bc,cd->ad", (3, 4), (5, 5), (5, 2))
    with pytest.raises(teir.EinsumError, match="dtype"):
        teir.contract_expression("ab,bc,cd->ad", (3, 4), (4, 5), (5, 2), dtype=np.int32)


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize(
    "bad, match",
    [
        (3, "is not a sequence of sizes"),
        (np.ones((3, 4)), "not the operands"),
        ((3, -4), "negative size"),
        ((3.7, 4), "not an integer size"),
        ((2**40, 2**40), "more than this machine's"),
    ],
)
def test_contract_expression_checks_its_shapes(bad, match, count):
    """Shapes that are not tuples of sizes get teir's error saying which and why (were
    Python's TypeError, NumPy's ValueError, or 3.7 taken as 3), with two operands or more."""
    subscripts = "ij,jk->ik" if count == 2 else "ij,jk,kl->il"
    rest = [(4, 5), (5, 2)][: count - 1]
    with pytest.raises(teir.TeirError, match=match):
        teir.contract_expression(subscripts, bad, *rest)
    shape = (np.int64(3), 4)  # NumPy integers are sizes
    assert teir.contract_expression(subscripts, shape, *rest).shapes[0] == (3, 4)


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        [(0, 7), (0, 1)],  # an operand that does not exist
        [(0, 1), (0, 5)],
        [(-9, 1), (0, 1)],
        [("a", "b")],
        3,
        "bogus",
        [(0, 0), (0, 1)],
        [(0, 1)],
        [(), (0, 1), (0, 1)],
        [(True, 1), (0, 1)],
    ],
    ids=[
        "index-7",
        "second-step",
        "negative",
        "letters",
        "int",
        "unknown-name",
        "twice",
        "incomplete",
        "empty-step",
        "bool",
    ],
)
def test_bad_paths(path):
    ops = operands([(3, 4), (4, 5), (5, 2)])
    with pytest.raises(teir.EinsumError) as error:
        teir.einsum("ij,jk,kl->il", *ops, optimize=path)
    assert "Error" not in str(error.value)  # teir's words, not another library's exception
    with pytest.raises(teir.EinsumError):
        teir.contract_expression("ij,jk,kl->il", (3, 4), (4, 5), (5, 2), optimize=path)


@pytest.mark.parametrize(
    ("subscripts", "shapes", "match"),
    [
        ("ij,jk,kl->il", [(3, 4), (5, 5), (5, 2)], "size"),
        ("ij,jk,kl->il", [(3, 4), (4, 5), (6, 2)], "size"),
        ("ij,jk,kl->il", [(3, 4), (4, 5)], "operand"),
        ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2), (2, 2)], "operand"),
        ("ij,jk,kl->iz", [(3, 4), (4, 5), (5, 2)], "does not appear"),
        ("ij,jk,kl->ii", [(3, 4), (4, 5), (5, 2)], "more than once"),
        ("ij,jk,k->i", [(3, 4), (4, 5), (5, 2)], "dimensions"),
        ("ii,ij,jk->k", [(3, 4), (4, 5), (5, 2)], "different sizes"),
        ("...ij,...jk,kl->...il", [(2, 3, 4), (3, 4, 5), (5, 2)], "size"),
    ],
)
def test_errors(subscripts, shapes, match):
    ops = operands(shapes)
    with pytest.raises(teir.TeirError, match=match):
        teir.einsum(subscripts, *ops)
    assert issubclass(teir.EinsumError, teir.TeirError)


def test_operand_errors():
    a, b = operands([(3, 4), (4, 5)])
    with pytest.raises(teir.EinsumError, match="int64"):
        teir.einsum("ij,jk,kl->il", a, b, np.ones((5, 2), np.int64))
    with pytest.raises(teir.EinsumError, match="complex128"):
        teir.einsum("ij,jk,kl->il", a, b, np.ones((5, 2), np.complex128))
    with pytest.raises(teir.EinsumError, match="dtype"):
        teir.einsum("ij,jk,kl->il", a, b, np.ones((5, 2)), dtype=np.int32)


@pytest.mark.parametrize("relu", [False, True])
def test_accumulate_into_out_when_the_tree_ends_in_a_permutation(relu):
    """A transposed operand can make the tree's last node a permutation (a Copy, which
    overwrites): the result is still added to out."""
    base = np.random.default_rng(0).uniform(-1, 1, (2, 2, 2)).astype(np.float32)
    ops = [base.transpose(2, 0, 1), base.copy(), base.copy()]
    start = np.random.default_rng(1).uniform(-1, 1, (2, 2, 2)).astype(np.float32)
    out = start.copy()
    teir.einsum("ebd,ddf,aaf->eab", *ops, out=out, accumulate=True, relu=relu)
    assert_close(out, "ebd,ddf,aaf->eab", ops, np.float32, start, relu)


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("ii,ij,jk->k", [(3, 3), (3, 4), (4, 2)]),
        ("ii,ij,jk->k", [(300, 300), (300, 4), (4, 2)]),
        ("iij,jk,kl->il", [(3, 3, 4), (4, 5), (5, 2)]),
        ("iji,jk,kl->l", [(3, 4, 3), (4, 5), (5, 2)]),
    ],
)
def test_contract_expression_takes_diagonals_of_views(subscripts, shapes):
    """A leaf compiled as the diagonal of a C-ordered operand (its elements n + 1 apart) given
    another layout is copied into the compiled one, not into a contiguous array the kernels
    would read n + 1 apart (which read past its end: garbage, or a crash at 3000 x 3000)."""
    expr = teir.contract_expression(subscripts, *shapes)
    ops = operands(shapes, seed=9)
    first = ops[0]
    roomy = np.zeros(tuple(n + 2 for n in first.shape))
    roomy[tuple(slice(0, n) for n in first.shape)] = first
    views = {
        "sliced": roomy[tuple(slice(0, n) for n in first.shape)],
        "fortran": np.asfortranarray(first),
        "broadcast": np.broadcast_to(first[:1], first.shape),
    }
    for view in views.values():
        given = [view, *ops[1:]]
        assert_close(expr(*given), subscripts, given)
    assert_close(expr(*ops), subscripts, ops)
