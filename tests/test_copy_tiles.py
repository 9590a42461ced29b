"""Copies whose tiles no Copy kernel fits run the generic primitive with the output's strides
decreasing inward; a copy that is one long run is cut into blocks the threads share; an
einsum that copies all three tensors keeps them in their own orders where it can."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import teir
from teir.lower.nest import lower
from teir.optimizer.primitive import ROW_BLOCK_BYTES


def _views(dtype, n: int, strided_in: bool, strided_out: bool):
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (n, 2 * n)).astype(dtype)
    source = a[:, ::2] if strided_in else np.ascontiguousarray(a[:, ::2])
    base = np.zeros((n, 2 * n), dtype)
    out = base[:, ::2] if strided_out else np.zeros((n, n), dtype)
    return source, base, out


@pytest.mark.parametrize("subscripts", ["ij->ij", "ij->ji"])
@pytest.mark.parametrize("strided_in, strided_out", [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_copies_run_the_generic_primitive_output_order_inward(
    subscripts, strided_in, strided_out, dtype
):
    source, base, out = _views(dtype, 96, strided_in, strided_out)
    teir.einsum(subscripts, source, out=out, threads=2)
    expected = source if subscripts == "ij->ij" else source.T
    np.testing.assert_array_equal(out, expected)
    if strided_out:  # the other elements of the wider output stay untouched
        assert not base[:, 1::2].any()
    plan = teir.einsum_plan(subscripts, source, out=out, threads=2)
    assert plan.config is not None
    op = lower(plan.config, False).main
    assert op is not None and op.kind == "generic"  # no unit stride in in0 or in out
    strides = [axis.out for axis in op.spec.axes]
    assert strides == sorted(strides, reverse=True)


def test_an_aliasing_output_keeps_the_listed_order():
    # out's tile aliases itself (two axes of stride 1): the updates stay in listed order,
    # the reference semantics, and the last write of each element wins
    config = teir.Config(
        data_type="FP64",
        prim_main="Copy",
        dim_types=["C", "C"],
        exec_types=["prim", "prim"],
        dim_sizes=[3, 4],
        strides_in0=[4, 1],
        strides_in1=[0, 0],
        strides_out=[1, 1],
    )
    op = lower(config, False).main
    assert op is not None and op.kind == "generic"
    assert [axis.size for axis in op.spec.axes] == [3, 4]
    in0 = np.arange(12.0)
    out = np.zeros(6)
    teir.compile(config)(in0, None, out)
    expected = np.zeros(6)
    teir.reference.execute(config, in0, None, expected)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_copy_of_one_run_is_shared_between_threads(dtype):
    a = np.random.default_rng(1).uniform(-1, 1, (512, 1024)).astype(dtype)
    out = np.empty_like(a)
    plan = teir.einsum_plan("ij->ij", a, out=out, threads=2)
    assert "shared 1 loop(s)" in plan.explain()
    assert plan.config is not None
    tile = [
        size for size, e in zip(plan.config.dim_sizes, plan.config.exec_types) if e.value == "prim"
    ]
    assert tile == [ROW_BLOCK_BYTES // a.itemsize]
    teir.einsum("ij->ij", a, out=out, threads=2)
    np.testing.assert_array_equal(out, a)
    small = np.ones(1000, dtype)  # one block: nothing to share
    text = teir.einsum_plan("i->i", small, out=np.empty_like(small), threads=2).explain()
    assert "direct tile 1000 " in text


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(st.integers(1, 9), min_size=2, max_size=4),
    st.integers(1, 3),
    st.integers(1, 3),
    st.data(),
)
def test_generated_strided_permutations(threads, shape, step_in, step_out, data):
    labels = "abcd"[: len(shape)]
    order = "".join(data.draw(st.permutations(labels)))
    rng = np.random.default_rng(len(shape))
    wide = rng.uniform(-1, 1, [*shape[:-1], shape[-1] * step_in])
    source = wide[..., ::step_in]
    out_shape = [shape[labels.index(c)] for c in order]
    base = np.zeros([*out_shape[:-1], out_shape[-1] * step_out])
    out = base[..., ::step_out]
    teir.einsum(f"{labels}->{order}", source, out=out, threads=threads)
    np.testing.assert_array_equal(out, np.einsum(f"{labels}->{order}", source))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_three_copied_keep_their_order_where_they_can(dtype):
    # every tensor a stride-2 view: no kernel fits any of them, so all three are copied, in
    # the orders they lie in (the transposed product's) rather than transposed
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (48, 80)).astype(dtype)[:, ::2]  # ik
    b = rng.uniform(-1, 1, (40, 64)).astype(dtype)[:, ::2]  # kj
    base = np.zeros((48, 64), dtype)
    out = base[:, ::2]
    text = teir.einsum_plan("ik,kj->ij", a, b, out=out, threads=2).explain()
    assert "in0 is copied into the order ik" in text
    assert "in1 is copied into the order kj" in text
    assert "the result is computed in the order ij" in text
    teir.einsum("ik,kj->ij", a, b, out=out, threads=2)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    assert not base[:, 1::2].any()
