"""Generated kernels against NumPy: exhaustive small sweeps, larger random sizes, canaries
around every tile, a forced AVX2-only target, and the public kernel API."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest

import teir
from kernel_harness import PAD, compile_many, guarded, matrix_mask, run_brgemm, run_unary, view
from teir import kernels
from teir.codegen.brgemm import (
    K_PIECE,
    SHIFT_LEAST_VECTORS,
    SHIFT_MOST_DEPTH_PER_VECTOR,
    Blocking,
    _Emitter,
    choose_blocking,
    dot_chains,
    pack_leading_bytes,
)
from teir.codegen.irtext import Module
from teir.codegen.specs import BrgemmSpec, KernelError, UnaryOp, UnarySpec
from teir.codegen.target import Target
from teir.codegen.unary import unary_function

HOST = Target.host()
LAYOUTS = list(itertools.product([False, True], repeat=2))
DTYPES = ["f32", "f64"]


def brgemm_spec(dtype, m, n, k, batch, trans_a, trans_b, beta, pad):
    lda = (k if trans_a else m) + pad
    ldb = (n if trans_b else k) + pad
    ldc = m + pad
    size_a = lda * (m if trans_a else k)
    size_b = ldb * (k if trans_b else n)
    return BrgemmSpec(
        dtype,
        m,
        n,
        k,
        batch,
        trans_a,
        trans_b,
        lda,
        ldb,
        ldc,
        stride_a=size_a + pad,
        stride_b=size_b + 2 * pad,
        beta=beta,
    )


def sweep(specs, target=HOST, blockings=None):
    functions = compile_many(specs, target, blockings)
    for seed, (spec, function) in enumerate(zip(specs, functions)):
        run_brgemm(spec, function, seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("trans_a", "trans_b"), LAYOUTS)
def test_every_m_and_n_up_to_17(dtype, trans_a, trans_b):
    specs = [
        brgemm_spec(
            dtype,
            m,
            n,
            1 + (7 * m + 3 * n) % 9,
            1 + (m + 2 * n) % 3,
            trans_a,
            trans_b,
            (m + n) % 2,
            (m * n) % 3,
        )
        for m in range(1, 18)
        for n in range(1, 18)
    ]
    sweep(specs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("trans_a", "trans_b"), LAYOUTS)
def test_every_k_batch_and_beta(dtype, trans_a, trans_b):
    shapes = [(17, 17), (16, 5), (1, 1), (9, 16), (33, 2)]
    specs = [
        brgemm_spec(
            dtype,
            *shapes[(k + batch) % len(shapes)],
            k,
            batch,
            trans_a,
            trans_b,
            beta,
            (k + batch) % 2,
        )
        for k in range(1, 10)
        for batch in range(1, 4)
        for beta in (0, 1)
    ]
    sweep(specs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_a_with_few_rows_runs_the_mirror_form(dtype):
    """A plain A (unit stride on M) of a few rows with B stored transposed vectorizes along
    N, A's elements broadcast (the outer form would fill one lane in 16 for M of 1); up to
    three blocks of vectors, N tails, K pieces and batches, overwriting and accumulating."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    specs = [
        brgemm_spec(dtype, m, n, k, batch, False, True, beta, pad)
        for m in (1, 2, 3, lanes // 4 + 1)
        for n, k, batch in ((lanes, 5, 1), (3 * lanes + 3, 17, 3), (2 * lanes - 1, 40, 2))
        for beta in (0, 1)
        for pad in (0, 3)
    ]
    assert all(choose_blocking(spec, HOST).form == "mirror" for spec in specs)
    sweep(specs)
    wide = brgemm_spec(dtype, lanes, lanes, 8, 1, False, True, 1, 0)
    assert choose_blocking(wide, HOST).form == "outer"


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_chunks_with_beta_zero_overwrite_only_once(dtype):
    # Chunks of the batch: beta 0 must zero C in the first chunk and accumulate afterwards.
    specs, blockings = [], []
    for trans_a, trans_b in LAYOUTS:
        for batch, chunk in ((6, 2), (6, 3), (8, 1), (4, 4)):
            spec = brgemm_spec(dtype, 19, 7, 5, batch, trans_a, trans_b, 0, 1)
            base = choose_blocking(spec, HOST)
            specs.append(spec)
            blockings.append(Blocking(base.form, base.lanes, base.vectors, base.columns, chunk))
    sweep(specs, blockings=blockings)


@pytest.mark.parametrize("seed", range(6))
def test_larger_random_sizes(seed):
    rnd = random.Random(seed)
    specs = []
    for trans_a, trans_b in LAYOUTS:
        m, n = rnd.randint(18, 300), rnd.randint(18, 200)
        k, batch = rnd.randint(10, 300), rnd.randint(1, 5)
        specs.append(
            brgemm_spec(
                rnd.choice(DTYPES),
                m,
                n,
                k,
                batch,
                trans_a,
                trans_b,
                rnd.randint(0, 1),
                rnd.randint(0, 7),
            )
        )
    sweep(specs)


def test_extreme_sizes_of_the_issue():
    specs = [
        brgemm_spec("f32", 1024, 3, 2048, 1, False, False, 1, 0),
        brgemm_spec("f64", 2, 1024, 7, 2, False, True, 0, 1),
        brgemm_spec("f32", 3, 2, 2, 1024, False, False, 1, 0),
        brgemm_spec("f64", 5, 3, 2048, 1, True, False, 0, 3),
    ]
    sweep(specs)


def test_forced_avx2_target_runs_correctly_here():
    avx2 = HOST.without_avx512()
    assert avx2.vector_bits == 256 and avx2.vector_registers == 16
    specs = [
        brgemm_spec(dtype, m, n, k, b, ta, tb, beta, 1)
        for dtype in DTYPES
        for (ta, tb) in LAYOUTS
        for m, n, k, b, beta in (
            (1, 1, 1, 1, 1),
            (17, 13, 9, 3, 0),
            (33, 17, 5, 2, 1),
            (8, 6, 4, 1, 0),
            (64, 48, 64, 2, 1),
        )
    ]
    sweep(specs, target=avx2)
    uspecs = [
        UnarySpec(dtype, op, m, n, trans_a=t)
        for dtype in DTYPES
        for op, t in (
            (UnaryOp.COPY, True),
            (UnaryOp.RELU, False),
            (UnaryOp.ZERO, False),
            (UnaryOp.RELU, True),
        )
        for m, n in ((1, 1), (17, 9), (8, 8), (33, 20))
    ]
    for seed, (spec, function) in enumerate(zip(uspecs, compile_many(uspecs, avx2))):
        run_unary(spec, function, seed)


def test_aarch64_code_generates_and_compiles():
    import llvmlite.binding as llvm

    from teir.kernels import jit

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    neon = Target("aarch64-unknown-linux-gnu", "generic", "+neon,+fp-armv8")
    try:
        llvm.Target.from_triple(neon.triple)
    except RuntimeError:
        pytest.skip("this LLVM has no AArch64 backend")
    assert neon.vector_bits == 128 and neon.lanes(4) == 4
    from kernel_harness import Module, brgemm_function, unary_function

    module = Module()
    for i, (ta, tb) in enumerate(LAYOUTS):
        brgemm_function(brgemm_spec("f32", 13, 7, 5, 2, ta, tb, 1, 1), neon, module, f"g{i}")
    unary_function(UnarySpec("f64", UnaryOp.COPY, 5, 7, trans_a=True), neon, module, "u")
    assert jit.compile_object(module.text(), neon)


UNARY_VARIANTS = [
    (UnaryOp.ZERO, False, False),
    (UnaryOp.COPY, False, False),
    (UnaryOp.RELU, False, False),
    (UnaryOp.COPY, True, False),
    (UnaryOp.RELU, True, False),
    (UnaryOp.RELU, False, True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("op", "transposed", "in_place"), UNARY_VARIANTS)
def test_unary_every_m_and_n_up_to_17(dtype, op, transposed, in_place):
    specs = []
    for m in range(1, 18):
        for n in range(1, 18):
            pad = (m + n) % 3
            rows_a = n if transposed else m
            lda = rows_a + (m % 2) if op is not UnaryOp.ZERO and not in_place else 0
            specs.append(
                UnarySpec(
                    dtype, op, m, n, lda=lda, ldb=m + pad, trans_a=transposed, in_place=in_place
                )
            )
    for seed, (spec, function) in enumerate(zip(specs, compile_many(specs, HOST))):
        run_unary(spec, function, seed)
    if transposed:  # small transposes get half-width blocks where vectors are 512 bits
        full = compile_many(specs, HOST, lanes=HOST.lanes(specs[0].itemsize))
        for seed, (spec, function) in enumerate(zip(specs, full)):
            run_unary(spec, function, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_short_columns_move_as_whole_narrow_vectors(dtype):
    """Columns of a power of two elements shorter than a vector (a permutation's innermost
    axis of 8 FP32) are copied as whole vectors that wide, not as full-width ones under a
    mask; other short columns keep the full width, and so does a contiguous tile, swept as
    one long column. Right for every op, in place or not (test_unary_every_m_and_n_up_to_17
    covers every short length)."""
    itemsize = 4 if dtype == "f32" else 8
    full = HOST.lanes(itemsize)
    kind = "float" if dtype == "f32" else "double"
    for m in (16 // itemsize, full // 2, full // 2 + 1):
        if m >= full:
            continue
        for spec in (
            UnarySpec(dtype, UnaryOp.COPY, m, 5, lda=m + 3, ldb=m + 1),
            UnarySpec(dtype, UnaryOp.RELU, m, 5, ldb=m + 2, in_place=True),
        ):
            module = Module()
            unary_function(spec, HOST, module, "kernel")
            text = module.text()
            if m & (m - 1):
                assert f"<{full} x {kind}>" in text and "masked.store" in text
            else:
                assert f"<{m} x {kind}>" in text and "masked" not in text.split("define")[-1]
        contiguous = UnarySpec(dtype, UnaryOp.COPY, m, 6, lda=m, ldb=m)
        module = Module()
        unary_function(contiguous, HOST, module, "kernel")
        assert f"<{full} x {kind}>" in module.text()


def test_unary_large_sizes():
    specs = [
        UnarySpec("f32", UnaryOp.COPY, 4096, 3, ldb=4099),
        UnarySpec("f64", UnaryOp.RELU, 3, 4096, lda=5),
        UnarySpec("f32", UnaryOp.COPY, 300, 517, trans_a=True, lda=520, ldb=301),
        UnarySpec("f64", UnaryOp.ZERO, 1000, 1000),
        UnarySpec("f32", UnaryOp.RELU, 4096, 4096, in_place=True),
        UnarySpec("f64", UnaryOp.RELU, 129, 4096, trans_a=True),
    ]
    for seed, (spec, function) in enumerate(zip(specs, compile_many(specs, HOST))):
        run_unary(spec, function, seed)


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_copy_at_every_alignment(dtype, streamed):
    """The transposed kernel shifts its block grid by the arrays' run-time alignment (B's
    rows with masked first and last blocks) and may visit blocks along diagonals, or as a
    tile of a loop nest (``streamed``) across B's rows; every alignment of A and B must give
    the same result and touch nothing outside B."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    shapes = [
        (2 * lanes, 2 * lanes, 2 * lanes, 2 * lanes),
        (2 * lanes + 3, 3 * lanes - 1, 4 * lanes, 3 * lanes),
        (5 * lanes + 1, 2 * lanes + 7, 3 * lanes + 1, 6 * lanes),  # lda breaks the alignment
        (8 * lanes + 5, 9 * lanes + 7, 10 * lanes, 9 * lanes),  # shifted, plain order
        (9 * lanes + 5, 10 * lanes + 3, 4096 // (4 if dtype == "f32" else 8), 16 * lanes),
        (
            8 * lanes,
            8 * lanes,
            2048 // (4 if dtype == "f32" else 8),
            2048 // (4 if dtype == "f32" else 8),
        ),
    ]
    specs, shifts = [], []
    for m, n, lda, ldb in shapes:
        for op in (UnaryOp.COPY, UnaryOp.RELU):
            for shift_a, shift_b in (
                (0, 0),
                (1, lanes - 1),
                (lanes // 2, 0),
                (0, 3),
                (lanes - 1, 1),
            ):
                specs.append(UnarySpec(dtype, op, m, n, lda=lda, ldb=ldb, trans_a=True))
                shifts.append((shift_a, shift_b))
    functions = compile_many(specs, HOST, streamed=streamed)
    for seed, (spec, function, shift) in enumerate(zip(specs, functions, shifts)):
        run_unary(spec, function, seed, shift)


@pytest.mark.parametrize("dtype", DTYPES)
def test_joined_tiles_fill_their_shared_lines_at_every_alignment(dtype):
    """Three joined tiles one after the other along B's columns (``UnarySpec.joined``, the
    way a loop nest calls them: each told whether a tile comes before and after it, and
    the next one's A) fill each column of B once at every alignment of B, short columns
    and columns ending inside a line included, columns a whole number of vectors apart
    (shifted alike) or not (each shifted on its own, its end spilling into a second
    vector or not), and touch nothing outside; unjoined calls (``joins`` 0) of the same
    kernel give the same result."""
    np_dtype = np.float32 if dtype == "f32" else np.float64
    lanes = HOST.lanes(np.dtype(np_dtype).itemsize)
    tiles = 3
    forms = [  # m, n, B's columns a whole number of vectors apart
        (lanes, lanes, True),
        (2 * lanes + 3, lanes + 5, True),
        (6 * lanes, 2 * lanes, True),
        (2 * lanes + 3, lanes + 5, False),
        (3 * lanes - 1, 2 * lanes + 1, False),
        (4 * lanes, lanes, False),
    ]
    for m, n, whole_vectors in forms:
        lda = n + 5  # A's rows: n elements, lda apart; each tile's A a block of its own
        ldb = -(-tiles * m // lanes) * lanes + (lanes if whole_vectors else 3)
        specs = [
            UnarySpec(dtype, op, m, n, lda, ldb, trans_a=True, stream_b=True, joined=True)
            for op in (UnaryOp.COPY, UnaryOp.RELU)
        ]
        for spec, function in zip(specs, compile_many(specs, HOST, streamed=True)):
            rng = np.random.default_rng(m)
            a = rng.uniform(-1, 1, (tiles, m, lda)).astype(np_dtype)
            a[:, :, n:] = np.nan  # never read
            expected = np.concatenate([a[t, :, :n] for t in range(tiles)])  # (tiles*m, n)
            if spec.op is UnaryOp.RELU:
                expected = np.maximum(expected, 0)
            for shift in range(lanes):
                for joined in (True, False):
                    used = matrix_mask(ldb * n, tiles * m, n, ldb)
                    b = guarded(np.zeros(ldb * n, np_dtype), used, 7.25, shift)
                    size = a.itemsize
                    for t in range(tiles):
                        joins = (t > 0) | (t < tiles - 1) << 1 if joined else 0
                        following = a[min(t + 1, tiles - 1)].ctypes.data
                        function(a[t].ctypes.data, b.address + t * m * size, following, joins)
                    result = view(b.data, 0, tiles * m, n, 1, ldb)
                    np.testing.assert_array_equal(result, expected)
                    outside = np.ones(b.full.size, dtype=bool)
                    outside[PAD : PAD + ldb * n][used] = False
                    assert (b.full[outside] == 7.25).all(), (m, n, shift, joined)


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_rows_in_runs(dtype, streamed):
    """A transposed A whose rows lie in runs of ``m_inner`` (two axes contiguous in B but not
    in A) fills B's long columns at every alignment, runs shorter or longer than a vector
    and blocks that cross runs included, touching nothing outside B."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    forms = [  # m_inner, runs, n, lda, lda_outer, ldb
        (lanes * 3, 4, 2 * lanes, 3 * lanes, 10 * lanes * lanes, 12 * lanes),
        (12, 16, 16, 20, 300, 192),  # runs of 12 (shorter than 16 lanes)
        (5, 40, 7, 9, 50, 200),  # odd runs, A narrower than a vector
        (lanes + 3, 9, lanes + 1, 2 * lanes, 40 * lanes, 9 * (lanes + 3) + 5),
    ]
    specs, shifts = [], []
    for m_inner, runs, n, lda, lda_outer, ldb in forms:
        for op, stream in ((UnaryOp.COPY, False), (UnaryOp.RELU, False), (UnaryOp.COPY, True)):
            for shift in ((0, 0), (1, lanes - 1), (0, 3), (lanes // 2, 0)):
                specs.append(
                    UnarySpec(
                        dtype,
                        op,
                        m_inner * runs,
                        n,
                        lda,
                        ldb,
                        trans_a=True,
                        stream_b=stream,
                        m_inner=m_inner,
                        lda_outer=lda_outer,
                    )
                )
                shifts.append(shift)
    functions = compile_many(specs, HOST, streamed=streamed)
    for seed, (spec, function, shift) in enumerate(zip(specs, functions, shifts)):
        run_unary(spec, function, seed, shift)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_columns_each_on_their_own_line_boundaries(dtype):
    """A streamed transposed tile whose columns are no whole number of lines apart stores each
    column in line-aligned vectors of its own, shifted across two blocks by a run-time
    permute, short columns down one block of columns at a time and long ones in rows of
    blocks: at every alignment of B, with
    row tails that end within a vector or spill into the next, a last block of columns
    clamped onto the one before it, rows in runs and ReLU, B gets A^T and nothing outside
    it is written."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    forms = [  # m, n, lda, ldb, m_inner, lda_outer
        (2 * lanes, lanes, lanes + 1, 2 * lanes + 1, 0, 0),
        (3 * lanes + 1, lanes + 3, 2 * lanes, 4 * lanes + 3, 0, 0),
        (4 * lanes - 1, 2 * lanes, 2 * lanes + 5, 4 * lanes + lanes // 2, 0, 0),
        (5 * lanes + lanes // 2 + 1, 3 * lanes + 1, 3 * lanes + 1, 6 * lanes - 1, 0, 0),
        (6 * lanes, lanes + 1, 2 * lanes, 6 * lanes + 1, 2 * lanes, 40 * lanes),
        (3 * 13, 20, 21, 3 * 13 * 17 + 2, 13, 400),  # runs shorter than a vector
        # columns and rows of A of 512 bytes or more: crossed in rows of blocks
        (10 * lanes + 5, 8 * lanes + 3, 9 * lanes, 11 * lanes + 1, 0, 0),
        (17 * (lanes // 2), 8 * lanes + 1, 9 * lanes, 9 * lanes + 3, lanes // 2, 40 * lanes),
        (16 * lanes, 9 * lanes, 9 * lanes + 1, 16 * lanes + 2, 0, 0),
        # too wide for the buffer of one vector per column: down the columns again
        (8 * lanes + 1, 40 * lanes - 3, 40 * lanes, 8 * lanes + 3, 0, 0),
    ]
    specs = []
    for m, n, lda, ldb, m_inner, lda_outer in forms:
        for op in (UnaryOp.COPY, UnaryOp.RELU):
            specs.append(
                UnarySpec(
                    dtype,
                    op,
                    m,
                    n,
                    lda,
                    ldb,
                    trans_a=True,
                    stream_b=True,
                    m_inner=m_inner,
                    lda_outer=lda_outer,
                )
            )
    if lanes * specs[0].itemsize == 64:  # the shifted columns are built for 64-byte vectors
        module = Module()
        unary_function(specs[0], HOST, module, "probe", streamed=True)
        assert "vpermi2var" in module.text()
    functions = compile_many(specs, HOST, streamed=True)
    for seed, (spec, function) in enumerate(zip(specs, functions)):
        for shift_b in range(lanes):
            run_unary(spec, function, seed, (shift_b % 3, shift_b))


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_copy_scaled_by_a_vector_or_per_column(dtype, streamed):
    """The transposed kernel that scales A^T elementwise (``scale``: S along B's columns, or
    one value per column of B), as elementwise products that write an input transposed run
    it: every block form (edges within a vector, masked rows of a shifted grid, columns
    shifted each on its own line boundaries, tails) multiplies the right elements of S, at
    every alignment, and touches nothing outside B (S's unused elements are NaN)."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    forms = [  # m, n, lda, ldb, stream_b
        (3, 2, 5, 4, False),
        (lanes + 3, lanes - 1, 2 * lanes, lanes + 5, False),
        (9 * lanes + 5, 10 * lanes + 3, 11 * lanes, 16 * lanes, False),  # shifted rows
        (8 * lanes, 8 * lanes, 8 * lanes, 8 * lanes, True),
        (3 * lanes + 1, lanes + 3, 2 * lanes, 4 * lanes + 3, True),  # columns shifted each
        (10 * lanes + 5, 8 * lanes + 3, 9 * lanes, 11 * lanes + 1, True),  # rows of blocks
    ]
    specs, shifts = [], []
    for m, n, lda, ldb, stream in forms:
        for op, scale in (
            (UnaryOp.COPY, (1, 0)),
            (UnaryOp.COPY, (0, 1)),
            (UnaryOp.RELU, (1, m + 2)),
            (UnaryOp.COPY, (0, 0)),
        ):
            for shift in ((0, 0), (1, lanes - 1), (lanes // 2, 3)):
                specs.append(
                    UnarySpec(dtype, op, m, n, lda, ldb, trans_a=True, stream_b=stream, scale=scale)
                )
                shifts.append(shift)
    functions = compile_many(specs, HOST, streamed=streamed)
    for seed, (spec, function, shift) in enumerate(zip(specs, functions, shifts)):
        run_unary(spec, function, seed, shift)


def test_scaled_copies_are_checked():
    with pytest.raises(KernelError, match="transposed"):
        UnarySpec("f32", UnaryOp.COPY, 10, 4, scale=(1, 0))
    with pytest.raises(KernelError, match="scale strides"):
        UnarySpec("f32", UnaryOp.COPY, 10, 4, trans_a=True, scale=(2, 0))
    with pytest.raises(KernelError, match="scale"):
        UnarySpec("f32", UnaryOp.COPY, 10, 4, trans_a=True, scale=(0, -1))
    spec = UnarySpec("f64", UnaryOp.COPY, 10, 4, trans_a=True, scale=(1, 10))
    assert "scaled1x10" in spec.name and spec.extent_s() == 9 + 30 + 1
    with pytest.raises(KernelError, match="inside the loop nests"):
        kernels.api.unary_kernel(spec)  # the public kernels take two operands


def test_rows_in_runs_are_checked():
    with pytest.raises(KernelError, match="m_inner must divide"):
        UnarySpec("f32", UnaryOp.COPY, 10, 4, trans_a=True, m_inner=3, lda_outer=40)
    with pytest.raises(KernelError, match="transposed"):
        UnarySpec("f32", UnaryOp.COPY, 10, 4, m_inner=5, lda_outer=40)
    with pytest.raises(KernelError, match="lda_outer"):
        UnarySpec("f32", UnaryOp.COPY, 10, 4, trans_a=True, m_inner=5, lda_outer=2)
    with pytest.raises(KernelError, match="without m_inner"):
        UnarySpec("f32", UnaryOp.COPY, 10, 4, trans_a=True, lda_outer=40)


@pytest.mark.parametrize("dtype", DTYPES)
def test_contiguous_unary_at_every_alignment(dtype):
    """A contiguous B is swept as one column whose stores start at B's first vector boundary,
    with overlapping full vectors at both ends."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    group = 4 * lanes
    specs, shifts = [], []
    for m, n in ((2 * group, 1), (2 * group + 1, 1), (group + 3, 3), (37, 41), (5 * group - 1, 2)):
        for op, in_place in (
            (UnaryOp.COPY, False),
            (UnaryOp.RELU, False),
            (UnaryOp.ZERO, False),
            (UnaryOp.RELU, True),
        ):
            for shift_a, shift_b in ((0, 0), (1, lanes - 1), (lanes // 2, 0), (0, 3)):
                specs.append(UnarySpec(dtype, op, m, n, in_place=in_place))
                shifts.append((shift_a, shift_b))
    for seed, (spec, function, shift) in enumerate(zip(specs, compile_many(specs, HOST), shifts)):
        run_unary(spec, function, seed, shift)


# ---- the public API -----------------------------------------------------------------------


def test_gemm_api_matches_numpy():
    gemm = kernels.gemm("fp64", 20, 9, 7)
    a = np.asfortranarray(np.random.rand(20, 7))
    b = np.asfortranarray(np.random.rand(7, 9))
    c = np.asfortranarray(np.random.rand(20, 9))
    expected = c + a @ b
    gemm(a, b, c)
    np.testing.assert_allclose(c, expected, rtol=1e-13)


def test_brgemm_api_transposed_layouts_and_beta_zero():
    kernel = kernels.brgemm(np.float32, 5, 6, 7, 3, trans_a=True, trans_b=True, beta=0)
    a = np.random.rand(3, 5, 7).astype(np.float32)  # row-major A_i: unit stride on K
    b = np.random.rand(3, 7, 6).astype(np.float32)  # row-major B_i: unit stride on N
    kernel = kernels.brgemm(
        "f32", 5, 6, 7, 3, trans_a=True, trans_b=True, beta=0, stride_a=35, stride_b=42
    )
    c = np.full((6, 5), np.nan, dtype=np.float32)  # column-major C: c.T is the result
    kernel(a, b, c)
    np.testing.assert_allclose(c.T, np.einsum("bmk,bkn->mn", a, b), rtol=1e-5)


def test_unary_api():
    transpose = kernels.unary("copy", "f32", 4, 3, trans_a=True)
    a = np.arange(12, dtype=np.float32).reshape(4, 3)  # row-major 4x3 = column-major 3x4
    b = np.empty((3, 4), dtype=np.float32)  # row-major 3x4 = column-major 4x3 = a
    transpose(a, b)
    np.testing.assert_array_equal(b.T, a)
    zero = kernels.unary("Zero", "f64", 5, 5)
    z = np.ones(25)
    zero(z)
    assert not z.any()
    relu = kernels.unary("relu", "f64", 25, 1, in_place=True)
    x = np.linspace(-1, 1, 25)
    relu(x)
    np.testing.assert_array_equal(x, np.maximum(np.linspace(-1, 1, 25), 0))


def test_relu_keeps_nan_like_numpy():
    relu = kernels.unary("relu", "f32", 4, 1)
    a = np.array([np.nan, -1, 2, -0.0], dtype=np.float32)
    b = np.empty(4, dtype=np.float32)
    relu(a, b)
    np.testing.assert_array_equal(b, np.maximum(a, 0))


def test_kernels_are_cached_in_memory():
    first = kernels.gemm("f32", 8, 8, 8)
    second = kernels.gemm("f32", 8, 8, 8, lda=8)
    assert second.address == first.address and second.origin == "memory"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: kernels.gemm("f16", 4, 4, 4), "dtype"),
        (lambda: kernels.gemm("f32", 0, 4, 4), "m must be"),
        (lambda: kernels.gemm("f32", 4, 4, 4, lda=3), "lda must be"),
        (lambda: kernels.gemm("f32", 4, 4, 4, trans_b=True, ldb=3), "ldb must be"),
        (lambda: kernels.gemm("f32", 4, 4, 4, beta=2), "beta"),
        (lambda: kernels.brgemm("f32", 4, 4, 4, 2, stride_a=-1), "stride_a"),
        (lambda: kernels.unary("sigmoid", "f32", 4, 4), "op must be"),
        (lambda: kernels.unary("copy", "f32", 4, 4, in_place=True), "only ReLU"),
        (lambda: kernels.unary("zero", "f32", 4, 4, trans_a=True), "transposed"),
        (lambda: kernels.gemm("f32", 2.0, 4, 4), "m must be"),
    ],
)
def test_bad_parameters_raise_kernel_error(call, match):
    with pytest.raises(KernelError, match=match):
        call()
    assert issubclass(KernelError, teir.TeirError)


class TestCallChecks:
    gemm = kernels.gemm("f32", 4, 3, 2)

    def arrays(self):
        return (np.ones(8, np.float32), np.ones(6, np.float32), np.zeros(12, np.float32))

    @pytest.mark.parametrize(
        ("index", "value", "match"),
        [
            (0, np.ones(7, np.float32), "A holds 7 elements"),
            (1, np.ones(6, np.float64), "B has dtype float64"),
            (2, np.zeros(24, np.float32)[::2], "C- or F-contiguous"),
            (0, [1.0] * 8, "NumPy array"),
            (2, None, "NumPy array"),
        ],
    )
    def test_bad_arrays(self, index, value, match):
        arrays = list(self.arrays())
        arrays[index] = value
        with pytest.raises(teir.ExecutionError, match=match):
            self.gemm(*arrays)

    def test_read_only_output(self):
        a, b, c = self.arrays()
        c.flags.writeable = False
        with pytest.raises(teir.ExecutionError, match="read-only"):
            self.gemm(a, b, c)

    def test_overlap(self):
        buffer = np.ones(30, np.float32)
        with pytest.raises(teir.ExecutionError, match="overlaps"):
            self.gemm(buffer[:8], buffer[8:14], buffer[4:16])


def test_unary_overlap_without_in_place_is_refused():
    copy = kernels.unary("copy", "f32", 4, 1)
    x = np.ones(4, np.float32)
    with pytest.raises(teir.ExecutionError, match="in_place"):
        copy(x, x)


def _streamed_c(
    dtype: str,
    m: int,
    n: int,
    k: int,
    batch: int,
    trans_a: bool,
    lda: int,
    ldc: int,
    beyond_caches: bool = True,
) -> BrgemmSpec:
    """A beta-0 kernel spec with ``stream_c`` (into an output beyond the caches unless
    ``beyond_caches`` is false), its batch elements one after the other."""
    stride_a = lda * (m if trans_a else k)
    return BrgemmSpec(
        dtype,
        m,
        n,
        k,
        batch,
        trans_a,
        False,
        lda,
        k,
        ldc,
        stride_a,
        k * n,
        beta=0,
        stream_c=True,
        c_beyond_caches=beyond_caches,
    )


def _run_at_every_shift(specs: list[BrgemmSpec], lanes: int) -> None:
    """Run each spec's kernel with C at the start of a line and 1, a quarter, half, three
    quarters and all but one lane past it, checking the result and what lies around it."""
    shifts = (0, 1, lanes // 4, lanes // 2, 3 * lanes // 4, lanes - 1)
    cases = [(spec, shift) for spec in specs for shift in shifts]
    functions = compile_many([spec for spec, _ in cases], HOST)
    for seed, ((spec, shift), function) in enumerate(zip(cases, functions)):
        run_brgemm(spec, function, seed, shift)


@pytest.mark.parametrize("dtype", DTYPES)
def test_streamed_c_at_every_alignment(dtype):
    """``stream_c`` kernels store C's full vectors non-temporally where C is vector-aligned
    at run time; C 16, 32 or 48 bytes past a boundary is swept from a shifted start with its
    edge lanes masked (where columns follow each other, ldc = m, the tail of one and the
    head of the next joined into one vector, across column blocks too), and other offsets
    store normally. All give the same result and touch nothing else."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    specs: list[BrgemmSpec] = []
    for m, n, k, batch, ldc in (
        (4 * lanes, 9, 7, 3, 4 * lanes),
        (2 * lanes + 3, 5, 4, 1, 3 * lanes),
        (lanes - 2, 3, 5, 2, lanes),
        (6 * lanes, 17, 3, 1, 7 * lanes),
        (4 * lanes + 5, 4, 6, 1, 5 * lanes),
        (6 * lanes, 17, 3, 1, 6 * lanes),
        (5 * lanes, 29, 5, 2, 5 * lanes),
        (7 * lanes, 1, 4, 1, 7 * lanes),
    ):
        for trans_a in (False, True):
            specs.append(_streamed_c(dtype, m, n, k, batch, trans_a, k if trans_a else m, ldc))
    _run_at_every_shift(specs, lanes)


@pytest.mark.parametrize("in_nest", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_streamed_copies_at_every_alignment(dtype, in_nest):
    """``stream_b`` copies store B's full vectors non-temporally where they lie on vector
    boundaries at run time (transposed blocks, the body of a contiguous column) and normally
    elsewhere; every alignment gives the same result and touches nothing else."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    forms = [
        dict(m=4 * lanes, n=4 * lanes, lda=4 * lanes, ldb=4 * lanes, trans_a=True),
        dict(m=9 * lanes, n=8 * lanes + 3, lda=9 * lanes, ldb=10 * lanes, trans_a=True),
        dict(m=2 * lanes + 5, n=3 * lanes, lda=3 * lanes + 7, ldb=3 * lanes, trans_a=True),
        dict(m=10 * lanes + 3, n=1),
        dict(m=3 * lanes, n=4, lda=5 * lanes, ldb=4 * lanes),
    ]
    specs, shifts = [], []
    for form in forms:
        for op in (UnaryOp.COPY, UnaryOp.RELU):
            for shift in ((0, 0), (1, lanes - 1), (0, 3), (lanes // 2, 0)):
                specs.append(UnarySpec(dtype, op, stream_b=True, **form))
                shifts.append(shift)
    assert all(spec.name.endswith("_stream") for spec in specs)
    functions = compile_many(specs, HOST, streamed=in_nest)
    for seed, (spec, function, shift) in enumerate(zip(specs, functions, shifts)):
        run_unary(spec, function, seed, shift)


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_a_blocks(dtype, whole):
    # A copied per row block into a lane-padded buffer (chosen for far-apart A columns), or
    # (whole) every row block of the chunk at once before column blocks sweep them.
    specs, blockings = [], []
    for m, n, k, batch, beta, pad in (
        (17, 9, 5, 3, 0, 2),
        (33, 20, 7, 2, 1, 0),
        (16, 16, 16, 4, 0, 1),
        (100, 40, 9, 2, 1, 3),
        (5, 30, 3, 1, 0, 0),
        (64, 64, 8, 6, 0, 5),
    ):
        spec = brgemm_spec(dtype, m, n, k, batch, False, False, beta, pad)
        base = choose_blocking(spec, HOST)
        for chunk in sorted({1, batch}):
            specs.append(spec)
            blockings.append(
                Blocking("outer", base.lanes, base.vectors, base.columns, chunk, True, whole)
            )
        # Half-width vectors put vectors at 32-byte (not 64-byte) offsets in the buffer.
        specs.append(spec)
        blockings.append(Blocking("outer", base.lanes // 2, 3, 2, 1, True, whole))
    sweep(specs, blockings=blockings)
    wide = BrgemmSpec(
        dtype, 64, 48, 32, 4, lda=2048, ldb=32, ldc=64, stride_a=2048 * 32, stride_b=32 * 48
    )
    assert choose_blocking(wide, HOST).pack_a
    assert choose_blocking(wide, HOST).pack_whole
    # A tile too large for the buffer at once is packed row block by row block.
    deep = BrgemmSpec(
        dtype, 256, 48, 256, 2, lda=2048, ldb=256, ldc=256, stride_a=2048 * 256, stride_b=256 * 48
    )
    assert choose_blocking(deep, HOST).pack_a
    assert not choose_blocking(deep, HOST).pack_whole


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("trans_a", "trans_b"), LAYOUTS)
def test_k_swept_in_pieces(dtype, trans_a, trans_b):
    # K in pieces (C accumulating between them, beta 0 only before the first), tails
    # included, on every layout and form, one batch element per chunk or several.
    specs, blockings = [], []
    for m, n, k, batch, beta, piece in (
        (40, 1, 19, 1, 0, 8),
        (33, 3, 17, 2, 0, 8),
        (9, 20, 64, 3, 1, 16),
        (70, 1, 23, 4, 0, 4),
        (1, 37, 30, 2, 0, 8),
        (16, 16, 9, 1, 1, 8),
    ):
        spec = brgemm_spec(dtype, m, n, k, batch, trans_a, trans_b, beta, (m + k) % 3)
        base = choose_blocking(spec, HOST)
        for chunk in sorted({1, batch}):
            specs.append(spec)
            blockings.append(replace(base, chunk=chunk, k_piece=piece))
    sweep(specs, blockings=blockings)


def test_matrix_vector_products_stream_k_in_pieces():
    # x @ A with A row-major: the matrix's K steps lie apart and one column block reads all
    # of it, so the kernel takes one batch element at a time and K a few steps at a time.
    lanes = HOST.lanes(8)
    outer = BrgemmSpec("f64", 512, 1, 100, 1, lda=4096, ldb=100, ldc=512, stride_a=0, stride_b=0)
    mirror = BrgemmSpec("f64", 1, 512, 8, 64, True, True, 8, 4096, 1, stride_a=8, stride_b=8 * 4096)
    for spec in (outer, mirror):
        blocking = choose_blocking(spec, HOST)
        assert blocking.chunk == 1
        assert blocking.k_piece == (K_PIECE if spec.k > 2 * K_PIECE else 0)
    # rows that one register block covers back to back: one run per block, no pieces
    tight = BrgemmSpec(
        "f64", lanes, 1, 100, 4, lda=lanes, ldb=100, ldc=lanes, stride_a=lanes * 100, stride_b=100
    )
    assert choose_blocking(tight, HOST).k_piece == 0


def test_mirror_k_pieces_only_where_c_is_a_row():
    """The mirror form's vectors of C run along N: K pieces, which load and store C again each
    piece, only where those vectors are whole (ldc 1, a row of C); a C of several rows would
    be gathered and scattered every 8 K steps (deac,cb->baed FP64: 2.1 -> 0.55 ms without)."""
    lanes = HOST.lanes(8)
    row = BrgemmSpec("f64", 1, 512, 64, 1, True, True, 64, 4096, 1)
    rows = BrgemmSpec("f64", 2, 124, 64, 1, True, True, 12288, 496, 384)
    for spec, pieces in ((row, True), (rows, False)):
        blocking = choose_blocking(spec, HOST)
        assert blocking.form == "mirror" and spec.ldb > blocking.vectors * lanes
        assert (blocking.k_piece == K_PIECE) is pieces, (spec, blocking)
    sweep([row, rows])  # both against the reference


@pytest.mark.parametrize("dtype", DTYPES)
def test_mirror_form_adds_a_row_of_c_by_whole_vectors(dtype):
    """Where C is one row of unit stride (M of one, ldc 1), each vector of the mirror form's
    block is a run of that row: loaded, added and stored whole (masked at an N tail), not lane
    by lane (FP64 ``cb,cba->a`` 61440 x 248, 8 rows per batch element, one thread: 11.8 ->
    9.5-9.9 ms). N tails, both betas, short and long K and batches give the reference."""
    from kernel_harness import Module, brgemm_function

    scalar = "float" if dtype == "f32" else "double"
    specs = []
    for n, (k, batch), beta in itertools.product((37, 64, 248), ((8, 75), (3, 5), (64, 1)), (0, 1)):
        specs.append(BrgemmSpec(dtype, 1, n, k, batch, True, True, k, n, 1, k, k * n, beta=beta))
    for spec in specs:
        assert choose_blocking(spec, HOST).form == "mirror", spec
        module = Module()
        brgemm_function(spec, HOST, module, "kernel")
        assert f"store {scalar} " not in module.text(), spec  # no element stored on its own
    sweep(specs)


@pytest.mark.parametrize(("columns", "pieces"), [(1, True), (2, True), (4, True), (13, False)])
def test_k_pieces_only_for_a_few_columns_of_c(columns, pieces):
    """A single column block of up to K_PIECE columns streams A in K pieces; a wider one would
    load and store its C every piece (`cda,bcd->ba` 213 x 13 x 37·40 FP64: 69 -> 98
    GFLOP/s without the pieces)."""
    spec = BrgemmSpec(
        "f64", 213, columns, 40, 37, lda=213, ldb=1480, ldc=213, stride_a=8520, stride_b=40
    )
    zen4 = Target("x86_64-unknown-linux-gnu", "znver4", "+avx512f,+avx512dq,+fma,+avx2,+avx")
    assert choose_blocking(spec, zen4).columns >= columns  # one column block there
    for target in (HOST, zen4, zen4.without_avx512()):
        blocking = choose_blocking(spec, target)
        # C in several column blocks is loaded and stored per block anyway: no pieces
        one_block = blocking.columns >= columns
        assert (blocking.k_piece == K_PIECE) is (pieces and one_block), (target.cpu, blocking)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_a_packed_into_the_outer_form(dtype):
    # A stored transposed (unit stride on K) with B unit on K: A's row blocks are transposed
    # into the packing buffer once M fills vectors, short K (masked loads) included.
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    specs = []
    for index, (m, k) in enumerate(
        itertools.product(
            (lanes, lanes + 1, 2 * lanes - 1, 33, 100), (1, 3, lanes - 1, lanes, lanes + 1, 31, 64)
        )
    ):
        n = (16, 17, 20, 33)[index % 4]
        specs.append(brgemm_spec(dtype, m, n, k, 1 + index % 3, True, False, index % 2, index % 3))
    assert all(choose_blocking(s, HOST).form == "outer" for s in specs)
    assert all(choose_blocking(s, HOST).pack_a for s in specs)
    sweep(specs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_both_transposed_pack_a_where_n_exceeds_the_depth(dtype):
    # A and B stored transposed: A's row blocks are packed (the outer form along M) where N
    # exceeds K x batch, the steps that repay the mirror form's transposes of C; otherwise
    # the mirror form runs along N.
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    packed, mirrored = [], []
    for index, (m, n, k, batch) in enumerate(
        itertools.product((lanes, 2 * lanes + 3), (16, 40, 160), (1, 3, lanes - 1, 31), (1, 2))
    ):
        spec = brgemm_spec(dtype, m, n, k, batch, True, True, index % 2, index % 3)
        (packed if n > k * batch else mirrored).append(spec)
    assert packed and mirrored
    assert all(choose_blocking(s, HOST).form == "outer" for s in packed)
    assert all(choose_blocking(s, HOST).pack_a for s in packed)
    assert all(choose_blocking(s, HOST).form == "mirror" for s in mirrored)
    sweep(packed + mirrored)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("trans_b", "form"), [(False, "dot"), (True, "mirror")])
def test_transposed_a_too_deep_to_pack_keeps_its_own_form(dtype, trans_b, form):
    # A row block of A over all of a long K outgrows the packing buffer: dot products along K
    # (B unit on K) or the mirror form (B unit on N) read A where it lies.
    spec = brgemm_spec(dtype, 64, 32, 8192, 1, True, trans_b, 1, 0)
    assert choose_blocking(spec, HOST).form == form
    sweep([spec])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [20, 28, 36, 44, 52])
def test_a_block_broadcasts_at_most_one_element_per_cycle(dtype, rows):
    """Zen 4 runs two half-width FMAs per cycle but only one broadcast: a block of a single
    half-width vector and 15 columns waits on its broadcasts (FP64 44 x 156 x 513 ran at
    0.39 of one core's peak in 1 x 4 x 15, 0.76 in 2 x 8 x 6)."""
    zen4 = Target("x86_64-unknown-linux-gnu", "znver4", "+avx512f,+avx512dq,+fma,+avx2,+avx")
    itemsize = 4 if dtype == "f32" else 8
    spec = BrgemmSpec(dtype, rows, 1000, 64, 4, False, True, rows, 1000, rows, 64 * rows, 1, 0)
    blocking = choose_blocking(spec, zen4)
    full = zen4.lanes(itemsize)
    fma_cycles = blocking.vectors * blocking.columns * (blocking.lanes / full)
    assert blocking.columns <= fma_cycles, blocking


@pytest.mark.parametrize(("rows", "half"), [(12, True), (36, False), (60, False), (81, False)])
def test_half_width_blocks_where_full_width_would_pad_many_rows(rows, half):
    """On Zen 4 a half-width block wins only where full-width vectors would pad many rows
    (FP64 M 12, 2 threads: 3x4 x 5 107 GFLOP/s, 2x8 x 8 83); where both pad about alike it
    lost (M 36: 67-88 against 101; M 81, F-ordered A: 71-73 against 95-97)."""
    zen4 = Target("x86_64-unknown-linux-gnu", "znver4", "+avx512f,+avx512dq,+fma,+avx2,+avx")
    spec = BrgemmSpec("f64", rows, 2000, 512, 1, False, True, rows, 2000, rows, 0, 0, 0)
    assert (choose_blocking(spec, zen4).lanes == 4) == half


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ldb", [512, 1024, 515])
def test_broadcast_columns_do_not_crowd_an_l1_set(dtype, ldb):
    """The outer form reads one line of each of its block's columns of B per step: columns a
    multiple of 4 KiB apart all fall into one L1 set, so a block takes no more of them than
    the set has ways (FP64 80 x 60 x 64, ldb 512: 1 x 15 ran at 52 % of peak, 2 x 6 at 95 %)."""
    from teir.codegen.transpose import L1_WAYS, set_crowding

    itemsize = 4 if dtype == "f32" else 8
    spec = BrgemmSpec(dtype, 80, 60, 64, 8, False, False, 400, ldb, 400, 25600, 64 * ldb, 0)
    blocking = choose_blocking(spec, HOST)
    assert blocking.form == "outer"
    assert set_crowding(ldb * itemsize, blocking.columns) <= L1_WAYS
    # the kernel on that block is still right
    (function,) = compile_many([spec], HOST)
    run_brgemm(spec, function, seed=ldb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a", [False, True])
def test_streamed_c_from_packed_a_at_every_alignment(dtype, trans_a):
    """A kernel that packs A row block by row block (columns pages apart, or A transposed)
    sweeps a streamed C that lies 16, 32 or 48 bytes past a vector boundary from a shifted
    start too: the first block's rows before the tile are packed as zeros, never read (FP64
    attention scores into `np.zeros`: C went through the caches)."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    itemsize = 4 if dtype == "f32" else 8
    specs: list[BrgemmSpec] = []
    # untransposed A packed by row blocks only when the whole tile would not fit the buffer
    cases = (
        ((5 * lanes, 17, 2 * lanes + 3, 1), (6 * lanes + 5, 33, lanes, 2))
        if trans_a
        else ((4 * lanes + 5, 20, 420, 1), (6 * lanes, 24, 400, 2))
    )
    for m, n, k, batch in cases:
        lda = k if trans_a else 4096 // itemsize + m
        ldc = -(-m // lanes) * lanes + lanes  # columns on vector boundaries
        spec = _streamed_c(dtype, m, n, k, batch, trans_a, lda, ldc)
        blocking = choose_blocking(spec, HOST)
        assert blocking.pack_a and not blocking.pack_whole, spec
        # C 16 bytes or more past a boundary gets a shifted sweep of its own
        emitter = _Emitter(spec, blocking, Module(), "kernel", "", "")
        assert emitter.c_shifts() == list(range(16 // itemsize, lanes, 16 // itemsize))
        specs.append(spec)
    _run_at_every_shift(specs, lanes)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shifted_sweeps_near_the_caches_need_few_k_steps_per_vector(dtype):
    """A misaligned streamed C with SHIFT_LEAST_VECTORS vectors per column or more is shifted
    onto vector boundaries where its output outgrows the caches, but where it does not only
    while K x batch is at most SHIFT_MOST_DEPTH_PER_VECTOR per vector (its normal stores
    mostly hit the last level, and the shift's extra vector costs K FMAs per column);
    unshifted, the kernel still stores a misaligned C right, normally."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    itemsize = 4 if dtype == "f32" else 8
    shifts = list(range(16 // itemsize, lanes, 16 // itemsize))
    checked = []
    for vectors in (SHIFT_LEAST_VECTORS - 1, SHIFT_LEAST_VECTORS, 7):
        m = vectors * lanes
        most = SHIFT_MOST_DEPTH_PER_VECTOR * vectors
        for k, batch in ((most, 1), (most // 2 + 1, 2), (most // 2, 2)):
            for beyond in (False, True):
                spec = _streamed_c(dtype, m, 9, k, batch, False, m, m + lanes, beyond)
                blocking = choose_blocking(spec, HOST)
                emitter = _Emitter(spec, blocking, Module(), "kernel", "", "")
                shifted = vectors >= SHIFT_LEAST_VECTORS and (beyond or k * batch <= most)
                assert emitter.c_shifts() == (shifts if shifted else []), (vectors, k, beyond)
                checked.append(spec)
    assert "_far" in checked[1].name and "_far" not in checked[0].name
    _run_at_every_shift([checked[8], checked[9], checked[10]], lanes)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unaligned_streamed_c_packs_a_whole(dtype):
    """A tile of an output beyond the caches whose columns are not vector-aligned (so stored
    normally) and many (more than the prefetchers follow) packs all of A's rows at once, A
    stored transposed too, and sweeps column blocks outside: right at every alignment of C,
    with more row blocks than one unrolled pass packs and a partial last one."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    specs = []
    for m, n, k, batch, trans_a in (
        (60 * lanes + 3, 40, 5, 2, False),
        (30 * lanes + 5, 41, 9, 2, True),
    ):
        # columns far enough apart for the kernel to pack A on any target
        far = pack_leading_bytes(HOST) // (4 if dtype == "f32" else 8) + 3
        lda = k if trans_a else max(m, far)
        spec = _streamed_c(dtype, m, n, k, batch, trans_a, lda, -(-m // lanes) * lanes + 3)
        blocking = choose_blocking(spec, HOST)
        assert blocking.pack_a and blocking.pack_whole and blocking.chunk == batch, spec
        specs.append(spec)
    _run_at_every_shift(specs, lanes)


@pytest.mark.parametrize("dtype", DTYPES)
def test_streamed_c_from_a_packed_whole_at_every_alignment(dtype):
    """A kernel that packs all of A's rows at once sweeps a streamed C that lies 16, 32 or 48
    bytes past a vector boundary from a shifted start as well, the rows before the tile
    packed as zeros into a buffer one block longer where need be (FP64 tensor-train root
    into a NumPy out 16 bytes off: C through the caches, 290 -> 158 ms), with contiguous
    columns (ldc = m, joined at their seams) or gaps between them, every row count a whole
    number of blocks or not."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    itemsize = 4 if dtype == "f32" else 8
    far = 4096 // itemsize  # A's columns pages apart: the kernel packs A
    specs: list[BrgemmSpec] = []
    for m, n, k, batch, ldc in (
        (6 * lanes, 37, 9, 1, 6 * lanes),
        (6 * lanes, 48, 5, 2, 6 * lanes),
        (5 * lanes + 3, 41, 7, 1, 6 * lanes),
        (8 * lanes, 33, 4, 1, 10 * lanes),
    ):
        spec = _streamed_c(dtype, m, n, k, batch, False, far + m, ldc)
        blocking = choose_blocking(spec, HOST)
        assert blocking.pack_a and blocking.pack_whole, (spec, blocking)
        emitter = _Emitter(spec, blocking, Module(), "kernel", "", "")
        assert emitter.c_shifts() == list(range(16 // itemsize, lanes, 16 // itemsize))
        specs.append(spec)
    _run_at_every_shift(specs, lanes)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_b_columns(dtype):
    """B stored transposed is copied column block by column block into a buffer every row
    block then reads: tails in rows, columns and K, several batch elements per chunk or one,
    half-width vectors, and beta 0 or 1."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    specs, blockings = [], []
    for m, n, k, batch, beta, pad in (
        (17, 9, 5, 3, 0, 2),
        (33, 20, 7, 2, 1, 0),
        (2 * lanes, 16, 16, 4, 0, 1),
        (100, 40, 9, 2, 1, 3),
        (5, 30, 3, 1, 0, 0),
        (64, 13, 8, 6, 0, 5),
    ):
        spec = brgemm_spec(dtype, m, n, k, batch, False, True, beta, pad)
        for chunk in sorted({1, batch}):
            for width, vectors, columns in ((lanes, 2, 5), (lanes, 1, 12), (lanes // 2, 3, 4)):
                specs.append(spec)
                blockings.append(Blocking("outer", width, vectors, columns, chunk, pack_b=True))
    sweep(specs, blockings=blockings)


@pytest.mark.parametrize("dtype", DTYPES)
def test_b_with_far_apart_k_steps_is_packed(dtype):
    """A transposed B whose K steps are 4 KiB or more apart puts one line per K step into a
    single L1 set; several row blocks rereading them get a packed copy (FP64 1024^3
    `ki,kj->ij`: 22 -> 45 GFLOP/s on 2 cores of a Xeon), in a buffer that leaves most of L1
    to A. A single row block reads each line once and packs nothing."""
    from teir.codegen.transpose import L1_WAYS, set_crowding

    itemsize = 4 if dtype == "f32" else 8
    lanes = HOST.lanes(itemsize)
    far = 4096 // itemsize
    spec = BrgemmSpec(
        dtype,
        8 * lanes,
        128,
        64,
        16,
        False,
        True,
        8 * lanes,
        far,
        8 * lanes,
        8 * lanes * 64,
        far * 64,
    )
    blocking = choose_blocking(spec, HOST)
    assert set_crowding(far * itemsize, 64) > L1_WAYS
    assert blocking.pack_b and blocking.form == "outer"
    assert blocking.b_buffer_bytes(spec) <= kernels_l1() // 8
    assert blocking.stack_bytes(spec) == blocking.b_buffer_bytes(spec)
    (function,) = compile_many([spec], HOST, [blocking])
    run_brgemm(spec, function, seed=1)
    # near K steps, or a single row block: no copy
    near = replace(spec, ldb=128, stride_b=128 * 64)
    assert not choose_blocking(near, HOST).pack_b
    narrow = replace(spec, m=lanes, lda=lanes, ldc=lanes, stride_a=lanes * 64)
    assert not choose_blocking(narrow, HOST).pack_b


def kernels_l1() -> int:
    from teir.codegen.target import cache_sizes

    return cache_sizes()["L1"]


def test_a_is_packed_nearer_on_cores_with_two_fma_pipes():
    """A's columns 2-4 KiB apart: a core with two full-width FMA pipes packs A (its sweep
    would stream A's row blocks from L2 at twice Zen 4's pace); Zen 4 reads them in place."""
    features = "+avx512f,+avx512dq,+fma,+avx2,+avx"
    zen4 = Target("x86_64-unknown-linux-gnu", "znver4", features)
    xeon = Target("x86_64-unknown-linux-gnu", "sapphirerapids", features)
    spec = BrgemmSpec(
        "f32", 125, 200, 100, 10, lda=750, ldb=1000, ldc=1000, stride_a=75000, stride_b=100
    )
    assert choose_blocking(spec, xeon).pack_a
    assert not choose_blocking(spec, zen4).pack_a
    far = replace(spec, lda=1024, stride_a=102400)
    assert choose_blocking(far, xeon).pack_a and choose_blocking(far, zen4).pack_a
    near = replace(spec, lda=500, stride_a=50000)
    assert not choose_blocking(near, xeon).pack_a


XEON = Target("x86_64-unknown-linux-gnu", "sapphirerapids", "+avx512f,+avx512dq,+fma,+avx2,+avx")
ZEN4 = Target("x86_64-unknown-linux-gnu", "znver4", "+avx512f,+avx512dq,+fma,+avx2,+avx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [40, 64, 96, 125, 150, 256])
def test_two_pipe_cores_block_several_vectors(dtype, rows):
    """A core with two full-width FMA pipes retires about as many loads as FMAs: a block of
    one vector, one broadcast per FMA, is load-bound there (the 1000^3 GEMM's FP64 kernel:
    1 x 12 at 66 % of peak, 3 x 8 at 91 %), so its blocks take several vectors and at least
    as many FMAs per step as values loaded; Zen 4's model is left as it was."""
    spec = BrgemmSpec(dtype, rows, 200, 100, 10, lda=rows, ldb=1000, ldc=1000, stride_a=rows * 100)
    blocking = choose_blocking(spec, XEON)
    assert blocking.vectors >= 2, blocking
    assert blocking.vectors * blocking.columns >= blocking.vectors + blocking.columns
    assert blocking.vectors * blocking.columns <= 24
    if dtype == "f64" and rows == 40:
        assert (choose_blocking(spec, ZEN4).vectors, choose_blocking(spec, ZEN4).columns) == (1, 12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_dot_blocks_sum_over_several_chains(dtype):
    """A dot-form block of few products (a dot product, a matrix-vector product's rows)
    spreads each sum over several accumulators, so that FMAs do not wait for each other
    (FP64 dot of 2M elements on one core, from L3: 52 -> 95 GB/s); every K length, tail
    lane count, batch and block shape still sums exactly what it should."""
    assert dot_chains(1, 1, 1000, 24) == 8
    assert dot_chains(4, 1, 1000, 24) == 2
    assert dot_chains(1, 1, 3, 24) == 3
    assert dot_chains(4, 4, 1000, 24) == 1
    assert dot_chains(2, 3, 1000, 15) == 1  # 16 registers: no room for a second chain
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    specs = [
        brgemm_spec(dtype, m, n, k, batch, True, False, beta, pad)
        for m, n in ((1, 1), (2, 1), (1, 3), (5, 2))
        for k, batch in ((lanes, 1), (3 * lanes - 1, 2), (9 * lanes + 3, 3), (17 * lanes, 4))
        for beta, pad in ((0, 1), (1, 0))
    ]
    for spec in specs:
        assert choose_blocking(spec, HOST).form == "dot"
    sweep(specs)


def test_zen5_is_blocked_as_a_two_pipe_core():
    """Zen 5 (EPYC 9005) runs 512-bit FMAs on two full-width pipes, as Intel's AVX-512 cores
    do: it takes their register blocks (1600^3 FP64 on 2 threads: 72 -> 85 % of peak), and
    only Zen 4 counts half-width FMAs as free."""
    features = "+avx512f,+avx512dq,+fma,+avx2,+avx"
    zen5 = Target("x86_64-unknown-linux-gnu", "znver5", features)
    assert ZEN4.half_width_is_free and not zen5.half_width_is_free and not XEON.half_width_is_free
    assert not Target("x86_64-unknown-linux-gnu", "znver4", "+fma,+avx2,+avx").half_width_is_free
    spec = BrgemmSpec(
        "f64", 40, 160, 64, 25, lda=40, ldb=1600, ldc=1600, stride_a=2560, stride_b=64
    )
    assert choose_blocking(spec, zen5) == choose_blocking(spec, XEON)
    assert choose_blocking(spec, zen5).vectors >= 2
    assert choose_blocking(spec, ZEN4).vectors == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_wide_register_blocks(dtype):
    """Blocks of up to 5 vectors and 24 accumulators, with row, column and K tails, batch
    chunks and beta 0 or 1, in the outer and mirror forms."""
    lanes = HOST.lanes(4 if dtype == "f32" else 8)
    specs, blockings = [], []
    for m, n, k, batch, beta, pad, trans in (
        (5 * lanes, 13, 7, 3, 0, 2, False),
        (5 * lanes - 3, 9, 5, 2, 1, 0, False),
        (3 * lanes + 1, 25, 9, 4, 1, 3, False),
        (2 * lanes, 30, 4, 1, 0, 1, False),
        (19, 5 * lanes - 5, 6, 2, 1, 2, True),
    ):
        spec = brgemm_spec(dtype, m, n, k, batch, trans, trans, beta, pad)
        form = "mirror" if trans else "outer"
        for vectors, columns in ((5, 4), (4, 6), (3, 8), (2, 12)):
            for chunk in sorted({1, batch}):
                specs.append(spec)
                blockings.append(Blocking(form, lanes, vectors, columns, chunk))
    sweep(specs, blockings=blockings)


def test_batch_chunks_spread_over_l2_sets():
    """Batch elements a multiple of L2's set period apart (1-2 MiB) share its sets: a chunk
    holds at most a quarter of a set's ways of them (FP32 `trus,pqtu->pqrs`'s kernel, A_i
    1 MiB apart: 43 % of peak in chunks of 32, 85-86 % in 4-8)."""
    from teir.codegen.target import l2_sets, l2_ways

    period = l2_sets() * 64
    allowed = max(1, l2_ways() // 4)
    spec = BrgemmSpec(
        "f32", 64, 144, 64, 32, lda=64, ldb=2048, ldc=4096, stride_a=period // 4, stride_b=64
    )
    assert choose_blocking(spec, HOST).chunk <= allowed
    half = replace(spec, stride_a=period // 8)  # two elements apart share the sets
    assert choose_blocking(half, HOST).chunk <= 2 * allowed
    # elements that spread over the sets are chunked by size alone
    spread = replace(spec, stride_a=64 * 64 + 16)
    assert choose_blocking(spread, HOST).chunk > allowed


def test_batch_chunks_count_what_the_sweep_reads_again(monkeypatch):
    """The sweep runs its column blocks outside its row blocks: a chunk keeps the vector
    operand's elements whole in half of L2, but of the broadcast operand only a column block
    (all of B_i cut the 1600³ GEMM's kernel into chunks of 5: 418 -> 436 GFLOP/s whole).
    Row blocks outside (A packed a row block at a time) read all of B_i again instead."""
    import teir.codegen.brgemm as brgemm

    monkeypatch.setattr(brgemm, "cache_sizes", lambda: {"L1": 49152, "L2": 2 << 20, "L3": 1 << 25})
    # A_i 51 KB, B_i 41 KB: 16 whole pairs (1.5 MB) outgrow half of L2, 16 A_i do not
    spec = BrgemmSpec(
        "f32", 200, 160, 64, 16, lda=200, ldb=64, ldc=200, stride_a=12800, stride_b=10240
    )
    blocking = choose_blocking(spec, HOST)
    assert not blocking.pack_a and blocking.form == "outer"
    assert blocking.chunk == 16
    # A packed a row block at a time (columns 8 KiB apart, 25 row blocks), B_i 400 KB: the
    # row blocks outside keep two B_i per chunk in half of L2
    packed = BrgemmSpec(
        "f32", 800, 1600, 64, 16, lda=2048, ldb=64, ldc=800, stride_a=64 * 2048, stride_b=102400
    )
    found = choose_blocking(packed, HOST)
    assert found.pack_a and not found.pack_whole
    assert found.chunk == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_element_loop_of_unit_strides_is_kept_whole_for_the_vectorizer(dtype):
    # the one-element nest's innermost loop steps every tensor by one element: LLVM is told
    # not to unroll it (unrolled, a short one was vectorized across the loop around it, with
    # gathers and scatters); an innermost loop with other strides is left to LLVM
    from teir.codegen.nest import nest_function

    rng = np.random.default_rng(5)
    for subscripts, unit in (("ib,jb->ijb", True), ("bi,bj->ijb", False)):
        for batch in (5, 16, 32, 48):
            shapes = [(7, batch), (9, batch)] if unit else [(batch, 7), (batch, 9)]
            a, b = (rng.random(shape).astype(dtype) for shape in shapes)
            out = np.zeros((7, 9, batch), dtype)
            plan = teir.einsum_plan(subscripts, a, b, out=out, threads=1)
            assert plan.canonical is None and plan.operation is not None
            nest = plan.operation.nest
            assert all(s in (0, 1) for s in nest.loops[-1].strides) is unit
            module = Module()
            nest_function(nest, Target.host(), module, "nest")
            assert ("llvm.loop.unroll.disable" in module.text()) is unit
            teir.einsum(subscripts, a, b, out=out, threads=1)
            np.testing.assert_allclose(out, np.einsum(subscripts, a, b), rtol=1e-6)


def _prefetched_addresses(
    spec: BrgemmSpec, prefetch=None, shifts: tuple[int, int] = (0, 0), target: Target = HOST
) -> tuple[list[int], dict]:
    """Compile ``spec``'s kernel with every ``@llvm.prefetch`` turned into a call that
    records its address, run it (A and the next call's A ``shifts`` bytes past a line
    boundary), check its result and return the recorded addresses and the operands' byte
    ranges."""
    import ctypes

    import llvmlite.binding as llvm

    from teir.codegen.brgemm import Prefetch, brgemm_function
    from teir.kernels import jit

    recorded: list[int] = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda address: recorded.append(address))
    name = f"record_prefetch_{id(callback)}"
    llvm.add_symbol(name, ctypes.cast(callback, ctypes.c_void_p).value)
    module = Module()
    brgemm_function(spec, target, module, "kernel", prefetch=prefetch or Prefetch(False, False))
    text = module.text().replace("call void @llvm.prefetch.p0(", f"call void @{name}(")
    for hint in (", i32 0, i32 2, i32 1)", ", i32 0, i32 3, i32 1)", ", i32 1, i32 3, i32 1)"):
        text = text.replace(hint, ")")
    text += f"\ndeclare void @{name}(ptr)\n"
    assert "@llvm.prefetch" not in text.split("declare void @llvm.prefetch")[0]
    kernel_name = f"prefetching_{id(callback)}"
    text = text.replace("@kernel(", f"@{kernel_name}(")
    address = jit.load_object(jit.compile_object(text, HOST), [kernel_name])[kernel_name]
    dtype = np.float32 if spec.dtype == "f32" else np.float64
    rng = np.random.default_rng(0)

    def values(extent: int, shift: int) -> np.ndarray:
        """``extent`` random values starting ``shift`` bytes past a 64-byte boundary."""
        room = np.empty(extent + 64, dtype)
        first = ((shift - room.ctypes.data) % 64) // room.itemsize
        array = room[first : first + extent]
        array[:] = rng.uniform(-1, 1, extent)
        return array

    a = values(spec.extent_a(), shifts[0])
    b = values(spec.extent_b(), 0)
    c = np.zeros(spec.extent_c(), dtype)
    nxt = values(spec.extent_a(), shifts[1])  # the "next call's" A
    function = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 5)(address)
    function(a.ctypes.data, b.ctypes.data, c.ctypes.data, nxt.ctypes.data, b.ctypes.data)
    ranges = {
        name: (array.ctypes.data, array.ctypes.data + array.nbytes)
        for name, array in (("A", a), ("B", b), ("C", c), ("next A", nxt))
    }
    # the kernel's result is unchanged by the recording calls
    expected = np.zeros((spec.m, spec.n))
    for i in range(spec.batch):
        if spec.trans_a:
            ai = view(a, i * spec.stride_a, spec.m, spec.k, spec.lda, 1)
        else:
            ai = view(a, i * spec.stride_a, spec.m, spec.k, 1, spec.lda)
        if spec.trans_b:
            bi = view(b, i * spec.stride_b, spec.k, spec.n, spec.ldb, 1)
        else:
            bi = view(b, i * spec.stride_b, spec.k, spec.n, 1, spec.ldb)
        expected = expected + ai.astype(np.float64) @ bi.astype(np.float64)
    got = view(c, 0, spec.m, spec.n, 1, spec.ldc)
    tolerance = 1e-3 if dtype is np.float32 else 1e-10  # sums of 600-1000 products of 1 or less
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance)
    return recorded, ranges


def _a_lines(spec: BrgemmSpec, start: int, elements: range) -> set[int]:
    """The cache lines of batch elements ``elements`` of A (A starting at byte ``start``)."""
    size = np.dtype(np.float32 if spec.dtype == "f32" else np.float64).itemsize
    rows, length = (spec.m, spec.k) if spec.trans_a else (spec.k, spec.m)
    lines = set()
    for element in elements:
        for row in range(rows):
            first = start + (element * spec.stride_a + row * spec.lda) * size
            lines.update(range(first // 64, (first + length * size - 1) // 64 + 1))
    return lines


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_batch_elements_far_apart_are_prefetched_block_by_block(dtype):
    """The next call's tiles whose batch elements lie far apart (each a dense block, the
    blocks 2000-2500 elements apart) are prefetched block by block: every line of every
    block and nothing in the gaps between them (GETD's root slab reads B as 10 blocks of
    8000 bytes 200 KB apart: FP64 155-169 -> 147-150 ms per call)."""
    from teir.codegen.brgemm import Prefetch, prefetch_blocks, prefetch_lines

    spec = BrgemmSpec(dtype, 64, 96, 16, 6, False, False, 64, 16, 64, 2000, 2500)
    itemsize = 4 if dtype == "f32" else 8
    block_lines = -(-64 * 16 * itemsize // 64), -(-16 * 96 * itemsize // 64)
    assert prefetch_blocks(spec, 0) == (block_lines[0], 2000 * itemsize)
    assert prefetch_blocks(spec, 1) == (block_lines[1], 2500 * itemsize)
    assert prefetch_lines(spec, Prefetch(True, True)) == (6 * block_lines[0], 6 * block_lines[1])
    recorded, ranges = _prefetched_addresses(spec, Prefetch(True, True))
    for address in recorded:
        assert any(low <= address < high for low, high in ranges.values()), hex(address)

    def block_lines_of(start: int, stride: int, size: int) -> set[int]:
        lines = set()
        for element in range(6):
            first = start + element * stride * itemsize
            lines.update(range(first // 64, (first + size * itemsize - 1) // 64 + 1))
        return lines

    for name, stride, size in (("next A", 2000, 64 * 16), ("B", 2500, 16 * 96)):
        low, high = ranges[name]
        got = {a // 64 for a in recorded if low <= a < high}
        wanted = block_lines_of(low, stride, size)
        assert got <= wanted, f"{name}: prefetches between its blocks"
        # a block starting inside a line may leave its last line to the hardware
        assert len(wanted - got) <= 6, f"{name}: {len(wanted - got)} lines not prefetched"


@pytest.mark.parametrize(
    "dtype, m, n, k, batch, ldc, beta, transposed, form, prefetched",
    [
        ("f64", 40, 24, 64, 3, 1600, 1, False, "outer", True),
        ("f32", 37, 11, 16, 4, 53, 1, False, "outer", True),
        ("f64", 9, 5, 8, 8, 9, 1, False, "outer", True),
        ("f64", 40, 24, 64, 3, 1600, 0, False, "outer", False),
        ("f32", 32, 16, 8, 1, 32, 1, False, "outer", False),
        # opt2_fctn's root kernel: both operands transposed, C^T in registers
        ("f32", 20, 60, 8, 8, 400, 1, True, "mirror", True),
        ("f64", 7, 19, 8, 8, 11, 1, True, "mirror", True),
        ("f32", 20, 60, 8, 8, 400, 0, True, "mirror", False),
    ],
)
def test_blocks_adding_to_c_prefetch_its_lines(
    dtype, m, n, k, batch, ldc, beta, transposed, form, prefetched
):
    """A register block that adds its sums to C after a long K loop prefetches the lines of
    C it will load, every one of them and nothing outside the tile, in the outer form and in
    the mirror form (C^T's rows); a block that overwrites C (beta 0) or whose K loop is
    short (8 steps) prefetches none of C."""
    lda, ldb = (k, n) if transposed else (m, k)
    spec = BrgemmSpec(
        dtype, m, n, k, batch, transposed, transposed, lda, ldb, ldc, m * k, k * n, beta
    )
    if choose_blocking(spec, HOST).form != form:
        pytest.skip(f"this target's kernel for it is not of the {form} form")
    recorded, ranges = _prefetched_addresses(spec)
    low, _ = ranges["C"]
    itemsize = 4 if dtype == "f32" else 8
    elements = {low + (col * ldc + row) * itemsize for col in range(n) for row in range(m)}
    in_c = [a for a in recorded if ranges["C"][0] <= a < ranges["C"][1]]
    assert set(in_c) <= elements, "a prefetch of C outside the tile's elements"
    if prefetched:
        assert {a // 64 for a in in_c} == {a // 64 for a in elements}
    else:
        assert not in_c


@pytest.mark.parametrize("avx512", [True, False])
@pytest.mark.parametrize(
    ("dtype", "m", "k", "batch", "trans_a", "lda"),
    [
        ("f64", 64, 100, 10, False, 1601),  # ik,kj->ij 97 x 1601 x 1000's kernel
        ("f64", 40, 100, 6, False, 1601),  # runs of 320 bytes: 5 lines, or 6 unaligned
        ("f32", 64, 100, 6, False, 1601),
        ("f64", 64, 100, 10, True, 1000),  # A stored transposed: its rows along K
    ],
)
def test_packing_sweeps_prefetch_the_next_chunks_rows(dtype, m, k, batch, trans_a, lda, avx512):
    """A kernel that packs A from rows pages apart, chunk after chunk of its batch, prefetches
    every line of the next chunk's rows while it computes on this one, and after the last
    chunk those of the next call's first (where the nest passes the next call's A): the
    hardware prefetchers do not follow rows pages apart, and the packing waited on memory
    row after row (``ik,kj->ij`` 97 x 1601 x 1000 FP64, one thread: 47-48 -> 52-53
    GFLOP/s). No prefetch leaves the operands."""
    from teir.codegen.brgemm import Prefetch

    stride_a = lda * (m if trans_a else k)
    spec = BrgemmSpec(dtype, m, 97, k, batch, trans_a, False, lda, k, m, stride_a, k * 97)
    target = HOST if avx512 else HOST.without_avx512()  # (an AVX2 machine's code runs here)
    blocking = choose_blocking(spec, target)
    if not (blocking.pack_a and blocking.chunk < batch):  # (they do on Zen 4, both widths)
        pytest.skip(f"this target's kernel packs no chunks of A here: {blocking}")
    for prefetch, shifts in itertools.product((None, Prefetch(True, False)), ((0, 8), (48, 0))):
        recorded, ranges = _prefetched_addresses(spec, prefetch, shifts, target)
        lines = {address // 64 for address in recorded}
        for address in recorded:
            assert any(low <= address < high for low, high in ranges.values()), hex(address)
        # every chunk but the first was prefetched before it was packed
        later = _a_lines(spec, ranges["A"][0], range(blocking.chunk, batch))
        assert later <= lines, f"{len(later - lines)} of {len(later)} lines not prefetched"
        next_first = _a_lines(spec, ranges["next A"][0], range(blocking.chunk))
        if prefetch is None:
            assert not any(
                ranges["next A"][0] <= address < ranges["next A"][1] for address in recorded
            )
        else:
            assert next_first <= lines, f"{len(next_first - lines)} of {len(next_first)}"
