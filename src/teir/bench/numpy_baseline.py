"""The same result as a configuration, computed by NumPy: the baseline the demo and benchmarks
compare with. ``np.einsum(optimize=True)`` works on strided views of the very buffers teir
uses, then the first/last primitives are applied to the output view."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from teir.ir import Config, PrimFirst, PrimLast, PrimMain, Tensor
from teir.ir.layout import tensor_axes

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def strided_view(config: Config, tensor: Tensor, buffer: np.ndarray) -> tuple[np.ndarray, str]:
    """``buffer`` seen as a tensor over the axes ``tensor`` takes part in, and their letters."""
    axes = tensor_axes(config.schedule, tensor)
    strides = config.schedule.strides(tensor)
    view = np.lib.stride_tricks.as_strided(
        buffer,
        shape=[config.dim_sizes[a] for a in axes],
        strides=[strides[a] * buffer.itemsize for a in axes],
    )
    return view, "".join(LETTERS[a] for a in axes)


def numpy_evaluator(config: Config, in0: Any, in1: Any, out: np.ndarray) -> Callable[[], None]:
    """A function that writes ``config``'s result into ``out`` with NumPy (outputs without
    aliasing; at most 52 axes)."""
    flat = out.reshape(-1, order="A")
    out_view, out_letters = strided_view(config, Tensor.OUT, flat)
    main = config.prim_main
    if main.is_contraction:
        a, a_letters = strided_view(config, Tensor.IN0, in0.reshape(-1, order="A"))
        b, b_letters = strided_view(config, Tensor.IN1, in1.reshape(-1, order="A"))
        expression = f"{a_letters},{b_letters}->{out_letters}"
    elif main.is_unary:
        a, a_letters = strided_view(config, Tensor.IN0, in0.reshape(-1, order="A"))

    def run() -> None:
        if config.prim_first is PrimFirst.ZERO:
            out_view[...] = 0
        elif config.prim_first is PrimFirst.RELU:
            np.maximum(out_view, 0, out=out_view)
        if main.is_contraction:
            out_view[...] += np.einsum(expression, a, b, optimize=True)
        elif main is PrimMain.COPY:
            np.copyto(out_view, a)
        elif main is PrimMain.RELU:
            np.maximum(a, 0, out=out_view)
        if config.prim_last is PrimLast.RELU:
            np.maximum(out_view, 0, out=out_view)

    return run
