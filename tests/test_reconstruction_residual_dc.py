"""benchmarks/reconstruction_residual_dc.py's summary over seeds: each method's mean and spread, and at how
many seeds Centralized (the pooled-data ceiling) scored above FedIOD's student."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import reconstruction_residual_dc as rdc


def _result(variant: str, seed: int, fediod: float, centralized: float) -> dict:
    rows = {m: {"ssim": 0.80, "psnr": 24.0} for m in ("zero-filled", *rdc.METHODS)}
    rows["zero-filled"] = {"ssim": 0.66, "psnr": 20.0}
    rows["fediod"] = {"ssim": fediod, "psnr": 24.5}
    rows["centralized"] = {"ssim": centralized, "psnr": 24.7}
    return {"variant": variant, "seed": seed, "label": variant, "rows": rows}


def test_over_seeds_averages_each_method_and_counts_the_seeds_centralized_leads():
    results = [
        _result("default", 0, fediod=0.8471, centralized=0.8427),
        _result("no-truth", 0, fediod=0.8312, centralized=0.8427),
        _result("default", 1, fediod=0.8444, centralized=0.8504),
        _result("no-truth", 1, fediod=0.8288, centralized=0.8504),
    ]
    default, no_truth = rdc.over_seeds(results)
    assert (default["variant"], default["seeds"]) == ("default", [0, 1])
    assert default["centralized_above_fediod"] == 1 and no_truth["centralized_above_fediod"] == 2
    assert default["methods"]["fediod"]["ssim"] == pytest.approx((0.8471 + 0.8444) / 2)
    assert default["methods"]["fediod"]["ssim_std"] == pytest.approx(statistics.stdev([0.8471, 0.8444]))
    assert default["methods"]["zero-filled"]["ssim_std"] == 0.0


def test_seed_zero_keeps_the_folder_it_had_before_seeds_and_others_get_their_own():
    assert rdc.run_folder("default", 0) == "default"
    assert rdc.run_folder("no-truth", 2) == "no-truth-seed2"
