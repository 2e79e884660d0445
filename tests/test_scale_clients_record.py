"""benchmarks/scale_clients.py's rows: FedIOD's set-up time is its stage 1 only when the sites trained their
teachers; a run that found them in the stage-1 cache of its runs folder (an earlier size or setting with the
same sites) loads them instead, and its row says so rather than passing the load off as training."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale_clients


def fake_run(cached: float):  # type: ignore[no-untyped-def]
    """A stand-in for the measured `fedistill run`: the files a finished FedIOD run leaves."""

    def run_measured(command: list[str], sample_s: float, log: Path) -> dict[str, float]:
        out, name = Path(command[command.index("--out") + 1]), command[command.index("--name") + 1]
        run = out / name / "fediod"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "round_time_s": 2.0}) + "\n")
        final = {"test_accuracy": 0.5, "teachers_from_cache": cached}
        summary = {"setup_time_s": 0.5, "wall_time_s": 3.0, "test_accuracy": 0.5, "final": final}
        (run / "summary.json").write_text(json.dumps(summary))
        return {"wall_s": 4.0, "peak_rss_mb": 100.0, "tree_peak_mb": 120.0}

    return run_measured


@pytest.mark.parametrize("cached", [0.0, 10.0])
def test_a_row_says_whether_fediods_stage_1_came_from_the_cache(tmp_path, monkeypatch, cached):
    monkeypatch.setattr(scale_clients, "run_measured", fake_run(cached))
    args = argparse.Namespace(dataset="digits", data_dir="data", model="lenet5", rounds=1, out=str(tmp_path),
                              fraction=0.1, device="cpu", sample_s=0.5, set=[], results=str(tmp_path),
                              table_only=False, earlier_commands=[])  # fmt: skip
    row = scale_clients.one_run("fediod", 10, args)
    assert row["stage1_cached"] == cached
    scale_clients.write(args, [row], gflops=50.0)
    table = (tmp_path / "scale_clients.md").read_text()
    assert ("0.5 (teachers cached)" in table) == bool(cached)
