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
