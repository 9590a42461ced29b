"""Generated configurations: the reference executor against np.einsum and the naive interpreter."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import teir
from helpers import operands
from naive import assert_matches_naive, naive_execute
from strategies import configs
from teir import reference
from teir.explain import explain


@given(configs(), st.integers(0, 2**32 - 1))
def test_reference_equals_einsum(data, seed):
    cfg = teir.Config.from_dict(data)
    in0, in1, out = operands(cfg, seed)
    before = out.copy()
    expected = reference.dense_result(cfg, in0, in1, out)
    reference.execute(cfg, in0, in1, out)
    comparison = reference.compare(cfg, before, out, expected)
    assert comparison.ok, f"{comparison.message}\n{cfg!r}"


@settings(max_examples=100)
@given(configs(max_dims=5, max_size=4, aliasing=True), st.integers(0, 2**32 - 1))
def test_reference_equals_naive_interpreter_even_with_aliasing(data, seed):
    cfg = teir.Config.from_dict(data)
    in0, in1, out = operands(cfg, seed)
    naive = naive_execute(
        data, [] if in0 is None else list(in0), [] if in1 is None else list(in1), list(out)
    )
    reference.execute(cfg, in0, in1, out)
    assert_matches_naive(data, out, naive, cfg.dtype)


@given(configs(), st.integers(0, 2**32 - 1))
def test_einsum_execute_writes_only_addressed_elements(data, seed):
    cfg = teir.Config.from_dict(data)
    in0, in1, out = operands(cfg, seed)
    padded = np.concatenate([out, np.full(5, 42.0, dtype=cfg.dtype)])
    reference.einsum_execute(cfg, in0, in1, padded)
    np.testing.assert_array_equal(padded[-5:], 42.0)


@given(configs())
def test_explain_mentions_every_loop_and_primitive(data):
    cfg = teir.Config.from_dict(data)
    text = explain(cfg)
    for axis in cfg.loop_axes:
        assert f"in range({cfg.dim_sizes[axis]})" in text and f"axis {axis}:" in text
    if cfg.prim_main is not teir.PrimMain.NONE:
        assert cfg.prim_main.value + ":" in text
    if cfg.prim_first is not teir.PrimFirst.NONE:
        assert f"{cfg.prim_first.value}(out_tile" in text
