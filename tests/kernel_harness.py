"""Test harness for kernels: bulk compilation, canary-guarded buffers, NumPy expectations."""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass

import numpy as np

from teir.codegen.brgemm import Blocking, brgemm_function
from teir.codegen.irtext import Module
from teir.codegen.specs import BrgemmSpec, UnaryOp, UnarySpec
from teir.codegen.target import Target
from teir.codegen.unary import unary_function
from teir.kernels import jit

PAD = 24  # canary elements before and after every buffer
_names = itertools.count()


def compile_many(
    specs: list,
    target: Target,
    blockings: list | None = None,
    lanes: int | None = None,
    streamed: bool = False,
) -> list:
    """Compile all kernels in one module (unary ones ``lanes`` wide where given, else as
    the generator chooses, and as tiles of a loop nest where ``streamed``); returns a ctypes
    function per spec."""
    module = Module()
    prefix = f"harness{next(_names)}_"
    names = []
    for index, spec in enumerate(specs):
        name = f"{prefix}{index}"
        names.append(name)
        if isinstance(spec, BrgemmSpec):
            blocking = blockings[index] if blockings else None
            brgemm_function(spec, target, module, name, blocking=blocking)
        else:
            unary_function(spec, target, module, name, lanes=lanes, streamed=streamed)
    addresses = jit.load_object(jit.compile_object(module.text(), target), names)
    functions = []
    for spec, name in zip(specs, names):
        scaled = isinstance(spec, UnarySpec) and spec.scale is not None
        joined = isinstance(spec, UnarySpec) and spec.joined
        pointers = 3 if isinstance(spec, BrgemmSpec) or scaled or joined else 2
        arguments = [ctypes.c_void_p] * pointers + ([ctypes.c_int64] if joined else [])
        signature = ctypes.CFUNCTYPE(None, *arguments)
        functions.append(signature(addresses[name]))
    return functions


@dataclass
class Guarded:
    """A flat buffer of ``extent`` elements surrounded by canaries; ``gaps`` marks elements
    inside the extent that the kernel must neither read into results nor write."""

    full: np.ndarray
    extent: int

    @property
    def data(self) -> np.ndarray:
        return self.full[PAD : PAD + self.extent]

    @property
    def address(self) -> int:
        return self.full.ctypes.data + PAD * self.full.itemsize


def guarded(
    values: np.ndarray, used: np.ndarray, canary: float, shift: int | None = None
) -> Guarded:
    """A guarded buffer holding ``values`` where ``used`` and ``canary`` elsewhere; with
    ``shift``, its data start ``shift`` elements past a 64-byte boundary."""
    full = np.full(values.size + 2 * PAD, canary, dtype=values.dtype)
    if shift is not None:
        room = np.full(full.size + 64, canary, dtype=values.dtype)
        start = ((-(room.ctypes.data + PAD * room.itemsize)) % 64) // room.itemsize + shift
        full = room[start : start + full.size]
    inner = full[PAD : PAD + values.size]
    inner[used] = values[used]
    return Guarded(full, values.size)


def matrix_mask(extent: int, rows: int, cols: int, ld: int, offset: int = 0) -> np.ndarray:
    mask = np.zeros(extent, dtype=bool)
    for c in range(cols):
        start = offset + c * ld
        mask[start : start + rows] = True
    return mask


def view(
    buffer: np.ndarray, offset: int, rows: int, cols: int, row_stride: int, col_stride: int
) -> np.ndarray:
    """A rows x cols matrix at ``offset`` with the given element strides."""
    size = buffer.itemsize
    return np.lib.stride_tricks.as_strided(
        buffer[offset:],
        shape=(rows, cols),
        strides=(row_stride * size, col_stride * size),
        writeable=False,
    )


def run_brgemm(spec: BrgemmSpec, function, seed: int, c_shift: int | None = None) -> None:
    """Run ``function`` (compiled for ``spec``) on canary-guarded buffers and check it (with C
    ``c_shift`` elements past a 64-byte boundary where given)."""
    dtype = np.float32 if spec.dtype == "f32" else np.float64
    rng = np.random.default_rng(seed)
    ea, eb, ec = spec.extent_a(), spec.extent_b(), spec.extent_c()
    used_a = np.zeros(ea, dtype=bool)
    used_b = np.zeros(eb, dtype=bool)
    for i in range(spec.batch):
        rows_a, cols_a = (spec.k, spec.m) if spec.trans_a else (spec.m, spec.k)
        used_a |= matrix_mask(ea, rows_a, cols_a, spec.lda, i * spec.stride_a)
        rows_b, cols_b = (spec.n, spec.k) if spec.trans_b else (spec.k, spec.n)
        used_b |= matrix_mask(eb, rows_b, cols_b, spec.ldb, i * spec.stride_b)
    used_c = matrix_mask(ec, spec.m, spec.n, spec.ldc)
    # NaN canaries in A and B poison any result they are read into; C's canaries must survive.
    a = guarded(rng.uniform(-1, 1, ea).astype(dtype), used_a, np.nan)
    b = guarded(rng.uniform(-1, 1, eb).astype(dtype), used_b, np.nan)
    c = guarded(rng.uniform(-1, 1, ec).astype(dtype), used_c, 7.25, c_shift)
    before = c.full.copy()
    function(a.address, b.address, c.address)

    expected = (
        np.zeros((spec.m, spec.n))
        if spec.beta == 0
        else view(before[PAD:], 0, spec.m, spec.n, 1, spec.ldc).astype(np.float64)
    )
    scale = np.abs(expected)
    for i in range(spec.batch):
        if spec.trans_a:
            ai = view(a.data, i * spec.stride_a, spec.m, spec.k, spec.lda, 1)
        else:
            ai = view(a.data, i * spec.stride_a, spec.m, spec.k, 1, spec.lda)
        if spec.trans_b:
            bi = view(b.data, i * spec.stride_b, spec.k, spec.n, spec.ldb, 1)
        else:
            bi = view(b.data, i * spec.stride_b, spec.k, spec.n, 1, spec.ldb)
        expected = expected + ai.astype(np.float64) @ bi.astype(np.float64)
        scale = scale + np.abs(ai.astype(np.float64)) @ np.abs(bi.astype(np.float64))
    got = view(c.data, 0, spec.m, spec.n, 1, spec.ldc).astype(np.float64)
    eps = float(np.finfo(dtype).eps)
    allowed = 2 * eps * (spec.k * spec.batch + 2) * scale
    bad = ~(np.abs(got - expected) <= allowed)
    assert not bad.any(), (
        f"{spec}: {int(bad.sum())} wrong elements, first at {np.argwhere(bad)[0]}: "
        f"got {got[tuple(np.argwhere(bad)[0])]}, expected {expected[tuple(np.argwhere(bad)[0])]}"
    )
    outside = ~np.concatenate([np.zeros(PAD, bool), used_c, np.zeros(PAD, bool)])
    assert np.array_equal(c.full[outside], before[outside]), f"{spec}: wrote outside the tile"


def run_unary(
    spec: UnarySpec, function, seed: int, shifts: tuple[int | None, int | None] = (None, None)
) -> None:
    """Run a unary kernel on guarded buffers (A and B ``shifts`` elements past a 64-byte
    boundary where given) and check it."""
    dtype = np.float32 if spec.dtype == "f32" else np.float64
    rng = np.random.default_rng(seed)
    eb = spec.extent_b()
    used_b = matrix_mask(eb, spec.m, spec.n, spec.ldb)
    b = guarded(rng.uniform(-1, 1, eb).astype(dtype), used_b, 7.25, shifts[1])
    before = b.full.copy()
    if spec.reads_a and spec.trans_a:
        # A's rows where spec.a_row puts them (in runs or lda apart), each n long
        ea = spec.extent_a()
        at = np.array([spec.a_row(r) for r in range(spec.m)])[:, None] + np.arange(spec.n)
        used_a = np.zeros(ea, dtype=bool)
        used_a[at.ravel()] = True
        a = guarded(rng.uniform(-1, 1, ea).astype(dtype), used_a, np.nan, shifts[0])
        source = a.data[at]
        if spec.scale is None:
            function(a.address, b.address)
        else:  # B := op(A^T * S), S's element (i, j) at i * scale[0] + j * scale[1]
            es = spec.extent_s()
            st = spec.scale[0] * np.arange(spec.m)[:, None] + spec.scale[1] * np.arange(spec.n)
            used_s = np.zeros(es, dtype=bool)
            used_s[st.ravel()] = True
            s = guarded(rng.uniform(-2, 2, es).astype(dtype), used_s, np.nan, shifts[1])
            source = source * s.data[st]
            function(a.address, b.address, s.address)
    elif spec.reads_a:
        ea = spec.extent_a()
        a = guarded(
            rng.uniform(-1, 1, ea).astype(dtype),
            matrix_mask(ea, spec.m, spec.n, spec.lda),
            np.nan,
            shifts[0],
        )
        source = view(a.data, 0, spec.m, spec.n, 1, spec.lda)
        function(a.address, b.address)
    else:
        source = view(before[PAD:], 0, spec.m, spec.n, 1, spec.ldb)
        function(b.address, b.address)
    if spec.op is UnaryOp.ZERO:
        expected = np.zeros((spec.m, spec.n), dtype)
    elif spec.op is UnaryOp.RELU:
        expected = np.maximum(source, 0)
    else:
        expected = np.array(source)
    got = view(b.data, 0, spec.m, spec.n, 1, spec.ldb)
    assert np.array_equal(got, expected), f"{spec}: wrong values"
    outside = ~np.concatenate([np.zeros(PAD, bool), used_b, np.zeros(PAD, bool)])
    assert np.array_equal(b.full[outside], before[outside]), f"{spec}: wrote outside B"


__all__ = ["Blocking", "compile_many", "run_brgemm", "run_unary"]
