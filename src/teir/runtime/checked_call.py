"""Checked calls: a compiled operation made callable from Python on NumPy arrays of one fixed
layout, checked and run in a single native call (:mod:`teir.codegen.checked_call`).

The function object is a CPython builtin made from the JIT's code with ``PyCFunction_NewEx``;
what it reads of an array object (type, data, ndim, dimensions, strides, dtype, flags) is at
offsets verified here on sample arrays, and where they do not match (another interpreter,
another NumPy layout) no checked call is made and callers keep their Python path.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from teir.codegen.checked_call import DONE as DONE  # the codes, for callers of CheckedCall
from teir.codegen.checked_call import FALLBACK as FALLBACK
from teir.codegen.checked_call import HEADER, ArrayFields, checked_call_module
from teir.codegen.checked_call import JOIN as JOIN
from teir.codegen.checked_call import WAKE as WAKE
from teir.codegen.target import Target
from teir.kernels.arrays import data_address
from teir.kernels.cache import CODE_CACHE
from teir.runtime.operation import Operation
from teir.runtime.pool import checked_state, current, dispatch_address
from teir.runtime.stack import UNCHECKED_BYTES

# A checked call holds the GIL while its kernels run: only operations estimated (on one core)
# below this get one; above it the Python path's microseconds do not matter.
MAX_ESTIMATED_SECONDS = 1e-3
_METH_FASTCALL = 0x80
_WRITEABLE = 0x400  # NPY_ARRAY_WRITEABLE
_ALIGNED = 0x100  # NPY_ARRAY_ALIGNED


class _MethodDef(ctypes.Structure):
    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


def _array_fields() -> ArrayFields | None:
    """The offsets of NumPy's array object fields, if they read right on sample arrays."""
    if sys.implementation.name != "cpython":
        return None
    head = object.__basicsize__  # ob_refcnt, ob_type
    pointer = ctypes.sizeof(ctypes.c_void_p)
    fields = ArrayFields(
        ob_type=head - pointer,
        data=head,
        nd=head + pointer,
        dimensions=head + 2 * pointer,
        strides=head + 3 * pointer,
        descr=head + 5 * pointer,  # after the base object
        flags=head + 6 * pointer,
        writeable=_WRITEABLE,
        aligned=_ALIGNED,
    )
    word = ctypes.c_ssize_t.from_address
    i32 = ctypes.c_int32.from_address
    base = np.arange(24.0).reshape(2, 3, 4)
    samples = [base, base[:, ::2].transpose(2, 0, 1), np.zeros((), np.float32), base[1, 1:]]
    readonly = np.zeros(3)
    readonly.flags.writeable = False
    unaligned = np.zeros(25, np.uint8)[1:].view(np.float64)
    for a in [*samples, readonly, unaligned]:
        at = id(a)
        if word(at + fields.ob_type).value != id(np.ndarray) or i32(at + fields.nd).value != a.ndim:
            return None
        if word(at + fields.data).value != a.__array_interface__["data"][0]:
            return None
        if word(at + fields.descr).value != id(a.dtype):
            return None
        dims, strides = word(at + fields.dimensions).value, word(at + fields.strides).value
        for d in range(a.ndim):
            if (
                word(dims + 8 * d).value != a.shape[d]
                or word(strides + 8 * d).value != a.strides[d]
            ):
                return None
        flags = i32(at + fields.flags).value
        if bool(flags & _WRITEABLE) != a.flags.writeable or bool(flags & _ALIGNED) != (
            a.flags.aligned
        ):
            return None
    return fields


@dataclass(frozen=True)
class _Native:
    method: _MethodDef  # must outlive every function made from it
    new_function: Callable[..., Any]


@cache
def _native() -> _Native | None:
    fields = _array_fields()
    if fields is None:
        return None
    loaded = CODE_CACHE.get(
        f"runtime:checked_call {fields}",
        Target.host(),
        ["_call"],
        lambda prefix: checked_call_module(fields, prefix),
    )
    method = _MethodDef(b"teir_checked_call", loaded.symbols["_call"], _METH_FASTCALL, None)
    new_function = ctypes.pythonapi.PyCFunction_NewEx
    new_function.restype = ctypes.py_object
    new_function.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]
    return _Native(method, new_function)


@dataclass(frozen=True)
class ArrayLayout:
    """What an argument must be: its shape and byte strides, and for the output writable."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    writable: bool = False

    def span(self, itemsize: int) -> tuple[int, int]:
        """The bytes it reaches: (offset of the lowest from the data address, count)."""
        low = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        high = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        return low, high - low + itemsize


class CheckedCall:
    """``call(in0, [in1,] out) -> code``: ``operation`` on arrays of exactly the planned
    layouts (:data:`DONE`), or :data:`FALLBACK` with nothing run. Codes :data:`WAKE` and
    :data:`JOIN` mean the call is still running: pass them to :meth:`finish`."""

    def __init__(self, operation: Operation, layouts: Sequence[ArrayLayout], native: _Native):
        self.operation = operation
        itemsize = operation.config.dtype.itemsize
        job = operation._job
        values: dict[str, int] = {
            "ndarray_type": id(np.ndarray),
            "incref": ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value or 0,
            "nargs": len(layouts),
            "descr": id(operation.config.dtype),
            "nest": operation._function,
            "size": operation.nest.parallel_size,
            "first": operation._flag_addresses[0],
            "last": operation._flag_addresses[1],
            "job": 0 if job is None else job.address,
            "pool": int(checked_state.ctypes.data),
            "dispatch": dispatch_address() if job is not None else 0,
            "helpers": 0 if job is None else job.count - 1,
        }
        self._codes = (DONE, FALLBACK, WAKE, JOIN)  # referenced while the context holds them
        for code in self._codes:
            values[f"code{code}"] = id(code)
        records: list[int] = []
        for index, layout in enumerate(layouts):
            low, count = layout.span(itemsize)
            values[f"record{index}"] = len(HEADER) + len(records)
            records += [len(layout.shape), int(layout.writable), low, count]
            records += [*layout.shape, *layout.strides]
        self._context = np.array([values.get(name, 0) for name in HEADER] + records, dtype=np.int64)
        self.call: Callable[..., int] = native.new_function(
            ctypes.byref(native.method), self._context, None
        )
        self._dtype = operation.config.dtype

    def finish(self, code: int, *arrays: np.ndarray) -> None:
        """Complete a call that returned :data:`WAKE` or :data:`JOIN` on these arguments."""
        pool, job = current(), self.operation._job
        assert pool is not None and job is not None
        in0, out = data_address(arrays[0]), data_address(arrays[-1])
        in1 = data_address(arrays[1]) if len(arrays) == 3 else 0
        pool.complete(job, in0, in1, out, code - WAKE + 1)


def checked_call(operation: Operation, layouts: Sequence[ArrayLayout]) -> CheckedCall | None:
    """A checked call of ``operation`` for arguments of these layouts (in0[, in1], out), or
    None where there cannot be one: the operation runs long (the call holds the GIL), or this
    interpreter's array objects are laid out unlike the verified ones, or the operation keeps
    a large packed panel on the stack (its Python call checks the calling thread's stack)."""
    native = _native()
    if native is None or operation.estimated_seconds > MAX_ESTIMATED_SECONDS:
        return None
    if operation.stack_bytes > UNCHECKED_BYTES:
        return None
    if len(layouts) not in (2, 3):
        return None
    return CheckedCall(operation, layouts, native)
