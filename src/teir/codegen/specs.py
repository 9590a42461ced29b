"""Parameters of the kernels: everything that is baked into the generated code.

All matrices are column-major in the BLAS sense: element (i, j) of a matrix with leading
dimension ``ld`` is at ``i + j * ld``. A "transposed" operand is stored as its transpose, so
that the unit stride runs along the other index.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from teir.errors import TeirError


class KernelError(TeirError, ValueError):
    """Kernel parameters that no kernel can be generated for."""


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KernelError(f"{name} must be an integer >= 1, got {value!r}")


def _check_at_least(name: str, value: int, minimum: int, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KernelError(f"{name} must be an integer >= {minimum} ({why}), got {value!r}")


def _itemsize(dtype: str) -> int:
    if dtype not in ("f32", "f64"):
        raise KernelError(f"dtype must be 'f32' or 'f64', got {dtype!r}")
    return 4 if dtype == "f32" else 8


@dataclass(frozen=True)
class BrgemmSpec:
    """``C += sum_i A_i @ B_i`` (``C = sum ...`` with ``beta = 0``) for ``i < batch``.

    ``A_i`` is m x k at ``A + i * stride_a``: column-major (element (m, k) at ``m + k * lda``)
    or, with ``trans_a``, stored transposed (at ``m * lda + k``: unit stride on K).
    ``B_i`` is k x n at ``B + i * stride_b``: column-major (``k + n * ldb``, unit stride on K)
    or, with ``trans_b``, stored transposed (``k * ldb + n``: unit stride on N).
    ``C`` is m x n column-major with leading dimension ``ldc``. GEMM is ``batch = 1``.
    """

    dtype: str
    m: int
    n: int
    k: int
    batch: int = 1
    trans_a: bool = False
    trans_b: bool = False
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    stride_a: int = 0
    stride_b: int = 0
    beta: int = 1
    # C is written once into an output far larger than the caches: store it around them
    # (non-temporal stores, where C is vector-aligned at run time)
    stream_c: bool = False
    # ... and that output outgrows the last level itself, so that C's lines stored normally
    # would be read from memory first: worth shifting a misaligned C's sweep onto vector
    # boundaries even where the shift's extra vector per column is a larger share
    c_beyond_caches: bool = False

    def __post_init__(self) -> None:
        _itemsize(self.dtype)
        _check_positive(m=self.m, n=self.n, k=self.k, batch=self.batch)
        # Leading dimensions default to the tight extent.
        rows_a = self.k if self.trans_a else self.m
        rows_b = self.n if self.trans_b else self.k
        for name, minimum in (("lda", rows_a), ("ldb", rows_b), ("ldc", self.m)):
            if getattr(self, name) == 0:
                object.__setattr__(self, name, minimum)
            _check_at_least(name, getattr(self, name), minimum, "the extent of a column")
        if self.batch == 1:  # batch strides do not matter then: one cache entry
            object.__setattr__(self, "stride_a", 0)
            object.__setattr__(self, "stride_b", 0)
        _check_at_least("stride_a", self.stride_a, 0, "a batch stride")
        _check_at_least("stride_b", self.stride_b, 0, "a batch stride")
        if self.beta not in (0, 1) or isinstance(self.beta, bool):
            raise KernelError(f"beta must be 0 or 1, got {self.beta!r}")
        for flag in ("trans_a", "trans_b"):
            if not isinstance(getattr(self, flag), bool):
                raise KernelError(f"{flag} must be a bool, got {getattr(self, flag)!r}")

    @property
    def itemsize(self) -> int:
        return _itemsize(self.dtype)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def one_element(self) -> bool:
        """Whether the kernel multiplies one element (m = n = k = batch = 1): scalar code
        that the loops around it, inlined, vectorize."""
        return self.flops == 2

    def extent_a(self) -> int:
        """Elements from A's first to one past its last element."""
        rows, cols = (self.k, self.m) if self.trans_a else (self.m, self.k)
        return (self.batch - 1) * self.stride_a + (cols - 1) * self.lda + rows

    def extent_b(self) -> int:
        rows, cols = (self.n, self.k) if self.trans_b else (self.k, self.n)
        return (self.batch - 1) * self.stride_b + (cols - 1) * self.ldb + rows

    def extent_c(self) -> int:
        return (self.n - 1) * self.ldc + self.m

    @property
    def name(self) -> str:
        layout = ("t" if self.trans_a else "n") + ("t" if self.trans_b else "n")
        return (
            f"brgemm_{self.dtype}_{self.m}x{self.n}x{self.k}_b{self.batch}_{layout}_"
            f"{self.lda}_{self.ldb}_{self.ldc}_{self.stride_a}_{self.stride_b}_beta{self.beta}"
            + ("_stream" if self.stream_c else "")
            + ("_far" if self.stream_c and self.c_beyond_caches else "")
        )


class UnaryOp(Enum):
    """The unary primitives: ``B := op(A)``."""

    ZERO = "zero"
    COPY = "copy"
    RELU = "relu"


@dataclass(frozen=True)
class UnarySpec:
    """``B := op(A)`` on an m x n column-major B (``ldb``); A is m x n column-major (``lda``)
    or, with ``trans_a``, n x m (B = op(A^T)). ``in_place`` ReLU reads and writes B only.
    Zero reads nothing. ``stream_b`` stores B's vector-aligned full vectors around the caches.

    A transposed A may lie in runs (``m_inner``): its rows come ``m_inner`` at a time ``lda``
    apart, run q starting at ``q * lda_outer`` (two axes that are contiguous in B but not
    in A, such as i and j of ``ijkl->lkji``), so that B's columns are long.

    A transposed, streamed B whose columns continue into the next tile's (``joined``: the
    tile after it in the loop nest starts where B's columns end) makes its kernel take two
    more arguments, ``ptr next_A, i64 joins``: bit 0 of ``joins`` says a tile before this
    one exists, bit 1 one after it, whose A is ``next_A``. The line B shares with each
    neighbour is then stored whole by the tile before it, around the caches, completed from
    the next tile's first rows of A, rather than in two masked halves, each read for ownership
    (see ``teir.codegen.transpose``).

    A transposed A may be scaled elementwise (``scale``, an internal extension for
    elementwise products, see ``teir.lower.products``): ``B := op(A^T * S)`` with element
    (i, j) of S at ``i * scale[0] + j * scale[1]``, ``scale[0]`` 0 (one value per column of
    B) or 1 (S runs along B's columns).
    """

    dtype: str
    op: UnaryOp
    m: int
    n: int
    lda: int = 0
    ldb: int = 0
    trans_a: bool = False
    in_place: bool = False
    stream_b: bool = False
    m_inner: int = 0
    lda_outer: int = 0
    scale: tuple[int, int] | None = None
    joined: bool = False

    def __post_init__(self) -> None:
        _itemsize(self.dtype)
        if not isinstance(self.op, UnaryOp):
            try:
                object.__setattr__(self, "op", UnaryOp(str(self.op).lower()))
            except ValueError:
                raise KernelError(f"op must be one of zero, copy, relu; got {self.op!r}") from None
        _check_positive(m=self.m, n=self.n)
        if self.in_place and self.op is not UnaryOp.RELU:
            raise KernelError("only ReLU runs in place (B := max(B, 0))")
        reads = self.op is not UnaryOp.ZERO and not self.in_place
        if self.trans_a and not reads:
            raise KernelError("a transposed A needs an op that reads A (copy or relu)")
        if self.ldb == 0:
            object.__setattr__(self, "ldb", self.m)
        _check_at_least("ldb", self.ldb, self.m, "the extent of a column of B")
        if not reads:
            object.__setattr__(self, "lda", 0)
        else:
            rows = self.n if self.trans_a else self.m
            if self.lda == 0:
                object.__setattr__(self, "lda", rows)
            _check_at_least("lda", self.lda, rows, "the extent of a column of A")
        if self.m_inner:
            if not self.trans_a:
                raise KernelError("runs of A's rows (m_inner) need a transposed A")
            if not 0 < self.m_inner < self.m or self.m % self.m_inner:
                raise KernelError(
                    f"m_inner must divide m = {self.m} and be smaller; got {self.m_inner}"
                )
            _check_at_least("lda_outer", self.lda_outer, self.n, "the extent of a column of A")
        elif self.lda_outer:
            raise KernelError("lda_outer is set without m_inner")
        if self.scale is not None:
            if not self.trans_a or self.m_inner or not reads:
                raise KernelError("a scaled A must be transposed, read whole, not in runs")
            rows, cols = self.scale
            if rows not in (0, 1) or isinstance(cols, bool) or not isinstance(cols, int):
                raise KernelError(f"scale strides must be (0 or 1, int >= 0); got {self.scale}")
            _check_at_least("the scale's column stride", cols, 0, "a stride")

        if self.joined and not (self.trans_a and self.stream_b and self.scale is None):
            raise KernelError("joined tiles need a transposed A, a streamed B and no scale")

    @property
    def itemsize(self) -> int:
        return _itemsize(self.dtype)

    @property
    def reads_a(self) -> bool:
        return self.op is not UnaryOp.ZERO and not self.in_place

    def extent_a(self) -> int:
        if not self.reads_a:
            return 0
        rows, cols = (self.n, self.m) if self.trans_a else (self.m, self.n)
        if self.m_inner:
            runs = self.m // self.m_inner
            return (runs - 1) * self.lda_outer + (self.m_inner - 1) * self.lda + rows
        return (cols - 1) * self.lda + rows

    def a_row(self, row: int) -> int:
        """The element offset of A's ``row`` (of m) for a transposed A."""
        if not self.m_inner:
            return row * self.lda
        run, within = divmod(row, self.m_inner)
        return run * self.lda_outer + within * self.lda

    def extent_b(self) -> int:
        return (self.n - 1) * self.ldb + self.m

    def extent_s(self) -> int:
        """Elements from S's first to one past its last element (0 without a scale)."""
        if self.scale is None:
            return 0
        return (self.m - 1) * self.scale[0] + (self.n - 1) * self.scale[1] + 1

    @property
    def bytes_moved(self) -> int:
        """Bytes read plus bytes written by one call."""
        per_element = (2 if self.reads_a or self.in_place else 1) * self.itemsize
        return per_element * self.m * self.n

    @property
    def name(self) -> str:
        kind = "inplace" if self.in_place else ("t" if self.trans_a else "n")
        stream = ("_stream" if self.stream_b else "") + ("_joined" if self.joined else "")
        runs = f"_runs{self.m_inner}x{self.lda_outer}" if self.m_inner else ""
        scaled = f"_scaled{self.scale[0]}x{self.scale[1]}" if self.scale else ""
        return (
            f"unary_{self.op.value}_{self.dtype}_{self.m}x{self.n}_{kind}_{self.lda}_{self.ldb}"
            f"{runs}{scaled}{stream}"
        )
