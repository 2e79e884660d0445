"""Each option with a fixed set of values names every value it accepts in its help line (`fedistill list
--options NAME`), the values its check gives when a misspelt one is refused."""

from __future__ import annotations

import dataclasses
import re

import pytest

from fedistill.algorithms.registry import algorithm_names, get_algorithm
from fedistill.errors import ConfigError
from fedistill.reference.options import options_of

TEXT_OPTIONS = [
    (name, option) for name in algorithm_names() for option in options_of(name) if option.type == "str"
]


def _accepted(name: str, key: str) -> list[str]:
    """The values a misspelt `key` is answered with, [] when it is no choice (a model name, a path)."""
    try:
        get_algorithm(name).options(**{key: "bogus"}).validate()
    except ConfigError as exc:
        listed = re.search(rf"\.{key} must be one of (.*?); got 'bogus'", str(exc))
        pair = re.search(rf"\.{key} must be '?([\w-]+)'? or '?([\w-]+)'?, got 'bogus'", str(exc))
        return listed.group(1).split(", ") if listed else list(pair.groups()) if pair else []
    return []


@pytest.mark.parametrize(("name", "option"), TEXT_OPTIONS, ids=lambda x: getattr(x, "name", x))
def test_a_choice_options_help_names_every_value_it_accepts(name, option):
    missing = [
        value
        for value in _accepted(name, option.name)
        if not re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", option.doc)
    ]
    assert not missing, f"{name}.{option.name}'s help never names {missing}: {option.doc!r}"


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedavgm", "feddf", "fediod"])
@pytest.mark.parametrize(("key", "values"), [("dp_accountant", "rdp, prv"), ("dp_noise_seed", "secret, run")])
def test_a_misspelt_privacy_choice_is_named_under_its_table(name, key, values):
    with pytest.raises(ConfigError) as refused:
        get_algorithm(name).options(**{key: "bogus"}).validate()
    assert str(refused.value) == f"{name}.{key} must be one of {values}; got 'bogus'"


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        (
            "fedavg-oneshot",
            ["dp_enabled", "dp_clip_norm", "groups", "prox_mu", "aggregate", "source", "steps"],
        ),
        ("feddf-oneshot", ["dp_enabled", "dp_delta", "groups", "student_init", "drop_worst"]),
        ("flmrcm", ["mu", "dp_enabled", "dp_noise_seed"]),
    ],
)
def test_the_options_listing_leaves_out_the_keys_an_algorithm_refuses(name, refused):
    """The one-shot baselines and FL-MRCM inherit keys (FedDF's per-round keys, FedProx's mu, the dp_*
    keys) that they refuse when set: `fedistill list --options` and the reference page listed them as if
    they could be set. Each such key is refused, and neither listing names it."""
    from fedistill.reference.options import format_options, options_markdown

    listed = {option.name for option in options_of(name)}
    assert not listed & set(refused)
    for key in refused:
        assert not re.search(rf"^  {key} = ", format_options(name), re.M)
        assert f"| `{key}` |" not in options_markdown(name)
        field = next(f for f in dataclasses.fields(get_algorithm(name).options) if f.name == key)
        value = {bool: True, int: 7, float: 0.5, str: "x"}[type(field.default)]
        with pytest.raises(ConfigError, match=rf"^{name}\.{key} = "):
            get_algorithm(name).options(**{key: value}).validate()
    assert {"teacher_epochs"} <= listed if "oneshot" in name else {"target_site", "weighting"} <= listed
