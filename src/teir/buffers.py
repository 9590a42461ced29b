"""Turning user arrays into checked flat element buffers, before any element is touched.

A configuration's strides address each tensor's element buffer from its first element, so an
array qualifies if it is C- or F-contiguous, has the configuration's dtype and holds at least
the elements the strides reach. The output must be writable and must not overlap an input.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from math import prod
from typing import Any

import numpy as np

from teir.errors import ExecutionError, OutOfMemoryError
from teir.ir import Config, PrimMain, Tensor
from teir.kernels.arrays import data_address


def _purpose(config: Config, tensor: Tensor) -> str:
    main = config.prim_main
    if tensor is Tensor.OUT:
        return "the output"
    if main is PrimMain.NONE:
        return "not read (prim_main None)"
    if tensor is Tensor.IN1 and not main.is_contraction:
        return f"not read ({main.value} is unary)"
    return f"read by {main.value}"


def flat_buffer(config: Config, tensor: Tensor, array: Any) -> np.ndarray | None:
    """The 1-D element buffer of ``array`` for ``tensor``, or ``None`` for an unused tensor.

    Raises :class:`teir.ExecutionError` naming the tensor, what was needed and what was given.
    """
    name = tensor.label
    needed = config.extent(tensor)
    if needed == 0:
        if array is not None and not isinstance(array, np.ndarray):
            raise ExecutionError(
                f"{name} is {_purpose(config, tensor)}: pass None (or an array, which is "
                f"ignored), not {type(array).__name__}"
            )
        return None
    if array is None:
        raise ExecutionError(
            f"{name} is {_purpose(config, tensor)} and needs an array of {needed} "
            f"{config.data_type.value} elements, but None was given"
        )
    if not isinstance(array, np.ndarray):
        raise ExecutionError(
            f"{name} must be a NumPy array of {config.dtype.name}, got {type(array).__name__}; "
            f"convert it with np.asarray(..., dtype=np.{config.dtype.name})"
        )
    if array.dtype != config.dtype:
        raise ExecutionError(
            f"{name} has dtype {array.dtype} but the configuration's data type "
            f"{config.data_type.value} needs {config.dtype.name}; "
            + (
                "convert it with .astype(np." + config.dtype.name + ")"
                if tensor is not Tensor.OUT
                else "allocate the output with that dtype"
            )
        )
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise ExecutionError(
            f"{name} is not contiguous (strides {array.strides} bytes); the configuration's "
            "strides address a contiguous element buffer: "
            + (
                "pass np.ascontiguousarray(" + name + ")"
                if tensor is not Tensor.OUT
                else "pass a contiguous output and copy the result into the view afterwards"
            )
        )
    if array.size < needed:
        raise ExecutionError(
            f"{name} holds {array.size} elements (shape {array.shape}), but the configuration's "
            f"strides reach {needed} elements; pass an array with at least {needed} elements"
        )
    if tensor is Tensor.OUT and not array.flags.writeable:
        raise ExecutionError("out is read-only; pass a writable array for the output")
    flat = array.reshape(-1, order="A")
    if flat.ctypes.data != array.ctypes.data:  # pragma: no cover - contiguous reshape is a view
        raise ExecutionError(f"{name} could not be viewed as a flat buffer")
    return flat


def checked_buffers(
    config: Config, in0: Any, in1: Any, out: Any
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    """Check all three arguments and return their flat buffers (``None`` for unused inputs)."""
    if not isinstance(config, Config):
        raise ExecutionError(
            f"expected a teir.Config, got {type(config).__name__}; build one with "
            "teir.Config(...) or teir.load(path)"
        )
    buf0 = flat_buffer(config, Tensor.IN0, in0)
    buf1 = flat_buffer(config, Tensor.IN1, in1)
    buf_out = flat_buffer(config, Tensor.OUT, out)
    assert buf_out is not None  # out is always used
    for tensor, buf in ((Tensor.IN0, buf0), (Tensor.IN1, buf1)):
        if buf is not None and np.shares_memory(buf_out, buf):
            raise ExecutionError(
                f"out overlaps {tensor.label} in memory; the operation writes out while it reads "
                f"{tensor.label}: pass a separate output array (or a copy of {tensor.label})"
            )
    return buf0, buf1, buf_out


VECTOR_ALIGN = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose data starts on a 64-byte boundary: kernels store full
    vectors there, and only aligned vectors can bypass the caches (NumPy aligns to 16)."""
    dtype = np.dtype(dtype)
    count = prod(shape)  # math.prod: np.prod of a tuple costs microseconds on every call
    # A clear error, not NumPy's; check_memory's own test is made here first so that its
    # message is formatted only when it is raised (every new result passes here).
    available = memory_bytes()
    if available is not None and count * dtype.itemsize > available:
        check_memory(
            count * dtype.itemsize,
            f"a new array of shape {tuple(shape)} ({dtype}) needs {{size}}",
            "use smaller operands (or sizes)",
        )
    raw = np.empty(count * dtype.itemsize + VECTOR_ALIGN, np.uint8)
    start = (-data_address(raw)) % VECTOR_ALIGN
    array: np.ndarray = raw[start : start + count * dtype.itemsize].view(dtype).reshape(shape)
    return array


def new_strides(
    shape: Sequence[int], itemsize: int, memory_order: Sequence[int] | None = None
) -> tuple[int, ...]:
    """The strides (in units of ``itemsize``) of a new array of ``shape`` whose axes lie in
    memory in ``memory_order`` (outermost first; None: C order), as :func:`new_result`
    makes it."""
    strides = [0] * len(shape)
    step = itemsize
    for axis in reversed(memory_order or range(len(shape))):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


def new_result(
    shape: tuple[int, ...],
    dtype: Any,
    memory_order: tuple[int, ...] | None = None,
    aligned: bool = True,
) -> np.ndarray:
    """A new array of ``shape`` whose axes lie in memory in ``memory_order`` (outermost first;
    None: C order), as a view in ``shape``'s axis order; 64-byte aligned unless ``aligned``
    is false (``np.empty``'s alignment: a small result's call costs less)."""
    empty = aligned_empty if aligned else np.empty
    if memory_order is None:
        return empty(shape, dtype)
    # the inverse permutation in Python: np.argsort costs ~2 us a call
    axes = [0] * len(memory_order)
    for place, axis in enumerate(memory_order):
        axes[axis] = place
    base = empty(tuple(shape[axis] for axis in memory_order), dtype)
    view: np.ndarray = base.transpose(axes)
    return view


@cache
def memory_bytes() -> int | None:
    """This machine's physical memory in bytes, where the platform says (None elsewhere)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(nbytes: int, need: str, fix: str) -> None:
    """ExecutionError, before anything is allocated, where ``nbytes`` exceed this machine's
    memory: ``need`` says what needs them (``{size}`` stands for their size), ``fix`` how
    to need less."""
    available = memory_bytes()
    if available is not None and nbytes > available:
        raise OutOfMemoryError(
            need.format(size=f"{nbytes / 2**30:.3g} GiB")
            + f", more than this machine's {available / 2**30:.3g} GiB of memory: {fix}"
        )
