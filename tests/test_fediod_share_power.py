"""`fediod.share_power`: the class counts' power in the class shares that weigh the teachers per class."""

import copy

import pytest
import torch

from algorithm_helpers import TINY_FEDIOD, fediod_parts
from fedistill.algorithms.fediod import FedIODOptions, FedIODServer
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.server import Federation
from fedistill.config import RunConfig, build_config, options_for
from fedistill.errors import ConfigError
from fedistill.federation.ledger import Ledger
from fedistill.transports.inprocess import InProcessFleet


def _config(**fediod) -> RunConfig:
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def test_square_root_shares_on_a_hand_computed_case():
    """Counts 9 / 1 / 0 of class 0 give shares 0.9 / 0.1 / 0 at power 1 and 3/4 / 1/4 / 0 at power 0.5; a
    class nobody holds stays uniform."""
    counts = torch.tensor([[9.0, 16.0, 0.0], [1.0, 4.0, 0.0], [0.0, 16.0, 0.0]])
    federation = Federation([0, 1, 2], torch.tensor([25.0, 5.0, 16.0]), counts)
    paper = federation.share([0, 1, 2], 3)
    torch.testing.assert_close(paper[:, 0], torch.tensor([0.9, 0.1, 0.0]))
    torch.testing.assert_close(paper[:, 1], torch.tensor([16 / 36, 4 / 36, 16 / 36]))
    federation.share_power = 0.5
    rooted = federation.share([0, 1, 2], 3)
    torch.testing.assert_close(rooted[:, 0], torch.tensor([0.75, 0.25, 0.0]))
    torch.testing.assert_close(rooted[:, 1], torch.tensor([0.4, 0.2, 0.4]))
    torch.testing.assert_close(rooted[:, 2], torch.full((3,), 1 / 3))
    # over a subset of the sites the shares renormalise over those asked
    torch.testing.assert_close(federation.share([1, 2], 3)[:, 1], torch.tensor([2 / 6, 4 / 6]))


@pytest.mark.parametrize("power", [0.0, -0.5])
def test_a_share_power_that_is_not_positive_is_refused(power):
    with pytest.raises(ConfigError, match=r"fediod\.share_power must be > 0"):
        options_for(_config(share_power=power), "fediod", FedIODOptions)


def test_a_run_weighs_its_teachers_by_the_rooted_counts_the_sites_sent_and_keeps_them_on_resume():
    """After stage 1 the server's shares are the rooted shares of the label counts the sites reported, and
    a server restored from the state keeps the power (a resumed run weighs the teachers alike)."""
    config = _config(share_power=0.5, ensemble_weighting="class-share")
    clients, server, _ = fediod_parts(config)
    server.setup(InProcessFleet(clients, Ledger(None)))
    federation = server.federation
    assert federation is not None and federation.counts is not None
    expected = L.class_share(federation.counts.float().sqrt())
    torch.testing.assert_close(federation.share(federation.clients, expected.shape[1]), expected)
    restored = FedIODServer(server.ctx)
    restored.load_state_dict(server.state_dict())
    assert restored.federation is not None and restored.federation.share_power == 0.5
    torch.testing.assert_close(restored.federation.share(federation.clients, expected.shape[1]), expected)
