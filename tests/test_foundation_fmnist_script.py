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
