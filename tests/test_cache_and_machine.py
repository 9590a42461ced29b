"""The kernel cache (memory, disk, corruption, concurrency), the machine probe, the bench CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from teir import machine
from teir.cli.main import main
from teir.kernels import cache_dir

LOAD = """
import json, sys
from teir import kernels
k = kernels.brgemm("f64", 13, 11, 7, 2, stride_a=100, stride_b=100, beta=0)
import numpy as np
a = np.random.rand(300); b = np.random.rand(300); c = np.zeros(13 * 11)
k(a, b, c)
expected = sum(a[i * 100:i * 100 + 91].reshape(7, 13).T @ b[i * 100:i * 100 + 77].reshape(11, 7).T
               for i in range(2))
ok = bool(np.allclose(c.reshape(11, 13).T, expected))
print(json.dumps({"origin": k.origin, "ms": k.load_seconds * 1e3, "ok": ok}))
"""


def load_in_subprocess(directory: Path | str) -> dict:
    environment = dict(os.environ, TEIR_CACHE_DIR=str(directory))
    result = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, env=environment, check=True
    )
    return json.loads(result.stdout)


def test_disk_cache_compiles_once_then_loads(tmp_path):
    first = load_in_subprocess(tmp_path)
    assert first == {**first, "origin": "compiled", "ok": True}
    files = list(tmp_path.glob("*.o"))
    assert len(files) == 1
    second = load_in_subprocess(tmp_path)
    assert second["origin"] == "disk" and second["ok"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip"])
def test_corrupted_cache_file_is_rebuilt(tmp_path, damage):
    load_in_subprocess(tmp_path)
    (path,) = tmp_path.glob("*.o")
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x7fELF not really an object")
    else:
        path.write_bytes(data[:-10] + bytes(b ^ 0xFF for b in data[-10:]))
    again = load_in_subprocess(tmp_path)
    assert again["origin"] == "compiled" and again["ok"]
    assert load_in_subprocess(tmp_path)["origin"] == "disk"


def test_empty_cache_dir_disables_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TEIR_CACHE_DIR", "")
    assert cache_dir() is None
    environment = dict(
        os.environ, TEIR_CACHE_DIR="", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg")
    )
    result = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, env=environment, check=True
    )
    assert json.loads(result.stdout)["origin"] == "compiled"
    assert not list(tmp_path.rglob("*.o"))


def test_default_cache_dir_follows_the_platform(monkeypatch, tmp_path):
    monkeypatch.delenv("TEIR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert cache_dir() == tmp_path / "teir"


def test_concurrent_processes_share_the_cache_safely(tmp_path):
    environment = dict(os.environ, TEIR_CACHE_DIR=str(tmp_path))
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True, env=environment
        )
        for _ in range(4)
    ]
    results = [json.loads(p.communicate()[0]) for p in processes]
    assert all(r["ok"] for r in results)
    assert not list(tmp_path.glob(".tmp-*"))
    assert load_in_subprocess(tmp_path)["origin"] == "disk"


def test_unwritable_cache_dir_still_works(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert load_in_subprocess(blocker / "cache")["ok"]


def test_machine_info_and_probe():
    info = machine.info()
    assert info.cores == machine.usable_cores() >= 1
    assert info.vector_bits in (128, 256, 512)
    assert {"L1", "L2", "L3"} <= set(info.caches)
    assert machine.peak_gflops("f32", 1, seconds=0.01) > 0.5
    assert machine.peak_gflops("f64", 2, seconds=0.01) > 0.5
    assert machine.copy_bandwidth(1 << 16, seconds=0.01) > 0.1
    assert machine.copy_bandwidth(1 << 16, seconds=0.01, threads=2) > 0.1


@pytest.mark.parametrize("streamed", [False, True])
def test_the_copy_probe_copies(streamed):
    """Both probes (regular stores, and stores around the caches for copies beyond the L3
    share) copy every element: the bandwidth they report is of a real copy."""
    import ctypes

    from teir.buffers import aligned_empty
    from teir.codegen.probes import copy_block_bytes, copy_probe
    from teir.codegen.target import Target
    from teir.kernels.cache import CODE_CACHE

    target = Target.host()
    loaded = CODE_CACHE.get(
        f"test:copy{streamed}", target, [""], lambda name: copy_probe(target, name, streamed)
    )
    probe = ctypes.CFUNCTYPE(
        None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64
    )(loaded.symbols[""])
    blocks = 37
    source = np.arange(blocks * copy_block_bytes(target) // 4 + 8, dtype=np.float32)
    destination = aligned_empty(source.shape, np.float32)
    destination[...] = -1
    probe(source.ctypes.data, destination.ctypes.data, blocks, 2)
    copied = blocks * copy_block_bytes(target) // 4
    assert np.array_equal(destination[:copied], source[:copied])
    assert (destination[copied:] == -1).all()


def test_bench_kernels_json(capsys):
    assert main(["bench", "kernels", "--dtype", "f64", "--json", "--seconds", "0.002"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == "f64" and report["peak_gflops_1core"] > 0
    kinds = {row["kernel"] for row in report["rows"]}
    assert {"gemm", "brgemm(batch 16)", "zero", "copy", "relu", "copy^T"} <= kinds
    for row in report["rows"]:
        assert row["loop"] > 0 and row["call"] > 0 and row["compile_ms"] > 0
        assert row["load_ms"] is None or row["load_ms"] >= 0


def test_the_l3_share_counts_the_cpus_that_share_it(monkeypatch):
    """A VM's vCPUs see the socket's whole L3 but share it with other tenants: a process
    counts at most L3_SHARE_PER_CPU per CPU listed as sharing it (unless TEIR_CACHE_SIZES
    names its share)."""
    from teir.codegen.target import (
        CACHE_SIZES_VARIABLE,
        L3_SHARE_PER_CPU,
        cache_sizes,
        cpu_list_count,
        l3_share,
    )

    assert cpu_list_count("0-1\n") == 2
    assert cpu_list_count("0-3,8,10-11") == 7
    assert cpu_list_count("5") == 1
    monkeypatch.delenv(CACHE_SIZES_VARIABLE, raising=False)
    for cached in (cache_sizes, l3_share):
        cached.cache_clear()
    try:
        assert 0 < l3_share() <= cache_sizes()["L3"]
        listed = Path("/sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list")
        if listed.exists():
            assert l3_share() <= cpu_list_count(listed.read_text()) * L3_SHARE_PER_CPU
    finally:
        monkeypatch.undo()
        for cached in (cache_sizes, l3_share):
            cached.cache_clear()


def test_copies_beyond_a_cores_l2_are_planned_in_memory(two_pipe_xeon, monkeypatch):
    """A copy whose tensors outgrow a core's L2, or this process's share of L3 where that is
    smaller, is planned as one between buffers in memory, even where the whole L3 would
    hold it (on the Xeon, whose L3 answers at about DRAM's rate)."""
    from teir.lower import tiles

    monkeypatch.setattr(tiles, "cache_sizes", lambda: {"L1": 1 << 15, "L2": 1 << 21, "L3": 1 << 30})
    monkeypatch.setattr(tiles, "l3_share", lambda: 1 << 23)
    assert tiles.copy_outgrows_cache(1 << 19, 4)  # 4 MiB moved
    assert not tiles.copy_outgrows_cache(1 << 18, 4)  # 2 MiB: the L2 holds it
    monkeypatch.setattr(tiles, "l3_share", lambda: 1 << 20)
    assert tiles.copy_outgrows_cache(1 << 18, 4)
    assert not tiles.copy_outgrows_cache(1 << 17, 4)


FAR_APART = """
import numpy as np, teir
reserved = []
for n in range(3, 60):
    for subscripts, a, b in (
        ("ikb,kjb->ijb", np.random.rand(n, 17, 8), np.random.rand(17, 5, 8)),
        ("bik,bkj->bij", np.random.rand(3, n, 17), np.random.rand(3, 17, 5)),
    ):
        assert np.allclose(teir.einsum(subscripts, a, b, threads=1), np.einsum(subscripts, a, b))
    try:
        reserved.append(np.empty(3 << 30, np.uint8))  # address space only: never touched
    except MemoryError:
        break
print(len(reserved))
"""


def test_kernels_load_after_the_process_reserved_much_address_space():
    """New kernels are loaded while the process holds tens of GiB of (untouched) arrays: with
    the default code model, MCJIT placed a kernel's code and constants more than 2 GiB apart
    there, and LLVM aborted the interpreter on the 32-bit relocation between them (3 of 3
    runs, after 30-50 kernels)."""
    environment = dict(os.environ, TEIR_CACHE_DIR="")  # compile each kernel here
    result = subprocess.run(
        [sys.executable, "-c", FAR_APART], capture_output=True, text=True, env=environment
    )
    assert result.returncode == 0, result.stderr[-2000:]
    if int(result.stdout) < 20:
        pytest.skip("this machine does not let a process reserve 60 GiB of address space")


def test_the_machine_can_be_named_in_the_environment(two_pipe_xeon):
    """TEIR_CPU_NAME and TEIR_CACHE_SIZES stand in for the CPU model and cache sizes the
    system reports (the instruction set stays the host's, so the code still runs), and a
    malformed size says what to write instead."""
    import teir
    from teir.codegen.target import (
        CACHE_SIZES_VARIABLE,
        Target,
        cache_sizes,
        l2_ways,
        l3_share,
    )
    from teir.kernels.cache import cache_key

    host = Target.host()
    assert host.cpu == "sapphirerapids" and not host.half_width_is_free
    pinned_key = cache_key("kernel", host)
    assert cache_sizes() == {"L1": 48 * 1024, "L2": 2 << 20, "L3": 105 << 20}
    # the L3 share and the L2's ways are the pinned machine's too, whatever this one's are
    assert l3_share() == 12 << 20 and l2_ways() == 16
    a = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(teir.einsum("ij,jk->ik", a, a.T), a @ a.T)
    for text in ("L4=1M", "L2=two", "L2", "L1=0", "L2ways=0", "L3share=-1M"):
        os.environ[CACHE_SIZES_VARIABLE] = text
        cache_sizes.cache_clear()
        with pytest.raises(teir.TeirError, match="LEVEL=SIZE"):
            cache_sizes()
    os.environ[CACHE_SIZES_VARIABLE] = " l2 = 512K ,L3=32M, l3share=200M"
    for cached in (cache_sizes, l3_share):
        cached.cache_clear()
    assert cache_sizes()["L2"] == 512 * 1024 and "L3share" not in cache_sizes()
    assert l3_share() == 32 << 20  # never more than the L3 itself
    # code planned for other cache sizes is compiled afresh, not taken from the cache
    assert cache_key("kernel", host) != pinned_key


def test_copies_within_a_near_l3_share_are_planned_in_cache(monkeypatch):
    """Where the L3 is near (Zen), a copy is planned in memory only beyond this process's
    share of it, not from just past L2 on."""
    from conftest import pinned_machine
    from teir.codegen.target import Target
    from teir.lower import tiles

    with pinned_machine("znver4"):
        assert Target.host().near_l3
        monkeypatch.setattr(
            tiles, "cache_sizes", lambda: {"L1": 1 << 15, "L2": 1 << 20, "L3": 1 << 25}
        )
        monkeypatch.setattr(tiles, "l3_share", lambda: 12 << 20)
        assert not tiles.copy_outgrows_cache(1 << 20, 4)  # 8 MiB moved: the L3 share holds it
        assert tiles.copy_outgrows_cache(2 << 20, 4)  # 16 MiB
