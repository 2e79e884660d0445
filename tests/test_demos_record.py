"""benchmarks/demos.py and the README's demo block: each demo's printed table, time, memory, bytes and
machine land in one record, and the README's block (and the demos page, which includes it) is made from
that record, every number computed, none typed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedistill import cli
from fedistill.machine import describe, machine
from fedistill.reference.demo_block import DEMO_END, DEMO_START, demo_markdown, with_demo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import demos


def test_the_record_holds_what_each_demo_printed_and_reuse_runs_nothing(tmp_path, monkeypatch):
    tiny = ("--algorithm", "fedavg,standalone", "--rounds", "1", "--clients", "3", "--device", "cpu")
    monkeypatch.setattr(demos, "DEMOS", {"tiny": tiny})

    real_run = subprocess.run

    def in_process(command, *args, **kwargs):  # `python -m fedistill.cli run ...`, in this process
        if command[1:4] != ["-m", "fedistill.cli", "run"]:
            return real_run(command, *args, **kwargs)  # git, for the record's commit
        assert kwargs == {"check": False}  # demos.py reads the exit code itself, to stop with one line
        return subprocess.CompletedProcess(command, cli.main(command[3:]))

    monkeypatch.setattr(subprocess, "run", in_process)
    argv = ["--demos", "tiny", "--out", str(tmp_path / "runs"), "--results", str(tmp_path)]
    demos.main(argv)
    record = json.loads((tmp_path / "demos.json").read_text())
    tiny_demo = record["demos"]["tiny"]
    assert tiny_demo["process_s"] > 0 and tiny_demo["peak_memory_mb"] > 0
    assert list(tiny_demo["methods"]) == ["fedavg", "standalone"]  # the order the run printed
    fedavg = tiny_demo["methods"]["fedavg"]
    assert fedavg["all_bytes"] > fedavg["up_bytes"] > 0
    assert record["machine"] == describe(machine())
    assert all(
        m["final"] for m in tiny_demo["methods"].values()
    )  # both runs finished (exit code 0) and record["matmul_peak_gflops"] > 0
    assert "│ fedavg " in tiny_demo["terminal"] and "ran on:" in tiny_demo["terminal"]
    text = (tmp_path / "demos.md").read_text()
    assert f"Machine: {describe(machine())}" in text and str(tmp_path) not in text
    assert text.index(demos.TABLES_START) < text.index("| fedavg |") < text.index(demos.TABLES_END)

    def never(command, *args, **kwargs):
        if command[1:4] == ["-m", "fedistill.cli", "run"]:
            raise AssertionError("a finished demo ran again")
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", never)
    demos.main([*argv, "--reuse"])
    again = json.loads((tmp_path / "demos.json").read_text())["demos"]["tiny"]
    assert again["process_s"] == tiny_demo["process_s"]  # the timing of the run that made it


def _method(accuracy: float, all_bytes: float, seconds: float, **final: float) -> dict:
    return {"final": {"test_accuracy": accuracy, **final}, "all_bytes": all_bytes, "wall_time_s": seconds}


def test_the_readme_block_is_computed_from_the_record(tmp_path):
    methods = {
        "fediod": _method(0.95, 37.5e6, 32.5, fraction_of_ensemble=0.991),
        "standalone": _method(0.6131, 5.5e3, 3.6),
        "fedavg": _method(0.9667, 25.7e6, 4.7),
    }
    digits = {"terminal": "│ fediod │ 95.00 │\n", "process_s": 49.7, "methods": methods}
    record = {"machine": "Some CPU, 2 CPUs, AVX2 kernels", "commit": "abc1234", "demos": {"digits": digits}}
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "demos.json").write_text(json.dumps(record))
    text = demo_markdown(tmp_path)
    assert (
        "│ fediod │ 95.00 │" in text and "on Some CPU, 2 CPUs, AVX2 kernels, commit `abc1234`: 50 s" in text
    )
    assert "reaches 95.0% (0.99 of its teachers' ensemble)" in text and "average 61%" in text
    assert "is 1.7 points ahead" in text and "37.5 MB against FedAvg's 25.7 MB (1.5 times)" in text
    assert "in 6.9 times FedAvg's time" in text
    assert "another moves the digits a little" in text  # no kernel-path record yet
    values = {"native": 95.0, "avx2": 94.7222, "sse41": 95.8333}
    rows = [{"method": "fediod", "metric": "test_accuracy", "values": values}]
    kernels = tmp_path / "benchmarks" / "results" / "sweeps" / "kernel_paths_demo-digits.json"
    kernels.parent.mkdir()
    kernels.write_text(json.dumps({"sections": {"The digits demo": {"rows": rows}}}))
    assert "FedIOD scored 94.72-95.83% through 3 kernel paths of one host" in demo_markdown(tmp_path)
    readme = f"top\n{DEMO_START}\nold numbers\n{DEMO_END}\nbottom\n"
    fresh = with_demo(readme, tmp_path)
    assert (
        "old numbers" not in fresh and fresh.startswith("top\n") and fresh.endswith(f"{DEMO_END}\nbottom\n")
    )
    with pytest.raises(ValueError, match="lacks the markers"):
        with_demo("no markers\n", tmp_path)


def test_a_demo_that_fails_stops_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(demos, "DEMOS", {"tiny": ("--algorithm", "fedavg")})
    monkeypatch.setattr(subprocess, "run", lambda command, check: subprocess.CompletedProcess(command, 1))
    with pytest.raises(SystemExit, match="the tiny demo failed; its run is in"):
        demos.main(["--demos", "tiny", "--out", str(tmp_path / "runs"), "--results", str(tmp_path)])


def test_peak_memory_is_named_in_the_unit_it_was_measured_in():
    # a run's peak_memory_mb is ru_maxrss (KiB) / 1024: MiB, where the record's MB of traffic are 10^6 bytes
    demo = {"command": "fedistill run", "process_s": 44.5, "peak_memory_mb": 752.4375, "table": "| t |",
            "methods": {"fedavg": {"all_bytes": 25_747_200}}}  # fmt: skip
    payload = {"command": "python benchmarks/demos.py", "commit": "abc1234", "machine": "m",
               "matmul_peak_gflops": 94.1, "demos": {"digits": demo}}  # fmt: skip
    line = next(line for line in demos.markdown(payload) if line.startswith("**digits**"))
    assert "peak 752 MiB resident; MB both directions: fedavg 25.7." in line
