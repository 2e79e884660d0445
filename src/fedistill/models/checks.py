"""Value checks shared by the models' constructors: each names the option and the bad value."""

from __future__ import annotations

from fedistill.errors import ConfigError


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int > 0 (bools refused), else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 0 (bools refused), else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def probability(name: str, value: object) -> float:
    """``value`` as a float if it is a number in [0, 1), else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ConfigError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_divisible(what: str, height: int, width: int, divisor: int) -> None:
    """ConfigError unless both sides are positive multiples of ``divisor`` (nets that halve and double)."""
    if height <= 0 or width <= 0 or height % divisor or width % divisor:
        raise ConfigError(
            f"{what} needs image sides divisible by {divisor}, got {height}×{width}; "
            f"crop or pad the images to a multiple of {divisor}"
        )


def check_instance_norm_size(what: str, size: int, poolings: int, norm: str) -> None:
    """InstanceNorm normalises each map over its pixels: the coarsest map needs more than one."""
    if norm == "instance" and size // 2**poolings < 2:
        raise ConfigError(
            f"{what} with norm 'instance' needs at least 2×2 pixels after {poolings} poolings, so images "
            f"of at least {2 * 2**poolings}×{2 * 2**poolings}, got {size}×{size}"
        )
