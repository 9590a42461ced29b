"""``teir.optimize``: write the schedule for a configuration.

A pipeline of small passes, each semantics-preserving (configuration in, configuration out):
drop size-1 axes, fuse stride-coherent axes, identify the primitive (GEMM or BRGEMM and the
kernel layout that fits the unit strides, with block sizes for the caches), reorder the loops
(copies: in both tensors' memory order, in blocks),
cut the outer tile loop into panels where the inner one outgrows L2, and share loops between
threads. ``optimize_with_log`` also returns each pass's decision.

>>> import teir
>>> gemm = teir.optimize({"data_type": "FP32", "prim_main": "GEMM",
...     "dim_types": ["M", "N", "K"], "exec_types": ["seq"] * 3, "dim_sizes": [256, 256, 256],
...     "strides_in0": [1, 0, 256], "strides_in1": [0, 256, 1], "strides_out": [1, 256, 0]},
...     threads=2)
>>> gemm.prim_main.is_contraction, len(gemm.prim_axes) >= 3
(True, True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from math import prod
from typing import Any

from teir.errors import TeirError
from teir.ir import Config, DimType, ExecType, PrimFirst, PrimLast, Rest, Tensor
from teir.ir.layout import is_injective
from teir.optimizer.partial import (
    THREAD_SPLIT_IDLE,
    describe,
    idle_share,
    problem_regions,
    thread_split_axes,
)
from teir.optimizer.primitive import contraction, unary
from teir.optimizer.problem import Problem, problem_from, read_source
from teir.optimizer.schedule import panel, parallelize, reorder
from teir.optimizer.simplify import drop_size_one, fuse_coherent
from teir.runtime.pool import default_threads


def optimize_with_log(
    config: Config | Mapping[str, Any] | str | os.PathLike[str],
    threads: int | None = None,
    *,
    resident_output: bool = False,
    partial_tiles: bool = True,
) -> tuple[Config, tuple[str, ...]]:
    """The optimized configuration and one line per pass saying what it decided.

    ``partial_tiles=False`` keeps every axis in one region (no ``rests``): for callers that
    have split the operation into its regions themselves."""
    config = read_source(config)
    if isinstance(config, Config) and config.rests:
        return _optimize_parts(config, threads, resident_output, partial_tiles)
    problem = problem_from(config)
    threads = default_threads() if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise TeirError(f"threads must be a positive integer, got {threads!r}")
    prims = problem.primitives
    order_matters = (
        prims.prim_first is not PrimFirst.NONE
        or prims.prim_last is not PrimLast.NONE
        or prims.prim_main.is_unary
    )
    out_axes = [a for a in problem.axes if a.dim_type is not DimType.K]
    distinct = is_injective([a.size for a in out_axes], [a.stride(Tensor.OUT) for a in out_axes])
    if order_matters and not distinct:
        # Tiles are identified by position: re-tiling an aliasing output would move first/last
        # accesses (or the order of overwrites), so the schedule stays as written.
        if isinstance(config, Config):
            return config, ("the output aliases: the schedule is kept as written",)
        raise TeirError(
            "the output aliases and the operation has first/last primitives or "
            "overwrites: its schedule cannot be re-tiled safely; write the prim "
            "axes yourself"
        )
    log = []
    for step in (drop_size_one, fuse_coherent):
        problem, text = step(problem)
        log.append(f"{step.__name__}: {text}")
    regions = problem_regions(problem) if partial_tiles else [(problem, (0, 0, 0))]
    first: tuple[Config, list[str]] | None = None  # the main region's schedule, where made
    if len(regions) == 1:
        scheduled, lines = _schedule(problem, threads, resident_output)
        idle = idle_share(_parallel_size(scheduled), threads)
        if not partial_tiles or idle < THREAD_SPLIT_IDLE:
            return scheduled, (*log, *lines)
        regions, first = _regions_for_threads(problem, threads, resident_output, idle)
        if not regions:
            return scheduled, (*log, *lines)
        log.append(
            f"partial tiles: {describe(problem, regions)} (its main part gives the threads "
            "loops they share evenly)"
        )
    else:
        log.append(f"partial tiles: {describe(problem, regions)}")
    parts = []
    for index, (region, offsets) in enumerate(regions):
        if index == 0 and first is not None:
            scheduled, lines = first
        else:
            region, _ = drop_size_one(region)  # a rest one element thin
            scheduled, lines = _schedule(region, threads, resident_output)
        parts.append(Rest(offsets, scheduled))
        log += [f"region {index}: {line}" for line in lines]
    main = parts[0].config
    return Config(main.primitives, main.schedule, rests=tuple(parts[1:])), tuple(log)


def _parallel_size(config: Config) -> int:
    """Iterations of the loops the threads share (1: none)."""
    shared = [n for n, e in zip(config.dim_sizes, config.exec_types) if e is ExecType.SHARED]
    return prod(shared)


def _regions_for_threads(
    problem: Problem, threads: int, resident_output: bool, idle: float
) -> tuple[list[tuple[Problem, tuple[int, int, int]]], tuple[Config, list[str]] | None]:
    """The regions of the first output axis split (``thread_split_axes``) whose main part
    leaves the threads idle at least THREAD_SPLIT_IDLE less than ``idle``, and less by more
    than its rest costs, with the main part's schedule (made to judge it); or none."""
    for index, cost in thread_split_axes(problem, threads):
        regions = problem_regions(problem, forced=index)
        main = _schedule(regions[0][0], threads, resident_output)
        now = idle_share(_parallel_size(main[0]), threads)
        if now <= idle - THREAD_SPLIT_IDLE and cost < idle - now:
            return regions, main
    return [], None


def _schedule(problem: Problem, threads: int, resident_output: bool) -> tuple[Config, list[str]]:
    """The passes after simplification: primitive, loop order, panels, threads."""
    prims = problem.primitives
    log = []
    if prims.prim_main.is_contraction:
        problem, text = contraction(problem, threads, resident_output)
        log.append(f"identify primitive: {text}")
    else:
        problem, text = unary(problem)
        log.append(f"identify primitive: {text}")
    problem, text = reorder(problem)
    log.append(f"reorder: {text}")
    problem, text = panel(problem, threads)
    log.append(f"panel: {text}")
    problem, text = parallelize(problem, threads)
    log.append(f"parallelize: {text}")
    return problem.to_config(), log


def _optimize_parts(
    config: Config, threads: int | None, resident_output: bool, partial_tiles: bool
) -> tuple[Config, tuple[str, ...]]:
    """A configuration that has rests already: each part optimized on its own (and split
    further where it needs it), their regions listed in the order the parts run."""
    parts: list[Rest] = []
    log: list[str] = []
    for index, part in enumerate(config.parts):
        optimized, lines = optimize_with_log(
            part.config, threads, resident_output=resident_output, partial_tiles=partial_tiles
        )
        log += [f"part {index}: {line}" for line in lines]
        (o0, o1, oo) = part.offsets
        parts += [
            Rest((o0 + r.offsets[0], o1 + r.offsets[1], oo + r.offsets[2]), r.config)
            for r in optimized.parts
        ]
    main = parts[0].config
    return Config(main.primitives, main.schedule, rests=tuple(parts[1:])), tuple(log)


def optimize(
    config: Config | Mapping[str, Any] | str | os.PathLike[str],
    threads: int | None = None,
    *,
    resident_output: bool = False,
    partial_tiles: bool = True,
) -> Config:
    """An equivalent configuration scheduled for speed on this machine with ``threads``.

    ``config`` may also be a mapping of the fields, or the path of a JSON file holding them,
    whose prim axes are not chosen yet (all ``seq``, as the course's optimizer inputs are).
    ``resident_output=True`` says the output will be memory reused call after call (an
    ``out`` array, not one allocated for each call): a large one is then tiled in longer
    column runs, to be stored around the caches (compile it with the same flag).

    Partial tiles: an axis with no good tile size (a C, M or N axis above 320, or a K axis
    above 1000, with no divisor from 16 to 320: 1601, 4099) is split into a main part (a
    multiple of 16) and its thin rest, and each combination of parts is scheduled as a region
    of its own: the result's ``rests`` (:class:`teir.Rest`, teir's extension of TEIR) run
    after its own schedule on the same tensors, and ``explain()`` lists them. A contraction
    whose output axes give the threads no loop to share at all (97 x 311) has one of them
    split alike, the one whose rest costs least (``teir.optimizer.partial``).
    ``partial_tiles=False`` keeps every axis whole instead (a flat TEIR configuration).

    >>> import teir
    >>> cfg = teir.optimize({"data_type": "FP64", "prim_first": "Zero", "prim_main": "GEMM",
    ...     "dim_types": ["M", "N", "K"], "exec_types": ["seq"] * 3, "dim_sizes": [97, 1601, 300],
    ...     "strides_in0": [1, 0, 97], "strides_in1": [0, 300, 1], "strides_out": [1, 97, 0]},
    ...     threads=2)
    >>> [(rest.offsets, rest.config.flops) for rest in cfg.rests]  # the column j = 1600
    [((0, 480000, 155200), 58200)]
    """
    return optimize_with_log(
        config, threads, resident_output=resident_output, partial_tiles=partial_tiles
    )[0]


__all__ = ["Problem", "optimize", "optimize_with_log"]
