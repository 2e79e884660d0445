"""FedIOD refuses option values that would silently train something else: a negative or non-finite loss
weight flips or poisons a term of G's loss, a collapse share outside [0, 1] never or always warns, and a
negative sample-grid period plots every epoch."""

import math

import pytest

from fedistill.algorithms.fediod import FedIODOptions
from fedistill.errors import ConfigError


@pytest.mark.parametrize("key", ["w_gan", "w_conf", "w_unique", "w_adv", "w_balance"])
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_a_loss_weight_that_is_negative_or_not_finite_is_refused(key, value):
    with pytest.raises(ConfigError, match=rf"fediod\.{key} must be a finite number >= 0"):
        FedIODOptions(**{key: value}).validate()


@pytest.mark.parametrize("share", [-0.1, 1.5, math.nan])
def test_a_collapse_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ConfigError, match=r"fediod\.collapse_share"):
        FedIODOptions(collapse_share=share).validate()


def test_a_negative_sample_grid_period_is_refused():
    with pytest.raises(ConfigError, match=r"fediod\.samples_every must be >= 0"):
        FedIODOptions(samples_every=-1).validate()


def test_zero_weights_and_the_ends_of_the_share_are_accepted():
    FedIODOptions(w_adv=0.0, w_balance=0.0, w_unique=0.0, collapse_share=1.0, samples_every=0).validate()
    FedIODOptions(collapse_share=0.0).validate()
