"""Checks of the MRI loaders' options, each raising a `ConfigError` that names the option and the value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fedistill.errors import ConfigError, unknown_name


def check_options(dataset: str, options: Mapping[str, object], allowed: Sequence[str]) -> None:
    """An error naming the options `dataset` does not take, and those it does."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"dataset {dataset!r} does not take option(s) {', '.join(unknown)}; it takes {', '.join(allowed)}"
        )


def check_choice(option: str, value: object, choices: Sequence[str]) -> str:
    """`value` if it is one of `choices` (case-insensitive), else an error listing them."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in choices:
        raise unknown_name(option, value, list(choices), ConfigError)
    return key


def check_image_size(image_size: object, native: str) -> int | None:
    """`image_size` as an int >= 8, or None (= the native size, described by `native`)."""
    if image_size is None:
        return None
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
        raise ConfigError(f"image_size must be an integer >= 8 or None ({native}), got {image_size!r}")
    return image_size


def check_max_volumes(value: object) -> int | None:
    """At most this many volumes per split (train, test); None reads all."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_volumes must be a positive integer or None (all), got {value!r}")
    return value


def check_test_fraction(value: object) -> float:
    """The share of subjects held out for test, in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"test_fraction must be a number in (0, 1), got {value!r}")
    return float(value)
