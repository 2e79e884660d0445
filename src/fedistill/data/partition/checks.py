"""The partitioners' seeded streams and argument checks, each failing with a message that says what to
change."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedistill.errors import PartitionError, UserError


def seeded_rng(seed: int) -> np.random.Generator:
    """A stream of its own for one call, never the global one, so a seed gives the same split anywhere."""
    return np.random.default_rng(seed)


def check_seed(seed: Any) -> int:
    """`seed` as a plain int; UserError unless it is a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise UserError(f"seed must be a non-negative integer (got {seed!r}); pass e.g. seed=0")
    return int(seed)


def as_labels(labels: Any, num_classes: int | None, what: str = "labels") -> np.ndarray:
    """Labels as a 1-D int64 array, checked against ``num_classes`` when given."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise UserError(f"{what} must be a 1-D array of class ids (got shape {y.shape})")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise UserError(f"{what} must hold integer class ids (got dtype {y.dtype})")
    y = y.astype(np.int64, copy=False)
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer) or num_classes < 1:
            raise UserError(f"num_classes must be a positive integer (got {num_classes!r})")
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise UserError(
                f"{what} must lie in [0, {num_classes}) (found {int(y.min())}..{int(y.max())}); "
                "check num_classes against the dataset"
            )
    return y


def check_num_clients(num_clients: Any, num_samples: int) -> int:
    """`num_clients` as a plain int; PartitionError unless 1 <= it <= the samples to split."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise PartitionError(f"num_clients (`clients`) must be a positive integer (got {num_clients!r})")
    if num_clients > num_samples:
        raise PartitionError(
            f"num_clients={num_clients} is more than the {num_samples} samples to split; "
            "lower `clients` (--clients) or use a larger training set"
        )
    return int(num_clients)


def check_alpha(alpha: Any, method: str) -> float:
    """`alpha` as a positive finite float; PartitionError naming what to pass otherwise."""
    if alpha is None:
        raise PartitionError(
            f"partitioner {method!r} needs alpha (the Dirichlet concentration); "
            "pass e.g. alpha=0.5, or use the 'iid' partitioner"
        )
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise PartitionError(f"alpha must be a number (got {alpha!r}); pass e.g. alpha=0.5") from None
    if not math.isfinite(value):
        raise PartitionError(
            f"alpha must be finite (got {alpha}); use a large value such as 1000 for a near-IID split, "
            "or the 'iid' partitioner"
        )
    if value <= 0:
        raise PartitionError(
            f"alpha must be > 0 (got {alpha}); use a small positive value such as 0.1 for a strong skew "
            "or 100 for a near-IID split"
        )
    return value


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """`value` as a plain int of at least `minimum`; UserError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum} (got {value!r})")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """`value` as a plain bool; UserError otherwise. A string such as "false" (a quoted TOML value, or
    ``--set key=False``, which TOML reads as text) is truthy and would silently mean the opposite."""
    if not isinstance(value, bool | np.bool_):
        raise UserError(f"{name} must be true or false (got {value!r}); write it unquoted, in lower case")
    return bool(value)


# What a partitioner that retries can be asked for instead: a minimum that is at least one sample.
_RETRY_FIX = {
    "dirichlet-balanced": "raise min_fraction (each client then needs more of the group's average)",
    "dirichlet-unbalanced": "raise min_size to at least 1",
    "dirichlet-flwr": "raise min_partition_size to at least 1",
}


def check_nonempty(parts: list[np.ndarray], method: str, alpha: float | None) -> None:
    """PartitionError naming the client that received no sample, and what to change: a partitioner
    that retries is told to ask for more of its retry, one that does not is pointed to one that does."""
    fix = _RETRY_FIX.get(method, "pick a partitioner that retries, such as 'dirichlet-balanced'")
    for client, part in enumerate(parts):
        if part.size == 0:
            raise PartitionError(
                f"client {client} received no training samples (partitioner {method!r}, alpha={alpha}, "
                f"{len(parts)} clients); raise alpha, lower the number of clients, or {fix}"
            )
