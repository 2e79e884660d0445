"""A suite of several algorithms in one process: what one run leaves behind must not change the next."""

import copy
from pathlib import Path

import pytest
import torch

from algorithm_helpers import TINY_FEDIOD
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite


def _final(out: Path, **changes) -> dict:
    layer = copy.deepcopy(TINY_FEDIOD) | {"rounds": 1, "stage1_cache": False}
    config = build_config(RunConfig(), layer, {"algorithm": "fediod", **changes})
    return run_suite(config, out, progress=False)[0]["final"]


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_suites_thread_count_does_not_outlive_it(tmp_path, one_thread):
    """Thread counts change float rounding: a run with `threads = 0` after one with `threads = 2` in the
    same process ran on two threads, and its numbers were not those of the same run in a fresh process."""
    fresh = _final(tmp_path / "fresh")
    _final(tmp_path / "two", threads=2)
    assert torch.get_num_threads() == 1
    assert _final(tmp_path / "after") == fresh


def test_an_algorithm_that_stops_a_suite_is_named(tmp_path, monkeypatch, capsys):
    """A suite of several algorithms stopped by one said only 'only 0 of 2 clients returned ...', not
    which algorithm's clients."""
    from fedistill.algorithms.classic.fedavg import FedAvgClient
    from fedistill.cli import main

    handle = FedAvgClient.handle

    def failing(self, message):
        if type(self) is FedAvgClient:  # FedDF's clients are FedAvg's too: only FedAvg's fail
            raise RuntimeError("out of memory")
        return handle(self, message)

    monkeypatch.setattr(FedAvgClient, "handle", failing)
    argv = ["run", "--algorithm", "standalone,fedavg,feddf", "--clients", "2", "--rounds", "1"]
    assert main([*argv, "--model", "mlp", "--quiet", "--out", str(tmp_path), "--name", "s"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedistill: run stopped: fedavg: only 0 of 2 clients returned"), err
    assert "client 0: RuntimeError: out of memory" in err and len(err.splitlines()) == 1
    assert (tmp_path / "s" / "standalone" / "summary.json").is_file()
