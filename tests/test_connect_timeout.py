"""How long a Flower server waits for the sites' nodes to connect is a run setting (`connect_timeout`): a
deployment's sites may start minutes or hours after the server, and a fixed 300 s ended such runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedistill.config import RunConfig, build_config
from fedistill.errors import ConfigError


def test_the_flower_fleet_waits_as_long_as_the_run_says(monkeypatch, tmp_path):
    pytest.importorskip("flwr")
    from fedistill.algorithms.registry import get_algorithm
    from fedistill.data.partition import make_split
    from fedistill.engine import loop
    from fedistill.engine.prepared import Prepared
    from fedistill.federation.ledger import Ledger
    from fedistill.transports.flower import grid_fleet

    seen = {}
    monkeypatch.setattr(grid_fleet, "GridFleet", lambda grid, ledger, **kwargs: seen.update(kwargs))
    config = build_config(RunConfig(), {"clients": 2, "connect_timeout": 3600.0}, {})
    split = make_split(
        np.arange(40) % 4, np.arange(8) % 4, 2, method="iid", alpha=None, seed=0, num_classes=4
    )
    data = Prepared(None, split)  # the fleet reads only the split (no dataset: the sites share one)
    loop._fleet(config, get_algorithm("fedavg"), {}, Ledger(None), object(), tmp_path, data)
    assert seen["connect_timeout"] == 3600.0 and seen["expected_clients"] == 2
    assert RunConfig().connect_timeout == 300.0  # the default, as before


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan])
def test_a_connect_timeout_that_is_not_a_positive_finite_number_is_refused(value):
    with pytest.raises(ConfigError, match=rf"connect_timeout must be a finite number( > 0)?, got {value}"):
        build_config(RunConfig(), {"connect_timeout": value}, {})


def test_a_resume_may_change_the_connect_timeout():
    from fedistill.engine.resume import RESUME_MAY_CHANGE

    assert "connect_timeout" in RESUME_MAY_CHANGE
