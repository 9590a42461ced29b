"""The compile cache: generated code by key, in memory and on disk as object code.

A key covers everything the machine code depends on: what is generated (the caller's
description, e.g. a kernel spec), the target (triple, CPU, features), LLVM's and llvmlite's
versions, the optimization level and a hash of teir's code generators' source, so a changed
generator never meets stale code.

Disk entries live under ``TEIR_CACHE_DIR`` (default: the platform's user cache directory plus
``teir``); ``TEIR_CACHE_DIR=`` (empty) disables the disk cache. Files are written to a
temporary name and renamed into place, so concurrent processes never see half a file; a file
that is truncated, corrupted or from another build fails its checksum and is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llvmlite  # type: ignore[import-untyped]
import llvmlite.binding as llvm  # type: ignore[import-untyped]

from teir.codegen.target import Target, cache_sizes, l2_ways
from teir.kernels import jit

MAGIC = b"TEIR-OBJ1\n"


@dataclass(frozen=True)
class Loaded:
    """Addresses of a compiled module's symbols and where the code came from."""

    symbols: dict[str, int]
    origin: str  # "compiled", "disk" or "memory"
    seconds: float


@cache
def _generator_hash() -> str:
    digest = hashlib.sha256()
    codegen = Path(__file__).resolve().parent.parent / "codegen"
    for path in sorted(codegen.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(description: str, target: Target) -> str:
    # Register blocks, batch chunks and stack buffers follow the cache sizes too (which
    # TEIR_CACHE_SIZES may set): code planned for other caches is not reused.
    caches = ",".join(f"{name}={size}" for name, size in sorted(cache_sizes().items()))
    parts = [
        description,
        target.key,
        f"{caches},L2ways={l2_ways()}",
        ".".join(map(str, llvm.llvm_version_info)),
        llvmlite.__version__,
        str(jit.OPT_LEVEL),
        jit.CODE_MODEL,
        jit.RELOCATION,
        _generator_hash(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def cache_dir() -> Path | None:
    """The disk cache directory, or ``None`` when disabled by ``TEIR_CACHE_DIR=``."""
    configured = os.environ.get("TEIR_CACHE_DIR")
    if configured is not None:
        return Path(configured).expanduser() if configured.strip() else None
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "teir"


def _read(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    header = len(MAGIC) + 32
    if len(data) < header or not data.startswith(MAGIC):
        return None
    payload = data[header:]
    if hashlib.sha256(payload).digest() != data[len(MAGIC) : header]:
        return None
    return payload


def _write(path: Path, code: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".o")
        with os.fdopen(handle, "wb") as stream:
            stream.write(MAGIC + hashlib.sha256(code).digest() + code)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only or full disk only costs the next process a compile


class CodeCache:
    """Compiled modules by key: memory first, then disk, then LLVM."""

    def __init__(self) -> None:
        self._memory: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}

    def get(
        self, description: str, target: Target, suffixes: list[str], generate: Callable[[str], str]
    ) -> Loaded:
        """Addresses of the symbols ``prefix + suffix`` of the module ``generate(prefix)``
        (called only on a miss), compiled for ``target``; keyed by ``description``.

        The prefix is derived from the key, so every loaded object defines distinct symbols.
        ``Loaded.symbols`` maps each suffix to its address.
        """
        start = time.perf_counter()
        key = cache_key(description, target)
        found = self._memory.get(key)
        if found is not None:
            return Loaded(found, "memory", time.perf_counter() - start)
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        with building:  # one thread builds a key; the others wait and reuse it
            found = self._memory.get(key)
            if found is not None:
                return Loaded(found, "memory", time.perf_counter() - start)
            prefix = f"teir_{key}"
            names = [prefix + suffix for suffix in suffixes]
            directory = cache_dir()
            path = directory / f"{key}.o" if directory is not None else None
            code = _read(path) if path is not None else None
            origin = "disk"
            addresses = None
            if code is not None:
                try:
                    addresses = jit.load_object(code, names)
                except RuntimeError:
                    addresses = None  # a foreign object that does not define our symbols
            if addresses is None:
                origin = "compiled"
                code = jit.compile_object(generate(prefix), target)
                if path is not None:
                    _write(path, code)
                addresses = jit.load_object(code, names)
            by_suffix = {suffix: addresses[prefix + suffix] for suffix in suffixes}
            self._memory[key] = by_suffix
            return Loaded(by_suffix, origin, time.perf_counter() - start)


CODE_CACHE = CodeCache()
