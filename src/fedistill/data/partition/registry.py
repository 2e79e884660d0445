"""The partitioners by name: ``register`` wraps each with the shared argument checks and adds it to
``PARTITIONERS``; ``partition`` runs one by name."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from fedistill.data.partition.checks import (
    as_labels,
    check_alpha,
    check_nonempty,
    check_num_clients,
    check_seed,
)
from fedistill.errors import unknown_name

Partitioner = Callable[..., list[np.ndarray]]

PARTITIONERS: dict[str, Partitioner] = {}
#: The partitioners that draw with `alpha` (the others ignore it: iid, natural).
DIRICHLET: set[str] = set()

_COMMON_ARGS = {"labels", "num_clients", "alpha", "seed", "num_classes"}


def own_options(fn: Partitioner) -> list[str]:
    """The options a partitioner takes beyond the arguments every one gets from the run."""
    return sorted(set(inspect.signature(fn).parameters) - _COMMON_ARGS)


def register(name: str, *, dirichlet: bool) -> Callable[[Partitioner], Partitioner]:
    """Wrap a partitioner with the shared validation and add it to ``PARTITIONERS``."""

    def wrap(fn: Partitioner) -> Partitioner:
        allowed = own_options(fn)

        @functools.wraps(fn)
        def run(
            labels: Any,
            num_clients: int,
            *,
            alpha: float | None,
            seed: int,
            num_classes: int,
            **options: Any,
        ) -> list[np.ndarray]:
            unknown = sorted(set(options) - set(allowed))
            if unknown:
                raise unknown_name(f"{name} option", unknown[0], list(allowed))
            y = as_labels(labels, num_classes)
            k = check_num_clients(num_clients, y.size)
            a = check_alpha(alpha, name) if dirichlet else None
            parts = fn(y, k, alpha=a, seed=check_seed(seed), num_classes=int(num_classes), **options)
            parts = [np.asarray(p, dtype=np.int64) for p in parts]
            check_nonempty(parts, name, a)
            return parts

        PARTITIONERS[name] = run
        if dirichlet:
            DIRICHLET.add(name)
        return run

    return wrap


def partition(
    labels: Any,
    num_clients: int,
    *,
    method: str,
    alpha: float | None,
    seed: int,
    num_classes: int,
    **options: Any,
) -> list[np.ndarray]:
    """Run the partitioner called ``method``; see ``PARTITIONERS`` for the names."""
    return get_partitioner(method)(
        labels, num_clients, alpha=alpha, seed=seed, num_classes=num_classes, **options
    )


def get_partitioner(method: str) -> Partitioner:
    """The partitioner called ``method``, or a UserError that lists the valid names."""
    if method not in PARTITIONERS:
        raise unknown_name("partitioner", method, sorted(PARTITIONERS))
    return PARTITIONERS[method]
