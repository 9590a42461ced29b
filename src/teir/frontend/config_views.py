"""``teir.compile``: a configuration whose layouts fit no kernel runs as an einsum on views.

A GEMM or BRGEMM kernel needs a unit stride on M or K in in0, on K or N in in1 and on M or N
in the output. Where the configuration's tensors have theirs elsewhere (a batch axis
innermost, ``mkc,nkc->mnc``), the loop nest can only call the generic scalar primitive, at
1-15 GFLOP/s. :func:`teir.einsum` plans such layouts as a whole: a batch axis of unit stride
everywhere becomes the vector lanes, other layouts are copied into ones that fit (and the
result back). So the contraction runs as that einsum, on strided views of the same buffers,
with the same first/last primitives (Zero: overwrite, None: accumulate, ReLU last); each
partial-tile rest (``Config.rests``) likewise. ``explain()`` says so and shows the einsum's
plan. 16 x 128^3 FP32 on 2 threads: ``mkc,cnk->cmn`` 14 -> 369 GFLOP/s, ``mkc,nkc->mnc``
7.8 -> 316, ``ckm,knc->cnm`` 1.4 -> 380 (einsum's rates; ``cmk,cnk->cmn`` 487).
"""

from __future__ import annotations

import ctypes
import string
from dataclasses import dataclass
from typing import Any

import numpy as np

from teir.codegen.target import Target
from teir.explain import explain as explain_config
from teir.frontend.einsum import einsum, einsum_plan
from teir.ir import Config, DimType, PrimFirst, PrimLast
from teir.ir.layout import is_injective
from teir.lower.nest import LoopNest, lower
from teir.runtime.operation import Operation, checked_arguments
from teir.runtime.operation import compile as compile_nest

# Below this much work the generic primitive's time (1-15 GFLOP/s) is about an einsum call's
# overhead of building views and looking up its plan (~10 us), so the nest stays.
MIN_FLOPS = 200_000
_LABELS = string.ascii_letters


@dataclass(frozen=True)
class EinsumForm:
    """A binary contraction configuration as an einsum on strided views of its buffers:
    the subscripts and, per tensor, the view's shape and element strides."""

    subscripts: str
    shapes: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    strides: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    accumulate: bool
    relu: bool

    def views(self, buffers: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[np.ndarray]:
        """The three tensors as views of flat buffers (each holding the tensor's extent)."""
        return [
            np.ndarray(
                shape,
                buffer.dtype,
                buffer=buffer,
                strides=tuple(s * buffer.itemsize for s in strides),
            )
            for buffer, shape, strides in zip(buffers, self.shapes, self.strides)
        ]


def einsum_form(config: Config) -> EinsumForm | None:
    """``config`` (its own region, without rests) as an einsum, or None where it is no
    binary contraction with Zero/None first and ReLU/None last whose output elements each
    belong to one C/M/N index and whose K axes each move an input (what an einsum can say)."""
    if not config.prim_main.is_contraction or config.prim_first not in (
        PrimFirst.NONE,
        PrimFirst.ZERO,
    ):
        return None
    if config.prim_last not in (PrimLast.NONE, PrimLast.RELU):
        return None
    dims = [i for i, size in enumerate(config.dim_sizes) if size > 1]
    if len(dims) > len(_LABELS):
        return None
    label = {d: _LABELS[n] for n, d in enumerate(dims)}
    terms: list[str] = []
    shapes: list[tuple[int, ...]] = []
    strides: list[tuple[int, ...]] = []
    for of_tensor in (config.strides_in0, config.strides_in1, config.strides_out):
        used = [d for d in dims if of_tensor[d] != 0]
        terms.append("".join(label[d] for d in used))
        shapes.append(tuple(config.dim_sizes[d] for d in used))
        strides.append(tuple(of_tensor[d] for d in used))
    summed = {label[d] for d in dims if config.dim_types[d] is DimType.K}
    if summed & set(terms[2]) or not set(terms[2]) <= set(terms[0] + terms[1]):
        return None  # a K axis along the output, or an output axis no input has
    if not summed <= set(terms[0] + terms[1]):
        return None  # a K axis neither input moves along: it multiplies, einsum drops it
    if any(config.dim_types[d] is not DimType.K and label[d] not in terms[2] for d in dims):
        return None  # a C/M/N axis of output stride 0: its elements sum into one
    if not is_injective(list(shapes[2]), list(strides[2])):
        return None  # output elements aliasing: updated in sequence, which einsum does not do
    return EinsumForm(
        f"{terms[0]},{terms[1]}->{terms[2]}",
        (shapes[0], shapes[1], shapes[2]),
        (strides[0], strides[1], strides[2]),
        accumulate=config.prim_first is PrimFirst.NONE,
        relu=config.prim_last is PrimLast.RELU,
    )


def generic_reason(nest: LoopNest) -> str | None:
    """Why the nest's contraction runs on the generic scalar primitive (None: it does not)."""
    for op in (nest.main, nest.main_zero):
        if op is not None and op.kind == "generic":
            return op.note or "no kernel fits the tile"
    return None


class ViewedOperation(Operation):
    """An :class:`Operation` whose own region runs as ``teir.einsum`` on views of the
    buffers (see the module's docstring); checks and rests are the Operation's."""

    def __init__(
        self,
        config: Config,
        threads: int,
        nest: LoopNest,
        form: EinsumForm,
        reason: str,
        rests: tuple[tuple[tuple[int, int, int], Operation], ...],
    ) -> None:
        # no native nest: the Operation's argument checks and rests, an einsum for the rest
        self._describe_operands(config, threads, nest, Target.host(), rests)
        self.origin = "teir.einsum"
        self.form = form
        self.reason = reason
        self.slices = [(0, 1)]  # the einsum splits its own work between the threads
        self.stack_bytes = 0
        self._checked = None
        self._checked_tried = True
        self._own_extents = config.own.extents
        self._last_views: tuple[tuple[int, int, int], tuple[np.ndarray, ...]] | None = None

    def run_addresses(self, in0: int, in1: int, out: int) -> None:
        size = self._dtype.itemsize
        addresses = (in0, in1, out)
        last = self._last_views  # views are kept for the last addresses (10 us to make)
        if last is not None and last[0] == addresses:
            a, b, c = last[1]
        else:
            buffers = tuple(
                np.frombuffer((ctypes.c_char * (extent * size)).from_address(address), self._dtype)
                for address, extent in zip(addresses, self._own_extents)
            )
            a, b, c = self.form.views(buffers)  # type: ignore[arg-type]
            self._last_views = (addresses, (a, b, c))
        einsum(self.form.subscripts, a, b, out=c, **self._options())
        for (o0, o1, oo), rest in self.rests:
            rest.run_addresses(in0 + o0 * size, in1 + o1 * size, out + oo * size)

    def explain(self, name: str | None = None) -> str:
        extents = self._own_extents
        buffers = tuple(np.zeros(max(e, 1), self._dtype) for e in extents)  # never touched
        a, b, c = self.form.views(buffers)  # type: ignore[arg-type]
        plan = einsum_plan(self.form.subscripts, a, b, out=c, **self._options())
        lines = [
            explain_config(self.config.own, name),
            "",
            f"# compiled: as teir.einsum('{self.form.subscripts}') on views of the buffers "
            f"(accumulate={self.form.accumulate}, relu={self.form.relu}), since the loop nest "
            f"would run the generic scalar primitive ({self.reason}):",
            plan.explain(),
        ]
        return "\n".join(lines + self._rests_explained())

    def _options(self) -> dict[str, Any]:
        form = self.form
        return {"threads": self.threads, "accumulate": form.accumulate, "relu": form.relu}

    def __repr__(self) -> str:
        return (
            f"<teir.Operation {self.config.prim_main.value} {self.config.dim_sizes} as "
            f"einsum '{self.form.subscripts}'"
            + (f" + {len(self.rests)} rest(s)" if self.rests else "")
            + f", {self.threads} thread(s)>"
        )


# what compile returned, either kind: deciding again would lower the nest (0.2 ms) per call
_compiled: dict[tuple[Config, int, bool], Operation] = {}


def compile(
    config: Config, threads: int | None = None, *, resident_output: bool = False
) -> Operation:
    """Compile ``config`` into an :class:`Operation` (cached by configuration and threads).

    ``threads`` defaults to ``TEIR_NUM_THREADS`` or the cores this process may use.
    ``resident_output=True`` says the output will be memory that is reused call after call
    (not allocated anew for each call): a large one is then stored around the caches.
    A contraction whose layouts fit no GEMM kernel (the loop nest would call the generic
    scalar primitive) runs as :func:`teir.einsum` on views of the same buffers instead, which
    relays out what it must; ``explain()`` says so.

    >>> import numpy as np, teir
    >>> cfg = teir.Config(  # a batch axis innermost in every tensor
    ...     data_type="FP32", prim_first="Zero", prim_main="GEMM", prim_last="None",
    ...     dim_types=["C", "M", "N", "K"], exec_types=["seq", "prim", "prim", "prim"],
    ...     dim_sizes=[16, 64, 64, 64], strides_in0=[1, 1024, 0, 16],
    ...     strides_in1=[1, 0, 16, 1024], strides_out=[1, 1024, 16, 0])
    >>> op = teir.compile(cfg, threads=2)
    >>> "teir.einsum('" in op.explain()
    True
    >>> a = np.random.rand(64, 64, 16).astype(np.float32)  # [m, k, c]
    >>> b = np.random.rand(64, 64, 16).astype(np.float32)  # [k, n, c]
    >>> c = np.empty((64, 64, 16), np.float32)
    >>> op(a, b, c)
    >>> bool(np.allclose(c, np.einsum("mkc,knc->mnc", a, b), rtol=1e-4))
    True
    """
    count = checked_arguments(config, threads)
    key = (config, count, resident_output)
    found = _compiled.get(key)
    if found is not None:
        return found
    own = config.own
    form = einsum_form(own) if own.flops >= MIN_FLOPS else None
    nest = lower(own, resident_output) if form is not None else None
    reason = generic_reason(nest) if nest is not None else None
    if form is None or nest is None or reason is None:
        built = compile_nest(config, count, resident_output=resident_output)
    else:
        rests = tuple(
            (rest.offsets, compile(rest.config, count, resident_output=resident_output))
            for rest in config.rests
        )
        built = ViewedOperation(config, count, nest, form, reason, rests)
    return _compiled.setdefault(key, built)
