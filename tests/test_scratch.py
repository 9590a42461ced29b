"""The scratch buffer einsum carves its temporaries from."""

from __future__ import annotations

import itertools
import threading

import numpy as np

from teir.runtime import scratch as scratch_module
from teir.runtime.scratch import SCRATCH_LIMIT_BYTES, scratch


def _span(array: np.ndarray) -> tuple[int, int]:
    return array.ctypes.data, array.ctypes.data + array.nbytes


def test_arrays_are_aligned_disjoint_and_reused():
    shapes = [(1024,), (3, 7), (1024,)]
    with scratch(shapes, np.float32) as arrays:
        assert [a.shape for a in arrays] == shapes
        assert all(a.dtype == np.float32 and a.ctypes.data % 64 == 0 for a in arrays)
        spans = sorted(_span(a) for a in arrays)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
        # Whole pages end to end would alias in the caches: starts differ modulo 4 KiB.
        assert len({a.ctypes.data % 4096 for a in arrays}) == 3
        for value, array in enumerate(arrays):
            array[...] = value
        assert [float(a.min()) for a in arrays] == [0.0, 1.0, 2.0]
        first = [a.ctypes.data for a in arrays]
    with scratch(shapes, np.float32) as arrays:
        assert [a.ctypes.data for a in arrays] == first


def test_a_buffer_in_use_is_never_shared():
    with scratch([(100,)], np.float64) as (outer,):
        with scratch([(100,)], np.float64) as (nested,):
            assert not np.shares_memory(outer, nested)
        seen: list[np.ndarray] = []

        def other_thread() -> None:
            with scratch([(100,)], np.float64) as (array,):
                seen.append(array)
                assert not np.shares_memory(outer, array)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert len(seen) == 1


def test_large_requests_are_not_kept():
    count = SCRATCH_LIMIT_BYTES // 8 + 1
    with scratch([(count,)], np.float64) as (large,):
        assert large.shape == (count,)
    kept = scratch_module._buffer
    assert not kept or kept[0].nbytes <= SCRATCH_LIMIT_BYTES


def test_scratch_bytes_places_arrays_where_scratch_would():
    shapes = [(1024,), (3, 7)]
    offsets, total = scratch_module.layout(shapes, np.float32)
    with scratch(shapes, np.float32) as arrays:
        base = arrays[0].ctypes.data
        assert [a.ctypes.data - base for a in arrays] == offsets
    with scratch_module.ScratchBytes(total) as address:
        assert address == base and address % 64 == 0
        # in use: a nested request gets other memory, and the lock is released after both
        with scratch_module.ScratchBytes(total) as nested:
            assert nested != address and nested % 64 == 0
        with scratch(shapes, np.float32) as arrays:
            assert arrays[0].ctypes.data != address
    with scratch_module.ScratchBytes(SCRATCH_LIMIT_BYTES + 64) as large:
        assert large != address and large % 64 == 0
    with scratch_module.ScratchBytes(total) as again:
        assert again == address
