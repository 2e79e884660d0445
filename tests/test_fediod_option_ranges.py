"""FedIOD refuses option values that would silently train something else: a negative or non-finite loss
weight flips or poisons a term of G's loss, a collapse share outside [0, 1] never or always warns, and a
negative sample-grid period plots every epoch; and on classification it refuses the per-pixel tasks' keys,
which it would accept and never use."""

import math

import pytest

from fedistill.algorithms.fediod import FedIODOptions, resolve_options
from fedistill.algorithms.registry import get_algorithm
from fedistill.config import RunConfig, build_config, options_for
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


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("generator_blocks", 4),
        ("noise_channels", 0),
        ("discriminator_layers", 2),
        ("mask_source", "prior"),
        ("mask_pool", 10),
        ("w_perceptual", 0.5),
        ("ratio_resolution", "pixel"),
    ],
)
def test_per_pixel_keys_on_classification_are_refused(key, value):
    """Classification's G draws from noise and its D_k is the unconditional patch discriminator: keys of
    the per-pixel tasks' conditional networks and mask uploads would be accepted and never used."""
    config = build_config(RunConfig(), {"fediod": {key: value}})
    options = options_for(config, "fediod", FedIODOptions)
    with pytest.raises(ConfigError, match=rf"fediod\.{key} .*per-pixel"):
        resolve_options(config, options, per_pixel=False)
    assert getattr(resolve_options(config, options, per_pixel=True), key) == value


def test_per_pixel_keys_at_their_defaults_are_accepted_on_classification():
    """A ready config may name a default; only a value that would change something is refused."""
    layer = {"fediod": {"generator_blocks": 9, "mask_source": "clients", "w_perceptual": 1.0}}
    config = build_config(RunConfig(), layer)
    resolve_options(config, options_for(config, "fediod", FedIODOptions), per_pixel=False)


def test_a_synthetic_batch_of_one_sample_is_refused():
    """G, every D_k and the student train with batch statistics: one sample has none (the student's
    BatchNorm would otherwise stop the first G-step with a bare ValueError)."""
    with pytest.raises(ConfigError, match=r"fediod\.synthetic_batch_size must be >= 2"):
        FedIODOptions(synthetic_batch_size=1).validate()
    FedIODOptions(synthetic_batch_size=2).validate()


def test_a_replay_batch_of_one_sample_is_refused():
    """The replay steps train the student on batch statistics too; 0 still means the synthetic batch."""
    with pytest.raises(ConfigError, match=r"fediod\.pool_batch_size must be 0 .* or >= 2"):
        FedIODOptions(pool_batch_size=1).validate()
    FedIODOptions(pool_batch_size=0).validate()
    FedIODOptions(pool_batch_size=2).validate()


@pytest.mark.parametrize("name", ["fediod", "asyndgan"])
@pytest.mark.parametrize("value", [0, -2, True, False, "12"])
def test_a_g_step_count_that_is_no_count_of_at_least_one_is_refused(name, value):
    """`true` would otherwise run one G-step an epoch (a bool is an int), and the message says what counts."""
    with pytest.raises(
        ConfigError, match=rf"^{name}\.iters_per_epoch must be max, min or a number >= 1; got"
    ):
        get_algorithm(name).options(iters_per_epoch=value).validate()
