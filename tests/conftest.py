import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile(
    "default",
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("TEIR_HYPOTHESIS_PROFILE", "default"))


# The two-pipe AVX-512 Xeon (Sapphire Rapids class: 48 KiB L1, 2 MiB 16-way L2, 2 vCPUs'
# share of L3) that planning tests written on one pin their machine to, whatever CPU runs them:
# the decisions they check (which kernel, which copies, how blocked) follow the CPU model and
# caches, and a Zen 4 (1 MiB L2, 512-bit FMAs on two 256-bit pipes) or a 16-core Xeon (16x the
# L3 share) rightly decides otherwise. The instruction set stays the host's, so what such a
# test compiles still runs.
XEON_CPU_NAME = "sapphirerapids"
XEON_CACHE_SIZES = "L1=48K,L2=2M,L3=105M,L3share=12M,L2ways=16"


def _forget_the_machine() -> None:
    from teir import machine
    from teir.codegen import target
    from teir.frontend.einsum import clear_plans
    from teir.tree import cost

    target.Target.host.cache_clear()
    for cached in (target.cache_sizes, target.l3_share, target.l2_sets, target.l2_ways):
        cached.cache_clear()
    machine.info.cache_clear()
    cost._contraction_cost.cache_clear()
    cost._is_generic.cache_clear()
    clear_plans()


@contextmanager
def pinned_machine(cpu_name: str, cache_sizes: str | None = None) -> Iterator[None]:
    """Plan (and compile) for the CPU model ``cpu_name`` and, where given, the cache sizes
    ``cache_sizes`` (TEIR_CACHE_SIZES' form), with this machine's instruction set; what was
    set before is restored afterwards."""
    from teir.codegen.target import CACHE_SIZES_VARIABLE, CPU_NAME_VARIABLE

    pinned = {CPU_NAME_VARIABLE: cpu_name}
    if cache_sizes is not None:
        pinned[CACHE_SIZES_VARIABLE] = cache_sizes
    before = {name: os.environ.get(name) for name in pinned}
    os.environ.update(pinned)
    _forget_the_machine()
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _forget_the_machine()


@pytest.fixture
def two_pipe_xeon() -> Iterator[None]:
    """Plan (and compile) as the two-pipe Xeon would, with this machine's instruction set."""
    with pinned_machine(XEON_CPU_NAME, XEON_CACHE_SIZES):
        yield
