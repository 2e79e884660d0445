"""The device smoke check's per-pixel FedIOD runs use the per-pixel settings, not the classification ones
(a config layer's table replaced the other whole, so both dense FedIOD runs ran the paper preset)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import device_smoke


def test_per_pixel_fediod_runs_take_the_per_pixel_table():
    runs = dict(device_smoke.planned_runs(["fediod", "fedavg"]))
    assert runs["fediod"]["fediod"] == device_smoke.PER_ALGORITHM["fediod"]["fediod"]
    for task in ("segmentation", "reconstruction"):
        assert runs[f"fediod-{task}"]["fediod"] == device_smoke.DENSE_FEDIOD["fediod"]
        assert runs[f"fediod-{task}"]["dataset"] == device_smoke.DENSE_TASKS[task]["dataset"]
    assert runs["asyndgan-segmentation"]["asyndgan"] == device_smoke.PER_ALGORITHM["asyndgan"]["asyndgan"]
