"""The command line: validate, run, explain."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import EXAMPLES
from teir.cli.main import main

VALID = sorted(EXAMPLES.glob("*.json"))
INVALID = sorted((EXAMPLES / "invalid").glob("*.json"))


def test_validate_ok(capsys):
    assert main(["validate", *map(str, VALID)]) == 0
    out = capsys.readouterr().out
    assert out.count(": OK") == len(VALID)


def test_validate_reports_every_violation_per_file(capsys):
    assert main(["validate", str(VALID[0]), *map(str, INVALID)]) == 1
    out = capsys.readouterr().out
    assert f"{VALID[0]}: OK" in out
    for path in INVALID:
        assert f"{path}: INVALID" in out
    assert "[R2]" in out and "[stride-zero]" in out and "[unary]" in out


def test_validate_unreadable_file(capsys, tmp_path):
    assert main(["validate", str(tmp_path / "missing.json")]) == 1
    assert "UNREADABLE" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["lab3_zero_brgemm_relu", "lab1_gemm", "permute_abcd_dcab"])
def test_run_check(capsys, name):
    assert main(["run", str(EXAMPLES / f"{name}.json"), "--check", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "check against np.einsum: OK" in out
    assert ("GFLOP/s" in out) == (not name.startswith("permute"))


def test_run_json(capsys):
    assert (
        main(
            [
                "run",
                str(EXAMPLES / "lab2_brgemm.json"),
                "--json",
                "--check",
                "--repeat",
                "2",
                "--seed",
                "7",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "native"
    assert report["flops"] == 536870912
    assert len(report["seconds"]) == 2
    assert report["check"]["ok"] is True
    assert report["gflops"] > 0


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_run_refuses_tensors_beyond_the_machines_memory(tmp_path, capsys, backend):
    """A configuration that validates but whose tensors span terabytes gets an error naming
    the sizes, not NumPy's MemoryError traceback."""
    config = json.loads((EXAMPLES / "lab1_gemm.json").read_text())
    config["dim_sizes"][0] = 2**30  # in0 and out then span 32 TiB and 128 TiB
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(config))
    assert main(["run", str(path), "--backend", backend, "--threads", "1"]) == 1
    error = capsys.readouterr().err
    assert "GiB of memory" in error and "reduce dim_sizes" in error and "Traceback" not in error


def test_run_check_fails_loudly_on_mismatch(capsys, monkeypatch):
    from teir.cli import run_cmd

    def wrong(config, threads):
        def execute(in0, in1, out):
            run_cmd.reference.execute(config, in0, in1, out)
            out.reshape(-1)[3] += 1.0

        return execute

    monkeypatch.setitem(run_cmd.BACKENDS, "native", wrong)
    assert main(["run", str(EXAMPLES / "lab1_gemm.json"), "--check", "--repeat", "1"]) == 1
    captured = capsys.readouterr()
    assert "MISMATCH" in captured.out
    assert "CHECK FAILED" in captured.err


def test_run_invalid_config_is_an_error(capsys):
    assert main(["run", str(EXAMPLES / "invalid" / "R3.json")]) == 1
    assert "[R3]" in capsys.readouterr().err


def test_run_check_on_aliasing_output_explains(capsys, tmp_path):
    path = tmp_path / "alias.json"
    path.write_text(
        json.dumps(
            dict(
                data_type="FP32",
                prim_main="Copy",
                dim_types=["C", "C"],
                exec_types=["seq", "prim"],
                dim_sizes=[4, 3],
                strides_in0=[3, 1],
                strides_in1=[0, 0],
                strides_out=[0, 1],
            )
        )
    )
    assert main(["run", str(path)]) == 0
    assert main(["run", str(path), "--check"]) == 1
    assert "aliasing" in capsys.readouterr().err


def test_run_rejects_bad_repeat():
    with pytest.raises(SystemExit) as info:
        main(["run", str(VALID[0]), "--repeat", "0"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["run", "FILE", "--seed", "-1"], "--seed: must be at least 0"),
        (["run", "FILE", "--seed", "x"], "--seed: 'x' is not an integer"),
        (["run", "FILE", "--threads", "0"], "--threads: must be at least 1"),
        (["explain", "FILE", "--threads", "-2"], "--threads: must be at least 1"),
        (["optimize", "FILE", "--threads", "0"], "--threads: must be at least 1"),
        (["demo", "--threads", "0"], "--threads: must be at least 1"),
        (["tree", "[0,1],[1,2]->[0,2]", "--sizes", "2,3,4", "--seconds", "inf"], "--seconds"),
        (["tree", "[0,1],[1,2]->[0,2]", "--sizes", "2,3,4", "--seconds", "nan"], "--seconds"),
        (["tree", "[0,1],[1,2]->[0,2]", "--sizes", "2,3,4", "--seconds", "-1"], "--seconds"),
        (["bench", "einsum", "--rounds", "0"], "--rounds: must be at least 1"),
        (["bench", "trees", "--seconds", "0"], "--seconds"),
        (["bench", "kernels", "--dtype", "f16"], "--dtype"),
    ],
)
def test_bad_arguments_are_refused_while_parsing(capsys, arguments, message):
    """Each bad value gets argparse's one-line usage error (exit status 2) before any work:
    a negative seed was NumPy's traceback, an infinite --seconds ran forever, --threads 0
    was refused by some commands only after probing the machine."""
    arguments = [str(VALID[0]) if a == "FILE" else a for a in arguments]
    with pytest.raises(SystemExit) as info:
        main(arguments)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_dtype_may_be_spelled_in_capitals(capsys):
    assert main(["tree", "[0,1],[1,2]->[0,2]", "--sizes", "2,3,4", "--dtype", "FP64"]) == 0
    assert "float64" in capsys.readouterr().out


def test_explain(capsys):
    assert main(["explain", str(EXAMPLES / "lab3_zero_brgemm_relu.json")]) == 0
    out = capsys.readouterr().out
    assert "for m0 in range(32):" in out and "for n1 in range(32):" in out
    assert "# compiled:" in out
    assert "Zero(out_tile [m3=32 x n4=32] strides (1, 32))" in out
    assert "BRGEMM: out_tile[m3,n4] += sum over k2 (batch-reduce, 8)" in out
    assert "ReLU(out_tile" in out


def test_explain_first_and_last_access_under_a_k_loop(capsys, tmp_path):
    data = json.loads((EXAMPLES / "lab1_gemm.json").read_text())
    path = tmp_path / "zero_gemm_relu.json"
    path.write_text(json.dumps(dict(data, prim_first="Zero", prim_last="ReLU")))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "for k2 in range(8):" in out
    assert "first access: when k2 == 0 (out has no aliasing)" in out
    assert "last access: when k2 == size - 1 (out has no aliasing)" in out


def test_console_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "teir", "validate", str(EXAMPLES / "lab1_gemm.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert ": OK" in result.stdout


def test_explain_compiled(capsys):
    assert main(["explain", str(EXAMPLES / "lab2_brgemm.json"), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "# compiled:" in out and "brgemm_f32_32x32x32_b8" in out


def test_explain_config_only(capsys):
    assert main(["explain", str(EXAMPLES / "lab2_brgemm.json"), "--config-only"]) == 0
    assert "# compiled:" not in capsys.readouterr().out


def test_run_native_with_threads(capsys):
    assert (
        main(
            [
                "run",
                str(EXAMPLES / "lab3_zero_brgemm_relu.json"),
                "--threads",
                "2",
                "--check",
                "--repeat",
                "2",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "native" and report["check"]["ok"]


def test_demo(capsys):
    assert main(["demo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["rows"]) >= 9
    assert all(row["check"] == "OK" for row in report["rows"])
    assert all(row["rate"] > 0 and row["numpy_seconds"] > 0 for row in report["rows"])


def test_bench_course(capsys):
    assert main(["bench", "course", "--dtype", "f64", "--seconds", "0.01", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["rows"]) == 6
    assert all(row["gflops"] > 0 and row["fraction"] > 0 for row in report["rows"])
    optimized = report["optimizer_inputs"]  # teir and NumPy's best of alternating rounds
    assert [row["name"] for row in optimized] == ["opt_gemm_1600", "opt_contraction_64_25"]
    assert all(row["gflops"] > 0 and row["numpy_gflops"] > 0 for row in optimized)


def test_optimize_command(capsys, tmp_path):
    target = tmp_path / "scheduled.json"
    assert (
        main(
            [
                "optimize",
                str(EXAMPLES / "unscheduled" / "opt_gemm_1600.json"),
                "--threads",
                "2",
                "-o",
                str(target),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "# identify primitive:" in out
    assert main(["validate", str(target)]) == 0


def test_run_optimize_unscheduled(capsys):
    path = EXAMPLES / "unscheduled" / "opt_contraction_64_25.json"
    assert main(["run", str(path), "--optimize", "--check", "--repeat", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["ok"] and report["gflops"] > 1


@pytest.mark.parametrize(
    "string",
    ["[[0,2]->[2,0]],[1,2]->[1,0]", "[3,2,0],[3,1,2]->[1,0]", "[3,2,1,0]->[3,1,2,0]"],
)
@pytest.mark.parametrize("optimize", [[], ["--no-optimize"]])
def test_tree_command_checks_against_numpy(capsys, string, optimize):
    status = main(["tree", string, "--sizes", "7,5,6,3", "--dtype", "f64", *optimize])
    out = capsys.readouterr().out
    assert status == 0
    assert "check against NumPy: OK" in out


def test_tree_command_explain_and_bench(capsys):
    string = "[[8,4],[7,3,8]->[7,3,4]],[[[2,6,7],[1,5,6]->[1,2,5,7]],[0,5]->[0,1,2,7]]->[0,1,2,3,4]"
    sizes = "6,5,7,8,3,4,9,5,3"
    assert (
        main(["tree", string, "--sizes", sizes, "--explain", "--bench", "--seconds", "0.01"]) == 0
    )
    out = capsys.readouterr().out
    assert out.count("## step") >= 4  # the optimizer may add permutation nodes
    assert "GFLOP/s" in out and "check against NumPy: OK" in out


def test_tree_command_errors_point_at_the_problem(capsys):
    assert main(["tree", "[0,1],[1,2->[0,2]", "--sizes", "3,3,3"]) == 1
    err = capsys.readouterr().err
    assert "position" in err and "^" in err
    assert main(["tree", "[0,1],[1,2]->[0,2]", "--sizes", "3,x"]) == 1
    assert "--sizes" in capsys.readouterr().err
    assert main(["tree", "[0,1],[1,2]->[0,2]", "--sizes", "3,3"]) == 1
    assert "ids [2]" in capsys.readouterr().err
    assert main(["tree", "[0,1],[1,2]->[0,2]", "--sizes", "3,,3"]) == 1
    assert "entry 1 is empty" in capsys.readouterr().err
    assert main(["tree", "[0,1],[1,2]->[0,2]", "--sizes", "2,3,99999999999999999999"]) == 1
    assert "the node [0,2] would hold" in capsys.readouterr().err
    # leaves larger than the machine's memory: an error before any is allocated
    assert main(["tree", "[0,1],[1,2]->[0,2]", "--sizes", "100000,100000,100000"]) == 1
    err = capsys.readouterr().err
    assert "random leaves" in err and "more than this machine's" in err and "--sizes" in err


def test_bench_trees_expression_follows_the_tree():
    from teir.bench.trees import COURSE_TREES, expression, opt_einsum_peak
    from teir.tree.parse import parse_tree

    _, string, sizes = COURSE_TREES[0]
    subscripts, path = expression(parse_tree(string))
    assert subscripts == "ie,hdi,cgh,bfg,af->abcde"
    assert path == [[0, 1], [0, 1], [0, 2], [0, 1]]
    assert opt_einsum_peak(parse_tree(string), sizes, 4) > 0


def test_baseline_processes_start_with_the_thread_count():
    # The runner imports NumPy (through teir) before its own code runs, so the thread count
    # must already be in the environment it starts with.
    from teir.bench.einsum_suite import baseline_environment

    script = (
        "import os, teir; print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['OMP_NUM_THREADS'])"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        env=baseline_environment(3),
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.split() == ["3", "3"]


def test_bench_einsum_keeps_each_libraries_best_round(monkeypatch, capsys):
    # Rounds alternate teir and the baselines, so a slow phase of the machine does not land
    # on one library only; each case keeps its best round.
    from teir.bench import einsum_suite

    monkeypatch.setattr(
        einsum_suite, "CONTRACTIONS", [("gemm", "ik,kj->ij", {"i": 8, "j": 8, "k": 8})]
    )
    monkeypatch.setattr(einsum_suite, "PERMUTATIONS", [("t", "ij->ji", {"i": 8, "j": 16})])
    teir_times = iter([3.0, 4.0, 2.0, 5.0])  # round 1: both cases, then round 2

    def time_teir(subscripts, arrays, out, threads, seconds):
        einsum_suite.einsum(subscripts, *arrays, out=out, threads=threads)
        return next(teir_times)

    monkeypatch.setattr(einsum_suite, "_time_teir", time_teir)
    rounds = {"numpy": iter([[6.0, None], [9.0, 8.0]]), "torch": iter([[1.0, 1.0], [3.0, 0.5]])}
    seconds = []

    def baseline(library, requests, threads, share):
        seconds.append(share)
        return next(rounds[library])

    monkeypatch.setattr(einsum_suite, "_baseline", baseline)
    report = einsum_suite.run("f64", seconds=0.5, threads=1, rounds=2)
    assert seconds == [0.25] * 4
    gemm, transpose = report["rows"]
    assert (gemm["seconds"], gemm["numpy"], gemm["torch"]) == (2.0, 6.0, 1.0)
    # a baseline that failed in one round keeps the rounds it ran
    assert (transpose["seconds"], transpose["numpy"], transpose["torch"]) == (4.0, 8.0, 0.5)
    assert gemm["speedup_numpy"] == 3.0 and transpose["speedup_torch"] == 0.125
    assert gemm["ok"] and transpose["ok"]
    assert "best of 2 rounds" in einsum_suite.format_report(report)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["bench", "einsum", "--rounds", "0"])
    assert info.value.code == 2
    assert "--rounds: must be at least 1" in capsys.readouterr().err
