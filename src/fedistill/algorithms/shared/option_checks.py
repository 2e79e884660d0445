"""Checks for an algorithm's options: each error names the option (``section.key``), its value and what
it must be, so an options class's ``validate`` reads as a list of rules."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from fedistill.errors import ConfigError, unknown_name
from fedistill.models import model_names
from fedistill.models.registry import builds_batchnorm


def check_choices(section: str, options: object, choices: Mapping[str, Sequence[str]]) -> None:
    """Each option named in `choices` must be one of the values listed for it."""
    for key, valid in choices.items():
        if getattr(options, key) not in valid:
            raise ConfigError(
                f"{section}.{key} must be one of {', '.join(valid)}; got {getattr(options, key)!r}"
            )


def check_refused(section: str, options: object) -> None:
    """The keys an options class inherits but refuses (its ``refused_keys``: key -> why, ``{section}`` and
    ``{default}`` filled in) must keep their defaults; the reference (`fedistill list --options`) leaves
    them out, so a user never sees a key that would be refused."""
    defaults = {item.name: item.default for item in dataclasses.fields(options)}  # type: ignore[arg-type]
    for key, why in getattr(type(options), "refused_keys", {}).items():
        value, default = getattr(options, key), defaults[key]
        if value != default:
            said = why.format(section=section, default=repr(default))
            raise ConfigError(f"{section}.{key} = {value!r} {said}")


def check_nonnegative(section: str, options: object, keys: str) -> None:
    """Each of the space-separated option `keys` must be a finite number >= 0."""
    for key in keys.split():
        value = getattr(options, key)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{section}.{key} must be a finite number >= 0, got {value!r}")


def check_positive(section: str, options: object, keys: str) -> None:
    """Each of the space-separated option `keys` must be a finite number > 0 (an infinite rate or size only
    fails later, as a diverged run or an allocation error)."""
    for key in keys.split():
        value = getattr(options, key)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{section}.{key} must be a finite number > 0, got {value!r}")


def check_iters_per_epoch(section: str, value: object) -> None:
    """`iters_per_epoch` (FedIOD's and AsynDGAN's G-steps per epoch) must be max, min or an int >= 1; a bool
    is an int to Python, and true would be one G-step."""
    if value not in ("max", "min") and (type(value) is not int or value < 1):
        raise ConfigError(f"{section}.iters_per_epoch must be max, min or a number >= 1; got {value!r}")


def check_model_names(section: str, options: object, keys: str) -> None:
    """Each of the space-separated option `keys` is a model name or a comma list of them ("" = the run's
    model): a misspelt one is refused with the options, before the run writes anything, not when a site
    first builds its model."""
    known = model_names()
    for key, name in _models_of(options, keys):
        if name not in known:
            raise ConfigError(f"{section}.{key} names an {unknown_name('model', name, known)}")


def named_models(options: object) -> list[tuple[str, str]]:
    """(key, model) for each model the options' `model_keys` name, in order ("" = the run's model, left
    out): what the run checks against its task before it writes anything."""
    return _models_of(options, str(getattr(options, "model_keys", "")))


def _models_of(options: object, keys: str) -> list[tuple[str, str]]:
    """(key, model) for each model the space-separated option `keys` name as a comma list, "" left out."""
    return [
        (key, name)
        for key in keys.split()
        for name in (part.strip() for part in str(getattr(options, key)).split(","))
        if name
    ]


def check_batchnorm_batch(section: str, options: object, keys: str) -> None:
    """Each of the space-separated `keys` sizes a batch that a module trains on in train mode with
    BatchNorm (a feature generator), which cannot normalise a single sample: it must be >= 2."""
    for key in keys.split():
        value = getattr(options, key)
        if value < 2:
            raise ConfigError(
                f"{section}.{key} must be >= 2 (the generator trains on it with BatchNorm, which needs "
                f"two samples per batch), got {value!r}"
            )


def check_dp_without_batchnorm(section: str, dp_enabled: bool, models: Sequence[str], norm: str) -> None:
    """Differential privacy clips and noises a client's update; a BatchNorm model's running statistics
    would leave beside it unclipped, so each of the sites' `models` (with the run's `norm`) must have none."""
    for model in models if dp_enabled else ():
        if builds_batchnorm(model, norm):
            raise ConfigError(
                f"{section}.dp_enabled = true clips and noises client updates, but model {model!r} has "
                "BatchNorm, whose running statistics would leave unclipped: set norm = 'group' or 'none', "
                "or use a model without BatchNorm (mlp, lenet5)"
            )


def parse_widths(key: str, text: str) -> tuple[int, ...]:
    """'512,256' -> (512, 256); a ConfigError naming `key` for anything else."""
    try:
        widths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{key} must be comma-separated positive integers, got {text!r}") from None
    if not widths or any(w <= 0 for w in widths):
        raise ConfigError(f"{key} must be comma-separated positive integers, got {text!r}")
    return widths
