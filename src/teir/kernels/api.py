"""Compiled primitives callable on NumPy arrays, for users who want just the kernels.

>>> import numpy as np
>>> from teir import kernels
>>> gemm = kernels.gemm("f32", 64, 48, 32)               # C += A @ B, column-major
>>> a = np.asfortranarray(np.random.rand(64, 32).astype(np.float32))
>>> b = np.asfortranarray(np.random.rand(32, 48).astype(np.float32))
>>> c = np.zeros((64, 48), dtype=np.float32, order="F")
>>> gemm(a, b, c)
>>> bool(np.allclose(c, a @ b, rtol=1e-5))
True
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from teir.codegen.brgemm import Blocking, brgemm_function, choose_blocking
from teir.codegen.driver import repeat_function
from teir.codegen.irtext import Module
from teir.codegen.specs import BrgemmSpec, KernelError, UnaryOp, UnarySpec
from teir.codegen.target import Target
from teir.codegen.unary import unary_function
from teir.errors import ExecutionError
from teir.ir.enums import DataType
from teir.kernels.arrays import checked_address, overlaps
from teir.kernels.cache import CODE_CACHE
from teir.runtime.stack import UNCHECKED_BYTES, check_stack

_VOID_P = ctypes.c_void_p


def _dtype_name(dtype: Any) -> str:
    if dtype in ("f32", "f64"):
        return str(dtype)
    parsed = DataType.parse(dtype)
    if parsed is None:
        raise KernelError(
            f"dtype must be FP32 or FP64 (or 'f32', 'f64', np.float32, ...), got {dtype!r}"
        )
    return parsed.short


class Kernel:
    """A compiled primitive. Call it on arrays (checked) or on raw addresses (unchecked)."""

    spec: Any
    pointers: int
    origin: str
    load_seconds: float

    def __init__(
        self, spec: Any, target: Target, addresses: dict[str, int], origin: str, seconds: float
    ) -> None:
        self.spec = spec
        self.target = target
        self.address = addresses[""]
        self.origin = origin
        self.load_seconds = seconds
        signature = ctypes.CFUNCTYPE(None, *([_VOID_P] * self.pointers))
        self._call = signature(self.address)
        self._repeat_address = addresses.get("_repeat")
        self._dtype = np.dtype(np.float32 if spec.dtype == "f32" else np.float64)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def call_addresses(self, *addresses: int) -> None:
        """Run on raw element-buffer addresses; nothing is checked."""
        self._call(*addresses)

    def repeat_addresses(self, count: int, *addresses: int) -> float:
        """Run ``count`` times in a compiled loop; returns the elapsed seconds."""
        if self._repeat_address is None:
            raise ExecutionError("this kernel was loaded without its timing loop")
        signature = ctypes.CFUNCTYPE(None, *([_VOID_P] * self.pointers), ctypes.c_int64)
        repeat = signature(self._repeat_address)
        start = time.perf_counter()
        repeat(*addresses, count)
        return time.perf_counter() - start

    def __repr__(self) -> str:
        return f"<teir kernel {self.spec.name} ({self.origin})>"


class BrgemmKernel(Kernel):
    """``C (+)= sum_i A_i @ B_i``; see :class:`teir.kernels.BrgemmSpec` for the layouts."""

    pointers = 3

    def __init__(
        self,
        spec: BrgemmSpec,
        target: Target,
        addresses: dict[str, int],
        origin: str,
        seconds: float,
        blocking: Blocking,
    ) -> None:
        super().__init__(spec, target, addresses, origin, seconds)
        self.blocking = blocking
        self.stack_bytes = blocking.stack_bytes(spec)  # its packing buffer, on the caller's stack

    def addresses(self, a: Any, b: Any, c: Any) -> tuple[int, int, int]:
        """Check the arrays and return their addresses."""
        s, dtype = self.spec, self._dtype
        pa = checked_address("A", a, dtype, s.extent_a(), False)
        pb = checked_address("B", b, dtype, s.extent_b(), False)
        pc = checked_address("C", c, dtype, s.extent_c(), True)
        for name, address, array in (("A", pa, a), ("B", pb, b)):
            if overlaps(pc, c.nbytes, address, array.nbytes):
                raise ExecutionError(f"C overlaps {name}; pass a separate output array")
        return pa, pb, pc

    def __call__(self, a: Any, b: Any, c: Any) -> None:
        addresses = self.addresses(a, b, c)
        if self.stack_bytes > UNCHECKED_BYTES:
            check_stack(self.stack_bytes, "this kernel")
        self._call(*addresses)


class UnaryKernel(Kernel):
    """``B := op(A)`` (or ``op(A^T)``, or ReLU in place on B); A may be None when unused."""

    pointers = 2

    def addresses(self, a: Any, b: Any) -> tuple[int, int]:
        s, dtype = self.spec, self._dtype
        pb = checked_address("B", b, dtype, s.extent_b(), True)
        if not s.reads_a:
            return pb, pb
        pa = checked_address("A", a, dtype, s.extent_a(), False)
        if overlaps(pa, a.nbytes, pb, b.nbytes):
            raise ExecutionError(
                "B overlaps A; use in_place=True for an in-place ReLU, or "
                "pass a separate output array"
            )
        return pa, pb

    def __call__(self, a: Any, b: Any = None) -> None:
        """``kernel(a, b)``; Zero and the in-place ReLU take ``kernel(b)``."""
        if b is None and not self.spec.reads_a:
            a, b = None, a
        self._call(*self.addresses(a, b))


def brgemm(
    dtype: Any,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    lda: int = 0,
    ldb: int = 0,
    ldc: int = 0,
    stride_a: int = 0,
    stride_b: int = 0,
    beta: int = 1,
    target: Target | None = None,
) -> BrgemmKernel:
    """The compiled BRGEMM kernel for these parameters (from the cache when possible).

    Leading dimensions of 0 mean the tight extent. ``beta=0`` overwrites C (a fused Zero).
    ``target`` defaults to this machine.
    """
    spec = BrgemmSpec(
        _dtype_name(dtype),
        m,
        n,
        k,
        batch,
        trans_a,
        trans_b,
        lda,
        ldb,
        ldc,
        stride_a,
        stride_b,
        beta,
    )
    return brgemm_kernel(spec, target)


def gemm(dtype: Any, m: int, n: int, k: int, **options: Any) -> BrgemmKernel:
    """The compiled GEMM kernel ``C (+)= A @ B`` (a BRGEMM with batch 1)."""
    return brgemm(dtype, m, n, k, 1, **options)


def brgemm_source(
    spec: BrgemmSpec, target: Target, blocking: Blocking | None = None
) -> tuple[str, Blocking, Any]:
    """(cache description, blocking, generator of the module text) of a BRGEMM kernel."""
    blocking = blocking or choose_blocking(spec, target)

    def generate(prefix: str) -> str:
        module = Module()
        brgemm_function(spec, target, module, prefix, blocking=blocking, attributes="noinline")
        repeat_function(module, prefix + "_repeat", prefix, 3)
        return module.text()

    return repr(spec) + repr(blocking), blocking, generate


def brgemm_kernel(
    spec: BrgemmSpec, target: Target | None = None, blocking: Blocking | None = None
) -> BrgemmKernel:
    """The compiled kernel for a :class:`BrgemmSpec` (``blocking`` overrides the register
    block the cost model picks; the chunk must divide the batch)."""
    target = target or Target.host()
    if blocking is not None and spec.batch % blocking.chunk:
        raise KernelError(f"the batch chunk {blocking.chunk} must divide the batch {spec.batch}")
    description, blocking, generate = brgemm_source(spec, target, blocking)
    loaded = CODE_CACHE.get(description, target, ["", "_repeat"], generate)
    return BrgemmKernel(spec, target, loaded.symbols, loaded.origin, loaded.seconds, blocking)


def unary(
    op: str | UnaryOp,
    dtype: Any,
    m: int,
    n: int,
    *,
    lda: int = 0,
    ldb: int = 0,
    trans_a: bool = False,
    in_place: bool = False,
    target: Target | None = None,
) -> UnaryKernel:
    """The compiled unary kernel ``B := op(A)`` (Zero, Copy, ReLU; transposed; in place)."""
    spec = UnarySpec(_dtype_name(dtype), op, m, n, lda, ldb, trans_a, in_place)  # type: ignore[arg-type]
    return unary_kernel(spec, target)


def unary_source(spec: UnarySpec, target: Target) -> tuple[str, Any]:
    """(cache description, generator of the module text) of a unary kernel."""

    def generate(prefix: str) -> str:
        module = Module()
        unary_function(spec, target, module, prefix, attributes="noinline")
        repeat_function(module, prefix + "_repeat", prefix, 2)
        return module.text()

    return repr(spec), generate


def unary_kernel(spec: UnarySpec, target: Target | None = None) -> UnaryKernel:
    """The compiled kernel for a :class:`UnarySpec`."""
    if spec.scale is not None:
        raise KernelError(
            "a scaled transposed copy (scale=...) takes a third operand and runs only inside "
            "the loop nests of elementwise products; build the spec without scale"
        )
    target = target or Target.host()
    description, generate = unary_source(spec, target)
    loaded = CODE_CACHE.get(description, target, ["", "_repeat"], generate)
    return UnaryKernel(spec, target, loaded.symbols, loaded.origin, loaded.seconds)
