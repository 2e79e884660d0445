"""benchmarks/flower_speed.py's record: its round times stand beside the machine's fp32 matmul rate, measured
in the same command, so that times measured on two hosts can be told apart."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import flower_speed


def test_the_record_names_the_matmul_rate_beside_the_round_times(tmp_path: Path):
    args = argparse.Namespace(dataset="digits", nodes=2, model="lenet-fedmdcg", fediod_iters=2,
                              results=str(tmp_path))  # fmt: skip
    row = {"transport": "inprocess", "run": "fedavg", "round_times_s": [2.0, 1.0], "steady_round_s": 1.0,
           "per_step_s": 1.0, "exchanges": 4, "wall_s": 9.0, "test_accuracy": 0.5}  # fmt: skip
    flower_speed.write(args, [row], gflops=87.6)
    record = json.loads((tmp_path / "flower_speed_digits.json").read_text())
    assert record["matmul_peak_gflops"] == 87.6
    assert "fp32 matmul 87.6 GFLOP/s at one thread" in (tmp_path / "flower_speed_digits.md").read_text()
