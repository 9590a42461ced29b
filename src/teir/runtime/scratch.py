"""The one scratch buffer that einsum calls carve their temporaries from.

A temporary allocated anew on every call costs a page fault per 4 KiB page when the
allocator hands it fresh pages: FP64 ``ijb,jkb->ikb`` (96, 96, 32), which copies both operands
and the result through temporaries, took 2.9 ms that way and 0.9 ms with this buffer.

The buffer is kept between calls up to ``SCRATCH_LIMIT_BYTES``; larger requests, and calls
that find it in use (another thread, or a nested call), get fresh arrays instead, so no caller
ever waits for it and it never holds more than the limit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from math import prod
from typing import Any

import numpy as np

from teir.buffers import VECTOR_ALIGN, aligned_empty, check_memory
from teir.kernels.arrays import data_address

SCRATCH_LIMIT_BYTES = 64 << 20

_lock = threading.Lock()
_buffer: list[np.ndarray] = []  # at most one uint8 array, 64-byte aligned


# Each array starts this many bytes later than where the previous one ends (modulo 4 KiB):
# arrays of whole pages laid end to end would share every address's low 12 bits, so the
# elements one loop step touches in each would fall into the same cache sets (FP32
# ijb,jkb->ikb through three 1.1 MiB temporaries: 0.50 ms apart, 0.81 ms end to end).
SKEW_BYTES = 17 * VECTOR_ALIGN


def _rounded(nbytes: int) -> int:
    return -(-nbytes // VECTOR_ALIGN) * VECTOR_ALIGN + SKEW_BYTES


def layout(shapes: Sequence[tuple[int, ...]], dtype: Any) -> tuple[list[int], int]:
    """The byte offset of each array :func:`scratch` carves for ``shapes``, and the bytes
    they take in all."""
    itemsize = np.dtype(dtype).itemsize
    # math.prod, not np.prod: this runs on every einsum call that needs a temporary, and
    # np.prod of a tuple costs microseconds
    offsets, total = [], 0
    for shape in shapes:
        offsets.append(total)
        total += _rounded(prod(shape) * itemsize)
    return offsets, total


def _shared(total: int) -> np.ndarray:
    """The shared buffer, at least ``total`` bytes (the caller holds the lock)."""
    if not _buffer or _buffer[0].size < total:
        _buffer[:] = [aligned_empty((total,), np.uint8)]
    return _buffer[0]


def _check_memory(total: int) -> None:
    check_memory(
        total,
        "teir needs {size} of temporaries here (the documented copies into kernel layouts, "
        "where an operand's layout fits no kernel; a broadcast view is copied whole)",
        "pass the operands in a layout with unit strides, or smaller",
    )


@contextmanager
def scratch(shapes: Sequence[tuple[int, ...]], dtype: Any) -> Iterator[list[np.ndarray]]:
    """Uninitialized, 64-byte-aligned arrays of ``shapes``, valid inside the ``with`` block
    only: they are reused by the next call, so nothing built on them may leave it.

    >>> with scratch([(2, 3), (4,)], np.float64) as (a, b):
    ...     a.shape, b.shape, a.ctypes.data % 64
    ((2, 3), (4,), 0)
    """
    dtype = np.dtype(dtype)
    offsets, total = layout(shapes, dtype)
    _check_memory(total)
    if total > SCRATCH_LIMIT_BYTES or not _lock.acquire(blocking=False):
        yield [aligned_empty(s, dtype) for s in shapes]
        return
    try:
        buffer = _shared(total)
        yield [
            buffer[start : start + prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
            for shape, start in zip(shapes, offsets)
        ]
    finally:
        _lock.release()


class ScratchBytes:
    """``with ScratchBytes(total) as address:`` the address of ``total`` uninitialized,
    64-byte-aligned bytes, valid inside the block only (the shared buffer, or a fresh one
    when it is in use or ``total`` is over the limit): for callers that place their arrays
    by address themselves (:func:`layout` gives :func:`scratch`'s placement)."""

    __slots__ = ("_fresh", "_locked", "total")

    def __init__(self, total: int) -> None:
        self.total = total
        self._fresh: np.ndarray | None = None
        self._locked = False

    def __enter__(self) -> int:
        _check_memory(self.total)
        if self.total <= SCRATCH_LIMIT_BYTES and _lock.acquire(blocking=False):
            self._locked = True
            try:
                return data_address(_shared(self.total))
            except BaseException:
                self._locked = False
                _lock.release()
                raise
        self._fresh = aligned_empty((max(self.total, 1),), np.uint8)
        return data_address(self._fresh)

    def __exit__(self, *exc: object) -> None:
        self._fresh = None
        if self._locked:
            self._locked = False
            _lock.release()
