"""benchmarks/foundation_fmnist.py runs again into the folder of its last run: `fedistill run` refuses to
write over a run, so each of the script's runs (and its timed default main job, which always has the same
name) starts from an empty folder of its own instead of stopping the script with a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import foundation_fmnist


def test_a_second_run_replaces_the_folder_of_the_first(tmp_path: Path, monkeypatch):
    earlier = tmp_path / "default-main-job"
    (earlier / "fedavg").mkdir(parents=True)
    (earlier / "results.json").write_text("[]")
    seen = []

    def fake_run(command: list[str], check: bool) -> subprocess.CompletedProcess:
        seen.append(earlier.exists())  # what `fedistill run` finds when it starts
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(foundation_fmnist.subprocess, "run", fake_run)
    seconds = foundation_fmnist.fedistill(["--out", str(tmp_path), "--name", earlier.name])
    assert seen == [False]
    assert seconds >= 0.0


def test_the_record_names_the_machine_its_runs_give_and_its_matmul_rate(tmp_path: Path, monkeypatch):
    # wall times beside the machine the runs name and its measured rate, not a machine typed into the code
    monkeypatch.setattr(foundation_fmnist, "RESULTS", tmp_path)
    args = type("Args", (), {"rounds": 1, "seeds": "0"})()
    demo = [{"algorithm": "fedavg", "test_accuracy": 0.9, "wall_time_s": 1.0, "peak_memory_mb": 10.0,
             "machine": {"cpu": "Some CPU", "cpus": 16, "kernels": "AVX2"}}]  # fmt: skip
    foundation_fmnist.write([], demo, 2.0, args, gflops=42.0)
    text = (tmp_path / "foundation_fmnist.md").read_text()
    assert "2-core CPU" not in text
    assert "Some CPU, 16 CPUs" in text and "fp32 matmul 42.0 GFLOP/s" in text
