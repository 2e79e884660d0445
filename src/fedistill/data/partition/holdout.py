"""The validation holdout, the IID evaluation shards and the per-client class counts of a split."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedistill.data.partition.checks import as_labels, check_seed, seeded_rng
from fedistill.data.partition.partitioners import deal_by_class
from fedistill.errors import PartitionError, UserError


def holdout(
    labels: Any, fraction: float, *, seed: int, mode: str = "random"
) -> tuple[np.ndarray, np.ndarray]:
    """Split off a validation set; returns ``(train_idx, holdout_idx)``, both sorted ascending.

    ``mode="tail"`` takes the last ``floor(fraction·N)`` samples in file order, as FedDF's code does
    (``val_data_ratio``); ``mode="random"`` (the default) a seeded stratified random holdout of the same
    size, whose per-class counts follow the class frequencies (largest remainder). ``fraction=0`` gives
    an empty holdout.
    """
    y = as_labels(labels, None)
    fraction = _checked_fraction(fraction)
    n = y.size
    size = min(math.floor(fraction * n + 1e-9), max(n - 1, 0))
    if mode == "tail":
        return np.arange(n - size, dtype=np.int64), np.arange(n - size, n, dtype=np.int64)
    if mode != "random":
        raise UserError(f"unknown holdout mode {mode!r}; valid: random, tail")
    rng = seeded_rng(check_seed(seed))
    classes, counts = np.unique(y, return_counts=True)
    per_class = _largest_remainder(counts * fraction, size)
    chosen = [rng.permutation(np.flatnonzero(y == c))[:m] for c, m in zip(classes, per_class, strict=True)]
    held = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
    mask = np.ones(n, dtype=bool)
    mask[held] = False
    return np.flatnonzero(mask).astype(np.int64), held.astype(np.int64)


def subject_holdout(
    groups: Any, parts: list[np.ndarray], fraction: float, *, seed: int, subjects: Any = None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's own validation split, for sites made of natural groups (subjects, volumes, sources).

    A slice next to a training slice of the same subject is nearly a training sample, so a holdout of
    slices measures memory, not generalisation. A client of several groups holds out whole groups: about
    ``fraction`` of all such groups, shared over those clients by their numbers of groups (largest
    remainders, ties drawn; at least one in all, never a client's last), so some small sites hold none
    out. A client of one group made of several ``subjects`` (one per sample: a source's volumes or whole
    images) holds out ``floor(fraction · m)`` of its m subjects whole (at least one, never all), drawn:
    a slab across two volumes would leave part of each in training. A client of one group with no such
    subjects (a volume, a hospital's stack) holds out one contiguous block of ``floor(fraction · n_k)``
    samples in file order (a slab; at least one) at a seeded offset. Returns ``(train, held)`` per
    client, both sorted ascending.
    """
    y = as_labels(groups, None)
    who = None if subjects is None else as_labels(subjects, None, "subjects")
    if who is not None and who.size != y.size:
        raise UserError(f"subjects has {who.size} entries for {y.size} samples; give one per sample")
    fraction = _checked_fraction(fraction)
    rng = seeded_rng(check_seed(seed))
    parts = [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]
    names = [np.unique(y[part]) for part in parts]
    several = np.array([len(n) >= 2 for n in names])
    quotas = np.array([fraction * len(n) if many else 0.0 for n, many in zip(names, several, strict=True)])
    total = round(float(quotas.sum())) if fraction > 0 else 0
    total = max(total, 1) if fraction > 0 and several.any() else total
    whole = _largest_remainder(quotas, total, rng)
    train, held = [], []
    for part, part_names, many, count in zip(parts, names, several, whole, strict=True):
        mask = np.zeros(part.size, dtype=bool)
        if many:
            chosen = rng.choice(part_names, size=min(int(count), part_names.size - 1), replace=False)
            mask = np.isin(y[part], chosen)
        elif fraction > 0 and who is not None and np.unique(who[part]).size >= 2:
            own = np.unique(who[part])
            size = min(max(math.floor(fraction * own.size + 1e-9), 1), own.size - 1)
            mask = np.isin(who[part], rng.choice(own, size=size, replace=False))
        elif fraction > 0 and part.size >= 2:
            size = min(max(math.floor(fraction * part.size + 1e-9), 1), part.size - 1)
            start = int(rng.integers(0, part.size - size + 1))
            mask[start : start + size] = True
        train.append(part[~mask])
        held.append(part[mask])
    return train, held


def _checked_fraction(fraction: Any) -> float:
    try:
        fraction = float(fraction)
    except (TypeError, ValueError):
        raise UserError(f"val fraction must be a number in [0, 1) (got {fraction!r})") from None
    if not 0 <= fraction < 1:
        raise UserError(f"val fraction must lie in [0, 1) (got {fraction}); use e.g. 0.1, or 0 for none")
    return fraction


def _largest_remainder(quotas: np.ndarray, total: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Integer counts close to ``quotas`` that sum to ``total``; equal remainders go to the earlier entry,
    or with `rng` in a seeded random order."""
    base = np.floor(quotas).astype(np.int64)
    extra = total - int(base.sum())
    if extra > 0:
        ties = np.arange(quotas.size) if rng is None else rng.permutation(quotas.size)
        order = np.lexsort((ties, -(quotas - base)))
        base[order[:extra]] += 1
    return base


def iid_shards(labels: Any, num_clients: int, *, seed: int, what: str = "validation") -> list[np.ndarray]:
    """Per-client IID shards of an evaluation set: each class split evenly, indices shuffled.

    FedMD-CG splits the global test set this way for its "local accuracy". An empty set gives empty
    shards; a non-empty set needs at least one sample per client. `what` names the set in that error:
    "validation" (its fraction can grow) or "test" (it cannot).
    """
    y = as_labels(labels, None)
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise PartitionError(f"num_clients (`clients`) must be a positive integer (got {num_clients!r})")
    if 0 < y.size < num_clients:
        fix = "use fewer clients" + (
            " or a larger validation fraction (or 0 for no validation set)" if what == "validation" else ""
        )
        raise PartitionError(
            f"cannot give each of {num_clients} clients a {what} shard from {y.size} samples; {fix}"
        )
    return deal_by_class(y, int(num_clients), seeded_rng(check_seed(seed)))


def class_counts(labels: Any, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Samples per client and class, shape (K, C), int64."""
    y = as_labels(labels, num_classes)
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for k, part in enumerate(parts):
        counts[k] = np.bincount(y[np.asarray(part, dtype=np.int64)], minlength=num_classes)
    return counts
