"""Fast access to a NumPy array's data address, and the checks every native call makes."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from teir.errors import ExecutionError


class _ArrayInterface(ctypes.Structure):
    """NumPy's ``PyArrayInterface`` (the C struct behind ``__array_struct__``)."""

    _fields_ = [
        ("two", ctypes.c_int),
        ("nd", ctypes.c_int),
        ("typekind", ctypes.c_char),
        ("itemsize", ctypes.c_int),
        ("flags", ctypes.c_int),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("descr", ctypes.c_void_p),
    ]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


# PyArrayInterface flags (numpy/ndarraytypes.h).
_C_CONTIGUOUS = 0x1
_F_CONTIGUOUS = 0x2
_WRITEABLE = 0x400
_ALIGNED = 0x100


def _interface_address(array: np.ndarray) -> int:
    interface = _ArrayInterface.from_address(_capsule_pointer(array.__array_struct__, None))
    address: int | None = interface.data
    return address or 0


def _object_field_reader() -> Callable[[np.ndarray], int] | None:
    """A reader of the data pointer stored in the array object itself, right after CPython's
    object header (NumPy's ``PyArrayObject_fields``), if it reads the right address here on
    fresh arrays, views at an offset and 0-d arrays (0.15 us against 0.5)."""
    if sys.implementation.name != "cpython":
        return None
    field = ctypes.c_size_t.from_address
    offset = object.__basicsize__
    samples = [np.empty(3), np.arange(10.0)[3:], np.zeros((4, 4), np.float32).T[1:], np.zeros(())]
    if any(field(id(a) + offset).value != _interface_address(a) for a in samples):
        return None
    return lambda array: int(field(id(array) + offset).value)


data_address: Callable[[np.ndarray], int] = _object_field_reader() or _interface_address
"""The address of ``array``'s first element (0 for an empty array's null pointer)."""

_CHECKED_FLAGS = _C_CONTIGUOUS | _F_CONTIGUOUS | _WRITEABLE | _ALIGNED


def _flag_bits(array: np.ndarray) -> int:
    """The checked flags of ``array`` as its ``flags`` attribute reports them."""
    flags = array.flags
    return (
        (_C_CONTIGUOUS if flags.c_contiguous else 0)
        | (_F_CONTIGUOUS if flags.f_contiguous else 0)
        | (_WRITEABLE if flags.writeable else 0)
        | (_ALIGNED if flags.aligned else 0)
    )


def _object_flags_reader() -> Callable[[np.ndarray], int] | None:
    """A reader of the flags word stored in the array object itself (NumPy's
    ``PyArrayObject_fields``: data, nd, dimensions, strides, base and descr precede it), if
    it reads the checked flags right here on arrays that differ in each of them: the
    address and flags of a compiled operation's three arguments cost 3.4 us a call through
    ``__array_struct__`` (a 32^3 GEMM called with arrays: 4.9 us, its nest 1.5)."""
    if data_address is _interface_address:
        return None  # the data field's offset did not check out: nor would this
    word = ctypes.sizeof(ctypes.c_void_p)
    field = ctypes.c_int.from_address
    offset = object.__basicsize__ + 6 * word
    read_only = np.arange(6.0)
    read_only.setflags(write=False)
    unaligned = np.frombuffer(bytearray(33), np.float32, 8, 1)
    samples = [
        np.empty(3),
        np.zeros((4, 5), np.float32).T,
        np.arange(12.0).reshape(3, 4)[:, 1:],
        read_only,
        unaligned,
        np.zeros(()),
    ]
    if any(field(id(a) + offset).value & _CHECKED_FLAGS != _flag_bits(a) for a in samples):
        return None
    return lambda array: int(field(id(array) + offset).value)


_flags_reader = _object_flags_reader()


def checked_address(
    name: str, array: Any, dtype: np.dtype[Any], needed: int, writable: bool
) -> int:
    """The data address of ``array`` after checking it can serve as ``needed`` elements of
    ``dtype`` addressed from its first element; raises :class:`teir.ExecutionError`."""
    if not isinstance(array, np.ndarray):
        raise ExecutionError(
            f"{name} must be a NumPy array of {dtype.name}, got {type(array).__name__}"
        )
    if array.dtype is not dtype and array.dtype != dtype:
        raise ExecutionError(f"{name} has dtype {array.dtype}, but {dtype.name} is needed")
    if _flags_reader is not None:
        flags, address = _flags_reader(array), data_address(array)
    else:  # one read of NumPy's array interface gives the address and the flags
        interface = _ArrayInterface.from_address(_capsule_pointer(array.__array_struct__, None))
        flags, address = interface.flags, interface.data or 0
    if not flags & (_C_CONTIGUOUS | _F_CONTIGUOUS):
        raise ExecutionError(
            f"{name} must be C- or F-contiguous (its element buffer is "
            f"addressed from the first element); pass "
            f"np.ascontiguousarray({name})"
        )
    if array.size < needed:
        raise ExecutionError(
            f"{name} holds {array.size} elements but {needed} are reached; "
            f"pass an array with at least {needed} elements"
        )
    if writable and not flags & _WRITEABLE:
        raise ExecutionError(f"{name} is read-only but it is written")
    if not flags & _ALIGNED:
        raise ExecutionError(
            f"{name} is not aligned to its {dtype.itemsize}-byte elements (address "
            f"{address:#x}); kernels address whole elements (and store around the "
            "caches on vectors found by shifting whole elements): pass "
            + (
                "an aligned output (any array NumPy allocates is) and copy it over"
                if writable
                else f"np.require({name}, requirements='A') (an aligned copy)"
            )
        )
    return address


def overlaps(address_a: int, bytes_a: int, address_b: int, bytes_b: int) -> bool:
    """Whether two byte ranges overlap (exact for contiguous arrays)."""
    return address_a < address_b + bytes_b and address_b < address_a + bytes_a
