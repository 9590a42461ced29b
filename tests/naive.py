"""A scalar, pure-Python interpreter of TEIR semantics: a third oracle for small configurations.

It shares no code with teir's executors: loops over every index one element at a time, in the
order the spec gives, with first/last access found by scanning the iteration sequence for each
output tile position. It tracks, per output element, a bound on the magnitude of everything
summed into it and the number of terms, so callers can compare with a rounding tolerance.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

ROLES = {"C": (1, 1, 1), "M": (1, 0, 1), "N": (0, 1, 1), "K": (1, 1, 0)}


@dataclass
class NaiveResult:
    values: list[float]
    scale: list[float]
    terms: list[int]
    written: list[bool]


def naive_execute(cfg: dict, in0: list[float], in1: list[float], out: list[float]) -> NaiveResult:
    types = [t.upper() for t in cfg["dim_types"]]
    execs = [e.lower() for e in cfg["exec_types"]]
    sizes = cfg["dim_sizes"]
    s0, s1, so = cfg["strides_in0"], cfg["strides_in1"], cfg["strides_out"]
    first, main, last = (
        cfg["prim_first"].lower(),
        cfg["prim_main"].lower(),
        cfg["prim_last"].lower(),
    )
    loops = [i for i, e in enumerate(execs) if e != "prim"]
    prims = [i for i, e in enumerate(execs) if e == "prim"]
    tile_axes = [i for i in prims if types[i] != "K"]
    k_axes = [i for i in prims if types[i] == "K"]

    values = [float(v) for v in out]
    scale = [abs(v) for v in values]
    terms = [0] * len(values)
    written = [False] * len(values)

    iterations = list(itertools.product(*(range(sizes[i]) for i in loops)))
    k_count = 1
    for a in k_axes:
        k_count *= sizes[a]

    def base(strides: list[int], idx: tuple[int, ...]) -> int:
        return sum(i * strides[a] for i, a in zip(idx, loops))

    first_at: dict[int, int] = {}
    last_at: dict[int, int] = {}
    for number, idx in enumerate(iterations):
        position = base(so, idx)
        first_at.setdefault(position, number)
        last_at[position] = number

    def tile_positions(b: int) -> list[tuple[tuple[int, ...], int]]:
        result = []
        for t_idx in itertools.product(*(range(sizes[a]) for a in tile_axes)):
            result.append((t_idx, b + sum(i * so[a] for i, a in zip(t_idx, tile_axes))))
        return result

    def relu(b: int) -> None:
        for _, p in tile_positions(b):
            values[p] = max(values[p], 0.0)
            written[p] = True

    for number, idx in enumerate(iterations):
        bo, b0, b1 = base(so, idx), base(s0, idx), base(s1, idx)
        if first_at[bo] == number:
            if first == "zero":
                for _, p in tile_positions(bo):
                    values[p], scale[p], terms[p], written[p] = 0.0, 0.0, 0, True
            elif first == "relu":
                relu(bo)
        if main in ("gemm", "brgemm"):
            for t_idx, p in tile_positions(bo):
                fixed = dict(zip(tile_axes, t_idx))
                total, magnitude = 0.0, 0.0
                for k_idx in itertools.product(*(range(sizes[a]) for a in k_axes)):
                    full = {**fixed, **dict(zip(k_axes, k_idx))}
                    a = in0[b0 + sum(i * s0[ax] for ax, i in full.items())]
                    b = in1[b1 + sum(i * s1[ax] for ax, i in full.items())]
                    total += float(a) * float(b)
                    magnitude += abs(float(a) * float(b))
                values[p] += total
                scale[p] += magnitude
                terms[p] += k_count
                written[p] = True
        elif main in ("copy", "identity", "relu"):
            for t_idx, p in tile_positions(bo):
                v = float(in0[b0 + sum(i * s0[a] for i, a in zip(t_idx, tile_axes))])
                values[p] = max(v, 0.0) if main == "relu" else v
                scale[p], terms[p], written[p] = abs(v), 0, True
        if last_at[bo] == number and last == "relu":
            relu(bo)
    return NaiveResult(values, scale, terms, written)


def assert_matches_naive(cfg: dict, out_after: np.ndarray, result: NaiveResult, dtype) -> None:
    """``out_after`` equals the naive result within a rounding bound of the summation."""
    eps = float(np.finfo(dtype).eps)
    got = out_after.reshape(-1, order="A").astype(np.float64)
    for p, expected in enumerate(result.values):
        expected_cast = float(np.asarray(expected, dtype=dtype))
        allowed = 4 * eps * (result.terms[p] + 2) * result.scale[p]
        assert abs(got[p] - expected_cast) <= allowed or got[p] == expected_cast, (
            f"out[{p}] = {got[p]!r}, naive interpreter gives {expected_cast!r} "
            f"(allowed error {allowed:.3g}) for {cfg}"
        )
