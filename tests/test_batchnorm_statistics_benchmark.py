"""The BatchNorm statistics benchmark (benchmarks/batchnorm_statistics.py): its estimates by hand on a tiny
net, so the record's columns mean what its text says."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import batchnorm_statistics as bench  # noqa: E402


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(), nn.Conv2d(2, 1, 1))


def test_batch_mean_is_the_plain_mean_of_each_batchs_own_statistics():
    net = _net()
    batches = [torch.randn(4, 1, 5, 5) * (i + 1) + i for i in range(3)]
    conv = net[0]
    with torch.no_grad():
        inputs = [conv(b) for b in batches]
    mean = torch.stack([h.mean((0, 2, 3)) for h in inputs]).mean(0)
    variance = torch.stack([h.var((0, 2, 3), unbiased=True) for h in inputs]).mean(0)

    averaged = bench.cumulative(net, iter(batches), lambda m, b: m(b))

    assert not averaged.training and averaged[1].momentum is None
    torch.testing.assert_close(averaged[1].running_mean, mean)
    torch.testing.assert_close(averaged[1].running_var, variance)


def test_moving_average_weighs_the_last_batch_by_the_momentum():
    net = _net()
    batches = [torch.randn(4, 1, 5, 5) + i for i in range(2)]
    with torch.no_grad():
        first, last = (net[0](b).mean((0, 2, 3)) for b in batches)
    averaged = bench.cumulative(net, iter(batches), lambda m, b: m(b), momentum=0.1)
    expected = 0.9 * (0.9 * 0.0 + 0.1 * first) + 0.1 * last  # from the reset mean of 0
    torch.testing.assert_close(averaged[1].running_mean, expected)


def test_distance_is_zero_for_the_same_statistics_and_in_standard_deviations_otherwise():
    mean, variance = np.array([0.0, 2.0]), np.array([4.0, 4.0])
    same = bench.distance({"bn": (mean, variance)}, {"bn": (mean, variance)})
    assert same == {"mean_in_std": 0.0, "abs_log_var_ratio": 0.0}
    moved = bench.distance({"bn": (mean + 1.0, variance * np.e)}, {"bn": (mean, variance)})
    assert moved["mean_in_std"] == pytest.approx(0.5)  # 1 over a standard deviation of 2
    assert moved["abs_log_var_ratio"] == pytest.approx(1.0)


def test_a_run_whose_checkpoint_holds_no_server_part_has_no_pool_row(tmp_path):
    from fedistill.engine.checkpoint import write_checkpoint

    run = tmp_path / "fediod-run"
    write_checkpoint(run / "checkpoints", "round-0001", {"client_0": {"model": {"w": torch.zeros(1)}}})
    assert bench.student_row(run, "FedIOD") is None  # not a KeyError
