"""The calling thread's stack size, so that kernels with packing buffers on the stack are not
run on a thread too small for them (the stack probes would stop the process at the guard
page): such a call raises :class:`teir.ExecutionError` instead.

Threads made after ``threading.stack_size(n)`` get ``n`` bytes; the platform default (8 MiB
on glibc) is far above what the kernels use. Sizes are read once per thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from functools import cache

from teir.errors import ExecutionError

_known = threading.local()  # per thread: its stack size, read once


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _measure() -> int | None:
    """This thread's stack size in bytes, or None where the platform does not say."""
    libc = _libc()
    if libc is None:
        return None
    if sys.platform.startswith("linux"):
        libc.pthread_self.restype = ctypes.c_void_p
        attributes = ctypes.create_string_buffer(256)  # pthread_attr_t (56-64 bytes)
        self = ctypes.c_void_p(libc.pthread_self())
        if libc.pthread_getattr_np(self, attributes) != 0:
            return None
        size = ctypes.c_size_t()
        status = libc.pthread_attr_getstacksize(attributes, ctypes.byref(size))
        libc.pthread_attr_destroy(attributes)
        return int(size.value) if status == 0 else None
    if sys.platform == "darwin":
        libc.pthread_get_stacksize_np.restype = ctypes.c_size_t
        libc.pthread_self.restype = ctypes.c_void_p
        return int(libc.pthread_get_stacksize_np(ctypes.c_void_p(libc.pthread_self())))
    return None


def thread_stack_bytes() -> int | None:
    """The calling thread's stack size (None: unknown)."""
    try:
        size: int | None = _known.size
    except AttributeError:
        size = _known.size = _measure()
    return size


# What a thread needs besides a kernel's buffers: the interpreter's frames below the call.
RESERVE_BYTES = 256 * 1024
# Buffers up to this size are not checked: no thread that runs Python has a stack that small
# (musl's default is 128 KiB), and checking would cost small operations their native
# checked call (a 64^3 GEMM with a 16 KiB panel: 3 -> 6 us per call).
UNCHECKED_BYTES = 64 * 1024


def check_stack(needed: int, what: str) -> None:
    """Raise :class:`ExecutionError` if this thread's stack cannot hold ``needed`` bytes of
    kernel buffers (plus a reserve for the frames below)."""
    size = thread_stack_bytes()
    if size is not None and size < needed + RESERVE_BYTES:
        raise ExecutionError(
            f"{what} keeps {needed // 1024} KiB of packing buffers on the stack, but this "
            f"thread's stack is {size // 1024} KiB; run it on a thread made after "
            f"threading.stack_size({(needed + RESERVE_BYTES) // (1 << 20) + 1} << 20), or on "
            "the main thread"
        )
