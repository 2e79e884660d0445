"""`fediod.label_shares`: Eq. 8's label term from the sites' class counts (the paper's "number of samples
from class c", the released code's) or from their class frequencies (the ratio P_Y'k(y) / P_Y'(y) the
paper says the term corresponds to)."""

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

COUNTS = torch.tensor([[90.0, 10.0, 0.0], [5.0, 5.0, 0.0], [100.0, 300.0, 50.0]])  # sizes 100, 10, 450


def _config(**fediod) -> RunConfig:
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def test_counts_and_frequencies_on_a_hand_computed_case():
    """Class 0 is held 90 / 5 / 100 times by sites of 100 / 10 / 450 samples. Counts: 90/195, 5/195,
    100/195. Frequencies 0.9 / 0.5 / 0.2222 normalised over the sites: 0.5548 / 0.3082 / 0.1370, so the
    small site whose class 0 is half its data now outweighs the large one that holds more of it. The two
    readings differ by the sites' sizes: frequencies times sizes, normalised, give the counts back."""
    federation = Federation([0, 1, 2], COUNTS.sum(1), COUNTS)
    counts = federation.share([0, 1, 2], 3)
    torch.testing.assert_close(counts[:, 0], torch.tensor([90.0, 5.0, 100.0]) / 195)
    federation.label_shares = "frequencies"
    frequencies = federation.share([0, 1, 2], 3)
    ratio = torch.tensor([0.9, 0.5, 100 / 450])
    torch.testing.assert_close(frequencies[:, 0], ratio / ratio.sum())
    torch.testing.assert_close(frequencies[:, 2], torch.tensor([0.0, 0.0, 1.0]))  # one holder: all its
    sizes = COUNTS.sum(1, keepdim=True)
    back = frequencies * sizes / (frequencies * sizes).sum(0, keepdim=True)
    torch.testing.assert_close(back, counts)
    torch.testing.assert_close(L.class_frequencies(torch.zeros(1, 3)), torch.zeros(1, 3))  # an empty site


def test_frequencies_with_square_roots():
    """share_power applies to the frequencies as it does to the counts."""
    federation = Federation([0, 1, 2], COUNTS.sum(1), COUNTS, share_power=0.5, label_shares="frequencies")
    rooted = torch.tensor([0.9, 0.5, 100 / 450]).sqrt()
    torch.testing.assert_close(federation.share([0, 1, 2], 3)[:, 0], rooted / rooted.sum())


def test_an_unknown_reading_is_refused():
    with pytest.raises(ConfigError, match=r"label_shares"):
        options_for(_config(label_shares="probabilities"), "fediod", FedIODOptions)


def test_a_run_weighs_its_teachers_by_the_frequencies_the_sites_counts_give_and_keeps_them_on_resume():
    config = _config(label_shares="frequencies", ensemble_weighting="class-share")
    clients, server, _ = fediod_parts(config)
    server.setup(InProcessFleet(clients, Ledger(None)))
    federation = server.federation
    assert federation is not None and federation.counts is not None
    expected = L.class_share(L.class_frequencies(federation.counts.float()))
    torch.testing.assert_close(federation.share(federation.clients, expected.shape[1]), expected)
    restored = FedIODServer(server.ctx)
    restored.load_state_dict(server.state_dict())
    assert restored.federation is not None and restored.federation.label_shares == "frequencies"
    torch.testing.assert_close(restored.federation.share(federation.clients, expected.shape[1]), expected)
