"""Checking the tensors passed to a compiled operation, before any native code runs.

NumPy arrays are used as they are; other objects that export DLPack (a CPU ``torch.Tensor``,
for example) are viewed through ``np.from_dlpack`` without a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from teir.errors import ExecutionError

_DLPACK_CPU = 1


def as_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a NumPy array sharing its memory; raises :class:`teir.ExecutionError`."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        device = getattr(value, "__dlpack_device__", None)
        if device is not None:
            try:
                kind, number = device()
            except Exception as error:
                raise ExecutionError(
                    f"{name}: its DLPack device could not be read ({error})"
                ) from None
            if int(kind) != _DLPACK_CPU:
                raise ExecutionError(
                    f"{name} lives on a non-CPU device (DLPack device type {int(kind)}, "
                    f"index {number}); teir runs on the CPU: move it there first (e.g. .cpu())"
                )
        try:
            return np.from_dlpack(value)
        except Exception as error:
            raise ExecutionError(f"{name} could not be shared through DLPack: {error}") from None
    raise ExecutionError(
        f"{name} must be a NumPy array or a CPU tensor that supports DLPack, "
        f"got {type(value).__name__}"
    )
