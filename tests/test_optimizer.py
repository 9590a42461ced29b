"""teir.optimize: invariants of the passes, equality with the unoptimized configuration."""

from __future__ import annotations

import json
import re
from math import prod

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import teir
from helpers import EXAMPLES, operands
from strategies import configs
from teir import reference
from teir.frontend import einsum_plan, element_layout
from teir.frontend.einsum import clear_plans
from teir.lower.nest import lower

RNG = np.random.default_rng(7)

UNSCHEDULED = sorted((EXAMPLES / "unscheduled").glob("*.json"))


def size_products(config: teir.Config) -> dict[teir.DimType, int]:
    return {
        t: prod(n for n, u in zip(config.dim_sizes, config.dim_types) if u is t)
        for t in teir.DimType
    }


@pytest.mark.parametrize("path", UNSCHEDULED, ids=lambda p: p.stem)
@pytest.mark.parametrize("threads", [1, 2])
def test_optimizer_inputs_become_valid_kernel_schedules(path, threads):
    data = json.loads(path.read_text())
    config, log = teir.optimize_with_log(data, threads=threads)
    assert config.prim_main in (teir.PrimMain.GEMM, teir.PrimMain.BRGEMM)
    assert config.flops == data["flops"]
    op = teir.compile(config, threads=threads)
    text = op.explain()
    assert "generic" not in text
    assert len(log) == 6 and all(": " in line for line in log)
    if threads == 2:
        assert any(e is teir.ExecType.SHARED for e in config.exec_types)
        assert len(op.slices) == 2


def test_optimized_contraction_is_fused_like_the_gemm():
    data = json.loads((EXAMPLES / "unscheduled" / "opt_contraction_64_25.json").read_text())
    _, log = teir.optimize_with_log(data, threads=1)
    assert "fused" in log[1]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(max_dims=5, max_size=6), st.sampled_from([1, 2, 3]), st.integers(0, 2**31))
def test_optimized_configs_compute_the_same_result(data, threads, seed):
    original = teir.Config.from_dict(data)
    optimized = teir.optimize(original, threads=threads)
    # The optimizer keeps the operation: per-type size products and each tensor's extent.
    kept = size_products(original)
    new = size_products(optimized)
    for dim_type in teir.DimType:
        assert new[dim_type] == kept[dim_type] or (kept[dim_type] == 1 and new[dim_type] == 1)
    for tensor in teir.Tensor:
        if original.uses(tensor):
            assert optimized.extent(tensor) <= original.extent(tensor)
    in0, in1, out = operands(original, seed)
    expected = out.copy()
    reference.execute(original, in0, in1, expected)
    got = out.copy()
    teir.compile(optimized, threads=threads)(in0, in1, got)
    eps = float(np.finfo(original.dtype).eps)
    k = prod(n for n, t in zip(original.dim_sizes, original.dim_types) if t is teir.DimType.K)
    np.testing.assert_allclose(got, expected, rtol=8 * eps * (k + 2), atol=8 * eps * (k + 2))


def test_aliasing_output_with_first_primitive_is_kept_as_written():
    config = teir.Config(
        data_type="FP64",
        prim_first="Zero",
        prim_main="GEMM",
        dim_types=["M", "M", "N", "K"],
        exec_types=["seq", "prim", "prim", "prim"],
        dim_sizes=[3, 2, 2, 2],
        strides_in0=[4, 1, 0, 2],
        strides_in1=[0, 0, 2, 1],
        strides_out=[0, 1, 2, 0],
    )
    optimized, log = teir.optimize_with_log(config)
    assert optimized == config and "aliases" in log[0]


def test_bad_inputs():
    with pytest.raises(teir.ValidationError):
        teir.optimize({"data_type": "FP16"})
    with pytest.raises(teir.ValidationError):
        teir.optimize([1, 2, 3])
    with pytest.raises(teir.TeirError, match="threads"):
        teir.optimize(teir.load(EXAMPLES / "lab1_gemm.json"), threads=0)


def test_awkward_sizes_keep_kernels():
    for size in (97, 1000, 1601):
        data = {
            "data_type": "FP32",
            "prim_main": "GEMM",
            "dim_types": ["M", "N", "K"],
            "exec_types": ["seq"] * 3,
            "dim_sizes": [size, 48, 64],
            "strides_in0": [1, 0, size],
            "strides_in1": [0, 64, 1],
            "strides_out": [1, size, 0],
        }
        config = teir.optimize(data, threads=2)
        assert "generic" not in teir.compile(config, threads=2).explain()


def _prim_sizes(config: teir.Config) -> dict[str, int]:
    return {
        t.value: s
        for t, e, s in zip(config.dim_types, config.exec_types, config.dim_sizes)
        if e is teir.ExecType.PRIM and t is not teir.DimType.K
    }


def test_gemm_larger_than_the_caches_runs_in_panels(monkeypatch):
    """When the inner tile loop sweeps more of its operand than L2 holds, the outer tile loop
    is cut into panels whose tiles reuse each inner tile while it is hot; the result stays
    the GEMM's (caches shrunk so that a small GEMM is "large")."""
    import teir.optimizer.schedule as schedule

    monkeypatch.setattr(
        schedule, "cache_sizes", lambda: {"L1": 4096, "L2": 64 * 1024, "L3": 1024 * 1024}
    )
    m, n, k = 480, 640, 96
    data = {
        "data_type": "FP64",
        "prim_main": "GEMM",
        "dim_types": ["M", "N", "K"],
        "exec_types": ["seq"] * 3,
        "dim_sizes": [m, n, k],
        "strides_in0": [1, 0, m],
        "strides_in1": [0, k, 1],
        "strides_out": [1, m, 0],
    }
    config, log = teir.optimize_with_log(data, threads=2)
    assert "panels of" in log[4], log
    loops = [
        (t, size)
        for t, size, e in zip(config.dim_types, config.dim_sizes, config.exec_types)
        if e is not teir.ExecType.PRIM
    ]
    # N panels outside the M loop, N tiles inside it
    assert [t for t, _ in loops] == [teir.DimType.N, teir.DimType.M, teir.DimType.N]
    panel_tiles = loops[2][1]
    prim_n = _prim_sizes(config)["N"]
    # a panel's tiles of B fit the threads' share of the (shrunk) last-level cache
    share = int(1024 * 1024 * schedule.PANEL_L3_SHARE) // 2
    assert panel_tiles >= 2 and panel_tiles * prim_n * k * 8 <= share
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(m * k), rng.standard_normal(n * k)
    c = np.zeros(m * n)  # GEMM without Zero accumulates
    teir.compile(config, threads=2)(a, b, c)
    expected = a.reshape(k, m).T @ b.reshape(n, k).T
    np.testing.assert_allclose(c.reshape(n, m).T, expected, rtol=1e-12, atol=1e-10)
    # within the caches: the order stays as reorder wrote it
    monkeypatch.undo()
    _, log = teir.optimize_with_log(data, threads=2)
    assert "no panels" in log[4], log


def test_store_bound_contraction_tiles_are_long_output_rows():
    """With K of size 1 (an outer product) the tile is a long run of the output's unit-stride
    axis times a few columns, not a cache-sized square."""
    data = {
        "data_type": "FP32",
        "prim_main": "GEMM",
        "dim_types": ["M", "N", "K"],
        "exec_types": ["seq"] * 3,
        "dim_sizes": [2048, 2048, 1],
        "strides_in0": [1, 0, 1],
        "strides_in1": [0, 1, 1],
        "strides_out": [2048, 1, 0],
    }
    sizes = _prim_sizes(teir.optimize(data, threads=2))
    assert sizes["N"] >= 1024 and sizes["M"] <= 8
    data["dim_sizes"] = [2048, 2048, 512]
    data["strides_in0"] = [512, 0, 1]
    data["strides_in1"] = [0, 1, 2048]
    sizes = _prim_sizes(teir.optimize(data, threads=2))
    assert sizes["M"] > 8  # compute-bound: cache-sized tiles


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("k,kj->j", [(4096,), (4096, 4096)]),  # x @ A, A row-major
        ("ji,j->i", [(1000, 2048), (1000,)]),  # A^T x
        ("bk,bkj->bj", [(3, 1009), (3, 1009, 600)]),  # batched, a prime K
    ],
)
def test_matrix_vector_products_stream_the_matrix(subscripts, shapes, threads):
    """A matrix-vector product whose matrix has unit stride along the output reads each K
    step as a run along the rows: long row blocks (at least a page), one per thread, and K
    a few steps at a time."""
    operands_ = [RNG.uniform(-1, 1, shape) for shape in shapes]
    plan = teir.einsum_plan(subscripts, *operands_, threads=threads)
    operation = plan.regions[0].operation
    main = operation.nest.main_zero or operation.nest.main
    assert main is not None
    spec = main.spec
    rows = spec.n if spec.m == 1 else spec.m
    assert rows * 8 >= 4096  # runs of at least a page
    assert spec.k <= 16 or "K swept 8 steps at a time" in operation.explain()
    np.testing.assert_allclose(
        teir.einsum(subscripts, *operands_, threads=threads),
        np.einsum(subscripts, *operands_),
        rtol=1e-11,
        atol=1e-11,
    )


@pytest.mark.parametrize("l2_kib", [512, 1024, 2048])
def test_long_matrix_rows_stream_in_blocks_of_an_eighth_of_l2(l2_kib):
    """Rows much longer than a page run in blocks of an eighth of L2 (the output's block
    stays there while the matrix's K steps stream past as long runs), not of a page."""
    from conftest import pinned_machine

    operands_ = [RNG.uniform(-1, 1, (64,)), RNG.uniform(-1, 1, (64, 65536))]
    with pinned_machine("znver4", f"L1=32K,L2={l2_kib}K,L3=32M"):
        plan = teir.einsum_plan("k,kn->n", *operands_, threads=1)
        main = plan.regions[0].operation.nest.main_zero or plan.regions[0].operation.nest.main
        assert main is not None
        rows = main.spec.n if main.spec.m == 1 else main.spec.m
        assert l2_kib * 1024 // 8 // 8 <= rows <= 2 * l2_kib * 1024 // 8 // 8
        np.testing.assert_allclose(
            teir.einsum("k,kn->n", *operands_, threads=1),
            operands_[0] @ operands_[1],
            rtol=1e-11,
            atol=1e-11,
        )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("subscripts", "sizes"),
    [
        ("ij,ij->j", {"i": 300, "j": 2100}),  # column dot products, the columns in blocks
        ("ijk,ijk->k", {"i": 7, "j": 9, "k": 40}),
        ("ijb,jb->ib", {"i": 37, "j": 29, "b": 32}),  # batched matrix-vector products
        ("jb,jkb->kb", {"j": 29, "k": 13, "b": 16}),
        ("kij,kj->ij", {"k": 5, "i": 6, "j": 33}),
        ("bij,bij->bj", {"b": 3, "i": 11, "j": 5}),
    ],
)
def test_products_summed_along_the_output_unit_stride(subscripts, sizes, threads):
    """The output's unit stride on a C axis the inputs run along too, with at most an M or
    an N axis: a one-element kernel in loops, the K loops just outside the C axis, so that
    the compiled nest vectorizes along it (ij,ij->j at 2048² FP64: 32 -> 2.5 ms)."""
    inputs, output = subscripts.split("->")
    arrays = [RNG.uniform(-1, 1, [sizes[c] for c in term]) for term in inputs.split(",")]
    plan = teir.einsum_plan(subscripts, *arrays, threads=threads)
    assert plan.lanes is None and plan.canonical is None
    assert "loops innermost (inside the K loops)" in plan.explain()
    expected = np.einsum(subscripts, *arrays)
    np.testing.assert_allclose(
        teir.einsum(subscripts, *arrays, threads=threads), expected, rtol=1e-12, atol=1e-12
    )
    # into a strided view, accumulating, with the ReLU fused; inputs reversed in memory
    base = RNG.uniform(-1, 1, [2 * sizes[c] for c in output])
    out = base[tuple(slice(None, None, 2) for _ in output)]
    before, untouched = out.copy(), base.copy()
    flipped = [a[::-1].copy()[::-1] for a in arrays]
    teir.einsum(subscripts, *flipped, out=out, accumulate=True, relu=True, threads=threads)
    np.testing.assert_allclose(out, np.maximum(before + expected, 0), rtol=1e-12, atol=1e-12)
    mask = np.ones(base.shape, bool)
    mask[tuple(slice(None, None, 2) for _ in output)] = False
    np.testing.assert_array_equal(base[mask], untouched[mask])


def test_equal_tiles_prefer_compact_strides():
    """abcd,dbef->acef: a and c are both M axes of size 32; c's rows are 32 elements apart in
    in0, a's 32768 (a multiple of 4 KiB, so all in one cache set): the kernel takes c (B's
    leading dimension 32; A, in1, comes from a packed panel with leading dimension 64)."""
    expression = teir.contract_expression(
        "abcd,dbef->acef", (32, 32, 32, 32), (32, 32, 32, 32), dtype=np.float32
    )
    # (the row block, 64 or 128, follows the machine's block targets)
    text = expression.explain()
    assert re.search(r"brgemm_f32_(64|128)x32x32_b32_nn_\1_32_1024_", text), text
    assert re.search(r"in1's kernel tile \((64|128) x 32 x batch 32\) is packed", text), text


def test_batch_reduce_axis_keeps_reads_close_together():
    """cdae,decb->ba: e is the kernel's K; c (16) and d (24) are left for the batch-reduce.
    A batch over d would put in1's tiles 31744 elements apart, one over c 64 apart (the
    next rows): the batch is c although d is longer."""
    sizes = {"a": 12, "b": 64, "c": 16, "d": 24, "e": 31}
    a, b = (RNG.uniform(-1, 1, [sizes[x] for x in term]) for term in ("cdae", "decb"))
    plan = teir.einsum_plan("cdae,decb->ba", a, b, threads=1)
    assert "K 31 (of 31), batch-reduce 16" in plan.explain()
    # 11904 products per element: rounding is relative to their magnitudes, not to a sum
    # that may cancel to near zero
    np.testing.assert_allclose(
        teir.einsum("cdae,decb->ba", a, b),
        np.einsum("cdae,decb->ba", a, b),
        rtol=1e-11,
        atol=1e-11 * np.sqrt(16 * 24 * 31),
    )


def _permutation(subscripts: str, size: int, dtype: str = "FP32") -> dict:
    """An unscheduled Copy config of a permutation of row-major tensors (all sizes ``size``)."""
    source, target = subscripts.split("->")

    def strides(labels: str) -> dict[str, int]:
        return {c: size ** (len(labels) - 1 - i) for i, c in enumerate(labels)}

    s_in, s_out = strides(source), strides(target)
    return {
        "data_type": dtype,
        "prim_main": "Copy",
        "dim_types": ["C"] * len(source),
        "exec_types": ["seq"] * len(source),
        "dim_sizes": [size] * len(source),
        "strides_in0": [s_in[c] for c in source],
        "strides_in1": [0] * len(source),
        "strides_out": [s_out[c] for c in source],
    }


def _loops(config: teir.Config) -> list[tuple[int, int, int]]:
    """(size, in0 stride, out stride) of each loop around the primitive, outermost first."""
    return [
        (size, config.strides_in0[i], config.strides_out[i])
        for i, (size, e) in enumerate(zip(config.dim_sizes, config.exec_types))
        if e is not teir.ExecType.PRIM
    ]


@pytest.mark.parametrize("threads", [1, 2])
def test_permutation_loops_follow_both_tensors(threads):
    """A transposing copy's innermost loop continues in0's rows and the next one the output's
    columns, each in blocks of a few tiles; the result stays the permutation."""
    n = 32
    config = teir.optimize(_permutation("ijkl->lkji", n), threads=threads)
    loops = _loops(config)
    # k (in0 stride n) innermost, j (out stride n) next, both cut into blocks outside them
    assert loops[-1] == (8, n, n * n) and loops[-2] == (8, n * n, n), loops
    assert sorted(loops[:-2]) == [(4, 8 * n, 8 * n * n), (4, 8 * n * n, 8 * n)], loops
    a = np.random.default_rng(0).standard_normal(n**4).astype(np.float32)
    out = np.full(n**4, np.nan, np.float32)
    teir.compile(config, threads=threads)(a, None, out)
    expected = np.einsum("ijkl->lkji", a.reshape((n,) * 4))
    np.testing.assert_array_equal(out.reshape((n,) * 4), expected)


@pytest.mark.parametrize(
    ("subscripts", "size", "streamed"),
    [
        ("ijkl->lkji", 16, True),  # columns of 64 bytes, scattered by the inner loop
        ("ijk->ikj", 32, True),  # one loop, whose tiles are whole planes
        ("ijkl->ljki", 16, True),  # the inner loop continues the columns: joined
        ("ijkl->lkji", 12, False),  # 48-byte columns share lines with the next tile
    ],
)
def test_large_copies_stream_their_scattered_output(monkeypatch, subscripts, size, streamed):
    """Copies whose input and output fill the last-level cache store scattered, whole-line
    output columns around the caches, and nothing else (caches shrunk so that small
    tensors are "large"); the results are the permutation either way."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    config = teir.optimize(_permutation(subscripts, size), threads=1)
    assert not lower(config).main.spec.stream_b  # real caches: these tensors fit
    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 2048, "L3": 4096})
    assert lower(config).main.spec.stream_b is streamed
    relu = config.replace(prim_last="ReLU")
    assert not lower(relu).main.spec.stream_b  # a last ReLU reads the output back
    ndim = len(subscripts.split("->")[0])
    a = np.random.default_rng(1).standard_normal(size**ndim).astype(np.float32)
    out = teir.buffers.aligned_empty((size**ndim,), np.float32)
    out[:] = np.nan
    teir.compile(config, threads=2)(a, None, out)
    expected = np.einsum(subscripts, a.reshape((size,) * ndim))
    np.testing.assert_array_equal(out.reshape(expected.shape), expected)


def _check_permutation_at_every_offset(config: teir.Config, subscripts: str, size: int) -> None:
    """The compiled permutation equals NumPy's into outputs 0-3 elements past a line,
    writing nothing around them."""
    from teir.buffers import aligned_empty

    ndim = len(subscripts.split("->")[0])
    a = np.random.default_rng(2).standard_normal(size**ndim).astype(config.dtype)
    expected = np.einsum(subscripts, a.reshape((size,) * ndim))
    run = teir.compile(config, threads=2)
    for shift in (0, 1, 2, 3):
        buffer = aligned_empty((size**ndim + 8,), config.dtype)
        buffer[:] = np.nan
        out = buffer[shift : shift + size**ndim]
        run(a, None, out)
        np.testing.assert_array_equal(out.reshape(expected.shape), expected)
        assert np.isnan(buffer[:shift]).all() and np.isnan(buffer[shift + size**ndim :]).all()


@pytest.mark.parametrize(
    ("subscripts", "size", "dtype"),
    [("ij->ji", 512, "FP32"), ("ij->ji", 512, "FP64"), ("ijk->kji", 64, "FP32")],
)
def test_crowded_output_columns_go_down_short_tiles(monkeypatch, subscripts, size, dtype):
    """A transpose whose output columns lie a multiple of 2-4 KiB apart (every block's
    stores in one L1 set) and that outgrows a core's L2 moves tiles of 256-byte columns,
    long along in0's unit stride, stored around the caches; the kernel goes down the
    output's columns with in0's grid shifted onto its lines. The results equal NumPy's with
    both arrays 0-3 elements past a line."""
    import teir.lower.tiles as tiles
    from teir.buffers import aligned_empty
    from teir.codegen.specs import UnarySpec
    from teir.codegen.target import Target
    from teir.codegen.transpose import crowded_columns
    from teir.lower.nest import lower
    from teir.optimizer.primitive import CROWDED_COLUMNS, CROWDED_ROW_BYTES

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 32768, "L2": 65536, "L3": 1 << 30})
    config = teir.optimize(_permutation(subscripts, size, dtype), threads=2)
    main = lower(config).main
    assert main is not None
    spec = main.spec
    assert isinstance(spec, UnarySpec) and spec.trans_a and spec.stream_b
    assert crowded_columns(spec.ldb * spec.itemsize, Target.host().lanes(spec.itemsize))
    assert spec.m * spec.itemsize == CROWDED_ROW_BYTES
    assert spec.n >= min(size, CROWDED_COLUMNS[1])
    ndim = len(subscripts.split("->")[0])
    count = size**ndim
    source = np.random.default_rng(3).standard_normal(count).astype(config.dtype)
    expected = np.einsum(subscripts, source.reshape((size,) * ndim))
    run = teir.compile(config, threads=2)
    for shift in (0, 1, 3):
        held = aligned_empty((count + 8,), config.dtype)
        held[shift : shift + count] = source
        buffer = aligned_empty((count + 8,), config.dtype)
        buffer[:] = np.nan
        out = buffer[3 - shift : 3 - shift + count]
        run(held[shift : shift + count], None, out)
        np.testing.assert_array_equal(out.reshape(expected.shape), expected)
        assert np.isnan(buffer[: 3 - shift]).all() and np.isnan(buffer[3 - shift + count :]).all()


@pytest.mark.parametrize(
    ("subscripts", "size", "dtype", "streamed"),
    [
        ("ijk->kji", 128, "FP32", True),  # 512-byte columns, continued by the inner loop
        ("ijkl->lkji", 24, "FP32", True),  # 96-byte ones, joined to the next tile's
        ("ij->ji", 1000, "FP64", True),  # 250-element columns on 8000-byte rows: shifted
        ("ij->ji", 1000, "FP32", True),  # 4000-byte rows: each column shifted on its own
        ("ijk->kji", 37, "FP32", True),  # 148-byte columns, continued, each shifted on its own
        ("ijkl->ljki", 45, "FP64", True),  # 360-byte ones
    ],
)
def test_long_transposed_columns_stream(monkeypatch, subscripts, size, dtype, streamed):
    """A transposed tile's columns of 512 bytes or more stream even where the next tile
    continues them or they end inside a line (the kernel shifts them onto lines, every column
    alike or each on its own, and masks their ends), and so do shorter ones of two vectors or
    more that lie no whole number of lines apart; the results equal NumPy's at every offset
    of the output from a line."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 2048, "L3": 4096})
    config = teir.optimize(_permutation(subscripts, size, dtype), threads=2)
    main = lower(config).main
    assert main is not None and main.spec.trans_a and main.spec.stream_b is streamed
    _check_permutation_at_every_offset(config, subscripts, size)


@pytest.mark.parametrize(
    ("subscripts", "size", "dtype", "joined"),
    [
        ("ijkl->lkji", 16, "FP64", True),  # 128-byte columns, continued along j
        ("ijkl->lkji", 32, "FP32", True),
        ("ijklm->mlkji", 8, "FP64", True),  # 64-byte ones: one vector
        ("ijk->kji", 168, "FP64", False),  # 1344-byte ones: long enough alone
        ("ijk->kji", 37, "FP32", True),  # 148-byte ones, each shifted on its own
        ("ijkl->lkji", 24, "FP32", True),  # 96-byte ones, streamed as they are joined
        ("ijkl->lkji", 12, "FP32", False),  # 48-byte ones: under a vector
    ],
)
def test_short_streamed_columns_join_the_next_tile(monkeypatch, subscripts, size, dtype, joined):
    """A streamed transposed tile whose short columns the next tile along a loop continues
    is joined to it (the line they share stored whole, once: ``UnarySpec.joined``); the
    results equal NumPy's at every offset of the output from a line, on two threads, with
    the loops that continue the columns split among them or not."""
    import teir.lower.tiles as tiles
    from teir.codegen.nest import joined_loops
    from teir.lower.nest import lower

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 2048, "L3": 4096})
    config = teir.optimize(_permutation(subscripts, size, dtype), threads=2)
    nest = lower(config)
    assert nest.main is not None and nest.main.spec.trans_a
    assert nest.main.spec.joined is joined
    assert bool(nest.main.spec.joined and joined_loops(nest, nest.main)) is joined
    _check_permutation_at_every_offset(config, subscripts, size)


@pytest.mark.parametrize(
    ("subscripts", "shape", "joined"),
    [
        ("ijkl->lkji", (48, 48, 48, 48), True),
        ("ij->ji", (2000, 2000), False),  # 3200-byte columns: long enough alone
        ("ij->ji", (2048, 2048), True),  # crowded columns: tiles of 256-byte ones
    ],
)
def test_explain_names_streamed_and_joined_copies(subscripts, shape, joined):
    """A permutation in memory says that it stores around the caches, and whether and along
    which loops its tiles are joined."""
    text = teir.einsum_plan(subscripts, np.empty(shape), threads=2).explain()
    assert "stores the output around the caches in whole lines" in text
    assert ("joined to the next tile along loop axis" in text) is joined


@pytest.mark.parametrize(
    ("subscripts", "dtype", "size", "runs"),
    [
        ("ijkl->ljki", "FP32", 16, True),  # rows of A along k follow each other in memory
        ("ijklm->ikmjl", "FP64", 8, True),  # along l
        ("ijkl->lkji", "FP32", 16, False),  # scattered along both i and j
        ("ijkl->ljki", "FP64", 32, False),  # rows of 256 bytes: tiles of their own, joined
        ("abcd->dacb", "FP32", 16, True),  # runs in blocks of 2 (crowded strides)
        ("abcd->dacb", "FP64", 16, False),  # ... which FP64 leaves to tiles of their own
    ],
)
def test_short_transposed_rows_join_the_next_axis(monkeypatch, subscripts, dtype, size, runs):
    """A transpose between buffers in memory whose output rows are short (below
    ``RUNS_ROW_BYTES``) takes the axis that continues them in the output into the tile, so
    that the kernel stores long columns and reads in0 in runs of rows, where those runs follow
    each other in in0 and (FP64) come in blocks of at least ``LEAST_RUNS_BLOCK``; results
    equal NumPy's at every offset of the output from a line."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 2048, "L3": 4096})
    config, log = teir.optimize_with_log(_permutation(subscripts, size, dtype), threads=2)
    main = lower(config).main
    assert main is not None and main.spec.trans_a
    assert bool(main.spec.m_inner) is runs
    assert any("read from in0 in runs" in line for line in log) is runs
    _check_permutation_at_every_offset(config, subscripts, size)


@pytest.mark.parametrize(
    ("subscripts", "sizes", "dtype", "runs"),
    [
        # rows of 16 bytes (a), in0's rows of 128 (d): runs of b although they lie scattered
        ("abcd->dcba", {"a": 4, "b": 8, "c": 6, "d": 32}, "FP32", True),
        ("abcde->ebdca", {"a": 3, "b": 8, "c": 4, "d": 5, "e": 16}, "FP64", True),
        ("abcd->dcba", {"a": 12, "b": 8, "c": 6, "d": 32}, "FP32", False),  # rows of 48 bytes
        ("abcd->dcba", {"a": 4, "b": 8, "c": 6, "d": 8}, "FP32", False),  # in0's rows of 32
    ],
)
def test_tiny_transposed_rows_take_scattered_runs(monkeypatch, subscripts, sizes, dtype, runs):
    """A transpose in memory whose output rows are half a line or less takes the axis that
    continues them in the output into its tile even where in0's rows lie scattered along
    both (``SCATTERED_RUNS_ROW_BYTES``), in a tile of about ``SCATTERED_RUNS_ROWS`` rows, as
    long as in0's rows fill a line; results equal NumPy's at every offset of the output from
    a line, writing nothing around it."""
    import teir.lower.tiles as tiles
    from teir.buffers import aligned_empty
    from teir.lower.nest import lower
    from teir.optimizer.primitive import SCATTERED_RUNS_ROWS

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 2048, "L3": 4096})
    source, target = subscripts.split("->")

    def strides(labels: str) -> dict[str, int]:
        step, result = 1, {}
        for c in reversed(labels):
            result[c] = step
            step *= sizes[c]
        return result

    s_in, s_out = strides(source), strides(target)
    data = {
        "data_type": dtype,
        "prim_main": "Copy",
        "dim_types": ["C"] * len(source),
        "exec_types": ["seq"] * len(source),
        "dim_sizes": [sizes[c] for c in source],
        "strides_in0": [s_in[c] for c in source],
        "strides_in1": [0] * len(source),
        "strides_out": [s_out[c] for c in source],
    }
    config, log = teir.optimize_with_log(data, threads=2)
    main = lower(config).main
    assert main is not None and main.spec.trans_a
    assert any("read from in0 in runs" in line for line in log) is runs
    if runs:
        tile_rows = main.spec.m
        assert sizes[target[-1]] < tile_rows <= 2 * SCATTERED_RUNS_ROWS
    shape = [sizes[c] for c in source]
    a = np.random.default_rng(3).standard_normal(shape).astype(config.dtype)
    expected = np.einsum(subscripts, a)
    run = teir.compile(config, threads=2)
    count = a.size
    for shift in (0, 1, 2, 3):
        buffer = aligned_empty((count + 8,), config.dtype)
        buffer[:] = np.nan
        out = buffer[shift : shift + count]
        run(a, None, out)
        np.testing.assert_array_equal(out.reshape(expected.shape), expected)
        assert np.isnan(buffer[:shift]).all() and np.isnan(buffer[shift + count :]).all()


def test_row_blocks_fill_whole_vectors():
    """Rows of 1000 FP32 elements go in blocks of 125 (8 vectors, 3 padding lanes), not of
    100 (7 vectors, 12 padding lanes); sizes with a multiple of the lanes keep it."""
    from teir.optimizer.simplify import lane_block

    assert lane_block(1000, 80, 16, 320, 16) == 125
    assert lane_block(1024, 80, 16, 320, 16) == 64
    assert lane_block(1600, 80, 16, 320, 16) == 80
    assert lane_block(200, 80, 16, 320, 16) == 200  # fits: one block
    data = {
        "data_type": "FP32",
        "prim_main": "GEMM",
        "dim_types": ["M", "N", "K"],
        "exec_types": ["seq"] * 3,
        "dim_sizes": [1000, 1000, 1000],
        "strides_in0": [1000, 0, 1],
        "strides_in1": [0, 1, 1000],
        "strides_out": [1000, 1, 0],
    }
    from teir.codegen.target import Target

    lanes = Target.host().lanes(4)
    assert _prim_sizes(teir.optimize(data, threads=1))["N"] == lane_block(1000, 80, 16, 320, lanes)


@pytest.mark.parametrize("dtype, rows", [("FP32", 80), ("FP64", 40)])
def test_row_blocks_keep_the_packed_panel_within_its_buffer(dtype, rows, monkeypatch):
    """1600^3 with rows 12.8 KiB apart (FP64): the kernel's operand over all of K packs into a
    panel of at most 512 KiB, so the row block shrinks to 40 and the nest packs it once for
    the loops over M; FP32's 80 rows already fit."""
    import teir.lower.panels as panels
    import teir.optimizer.primitive as primitive
    from teir.lower.nest import lower
    from teir.lower.panels import STACK_LIMIT_BYTES

    caches = {"L1": 32 * 1024, "L2": 1024 * 1024, "L3": 32 * 1024 * 1024}
    monkeypatch.setattr(panels, "cache_sizes", lambda: caches)
    monkeypatch.setattr(primitive, "cache_sizes", lambda: caches)

    n = 1600
    data = {
        "data_type": dtype,
        "prim_main": "GEMM",
        "dim_types": ["M", "N", "K"],
        "exec_types": ["seq"] * 3,
        "dim_sizes": [n, n, n],
        "strides_in0": [n, 0, 1],
        "strides_in1": [0, 1, n],
        "strides_out": [n, 1, 0],
    }
    config = teir.optimize(data, threads=2)
    assert _prim_sizes(config)["N"] == rows
    nest = lower(config)
    assert nest.panel is not None
    assert nest.panel.elements * config.data_type.itemsize <= STACK_LIMIT_BYTES


@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
def test_transposes_in_memory_move_long_tiles(dtype, monkeypatch):
    """A transpose whose tensors outgrow a core's L2 (or the share of the last-level cache)
    moves tiles of 256 elements along the output's unit stride and 128 along in0's, stored
    around the caches; one that fits moves 64 x 64. Both equal NumPy, also into an output
    16 bytes off a cache line (NumPy's usual offset for large arrays)."""
    import teir.codegen.transpose as transpose
    import teir.lower.tiles as tiles
    from teir.buffers import aligned_empty
    from teir.lower.nest import lower

    # rows 4 KiB apart crowd an L1 set (test_crowded_output_columns_go_down_short_tiles)
    monkeypatch.setattr(transpose, "CROWDED_STORES", 1 << 30)
    config = _permutation("ij->ji", 1024, dtype)

    def tile(scheduled: teir.Config) -> dict[str, int]:
        """The primitive's sizes along out's unit stride and in0's."""
        prims = [
            (size, scheduled.strides_in0[i], scheduled.strides_out[i])
            for i, (e, size) in enumerate(zip(scheduled.exec_types, scheduled.dim_sizes))
            if e is teir.ExecType.PRIM
        ]
        return {
            "out": next(size for size, _, s_out in prims if s_out == 1),
            "in0": next(size for size, s_in, _ in prims if s_in == 1),
        }

    roomy = {"L1": 32 * 1024, "L2": 1 << 30, "L3": 1 << 30}  # this process's share too
    monkeypatch.setattr(tiles, "cache_sizes", lambda: roomy)
    monkeypatch.setattr(tiles, "l3_share", lambda: 1 << 30)
    assert tile(teir.optimize(config, threads=1)) == {"out": 64, "in0": 64}
    caches = {"L1": 32 * 1024, "L2": 256 * 1024, "L3": 1024 * 1024}  # 2 x 4-8 MiB >= "L3"
    monkeypatch.setattr(tiles, "cache_sizes", lambda: caches)
    long_tiles = teir.optimize(config, threads=1)
    assert tile(long_tiles) == {"out": 256, "in0": 128}
    main = lower(long_tiles).main
    assert main is not None and main.spec.stream_b
    itemsize = long_tiles.data_type.itemsize
    source = np.random.default_rng(0).standard_normal(1024**2).astype(long_tiles.dtype)
    run = teir.compile(long_tiles, threads=2)
    expected = source.reshape(1024, 1024).T
    for offset in (0, 16):
        buffer = aligned_empty((1024**2 + 16,), long_tiles.dtype)
        buffer[:] = 7.0
        out = buffer[offset // itemsize : offset // itemsize + 1024**2]
        run(source, None, out)
        np.testing.assert_array_equal(out.reshape(1024, 1024), expected)
        assert np.all(buffer[: offset // itemsize] == 7.0)
        assert np.all(buffer[offset // itemsize + 1024**2 :] == 7.0)


def _prim_sizes_all(config: teir.Config) -> list[int]:
    return [s for e, s in zip(config.exec_types, config.dim_sizes) if e is teir.ExecType.PRIM]


@pytest.mark.parametrize(
    ("sizes", "threads", "shared"),
    [
        ((25, 5, 25), 2, 2),  # 25 split 12/13 leaves a thread idle 4 %: the 5 joins (125)
        ((64, 5), 2, 1),  # even
        ((9, 3), 4, 2),  # 9 on 4 threads: 3/2/2/2
        ((3, 4), 4, 2),  # fewer iterations than threads: the next loop joins
        ((7, 1000), 1, 0),
        ((99, 3), 2, 1),  # 50/49: within 2 %
        ((65, 3), 2, 1),  # 33/32 is 1.5 % over even: within 2 %
    ],
)
def test_shared_loops_balance_the_threads(sizes, threads, shared):
    from teir.ir import DimType, ExecType, Primitives, PrimMain
    from teir.optimizer.problem import Axis, Problem
    from teir.optimizer.schedule import parallelize

    primitives = Primitives(
        teir.DataType.FP32, teir.PrimFirst.NONE, PrimMain.COPY, teir.PrimLast.NONE
    )
    stride = 1
    loops = []
    for size in reversed(sizes):
        loops.insert(0, Axis(DimType.C, size, (stride * 16, 0, stride * 16)))
        stride *= size
    prim = Axis(DimType.C, 16, (1, 0, 1), ExecType.PRIM)
    result, _ = parallelize(Problem(primitives, (*loops, prim)), threads)
    marks = [a.exec_type is ExecType.SHARED for a in result.axes]
    assert marks == [i < shared for i in range(len(sizes))] + [False]


@pytest.mark.parametrize(
    ("row", "column", "others", "wanted", "blocks"),
    [
        # a GEMM of 200 (M) x 300 (N, the rows) for 4 tiles: 2 x 2 reads each operand twice,
        # 4 M tiles would read the N operand four times
        ((300, 300, 8), (200, 200, 8), 1, 4, (150, 100)),
        # enough tiles already: unchanged
        ((256, 128, 8), (256, 64, 8), 1, 4, (128, 64)),
        # other loops' tiles count: 3 of them need only 2 more
        ((64, 64, 8), (96, 96, 8), 3, 4, (64, 48)),
        # no divisor down to the floors reaches the count: the most tiles there are
        ((16, 16, 16), (13, 13, 8), 1, 4, (16, 13)),
        # 25 tiles of 64 split 13/12 between 2 threads: 40 tiles of 40 (whole vectors of 8;
        # 32 of 50 would read less but fill 50 of 56 lanes)
        ((1600, 64, 8), (97, 97, 8), 1, 4, (40, 97)),
        # 5 tiles of 200: those that split evenly (10 of 100, 8 of 125) fill fewer lanes
        ((1000, 200, 8), (8, 8, 8), 1, 4, (200, 8)),
    ],
)
def test_tiles_for_the_threads_read_the_least(row, column, others, wanted, blocks):
    from teir.optimizer.primitive import _shared_blocks

    assert _shared_blocks(row, column, others, wanted, 2) == blocks


def test_a_gemm_with_one_output_tile_is_cut_both_ways_for_two_threads():
    # M 200 x N 300 x K 3000 on 2 threads: tiles of M 100 x N 150, not four M tiles of 50
    text = teir.contract_expression(
        "abc,bcd->ad", (200, 50, 60), (50, 60, 300), dtype="float64", threads=2
    ).explain()
    assert "M 100 (of 200), N 150 (of 300)" in text
    rng = np.random.default_rng(5)
    a, b = rng.uniform(-1, 1, (200, 50, 60)), rng.uniform(-1, 1, (50, 60, 300))
    np.testing.assert_allclose(
        teir.einsum("abc,bcd->ad", a, b, threads=2), np.einsum("abc,bcd->ad", a, b), rtol=1e-10
    )


def _small_caches(monkeypatch):
    """A 512 KiB L2 (panels of at most 256 KiB), whatever this machine has."""
    import teir.lower.panels as panels
    import teir.optimizer.primitive as primitive

    caches = {"L1": 48 * 1024, "L2": 512 * 1024, "L3": 32 * 1024 * 1024}
    monkeypatch.setattr(panels, "cache_sizes", lambda: caches)
    monkeypatch.setattr(primitive, "cache_sizes", lambda: caches)


def _transposed_a_gemm(m, n, k):
    """An unscheduled FP32 GEMM with Zero and ReLU whose A and B both have unit stride on K."""
    return {
        "data_type": "FP32",
        "prim_first": "Zero",
        "prim_main": "GEMM",
        "prim_last": "ReLU",
        "dim_types": ["M", "N", "K"],
        "exec_types": ["seq"] * 3,
        "dim_sizes": [m, n, k],
        "strides_in0": [k, 0, 1],
        "strides_in1": [0, k, 1],
        "strides_out": [1, m, 0],
    }


def _check_transposed_a_gemm(config, m, n, k, threads):
    """Run ``config`` on random inputs into a NaN-filled output and compare with NumPy."""
    in0, in1 = (
        RNG.uniform(-1, 1, config.extent(t)).astype(np.float32)
        for t in (teir.Tensor.IN0, teir.Tensor.IN1)
    )
    out = np.full(config.extent(teir.Tensor.OUT), np.nan, np.float32)
    teir.compile(config, threads=threads)(in0, in1, out)
    expected = np.maximum(in0.reshape(m, k) @ in1.reshape(n, k).T, 0)
    np.testing.assert_allclose(out.reshape(n, m).T, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_k_steps_let_the_packed_panel_fit(threads, monkeypatch):
    """A transposed A (unit stride on K) whose rows (250) have no lane-multiple block small
    enough for its panel over all of K: the batch-reduce axis is cut into outer K steps that
    each fit a panel, ordered between the row loop and the column loop that reuses the panel;
    the first Zero and the last ReLU still apply once per output tile."""
    import teir.lower.panels as panels
    from teir.lower.nest import lower

    _small_caches(monkeypatch)
    m, n, k = 250, 384, 1280
    data = _transposed_a_gemm(m, n, k)
    config, log = teir.optimize_with_log(data, threads=threads)
    assert "K steps" in log[2]
    loops = [
        (t, size)
        for t, e, size in zip(config.dim_types, config.exec_types, config.dim_sizes)
        if e is not teir.ExecType.PRIM
    ]
    kinds = [t for t, _ in loops]
    assert kinds.count(teir.DimType.K) == 1
    steps = kinds.index(teir.DimType.K)
    assert kinds[steps + 1 :] == [teir.DimType.N]  # the loop that reuses the panel
    assert teir.DimType.N not in kinds[:steps]
    products = size_products(config)
    assert (products[teir.DimType.M], products[teir.DimType.N], products[teir.DimType.K]) == (
        m,
        n,
        k,
    )
    nest = lower(config)
    assert nest.panel is not None and nest.panel.depth == steps + 1
    assert nest.panel.elements * 4 <= panels.panel_limit_bytes()
    _check_transposed_a_gemm(config, m, n, k, threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("relu, accumulate", [(False, False), (True, False), (False, True)])
def test_a_transposed_b_far_apart_is_packed_once_per_tile(threads, relu, accumulate):
    """``ki,kj->ij``: the kernel's B (in0, unit stride on N, K steps 4 KiB apart) would be
    copied a column block at a time on every call; the loop that moves only the kernel's A
    runs innermost and the nest packs B's tile once for it, into rows of whole lines."""
    from teir.lower.panels import b_panel_row

    a = RNG.uniform(-1, 1, (256, 1024)).astype(np.float32)
    b = RNG.uniform(-1, 1, (256, 1024)).astype(np.float32)
    plan = teir.einsum_plan("ki,kj->ij", a, b, threads=threads)
    text = plan.explain()
    assert "in0's kernel tile (128 x 256) is packed" in text
    nest = plan.operation.nest
    assert nest.panel is not None and nest.panel.tensor is teir.Tensor.IN0
    spec = nest.main_zero.spec
    assert spec.trans_b and spec.ldb == b_panel_row(spec)
    assert "B packed column block" not in text
    out = RNG.uniform(-1, 1, (1024, 1024)).astype(np.float32)
    start = out.copy()
    teir.einsum("ki,kj->ij", a, b, out=out, threads=threads, relu=relu, accumulate=accumulate)
    expected = a.T @ b + (start if accumulate else 0)
    expected = np.maximum(expected, 0) if relu else expected
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_spread_over_far_batch_elements_is_packed_once_per_tile(dtype, threads):
    """``trus,pqtu->pqrs``: the kernel's A (in0) is a 64 x 64 block per batch element t, the
    blocks 128 KiB (FP32) apart; the nest packs them together once for the N loop that
    reuses them (FP64: in K steps, so that a step's panel fits)."""
    sizes = {"t": 32, "r": 8, "u": 64, "s": 64, "p": 24, "q": 24}
    a = RNG.uniform(-1, 1, [sizes[x] for x in "trus"]).astype(dtype)
    b = RNG.uniform(-1, 1, [sizes[x] for x in "pqtu"]).astype(dtype)
    plan = teir.einsum_plan("trus,pqtu->pqrs", a, b, threads=threads)
    text = plan.explain()
    assert "in0's kernel tile (64 x 64 x batch" in text
    nest = plan.operation.nest
    assert nest.panel is not None and nest.panel.tensor is teir.Tensor.IN0
    if dtype == np.float64:
        assert "in 2 K steps" in text
    out = RNG.uniform(-1, 1, [sizes[x] for x in "pqrs"]).astype(dtype)
    start = out.copy()
    teir.einsum("trus,pqtu->pqrs", a, b, out=out, threads=threads, accumulate=True, relu=True)
    wide = np.einsum("trus,pqtu->pqrs", a.astype(np.float64), b.astype(np.float64))
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(out, np.maximum(start + wide, 0), rtol=tolerance, atol=tolerance)


def test_the_column_loop_inside_k_steps_is_shared(monkeypatch):
    """Rows of 250 (one tile) over K steps: the only loop that can give the threads work is
    the column loop inside the K steps, which is shared; each thread keeps its own output
    tiles through every step, so the first Zero and the last ReLU still apply once."""
    _small_caches(monkeypatch)
    m, n, k = 250, 1000, 1280
    data = _transposed_a_gemm(m, n, k)
    config = teir.optimize(data, threads=2)
    loops = [
        (t, e) for t, e in zip(config.dim_types, config.exec_types) if e is not teir.ExecType.PRIM
    ]
    assert loops == [(teir.DimType.K, teir.ExecType.SEQ), (teir.DimType.N, teir.ExecType.SHARED)]
    assert len(teir.compile(config, threads=2).slices) == 2
    _check_transposed_a_gemm(config, m, n, k, threads=2)


def test_panel_rows_shrink_at_most_to_half_the_block(monkeypatch):
    """Rows whose panel over all of K outgrows the panel buffer shrink to a divisor down to
    half the block; below that the block stays and K is cut into steps instead (FP64
    ijk,jkl->il 256x64x64x256: rows 16 ran at 55 % of peak, rows 128 in K steps 74-79 %)."""
    from teir.optimizer import primitive
    from teir.optimizer.problem import Axis

    monkeypatch.setattr(primitive, "_packs_rows", lambda row, block, k, itemsize: True)
    monkeypatch.setattr(primitive, "panel_limit_bytes", lambda: 512 * 1024)
    row = Axis(teir.DimType.N, 256, (0, 1, 1))
    k = Axis(teir.DimType.K, 64, (1, 256, 0))
    # 4096 K steps of 8 bytes: 16 rows fit, far below half of 64
    assert primitive._panel_rows(row, 64, k, 4096, 8, 8) == 64
    # 1600 K steps: 40 rows fit, half of 80 (1600^3 FP64: 85 -> 92 % of peak)
    assert primitive._panel_rows(Axis(teir.DimType.N, 1600, (0, 1, 1)), 80, k, 1600, 8, 8) == 40
    # a block that fits stays
    assert primitive._panel_rows(row, 16, k, 4096, 8, 8) == 16


def _scaled_transpose(rows: int, columns: int) -> dict:
    """``ij,i->ji``: in0's unit stride on j, the output's on i (one-element kernels)."""
    return {
        "data_type": "FP32",
        "prim_main": "GEMM",
        "dim_types": ["C", "M"],
        "exec_types": ["seq"] * 2,
        "dim_sizes": [rows, columns],
        "strides_in0": [columns, 1],
        "strides_in1": [1, 0],
        "strides_out": [1, rows],
    }


def _loops(config: teir.Config) -> list[tuple[int, int, int]]:
    """(size, in0 stride, out stride) of each loop, outermost first."""
    s = config.schedule
    return [
        (n, a, o)
        for n, a, o, e in zip(s.dim_sizes, s.strides_in0, s.strides_out, s.exec_types)
        if e is not teir.ExecType.PRIM
    ]


@pytest.mark.parametrize(("rows", "columns"), [(2048, 640), (2048, 97), (4, 5)])
def test_scaled_transposes_run_in_transposed_tiles(rows, columns, two_pipe_xeon):
    """A permuted elementwise product (one-element kernels, no K loop) that writes its input
    transposed runs tiles of the output's and in0's unit-stride loops innermost, cut as a
    transposing Copy's tiles (97, no good block, whole), on the scaled transposing kernel;
    the threads share loops outside the tile. Small ones keep the output's order. (The
    kernel overwrites its tile: the product has a first Zero.)"""
    data = dict(_scaled_transpose(rows, columns), prim_first="Zero")
    config, log = teir.optimize_with_log(data, threads=2)
    loops = _loops(config)
    nest = lower(config)
    if rows * columns < 1000:
        assert "transposed" not in log[3] and nest.transposed is None, log
        assert loops[-1][2] == 1  # the output's unit stride innermost
    else:
        assert "transposed tile" in log[3], log
        assert loops[-2][2] == 1 and loops[-1][1] == 1  # out's rows, then in0's columns
        assert 64 <= loops[-2][0] <= 512 and loops[-1][0] in (97, 128)  # tile sizes
        assert nest.transposed is not None and nest.transposed.depth == len(nest.loops) - 2
        assert not any(loop.parallel for loop in nest.loops[-2:])
    assert [size_products(config)[t] for t in teir.DimType] == [rows, columns, 1, 1]
    a = RNG.standard_normal((rows, columns)).astype(np.float32)
    b = RNG.standard_normal(rows).astype(np.float32)
    c = np.full((columns, rows), np.nan, np.float32)  # overwritten
    teir.compile(config, threads=2)(a, b, c)
    np.testing.assert_allclose(c, (a * b[:, None]).T, rtol=1e-6)


def test_accumulated_scaled_transposes_read_in0_in_runs():
    """Added into the output (no first Zero), the same product keeps the one-element nest,
    in0's next elements innermost in runs, the output's around them."""
    config, log = teir.optimize_with_log(_scaled_transpose(2048, 640), threads=2)
    assert "elementwise: in0's next elements innermost" in log[3], log
    loops = _loops(config)
    assert loops[-1][1] == 1 and 4 <= loops[-1][0] <= 16  # in0 in short runs
    assert loops[-2][2] == 1 and 16 <= loops[-2][0] <= 64  # the output's run outside
    assert lower(config).transposed is None


def test_elementwise_order_reads_the_larger_input_in_runs(monkeypatch):
    """Where in1 is the large input (``dc,bcda->abcd``), its unit stride is the one read in
    runs, and the result equals NumPy's. (teir.einsum copies in0, small and strided along
    the result's unit stride, first: element_layout.small_copies, turned off here.)"""
    monkeypatch.setattr(element_layout, "SMALL_SHARE", 0)
    clear_plans()
    a = RNG.standard_normal((48, 20)).astype(np.float32)
    b = RNG.standard_normal((24, 20, 48, 64)).astype(np.float32)
    out = np.empty((64, 24, 20, 48), np.float32)  # a new result would take in1's order
    plan = teir.einsum_plan("dc,bcda->abcd", a, b, out=out, threads=2)
    assert "elementwise: in1's next elements innermost" in plan.explain()
    teir.einsum("dc,bcda->abcd", a, b, out=out, threads=2)
    np.testing.assert_allclose(out, np.einsum("dc,bcda->abcd", a, b), rtol=1e-6)
    clear_plans()  # planned without small copies


def test_loop_stepping_within_an_inputs_lines_runs_innermost(monkeypatch):
    """``echg,gceh->ge``: in0's unit stride lies on the C axis g, outside the kernel; each
    call reads more of in0 than L1 holds, so the g loop runs innermost, where consecutive
    calls find in0's lines in cache (not outermost, by the output's strides). Planned as
    the operands lie: teir.einsum copies in0 first (a gathered dot product, faster still)."""
    monkeypatch.setattr(einsum_plan, "GATHERED_MIN_BYTES", 1 << 62)
    clear_plans()
    sizes = {"c": 256, "e": 6, "g": 16, "h": 64}
    a = RNG.standard_normal([sizes[x] for x in "echg"]).astype(np.float32)
    b = RNG.standard_normal([sizes[x] for x in "gceh"]).astype(np.float32)
    text = teir.einsum_plan("echg,gceh->ge", a, b, threads=2).explain()
    clear_plans()
    assert "reorder: loops C6, C16" in text, text
    result = teir.einsum("echg,gceh->ge", a, b, threads=2)
    exact = np.einsum("echg,gceh->ge", a.astype(np.float64), b.astype(np.float64))
    # sums of 16384 products of magnitude ~1: FP32 rounding leaves ~1e-5 of their ~128
    np.testing.assert_allclose(result, exact, rtol=1e-4, atol=5e-3)


@pytest.mark.parametrize(("d", "blocked"), [(256, True), (8, False)])
def test_rows_read_pages_apart_run_in_blocks(d, blocked):
    """``d,dga->gda``: each kernel call scales a row of 136 elements of in1, and the loops in
    the output's order step in1 a page or more per iteration while its next rows lie along
    the outer loop. Beyond L2 (d 256: 8.5 MiB) the loops run in blocks, in1's next rows
    innermost; a small in1 keeps the output's order."""
    x = RNG.standard_normal(d).astype(np.float32)
    y = RNG.standard_normal((d, 64, 136)).astype(np.float32)
    out = np.empty((64, d, 136), np.float32)  # a new result would take in1's order
    text = teir.einsum_plan("d,dga->gda", x, y, out=out, threads=2).explain()
    assert ("scattered rows: in1's next tiles innermost" in text) == blocked, text
    teir.einsum("d,dga->gda", x, y, out=out, threads=2)
    np.testing.assert_allclose(out, np.einsum("d,dga->gda", x, y), rtol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_k_steps_keep_an_unpacked_operand_in_l2(threads, monkeypatch):
    """``ik,kj->ij`` with rows of j 512 bytes apart (no panel) whose tile over all of K
    outgrows L2: K is cut into steps whose tiles fit a panel, so that the M loop inside
    finds each step's tile in L2; the first Zero and the last ReLU still apply once."""
    _small_caches(monkeypatch)
    a = RNG.uniform(-1, 1, (384, 4096)).astype(np.float32)
    b = RNG.uniform(-1, 1, (4096, 128)).astype(np.float32)
    plan = teir.einsum_plan("ik,kj->ij", a, b, threads=threads, relu=True)
    text = plan.explain()
    assert "K steps, so that one step's tile of in1 fits a panel" in text
    assert "is packed" not in text
    out = RNG.uniform(-1, 1, (384, 128)).astype(np.float32)
    start = out.copy()
    teir.einsum("ik,kj->ij", a, b, out=out, threads=threads, relu=True, accumulate=True)
    expected = np.maximum(start + a.astype(np.float64) @ b.astype(np.float64), 0)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_a_tile_fitting_l2_is_not_cut_into_k_steps(monkeypatch):
    """The same product with K short enough that the operand's tile fits L2: no K steps."""
    _small_caches(monkeypatch)
    a = RNG.uniform(-1, 1, (384, 512)).astype(np.float32)
    b = RNG.uniform(-1, 1, (512, 128)).astype(np.float32)
    plan = teir.einsum_plan("ik,kj->ij", a, b, threads=2)
    assert "K steps" not in plan.explain()
    np.testing.assert_allclose(
        teir.einsum("ik,kj->ij", a, b, threads=2), a @ b, rtol=1e-4, atol=1e-4
    )


def test_rows_a_short_distance_apart_are_packed_by_the_nest_only():
    """Columns of the vector operand ``panel_leading_bytes`` apart (half the kernel's own
    packing distance) count as packed where the tile leaves gaps between them; a tile whose
    columns follow one another without a gap is a panel as it lies."""
    from teir.codegen.target import Target
    from teir.lower.panels import panel_leading_bytes
    from teir.optimizer import primitive
    from teir.optimizer.problem import Axis

    leading = panel_leading_bytes(Target.host()) // 4  # FP32 elements
    row = Axis(teir.DimType.N, leading, (0, 1, 1))
    k = Axis(teir.DimType.K, 4096, (1, leading, 0))
    assert primitive._packs_rows(row, leading // 2, k, 4)
    assert not primitive._packs_rows(row, leading, k, 4)
    near = Axis(teir.DimType.K, 4096, (1, leading // 2, 0))
    half = Axis(teir.DimType.N, leading // 2, (0, 1, 1))
    assert not primitive._packs_rows(half, leading // 4, near, 4)


def test_a_panel_of_rows_a_short_distance_apart(two_pipe_xeon, monkeypatch):
    """FP32 ``ijk,jkl->il`` with l's rows ``panel_leading_bytes`` apart, shared by two
    threads: each thread's half of the rows is packed once per K step for the M loop."""
    from teir.codegen.target import Target
    from teir.lower.panels import panel_leading_bytes

    _small_caches(monkeypatch)
    width = panel_leading_bytes(Target.host()) // 4
    sizes = {"i": 256, "j": 32, "k": 64, "l": width}
    a = RNG.uniform(-1, 1, [sizes[x] for x in "ijk"]).astype(np.float32)
    b = RNG.uniform(-1, 1, [sizes[x] for x in "jkl"]).astype(np.float32)
    plan = teir.einsum_plan("ijk,jkl->il", a, b, threads=2)
    text = plan.explain()
    assert "in1's kernel tile" in text and "is packed" in text
    nest = plan.operation.nest
    assert nest.panel is not None and nest.panel.tensor is teir.Tensor.IN1
    expected = np.einsum("ijk,jkl->il", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(
        teir.einsum("ijk,jkl->il", a, b, threads=2), expected, rtol=1e-4, atol=1e-4
    )
