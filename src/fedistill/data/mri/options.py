"""Checks of the MRI loaders' options, each raising a `ConfigError` that names the dataset, the option and
the value ("brats-mri option test_fraction must be ...", as the other datasets' option errors read)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from fedistill.errors import ConfigError


def check_options(dataset: str, options: Mapping[str, object], allowed: Sequence[str]) -> None:
    """An error naming the options `dataset` does not take, and those it does."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"dataset {dataset!r} does not take option(s) {', '.join(unknown)}; it takes {', '.join(allowed)}"
        )


def check_choice(
    dataset: str, option: str, value: object, choices: Sequence[str], shown: object = None
) -> str:
    """`value` if it is one of `choices` (case-insensitive), else an error listing them (and the closest);
    `shown`: the value the user wrote, when `value` is one item of it."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in choices:
        close = difflib.get_close_matches(str(value), list(choices), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        got = f"{value!r}" if shown is None else f"{value!r} in {shown!r}"
        raise ConfigError(f"{dataset} option {option} must be one of {', '.join(choices)}; got {got}{hint}")
    return key


def check_image_size(dataset: str, image_size: object, native: str) -> int | None:
    """`image_size` as an int >= 8, or None (= the native size, described by `native`)."""
    if image_size is None:
        return None
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
        raise ConfigError(
            f"{dataset} option image_size must be an integer >= 8 or None ({native}), got {image_size!r}"
        )
    return image_size


def check_max_volumes(dataset: str, value: object) -> int | None:
    """At most this many volumes per split (train, test); None reads all."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{dataset} option max_volumes must be a positive integer or None (all), got {value!r}"
        )
    return value


def check_test_fraction(dataset: str, value: object) -> float:
    """The share of subjects held out for test, in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"{dataset} option test_fraction must be a number in (0, 1), got {value!r}")
    return float(value)
