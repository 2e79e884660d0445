"""The shared option checks name the option, its value and the rule it broke."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from fedistill.algorithms.shared.option_checks import check_nonnegative, check_positive
from fedistill.errors import ConfigError


@dataclass
class _Options:
    lr: float = 0.1
    epochs: int = 2


@pytest.mark.parametrize("value", [0, -1e-3, math.nan, math.inf])
def test_check_positive_refuses_zero_negative_nan_and_infinite_values(value):
    with pytest.raises(ConfigError, match=rf"x\.lr must be a finite number > 0, got {value!r}"):
        check_positive("x", _Options(lr=value), "epochs lr")


@pytest.mark.parametrize("value", [-1, math.nan, math.inf])
def test_check_nonnegative_refuses_negative_nan_and_infinite_values(value):
    with pytest.raises(ConfigError, match=r"x\.epochs must be a finite number >= 0"):
        check_nonnegative("x", _Options(epochs=value), "lr epochs")


def test_the_checks_accept_values_in_range():
    check_positive("x", _Options(lr=1e-9, epochs=1), "lr epochs")
    check_nonnegative("x", _Options(lr=0.0, epochs=0), "lr epochs")
