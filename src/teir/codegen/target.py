"""The machine code is generated for: triple, CPU name, features, and what follows from them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llvmlite.binding as llvm  # type: ignore[import-untyped]

from teir.errors import TeirError


@cache
def initialize_llvm() -> None:
    """Initialize LLVM's native target once per process."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


CPU_NAME_VARIABLE = "TEIR_CPU_NAME"
CACHE_SIZES_VARIABLE = "TEIR_CACHE_SIZES"


@dataclass(frozen=True)
class Target:
    """An LLVM code-generation target.

    ``vector_bits`` is the widest vector register the features allow (512 with AVX-512F, 256
    with AVX/AVX2, 128 for SSE2 and NEON) and ``vector_registers`` how many of them there are.
    """

    triple: str
    cpu: str
    features: str

    @property
    def is_x86(self) -> bool:
        return self.triple.startswith(("x86_64", "i386", "i686"))

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")

    @property
    def vector_bits(self) -> int:
        if self.is_x86:
            if self.has("avx512f"):
                return 512
            if self.has("avx"):
                return 256
        return 128

    @property
    def vector_registers(self) -> int:
        if self.is_x86:
            return 32 if self.has("avx512f") else 16
        return 32  # aarch64 has 32 SIMD registers

    @property
    def has_fma(self) -> bool:
        return self.has("fma") if self.is_x86 else True

    def lanes(self, itemsize: int) -> int:
        """Elements of ``itemsize`` bytes in one vector register."""
        return self.vector_bits // (8 * itemsize)

    @property
    def half_width_is_free(self) -> bool:
        """Whether half-width vectors reach the same FLOP rate: AMD Zen 4 runs 512-bit FMAs
        on two 256-bit pipes. Zen 5 (EPYC 9005, Ryzen 9000) has two full-width pipes, 64
        FP32 FLOP per cycle, and is blocked as Intel's AVX-512 cores are (its optimizer inputs,
        1600^3 FP64 on 2 threads: 72 -> 85 % of peak, 1000^3 FP64 77 -> 89 %); a Zen 5 that
        is double-pumped (the mobile parts) plans as Zen 4 with ``TEIR_CPU_NAME=znver4``."""
        return self.cpu == "znver4" and self.vector_bits == 512

    @property
    def near_l3(self) -> bool:
        """Whether the last-level cache answers a core's scattered lines far faster than
        memory: AMD Zen's L3, shared by the few cores of one complex (a 2-vCPU Xeon's mesh L3
        answered at about DRAM's rate)."""
        return self.cpu.startswith("znver")

    @property
    def key(self) -> str:
        """Identifies the generated code's target, for cache keys."""
        return f"{self.triple}|{self.cpu}|{self.features}"

    @staticmethod
    @cache
    def host() -> Target:
        """The machine this process runs on, as LLVM reports it.

        ``TEIR_CPU_NAME`` names another CPU model (as LLVM's ``-mcpu`` does: ``znver4``,
        ``sapphirerapids``) for code that is scheduled and blocked for it; the instruction set
        stays this machine's, so the code still runs here. Read once per process.
        """
        initialize_llvm()
        return Target(
            llvm.get_process_triple(),
            os.environ.get(CPU_NAME_VARIABLE, "").strip() or llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten(),
        )

    def without_avx512(self) -> Target:
        """This x86 target with every AVX-512 feature turned off (an AVX2-only machine)."""
        features = [f"-{f[1:]}" if f.startswith("+avx512") else f for f in self.features.split(",")]
        features = [f for f in features if not f.startswith("+amx") and not f.startswith("+avx10")]
        return Target(self.triple, "x86-64-v3" if self.is_x86 else self.cpu, ",".join(features))


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


@cache
def cache_sizes() -> dict[str, int]:
    """Per-core data cache sizes ("L1", "L2") and the last level ("L3") in bytes.

    ``TEIR_CACHE_SIZES`` (``L1=48K,L2=2M,L3=105M``: any of the three, bytes or K/M/G) stands
    in for what the system reports, for a machine that reports none or a wrong one (some
    VMs), and to plan as another machine would; it may also name ``L3share`` (see
    :func:`l3_share`) and ``L2ways`` (see :func:`l2_ways`). Read once per process.
    """
    sizes: dict[str, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(root.glob("index*")):
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            number = int((index / "level").read_text())
            sizes[f"L{number}"] = _parse_size((index / "size").read_text())
    except (OSError, ValueError):
        pass
    sizes.update((name, size) for name, size in _configured().items() if name in ("L1", "L2", "L3"))
    # Typical sizes where the system does not say.
    for name, default in (("L1", 32 * 1024), ("L2", 1024 * 1024), ("L3", 8 * 1024 * 1024)):
        sizes.setdefault(name, default)
    return sizes


# What TEIR_CACHE_SIZES may name, in its spelling.
CONFIGURABLE = {"L1": "L1", "L2": "L2", "L3": "L3", "L3SHARE": "L3share", "L2WAYS": "L2ways"}


def _configured() -> dict[str, int]:
    """What ``TEIR_CACHE_SIZES`` sets, keyed by :data:`CONFIGURABLE`'s spellings."""
    return _configured_cache_sizes(os.environ.get(CACHE_SIZES_VARIABLE, ""))


def _configured_cache_sizes(text: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, equals, value = part.partition("=")
        name = name.strip().upper()
        try:
            size = _parse_size(value) if equals else 0
        except ValueError:
            size = 0
        if name not in CONFIGURABLE or size <= 0:
            raise TeirError(
                f"{CACHE_SIZES_VARIABLE}={text!r}: cannot read {part.strip()!r}; write each "
                "cache as LEVEL=SIZE with LEVEL one of L1, L2, L3 (or L3share, the part of L3 "
                "this process can count on, or L2ways, the L2's associativity) and SIZE a "
                "positive number, optionally with K, M or G, e.g. "
                f"{CACHE_SIZES_VARIABLE}=L1=48K,L2=2M"
            )
        sizes[CONFIGURABLE[name]] = size
    return sizes


# The most of a shared L3 one CPU can count on (Zen 4 has 4 MiB per core, Sapphire Rapids
# about 2): a VM's few vCPUs see the whole socket's L3 (105 MiB on a 2-vCPU Xeon) but share
# it with other tenants' cores.
L3_SHARE_PER_CPU = 6 * 1024 * 1024


@cache
def l3_share() -> int:
    """The part of the last-level cache this process can count on: its size, at most
    ``L3_SHARE_PER_CPU`` per CPU that shares it here, or ``L3share`` of ``TEIR_CACHE_SIZES``
    (for a machine whose other tenants take more, or to plan as another machine would)."""
    l3 = cache_sizes()["L3"]
    configured = _configured().get("L3share")
    if configured is not None:
        return min(l3, configured)
    try:
        listed = Path("/sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list").read_text()
        cpus = cpu_list_count(listed)
    except (OSError, ValueError):
        return l3
    return min(l3, max(1, cpus) * L3_SHARE_PER_CPU)


def cpu_list_count(listed: str) -> int:
    """The CPUs in a kernel CPU list such as ``0-3,8,10-11``."""
    count = 0
    for part in listed.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
    return count


@cache
def l2_sets() -> int:
    """Sets of the per-core L2: lines whose addresses differ by a multiple of this many lines
    compete for one set's ways (:func:`l2_ways`)."""
    return max(1, cache_sizes()["L2"] // (64 * l2_ways()))


@cache
def l2_ways() -> int:
    """Ways of the per-core L2 (8 where the system does not say: Zen 4's, the fewest), or
    ``L2ways`` of ``TEIR_CACHE_SIZES``."""
    configured = _configured().get("L2ways")
    if configured is not None:
        return configured
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if int((index / "level").read_text()) == 2:
                return max(1, int((index / "ways_of_associativity").read_text()))
        except (OSError, ValueError):
            continue
    return 8


def probe_attribute(target: Target, stack_bytes: int) -> str:
    """The function attribute that probes a stack buffer page by page (x86), so that a thread
    with too small a stack stops at its guard page instead of writing past it."""
    return ' "probe-stack"="inline-asm"' if stack_bytes and target.is_x86 else ""
