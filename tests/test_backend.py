"""The native backend against the reference executor, threads, argument checks and fuzzing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import teir
from helpers import EXAMPLES, operands
from naive import assert_matches_naive, naive_execute
from strategies import broken_configs, configs
from teir import reference
from test_reference import VARIANTS, trus_config

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.json"))


def run_both(config: teir.Config, threads: int, seed: int = 0):
    """(native result, reference result, initial out) for random operands."""
    in0, in1, out = operands(config, seed)
    expected = out.copy()
    reference.execute(config, in0, in1, expected)
    got = out.copy()
    teir.compile(config, threads=threads)(in0, in1, got)
    return got, expected, out


def assert_close(config: teir.Config, got, expected, terms: int = 1) -> None:
    eps = float(np.finfo(config.dtype).eps)
    np.testing.assert_allclose(
        got, expected, rtol=8 * eps * (terms + 2), atol=8 * eps * (terms + 2)
    )


def k_terms(config: teir.Config) -> int:
    return int(
        np.prod([n for n, t in zip(config.dim_sizes, config.dim_types) if t is teir.DimType.K])
    )


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_examples_equal_reference(path, threads):
    config = teir.load(path)
    got, expected, _ = run_both(config, threads)
    assert_close(config, got, expected, k_terms(config))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("variant", "first", "last", "shared"), VARIANTS)
def test_trus_family_equals_reference(variant, first, last, shared, threads):
    sizes = (3, 7, 5, 4, 3, 7)
    config = trus_config(*sizes, variant, first, last, shared)
    got, expected, _ = run_both(config, threads)
    assert_close(config, got, expected, k_terms(config))


@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
@pytest.mark.parametrize("threads", [1, 2])
def test_lab_configurations_with_shared_axes(dtype, threads):
    for name in ("lab1_gemm", "lab2_brgemm", "lab3_zero_brgemm_relu"):
        config = teir.load(EXAMPLES / f"{name}.json")
        config = config.replace(
            data_type=dtype, exec_types=["shared", "shared", *config.exec_types[2:]]
        )
        got, expected, _ = run_both(config, threads)
        assert_close(config, got, expected, k_terms(config))
        op = teir.compile(config, threads=threads)
        assert len(op.slices) == threads


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.sampled_from([1, 2, 3]), st.integers(0, 2**31))
def test_generated_configs_equal_einsum(data, threads, seed):
    config = teir.Config.from_dict(data)
    in0, in1, out = operands(config, seed)
    before = out.copy()
    expected = reference.dense_result(config, in0, in1, out)
    teir.compile(config, threads=threads)(in0, in1, out)
    comparison = reference.compare(config, before, out, expected)
    assert comparison.ok, f"{comparison.message}\n{config!r}"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    configs(max_dims=5, max_size=4, aliasing=True), st.sampled_from([1, 3]), st.integers(0, 2**31)
)
def test_generated_aliasing_configs_equal_naive_interpreter(data, threads, seed):
    config = teir.Config.from_dict(data)
    in0, in1, out = operands(config, seed)
    naive = naive_execute(
        data, [] if in0 is None else list(in0), [] if in1 is None else list(in1), list(out)
    )
    teir.compile(config, threads=threads)(in0, in1, out)
    assert_matches_naive(data, out, naive, config.dtype)


PRIMES = st.sampled_from([1, 1, 2, 3, 5, 7, 11, 13, 17, 19])


@st.composite
def prime_sized(draw):
    data = draw(configs(max_dims=4))
    data["dim_sizes"] = [draw(PRIMES) for _ in data["dim_sizes"]]
    # Recompute dense strides for the new sizes: a fresh layout for each tensor.
    for tensor, name in enumerate(("strides_in0", "strides_in1", "strides_out")):
        members = [
            a
            for a, t in enumerate(data["dim_types"])
            if {"C": (1, 1, 1), "M": (1, 0, 1), "N": (0, 1, 1), "K": (1, 1, 0)}[t.upper()][tensor]
        ]
        order = draw(st.permutations(members))
        strides = [0] * len(data["dim_sizes"])
        step = 1
        for a in reversed(order):
            strides[a] = step
            step *= data["dim_sizes"][a]
        data[name] = strides
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prime_sized(), st.sampled_from([1, 2]))
def test_sizes_one_and_primes(data, threads):
    config = teir.Config.from_dict(data)
    got, expected, _ = run_both(config, threads)
    assert_close(config, got, expected, k_terms(config))


def test_shared_k_axis_runs_sequentially_and_is_correct():
    config = teir.Config(
        data_type="FP64",
        prim_first="Zero",
        prim_main="GEMM",
        prim_last="ReLU",
        dim_types=["K", "M", "N", "K"],
        exec_types=["shared", "prim", "prim", "prim"],
        dim_sizes=[6, 8, 5, 3],
        strides_in0=[24, 1, 0, 8],
        strides_in1=[15, 0, 3, 1],
        strides_out=[0, 1, 8, 0],
    )
    op = teir.compile(config, threads=3)
    assert not any(loop.parallel for loop in op.nest.loops)
    assert "shared K axes" in op.explain()
    got, expected, _ = run_both(config, 3)
    assert_close(config, got, expected, 18)


def test_aliasing_output_with_shared_axis_runs_sequentially():
    config = teir.Config(
        data_type="FP64",
        prim_main="GEMM",
        dim_types=["M", "M", "N", "K"],
        exec_types=["shared", "prim", "prim", "prim"],
        dim_sizes=[5, 4, 3, 2],
        strides_in0=[8, 1, 0, 4],
        strides_in1=[0, 0, 2, 1],
        strides_out=[0, 1, 4, 0],
    )
    op = teir.compile(config, threads=2)
    assert not any(loop.parallel for loop in op.nest.loops)
    got, expected, _ = run_both(config, 2)
    assert_close(config, got, expected, 10)


def test_generic_fallback_for_layouts_without_unit_strides():
    config = teir.Config(
        data_type="FP32",
        prim_first="ReLU",
        prim_main="GEMM",
        prim_last="ReLU",
        dim_types=["M", "N", "K"],
        exec_types=["prim"] * 3,
        dim_sizes=[3, 4, 5],
        strides_in0=[2, 0, 7],
        strides_in1=[0, 11, 2],
        strides_out=[3, 9, 0],
    )
    op = teir.compile(config, threads=1)
    assert "generic scalar primitive" in op.explain()
    got, expected, _ = run_both(config, 1)
    assert_close(config, got, expected, 5)


def test_transposed_copy_and_broadcast():
    transpose = teir.load(EXAMPLES / "transpose_3x4.json")
    assert "unary_copy" in teir.compile(transpose).explain()
    broadcast = teir.Config(
        data_type="FP32",
        prim_main="Copy",
        dim_types=["C", "C"],
        exec_types=["seq", "prim"],
        dim_sizes=[3, 4],
        strides_in0=[0, 1],
        strides_in1=[0, 0],
        strides_out=[4, 1],
    )
    got, expected, _ = run_both(broadcast, 1)
    np.testing.assert_array_equal(got, expected)


def test_prim_main_none_with_first_and_last():
    config = teir.Config(
        data_type="FP64",
        prim_first="ReLU",
        prim_main="None",
        prim_last="None",
        dim_types=["M", "N", "K"],
        exec_types=["seq", "prim", "seq"],
        dim_sizes=[3, 4, 2],
        strides_in0=[0, 0, 0],
        strides_in1=[0, 0, 0],
        strides_out=[4, 1, 0],
    )
    out = np.linspace(-1, 1, 12)
    teir.compile(config)(None, None, out)
    np.testing.assert_array_equal(out, np.maximum(np.linspace(-1, 1, 12), 0))


def test_same_operation_from_eight_threads():
    config = teir.load(EXAMPLES / "lab3_zero_brgemm_relu.json").replace(
        exec_types=["shared", "seq", "prim", "prim", "prim", "prim"]
    )
    op = teir.compile(config, threads=2)
    in0, in1, out = operands(config)
    expected = out.copy()
    reference.execute(config, in0, in1, expected)
    outputs = [out.copy() for _ in range(8)]
    errors = []

    def work(target):
        try:
            for _ in range(3):
                op(in0, in1, target)
        except Exception as error:
            errors.append(error)

    workers = [threading.Thread(target=work, args=(o,)) for o in outputs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    for result in outputs:
        assert_close(config, result, expected, 256)


def test_compiled_operations_are_cached():
    config = teir.load(EXAMPLES / "lab1_gemm.json")
    assert teir.compile(config, threads=1) is teir.compile(config, threads=1)
    assert teir.compile(config, threads=2) is not teir.compile(config, threads=1)


def test_threads_from_environment(monkeypatch):
    config = teir.load(EXAMPLES / "lab1_gemm.json").replace(
        exec_types=["shared", "shared", "seq", "prim", "prim", "prim"]
    )
    monkeypatch.setenv("TEIR_NUM_THREADS", "3")
    assert teir.compile(config).threads == 3
    monkeypatch.setenv("TEIR_NUM_THREADS", "zero")
    with pytest.raises(teir.TeirError, match="TEIR_NUM_THREADS"):
        teir.compile(config)
    with pytest.raises(teir.TeirError, match="threads"):
        teir.compile(config, threads=0)
    with pytest.raises(teir.TeirError, match="Config"):
        teir.compile({"prim_main": "GEMM"})


def test_small_work_runs_on_the_calling_thread():
    config = teir.Config(
        data_type="FP32",
        prim_main="GEMM",
        dim_types=["M", "M", "N", "K"],
        exec_types=["shared", "prim", "prim", "prim"],
        dim_sizes=[4, 2, 2, 2],
        strides_in0=[4, 1, 0, 2],
        strides_in1=[0, 0, 2, 1],
        strides_out=[4, 1, 2, 0],
    )
    op = teir.compile(config, threads=2)
    assert len(op.slices) == 1
    assert "too little work" in op.explain()


@pytest.mark.parametrize(("threads", "blocks", "tile"), [(1, 4, 16), (2, 8, 64)])
def test_repeated_calls_run_natively_and_still_check_everything(threads, blocks, tile):
    """After a first call whose arguments pass the checks, calls with arrays of the same
    layouts are checked and run in one native call (``Operation._checked``, on this thread
    or handing slices to the pool); arrays of other layouts, read-only or overlapping
    outputs, wrong dtypes and missing inputs still go through the Python checks and raise
    as before, and results stay right."""
    rows = blocks * tile
    config = teir.Config(
        data_type="FP64",
        prim_first="Zero",
        prim_main="GEMM",
        dim_types=["M", "M", "N", "K"],
        exec_types=["shared", "prim", "prim", "prim"],
        dim_sizes=[blocks, tile, tile, tile],
        strides_in0=[tile, 1, 0, rows],
        strides_in1=[0, 0, tile, 1],
        strides_out=[tile, 1, rows, 0],
    )
    op = teir.compile(config, threads=threads)
    assert len(op.slices) == threads
    rng = np.random.default_rng(5)
    size_a, size_b = rows * tile, tile * tile

    def expected(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        result = np.zeros(size_a)
        teir.reference.execute(config, a, b, result)
        return result

    a, b = rng.standard_normal(size_a), rng.standard_normal(size_b)
    out = np.empty(size_a)
    op(a, b, out)
    assert op._checked is not None
    for _ in range(3):  # new values in the same arrays, and new arrays of the same layouts
        a[:] = rng.standard_normal(size_a)
        op(a, b, out)
        np.testing.assert_allclose(out, expected(a, b), rtol=1e-12, atol=1e-12)
        a, b, out = a.copy(), rng.standard_normal(size_b), np.empty(size_a)
        op(a, b, out)
        np.testing.assert_allclose(out, expected(a, b), rtol=1e-12, atol=1e-12)
    longer = np.zeros(2 * size_a)  # another layout: the Python path, whose checks it passes
    op(a, b, longer)
    np.testing.assert_allclose(longer[:size_a], expected(a, b), rtol=1e-12, atol=1e-12)
    frozen = np.empty(size_a)
    frozen.setflags(write=False)
    with pytest.raises(teir.ExecutionError, match="read-only"):
        op(a, b, frozen)
    with pytest.raises(teir.ExecutionError, match="overlaps"):
        op(a, b, a)
    with pytest.raises(teir.ExecutionError, match="dtype"):
        op(a.astype(np.float32), b, out)
    with pytest.raises(teir.ExecutionError, match="None"):
        op(a, None, out)


def test_explain_reports_kernels_and_split():
    config = teir.load(EXAMPLES / "lab2_brgemm.json").replace(
        exec_types=["shared", "shared", "prim", "prim", "prim", "prim"]
    )
    text = teir.compile(config, threads=2).explain("lab2")
    assert "brgemm_f32_32x32x32_b8" in text and "register block" in text
    assert "2 slices of the parallel index space (size 1024): [0, 512), [512, 1024)" in text
    assert "loop axis 0 (M, size 32): parallel" in text


class TestArguments:
    config = teir.load(EXAMPLES / "lab1_gemm.json")

    def call(self, **given):
        in0, in1, out = operands(self.config)
        arguments = {"in0": in0, "in1": in1, "out": out, **given}
        teir.compile(self.config, threads=1)(arguments["in0"], arguments["in1"], arguments["out"])

    @pytest.mark.parametrize(
        ("given", "match"),
        [
            ({"in0": None}, r"in0 is needed \(262144 elements of float32\) but None"),
            ({"in1": np.zeros(10, np.float32)}, "in1 holds 10 elements but 262144"),
            ({"out": np.zeros(1048576)}, "out has dtype float64, but float32"),
            ({"in0": np.zeros(2 * 262144, np.float32)[::2]}, "contiguous"),
            ({"in0": [0.0] * 262144}, "NumPy array or a CPU tensor"),
            ({"out": "out"}, "NumPy array or a CPU tensor"),
        ],
    )
    def test_bad_arguments(self, given, match):
        with pytest.raises(teir.ExecutionError, match=match):
            self.call(**given)

    def test_read_only_output(self):
        out = np.zeros(1048576, np.float32)
        out.flags.writeable = False
        with pytest.raises(teir.ExecutionError, match="read-only"):
            self.call(out=out)

    def test_overlap(self):
        buffer = np.zeros(2 * 1048576, np.float32)
        with pytest.raises(teir.ExecutionError, match="out overlaps in1"):
            self.call(in1=buffer[:262144], out=buffer[1000 : 1000 + 1048576])

    def test_wrong_count_and_names(self):
        op = teir.compile(self.config, threads=1)
        in0, in1, out = operands(self.config)
        with pytest.raises(teir.ExecutionError, match="expected 3 tensors"):
            op(in0, out)
        with pytest.raises(teir.ExecutionError, match="unknown tensor names"):
            op(in0, in1, output=out)
        with pytest.raises(teir.ExecutionError, match="given twice"):
            op(in0, in1, out, out=out)
        op(in0, in1, out=out)

    def test_non_cpu_dlpack_object(self):
        class DeviceTensor:
            def __dlpack__(self, **_):
                raise AssertionError("must not be exported")

            def __dlpack_device__(self):
                return (2, 0)

        with pytest.raises(teir.ExecutionError, match="non-CPU device"):
            self.call(in0=DeviceTensor())

    def test_torch_cpu_tensors_zero_copy(self):
        torch = pytest.importorskip("torch")
        in0, in1, out = operands(self.config)
        expected = out.copy()
        reference.execute(self.config, in0, in1, expected)
        result = torch.from_numpy(out.copy())
        teir.compile(self.config, threads=1)(torch.from_numpy(in0), torch.from_numpy(in1), result)
        assert_close(self.config, result.numpy(), expected, 256)
        with pytest.raises(teir.ExecutionError, match="DLPack"):
            self.call(in0=torch.from_numpy(in0).requires_grad_(True))

    def test_nothing_is_written_on_error(self):
        in0, _, out = operands(self.config)
        before = out.copy()
        with pytest.raises(teir.ExecutionError):
            teir.compile(self.config, threads=1)(in0, np.zeros(3, np.float32), out)
        np.testing.assert_array_equal(out, before)


def _random_array(draw, dtype, size):
    kind = draw(st.sampled_from(["ok", "ok", "ok", "short", "dtype", "strided", "none", "list"]))
    if kind == "short":
        return np.zeros(max(0, size - draw(st.integers(1, 3))), dtype)
    if kind == "dtype":
        return np.zeros(size, np.float64 if dtype == np.float32 else np.float32)
    if kind == "strided":
        return np.zeros(2 * size + 2, dtype)[::2]
    if kind == "none":
        return None
    if kind == "list":
        return [0.0] * size
    return np.random.default_rng(size).uniform(-1, 1, size + draw(st.integers(0, 3))).astype(dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(configs(max_dims=4), broken_configs().map(lambda case: case[0])), st.data())
def test_fuzz_configs_and_arrays_never_crash(data, draw):
    try:
        config = teir.Config.from_dict(data)
    except teir.ValidationError:
        return
    dtype = config.dtype
    arrays = [_random_array(draw.draw, dtype, max(config.extent(t), 1)) for t in teir.Tensor]
    try:
        op = teir.compile(config, threads=draw.draw(st.sampled_from([1, 2])))
        before = None if not isinstance(arrays[2], np.ndarray) else arrays[2].copy()
        op(*arrays)
    except teir.TeirError:
        return
    # It ran: then it must equal the reference on the same arrays.
    expected = before
    reference.execute(config, arrays[0], arrays[1], expected)
    assert_close(config, arrays[2], expected, k_terms(config) * 4)


def _zero_gemm(m: int, n: int, k: int) -> dict:
    """An FP32 GEMM with a first Zero, all axes sequential: A M-major, B K-major, out
    M-major."""
    return {
        "data_type": "FP32",
        "prim_first": "Zero",
        "prim_main": "GEMM",
        "prim_last": "None",
        "dim_types": ["M", "N", "K"],
        "exec_types": ["seq", "seq", "seq"],
        "dim_sizes": [m, n, k],
        "strides_in0": [1, 0, m],
        "strides_in1": [0, k, 1],
        "strides_out": [1, m, 0],
    }


def test_outputs_far_larger_than_the_caches_are_streamed(monkeypatch):
    """A kernel writing each output tile once, into an output of more than twice the
    last-level cache, stores it around the caches; not when a last ReLU reads it back."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 2048, "L3": 4096})
    config = _zero_gemm(64, 64, 32)
    nest = lower(teir.optimize(config, threads=1))
    assert nest.main_zero is not None and nest.main_zero.spec.stream_c
    relu = lower(teir.optimize({**config, "prim_last": "ReLU"}, threads=1))
    assert relu.main_zero is None or not relu.main_zero.spec.stream_c
    a = np.random.default_rng(0).standard_normal(64 * 32).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(32 * 64).astype(np.float32)
    out = teir.buffers.aligned_empty((64 * 64,), np.float32)
    teir.compile(teir.optimize(config, threads=1), threads=1)(a, b, out)
    expected = a.reshape(32, 64).T @ b.reshape(64, 32).T
    np.testing.assert_allclose(out.reshape(64, 64).T, expected, rtol=1e-5, atol=1e-5)


def test_resident_outputs_beyond_the_l3_share_are_streamed_in_longer_rows(monkeypatch):
    """An output in memory reused call after call (``resident_output``) larger than twice
    this process's share of the last level is stored around the caches, its tiles' columns
    longer; an output allocated per call (the default) is not: its zeroed pages arrive
    through the caches."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    monkeypatch.setattr(tiles, "l3_share", lambda: 16 << 10)
    config = _zero_gemm(1024, 48, 32)

    def tile_rows(optimized: teir.Config) -> int:
        s = optimized.schedule
        return next(s.dim_sizes[a] for a in s.prim_axes if s.dim_types[a] is teir.DimType.M)

    fresh = teir.optimize(config, threads=1)
    resident = teir.optimize(config, threads=1, resident_output=True)
    assert tile_rows(resident) > tile_rows(fresh)
    fresh_nest = lower(fresh)
    assert fresh_nest.main_zero is not None and not fresh_nest.main_zero.spec.stream_c
    nest = lower(resident, resident_output=True)
    assert nest.main_zero is not None and nest.main_zero.spec.stream_c
    rng = np.random.default_rng(2)
    a = rng.standard_normal(1024 * 32).astype(np.float32)
    b = rng.standard_normal(32 * 48).astype(np.float32)
    expected = a.reshape(32, 1024).T @ b.reshape(48, 32).T
    for optimized, flag in ((fresh, False), (resident, True)):
        out = teir.buffers.aligned_empty((1024 * 48,), np.float32)
        teir.compile(optimized, threads=1, resident_output=flag)(a, b, out)
        np.testing.assert_allclose(out.reshape(48, 1024).T, expected, rtol=1e-5, atol=1e-5)


def test_resident_outer_products_stay_in_cache_up_to_more_shares(monkeypatch):
    """A resident output of a product summing nothing (K 1) is stored normally up to
    ``PRODUCT_RESIDENT_SHARES`` L3 shares, where the last level keeps it from one call to
    the next; summed over K, the same output streams beyond two shares."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    out_bytes = 1024 * 48 * 4
    share = out_bytes // 3  # beyond two shares, within four
    monkeypatch.setattr(tiles, "l3_share", lambda: share)

    def stream_c(k: int, resident: bool) -> bool:
        config = teir.optimize(_zero_gemm(1024, 48, k), threads=1, resident_output=resident)
        nest = lower(config, resident_output=resident)
        assert nest.main_zero is not None
        return nest.main_zero.spec.stream_c

    assert not stream_c(1, True)
    assert stream_c(2, True)
    assert not stream_c(1, False) and not stream_c(2, False)  # fresh memory: never
    monkeypatch.setattr(tiles, "l3_share", lambda: out_bytes // 5)
    assert stream_c(1, True)


def test_aligned_empty():
    for shape in ((3, 5), (0,), (7,)):
        for dtype in (np.float32, np.float64):
            array = teir.buffers.aligned_empty(shape, dtype)
            assert array.shape == shape and array.dtype == dtype
            assert array.flags.c_contiguous
            assert array.size == 0 or array.ctypes.data % 64 == 0


@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("m_loop", [1, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_reused_kernel_tiles_are_packed_once(dtype, transposed, m_loop, threads):
    """A kernel whose A columns are pages apart (or transposed), inside loops that do not move
    A, reads A from a buffer packed once before those loops (and prefetches B's next tile);
    M tails, batches, both layouts and a shared loop (each thread packs its own) give the
    reference result."""
    from teir.codegen.brgemm import Prefetch
    from teir.codegen.nest import prefetch_for
    from teir.lower.nest import lower

    ld = 1030  # columns 4 KiB (FP32) and 8 KiB (FP64) apart
    m, n, k, batch, n_loop = 37, 40, 24, 3, 3
    in0_strides = [37 * ld, 0, 24, ld, 0, 1] if transposed else [40, 0, k * ld, 1, 0, ld]
    config = teir.Config.from_dict(
        {
            "data_type": dtype,
            "prim_first": "Zero",
            "prim_main": "BRGEMM",
            "prim_last": "None",
            "dim_types": ["M", "N", "K", "M", "N", "K"],
            "exec_types": ["seq", "shared", "prim", "prim", "prim", "prim"],
            "dim_sizes": [m_loop, n_loop, batch, m, n, k],
            "strides_in0": in0_strides,
            "strides_in1": [0, n * batch * k, k, 0, batch * k, 1],
            "strides_out": [m, n * 80, 0, 1, 80, 0],
        }
    )
    nest = lower(config)
    assert nest.panel is not None, nest.notes
    assert nest.panel.depth == (0 if m_loop == 1 else 1)
    assert nest.panel.reuse == n_loop
    # the kernel reads A from the panel; only in1's next tile (B) is worth prefetching
    role = "main_zero" if nest.main_zero is not None else "main"
    assert prefetch_for(nest, role) == Prefetch(a=False, b=True)
    assert nest.main is not None and not nest.main.spec.trans_a
    assert "packed into a contiguous" in teir.compile(config, threads=threads).explain()
    got, expected, _ = run_both(config, threads)
    assert_close(config, got, expected, k_terms(config))


def _nest_ir(config: teir.Config) -> str:
    from teir.codegen.irtext import Module
    from teir.codegen.nest import nest_function
    from teir.codegen.target import Target
    from teir.lower.nest import lower

    module = Module()
    nest_function(lower(config), Target.host(), module, "nest")
    return module.text()


def _batched_gemm(dtype: str, batch: int, m: int, n: int, k: int, **extra) -> dict:
    """``batch`` column-major GEMMs, one after the other in memory, the batch loop outside."""
    return {
        "data_type": dtype,
        "prim_first": "Zero",
        "prim_main": "GEMM",
        "prim_last": "None",
        "dim_types": ["C", "M", "N", "K"],
        "exec_types": [extra.get("batch_exec", "shared"), "prim", "prim", "prim"],
        "dim_sizes": [batch, m, n, k],
        "strides_in0": [m * k, 1, 0, m],
        "strides_in1": [k * n, 0, k, 1],
        "strides_out": [m * n, 1, m, 0],
    }


@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
@pytest.mark.parametrize("batch_exec", ["seq", "shared"])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_in_a_batch_loop_prefetch_the_next_tiles(dtype, batch_exec, threads):
    """A GEMM called in a loop over batch elements prefetches the next element's A and B
    while it computes (FP64 64 x 128³ from memory: 80 -> 111 GFLOP/s); tails, thread slices
    (each prefetches within its own) and the last element give the reference result."""
    config = teir.Config.from_dict(_batched_gemm(dtype, 7, 70, 67, 24, batch_exec=batch_exec))
    assert _prefetch_blocks(_nest_ir(config))
    dtype_np = np.float32 if dtype == "FP32" else np.float64
    rng = np.random.default_rng(3)
    a = rng.standard_normal(7 * 70 * 24).astype(dtype_np)
    b = rng.standard_normal(7 * 24 * 67).astype(dtype_np)
    out = np.full(7 * 70 * 67, np.nan, dtype_np)
    operation = teir.compile(config, threads=threads)
    assert "prefetches the next iteration's A and B" in operation.explain()
    operation(a, b, out)
    expected = np.full_like(out, np.nan)
    reference.execute(config, a, b, expected)
    assert_close(config, out, expected, k_terms(config) * 4)


def _prefetch_blocks(ir: str) -> list[str]:
    """The basic block (its label's name before the number) of every prefetch for reading
    in ``ir`` (those of the next tiles; C's lines, prefetched for writing, are another
    test's)."""
    blocks, label = [], ""
    for line in ir.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            label = line[:-1].rstrip("0123456789")
        elif "@llvm.prefetch" in line and "call" in line and "i32 0, i32" in line:
            blocks.append(label)
    return blocks


@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
@pytest.mark.parametrize("k", [4, 9, 64])
def test_register_blocks_spread_their_prefetches_over_the_k_loop(dtype, k):
    """A register block whose K loop runs two unrolled rounds or more issues its share of the
    next tiles' prefetches a few per round, not as a burst before the block, where they took
    the fill buffers its own loads of A wait for (attention output 0.78 -> 0.62-0.69 ms);
    one round (K 4) keeps the burst. Every variant gives the reference result."""
    config = teir.Config.from_dict(_batched_gemm(dtype, 5, 100, 120, k))
    blocks = _prefetch_blocks(_nest_ir(config))
    assert blocks
    if k >= 8:
        assert set(blocks) == {"k.body"}
    else:
        assert "k.body" not in blocks
    dtype_np = np.float32 if dtype == "FP32" else np.float64
    rng = np.random.default_rng(k)
    a = rng.standard_normal(5 * 100 * k).astype(dtype_np)
    b = rng.standard_normal(5 * k * 120).astype(dtype_np)
    out = np.full(5 * 100 * 120, np.nan, dtype_np)
    teir.compile(config, threads=2)(a, b, out)
    expected = np.full_like(out, np.nan)
    reference.execute(config, a, b, expected)
    assert_close(config, out, expected, k_terms(config) * 4)


def test_prefetched_tiles_fill_their_extent_and_a_part_of_l2(monkeypatch):
    """Only tiles that fill most of their extent are prefetched (not the columns of a large
    matrix), no more of them than a quarter of L2 (A before B), and none for a kernel of
    fewer than 32 FMAs per line."""
    import teir.codegen.brgemm as brgemm
    from teir.codegen.brgemm import Prefetch, prefetch_lines
    from teir.codegen.specs import BrgemmSpec

    monkeypatch.setattr(brgemm, "cache_sizes", lambda: {"L1": 32768, "L2": 1 << 20, "L3": 1 << 25})
    both = Prefetch(True, True)
    dense = BrgemmSpec("f64", 128, 128, 128)  # 128 KiB each: 2048 lines
    assert prefetch_lines(dense, both) == (2048, 2048)
    assert prefetch_lines(dense, Prefetch(False, True)) == (0, 2048)
    columns = BrgemmSpec("f64", 128, 128, 128, lda=1024)  # a panel of a 1024-row matrix
    assert prefetch_lines(columns, both) == (0, 2048)
    large = BrgemmSpec("f64", 64, 256, 256)  # A 128 KiB, B 512 KiB
    assert prefetch_lines(large, both) == (2048, 0)
    short = BrgemmSpec("f64", 32, 32, 32)  # 4096 FMAs, 256 lines
    assert prefetch_lines(short, both) == (0, 0)
    assert prefetch_lines(BrgemmSpec("f64", 64, 64, 32), both) == (256, 256)


def test_chunked_kernels_beside_a_panel_prefetch_the_swept_tiles():
    """``abcd,dbef->acef``: in1's tile is packed into a panel, in0's 32 x 32 blocks of short
    columns stream past it from memory in a kernel that sweeps its batch in chunks; every
    chunk's register blocks take their share of the next in0 tile's prefetches (FP64 32^6,
    one thread: median 32-50 -> 53-55 GFLOP/s), and the result is NumPy's."""
    from conftest import pinned_machine
    from teir.codegen.brgemm import Prefetch, choose_blocking, prefetched_lines
    from teir.codegen.irtext import Module
    from teir.codegen.nest import nest_function, prefetch_for
    from teir.codegen.target import Target
    from teir.ir import Tensor

    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (2, 32, 16, 32))
    b = rng.uniform(-1, 1, (32, 32, 8, 8))
    with pinned_machine("znver4", "L1=32K,L2=1M,L3=32M,L3share=12M"):
        plan = teir.einsum_plan("abcd,dbef->acef", a, b, threads=1)
        nest = plan.regions[0].operation.nest
        kernel = nest.main_zero
        assert kernel is not None and nest.panel is not None
        assert nest.panel.tensor is Tensor.IN1 and kernel.operands[:2] == (Tensor.IN1, Tensor.IN0)
        blocking = choose_blocking(kernel.spec, Target.host())
        assert blocking.chunk < kernel.spec.batch
        prefetch = prefetch_for(nest, "main_zero")
        assert prefetch == Prefetch(a=False, b=True)
        assert prefetched_lines(kernel.spec, blocking, prefetch) == (0, 32 * 16 * 32 * 8 // 64)
        module = Module()
        nest_function(nest, Target.host(), module, "nest")
        assert _prefetch_blocks(module.text())
        assert "prefetches the next iteration's B" in plan.explain()
        np.testing.assert_allclose(
            teir.einsum("abcd,dbef->acef", a, b, threads=1),
            np.einsum("abcd,dbef->acef", a, b),
            rtol=1e-12,
            atol=1e-12,
        )


def test_a_loop_that_moves_neither_input_prefetches_nothing():
    """With the output's loop innermost over a fixed A and B (a K-less broadcast), the
    kernel has nothing new to prefetch."""
    config = _batched_gemm("FP64", 4, 16, 16, 16)
    config["strides_in0"][0] = config["strides_in1"][0] = 0
    assert not _prefetch_blocks(_nest_ir(teir.Config.from_dict(config)))


@pytest.mark.parametrize(
    ("k", "l3", "streamed"),
    [
        (32, 128 * 1024, True),  # 96 KiB moved, a third of it written
        (32, 256 * 1024, False),  # all of it fits in half the last level
        (16, 64 * 1024, False),  # 16 K steps per element: bound by memory
        (256, 64 * 1024, False),  # the output is an eighth of the traffic
    ],
)
def test_deep_contractions_past_half_the_last_level_stream_their_output(
    monkeypatch, k, l3, streamed
):
    """An output written once and summed over 32 or more K steps per element, a quarter or
    more of a traffic over half the last-level cache, is stored around the caches (FP64
    attention scores 4x8x256x256x64: 84 -> 112 GFLOP/s)."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 4096, "L3": l3})
    config = teir.Config.from_dict(_batched_gemm("FP32", 8, 32, 32, k))
    nest = lower(config)
    assert nest.main_zero is not None and nest.main_zero.spec.stream_c is streamed


@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
@pytest.mark.parametrize("offset", [0, 1, 2, 3, 4])
def test_streamed_outputs_at_any_offset_with_prefetches(monkeypatch, dtype, offset):
    """Streamed C, swept from a shifted start where the output lies off a vector boundary,
    prefetches the next batch element's tiles in each sweep; every offset gives the
    reference result."""
    import teir.lower.tiles as tiles
    from teir.lower.nest import lower

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1024, "L2": 4096, "L3": 8192})
    batch, m, n, k = 5, 70, 70, 32
    config = teir.Config.from_dict(_batched_gemm(dtype, batch, m, n, k))
    assert lower(config).main_zero.spec.stream_c
    assert _prefetch_blocks(_nest_ir(config))
    dtype_np = np.float32 if dtype == "FP32" else np.float64
    rng = np.random.default_rng(offset)
    a = rng.standard_normal(batch * m * k).astype(dtype_np)
    b = rng.standard_normal(batch * k * n).astype(dtype_np)
    size = batch * m * n
    out = teir.buffers.aligned_empty((size + 8,), dtype_np)[offset : offset + size]
    out[:] = np.nan
    teir.compile(config, threads=2)(a, b, out)
    expected = np.full_like(out, np.nan)
    reference.execute(config, a, b, expected)
    assert_close(config, out, expected, k_terms(config) * 4)
