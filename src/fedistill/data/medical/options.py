"""Checks for dataset options: values come from config files and `--set`, so every one is validated here
and a wrong one becomes a ConfigError that names the dataset, the option and the value."""

from __future__ import annotations

from collections.abc import Iterable

from fedistill.errors import ConfigError


def positive_int(dataset: str, name: str, value: object, minimum: int = 1) -> int:
    """`value` as an integer of at least `minimum`; booleans and other types are a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{dataset} option {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def positive_float(dataset: str, name: str, value: object, maximum: float | None = None) -> float:
    """`value` as a positive finite number, at most `maximum` when given."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ConfigError(f"{dataset} option {name} must be a positive number, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{dataset} option {name} must be at most {maximum}, got {value!r}")
    return float(value)


def flag(dataset: str, name: str, value: object) -> bool:
    """`value` as a boolean: only true or false, not a number or a string."""
    if not isinstance(value, bool):
        raise ConfigError(f"{dataset} option {name} must be true or false, got {value!r}")
    return value


def choice(dataset: str, name: str, value: object, valid: Iterable[str]) -> str:
    """`value` as one of `valid`, matched without case or surrounding spaces."""
    valid = tuple(valid)
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in valid:
        raise ConfigError(f"{dataset} option {name} must be one of {', '.join(valid)}; got {value!r}")
    return str(key)


def name_list(dataset: str, name: str, value: object, valid: Iterable[str] | None = None) -> tuple[str, ...]:
    """A list of names given as a list or as one comma-separated string ("HGG,LGG"), lower-cased."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{dataset} option {name} must be a list of names or a comma-separated string")
    names = tuple(dict.fromkeys(i.strip().lower() for i in items if i.strip()))
    if not names:
        raise ConfigError(f"{dataset} option {name} is empty; name at least one")
    if valid is not None:
        valid = tuple(valid)
        unknown = [n for n in names if n not in valid]
        if unknown:
            raise ConfigError(
                f"{dataset} option {name}: unknown value(s) {', '.join(unknown)} (valid: {', '.join(valid)})"
            )
    return names


def int_list(dataset: str, name: str, value: object) -> tuple[int, ...]:
    """A list of integers given as a list or as one comma-separated string ("1,2,3")."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        if not isinstance(items, list | tuple) or any(isinstance(i, bool | float) for i in items):
            raise ValueError
        numbers = tuple(int(i) for i in items)
    except (TypeError, ValueError):
        raise ConfigError(f"{dataset} option {name} must be a list of integers, got {value!r}") from None
    if not numbers:
        raise ConfigError(f"{dataset} option {name} is empty; give at least one number")
    return numbers
