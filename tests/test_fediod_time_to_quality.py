"""The time-to-quality benchmark (benchmarks/fediod_time_to_quality.py) reads FedIOD's validated student the
way the engine selects it: a tie on the validation splits goes to the later epoch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import fediod_time_to_quality as t2q  # noqa: E402


def test_a_validation_tie_hands_over_the_later_epoch(tmp_path: Path):
    rows = [
        {"round": 1, "round_time_s": 1.0, "val_accuracy": 0.5, "test_accuracy": 0.40},
        {"round": 2, "round_time_s": 1.0, "val_accuracy": 0.5, "test_accuracy": 0.45},  # a tie: taken
        {"round": 3, "round_time_s": 1.0, "val_accuracy": 0.4, "test_accuracy": 0.60},  # worse: not taken
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"wall_time_s": 5.0, "final": {"ensemble_accuracy": 0.5}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    curve = t2q.fediod_curve(tmp_path, iters=10)
    assert [p["validated_accuracy"] for p in curve["points"]] == [0.40, 0.45, 0.45]
    assert curve["stage1_and_setup_s"] == 2.0


def test_a_student_exactly_at_a_threshold_of_its_ensemble_reaches_it(tmp_path: Path):
    # 0.72 is exactly 0.90 of an ensemble at 0.80, though 0.72 / 0.80 is 0.8999999999999999 in floats
    rows = [
        {"round": 1, "round_time_s": 1.0, "val_accuracy": 0.5, "test_accuracy": 0.70},
        {"round": 2, "round_time_s": 1.0, "val_accuracy": 0.6, "test_accuracy": 0.72},
        {"round": 3, "round_time_s": 1.0, "val_accuracy": 0.7, "test_accuracy": 0.76},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"wall_time_s": 5.0, "final": {"ensemble_accuracy": 0.80}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    curve = t2q.fediod_curve(tmp_path, iters=10)
    assert curve["reached"] == {
        "0.90": {"wall_s": 4.0, "g_steps": 20},
        "0.95": {"wall_s": 5.0, "g_steps": 30},
    }


def test_a_run_that_never_validates_hands_over_each_epochs_student(tmp_path: Path):
    # `fediod.selection = "last"`: no validation scores, the last epoch's student is the one handed over
    rows = [
        {"round": 1, "round_time_s": 1.0, "test_accuracy": 0.30},
        {"round": 2, "round_time_s": 1.0, "test_accuracy": 0.48},
        {"round": 3, "round_time_s": 1.0, "test_accuracy": 0.46},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"wall_time_s": 5.0, "final": {"ensemble_accuracy": 0.5}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    curve = t2q.fediod_curve(tmp_path, iters=10)
    assert [p["validated_accuracy"] for p in curve["points"]] == [0.30, 0.48, 0.46]
    assert curve["reached"] == {
        "0.90": {"wall_s": 4.0, "g_steps": 20},
        "0.95": {"wall_s": 4.0, "g_steps": 20},
    }
    assert curve["final"]["validated_accuracy"] == 0.46


def test_the_report_names_the_machine_and_its_matmul_rate_beside_the_wall_times():
    # wall times mean nothing without the speed of the machine that measured them
    point = {"epoch": 1, "g_steps": 10, "wall_s": 3.0, "validated_accuracy": 0.4, "of_ensemble": 0.8}
    fedavg_point = {"round": 1, "wall_s": 2.0, "test_accuracy": 0.5}
    result = {
        "dataset": "digits",
        "alpha": 0.5,
        "fediod": {"ensemble_accuracy": 0.5, "stage1_and_setup_s": 2.0, "points": [point],
                   "reached": {"0.90": None, "0.95": None}, "wall_time_s": 3.0, "final": point},
        "fedavg": {"points": [fedavg_point], "final": fedavg_point, "wall_time_s": 2.0,
                   "reaches_fediod_final": None},
    }  # fmt: skip
    provenance = t2q.provenance(["/nowhere"], gflops=123.4, threads=2)
    assert provenance == {
        "machine": "not recorded",
        "matmul_peak_gflops": 123.4,
        "threads": 2,
    }
    text = t2q.report(result | provenance, "python benchmarks/fediod_time_to_quality.py")
    assert "fp32 matmul 123.4 GFLOP/s at 2 thread(s)" in text
    assert "Machine: not recorded" in text
