"""Seeded splits of a labelled training set into federated clients.

The three seed papers each ship their own Dirichlet partitioner and they do not produce the same skew for
the same alpha, so each one is reproduced here under its own name (the FedGen variant is not included):

* ``iid`` -- every class dealt evenly over the clients (FedMD-CG's ``iid`` mode, without its float
  rounding, so client sizes differ by at most one sample per class).
* ``dirichlet`` -- FedIOD's ``dirichlet_datasplit``: one Dir(alpha) row per class, consecutive chunks.
* ``dirichlet-balanced`` -- FedDF's ``build_non_iid_by_dirichlet``: groups of clients, "balance" trick,
  retry until the smallest client is at least half the average.
* ``dirichlet-equal`` -- FedMD-CG's ``non_iid_dirichlet_balanced`` (its default): every client draws a
  class prior and exactly floor(N/K) samples.
* ``dirichlet-unbalanced`` -- FedMD-CG's ``non_iid_dirichlet_unbalanced``: per-class Dir(alpha) with the
  same "balance" trick as FedDF, retried until every client has ``min_size`` samples.
* ``dirichlet-flwr`` -- flwr-datasets' ``DirichletPartitioner`` run on an index table (optional extra).

Every function draws from its own ``numpy.random.default_rng(seed)``, never from global RNG state, so the
same inputs and seed give the same split on every machine. The original codes used global or
``RandomState`` streams, so a split here matches theirs in distribution, not sample for sample.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedistill.errors import DataError, PartitionError, UserError, unknown_name

Partitioner = Callable[..., list[np.ndarray]]

PARTITIONERS: dict[str, Partitioner] = {}

_COMMON_ARGS = {"labels", "num_clients", "alpha", "seed", "num_classes"}
_SPLIT_FORMAT = "fedistill-partition"
_SPLIT_VERSION = 1


# --------------------------------------------------------------------------------------------------
# validation helpers


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise UserError(f"seed must be a non-negative integer (got {seed!r}); pass e.g. seed=0")
    return int(seed)


def _as_labels(labels: Any, num_classes: int | None, what: str = "labels") -> np.ndarray:
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


def _check_num_clients(num_clients: Any, num_samples: int) -> int:
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise PartitionError(f"num_clients must be a positive integer (got {num_clients!r})")
    if num_clients > num_samples:
        raise PartitionError(
            f"num_clients={num_clients} is more than the {num_samples} samples to split; "
            "lower num_clients or use a larger training set"
        )
    return int(num_clients)


def _check_alpha(alpha: Any, method: str) -> float:
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


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum} (got {value!r})")
    return int(value)


def _check_nonempty(parts: list[np.ndarray], method: str, alpha: float | None) -> None:
    for client, part in enumerate(parts):
        if part.size == 0:
            raise PartitionError(
                f"client {client} received no training samples (partitioner {method!r}, alpha={alpha}, "
                f"{len(parts)} clients); raise alpha, lower the number of clients, or pick another "
                "partitioner such as 'dirichlet-balanced'"
            )


def _register(name: str, *, dirichlet: bool) -> Callable[[Partitioner], Partitioner]:
    """Wrap a partitioner with the shared validation and add it to ``PARTITIONERS``."""

    def wrap(fn: Partitioner) -> Partitioner:
        allowed = sorted(set(inspect.signature(fn).parameters) - _COMMON_ARGS)

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
            y = _as_labels(labels, num_classes)
            k = _check_num_clients(num_clients, y.size)
            a = _check_alpha(alpha, name) if dirichlet else None
            parts = fn(y, k, alpha=a, seed=_check_seed(seed), num_classes=int(num_classes), **options)
            parts = [np.asarray(p, dtype=np.int64) for p in parts]
            _check_nonempty(parts, name, a)
            return parts

        PARTITIONERS[name] = run
        return run

    return wrap


# --------------------------------------------------------------------------------------------------
# shared building blocks


def _deal_by_class(y: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Deal the class-sorted, within-class shuffled indices round-robin to ``k`` shards.

    Each class lands on every shard with floor or ceil of n_c/k samples, and shard sizes differ by at
    most one, without any float rounding. Each shard is shuffled.
    """
    classes = np.unique(y)
    order = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    flat = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
    return [rng.permutation(flat[i::k]) for i in range(k)]


def _balanced_class_split(
    class_members: list[np.ndarray],
    n: int,
    alpha: float,
    cap: float,
    rng: np.random.Generator,
    *,
    shuffle_members: bool,
) -> list[np.ndarray] | None:
    """One pass of the Yurochkin/Li-style per-class Dirichlet split with the "balance" trick.

    For each class (empty ones included, so the draw sequence does not depend on which classes are
    present) draw p ~ Dir(alpha·1_n), zero p for clients already holding >= ``cap`` samples, renormalise
    and cut the class at the cumulative proportions. Returns None when every remaining proportion is
    zero (possible for tiny alpha); the caller treats that as a failed attempt.
    """
    chunks: list[list[np.ndarray]] = [[] for _ in range(n)]
    sizes = np.zeros(n, dtype=np.int64)
    for members in class_members:
        if shuffle_members:
            members = rng.permutation(members)
        p = rng.dirichlet(np.full(n, alpha))
        p = p * (sizes < cap)
        total = p.sum()
        if not total > 0:
            return None
        cuts = (np.cumsum(p / total) * len(members)).astype(np.int64)[:-1]
        for j, piece in enumerate(np.split(members, cuts)):
            chunks[j].append(piece)
            sizes[j] += piece.size
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in chunks]


# --------------------------------------------------------------------------------------------------
# the partitioners


@_register("iid", dirichlet=False)
def iid(
    labels: np.ndarray, num_clients: int, *, alpha: float | None, seed: int, num_classes: int
) -> list[np.ndarray]:
    """Class-stratified equal split; ``alpha`` is ignored. Indices are shuffled within each client.

    FedMD-CG's ``iid`` mode, with integer dealing instead of float cut points so that no client is short
    by a sample because of rounding.
    """
    return _deal_by_class(labels, num_clients, _rng(seed))


@_register("natural", dirichlet=False)
def natural(
    labels: np.ndarray, num_clients: int, *, alpha: float | None, seed: int, num_classes: int
) -> list[np.ndarray]:
    """Sites given by the data: ``labels`` are the dataset's natural groups (subjects in the protocol's
    order, organs, source datasets), and the sorted groups are cut into ``num_clients`` contiguous runs
    of near-equal length, each client taking every sample of its groups. Chang et al.'s BraTS split (the
    training subjects sorted by tumour size, cut into K sites) and one organ per site are both this.
    ``alpha`` and ``seed`` are unused: the split is fixed by the data."""
    groups = np.unique(labels)
    if num_clients > groups.size:
        raise PartitionError(
            f"the natural partition has {groups.size} groups in its data, fewer than {num_clients} clients; "
            "lower the number of clients"
        )
    return [np.flatnonzero(np.isin(labels, run)) for run in np.array_split(groups, num_clients)]


@_register("dirichlet", dirichlet=True)
def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    num_classes: int,
    shuffle_within_class: bool = True,
) -> list[np.ndarray]:
    """FedIOD's ``dirichlet_datasplit``: P[c,:] ~ Dir(alpha·1_K), consecutive chunks per class.

    Client k gets ``int(P[c,k]·n_c)`` samples of class c and the last client the remainder; no retry and
    no balancing, so a client may end up empty (a PartitionError here; the released code crashes).
    FedIOD cuts the class indices in file order; ``shuffle_within_class=True`` (the default) shuffles
    them first so that the chunks are not tied to the file's ordering, ``False`` reproduces the release.
    Each client's indices come class by class (class 0 first), in the cut order.
    """
    rng = _rng(seed)
    proportions = rng.dirichlet(np.full(num_clients, alpha), size=num_classes)
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        if shuffle_within_class:
            members = rng.permutation(members)
        counts = (proportions[c, :-1] * members.size).astype(np.int64)
        for k, piece in enumerate(np.split(members, np.cumsum(counts))):
            chunks[k].append(piece)
    return [np.concatenate(c) for c in chunks]


@_register("dirichlet-balanced", dirichlet=True)
def dirichlet_balanced(
    labels: np.ndarray,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    num_classes: int,
    group_size: int = 10,
    min_fraction: float = 0.5,
    max_retries: int = 1000,
) -> list[np.ndarray]:
    """FedDF's ``build_non_iid_by_dirichlet``.

    The data are shuffled once, then clients are split into groups of ``group_size`` (the last group
    takes the rest); group g takes a contiguous slice of ``int(size_g / K · N)`` shuffled samples (the
    last group the remainder). Inside a group of n clients holding T samples the balanced per-class
    Dirichlet split is redrawn until the smallest client holds at least ``int(min_fraction · T / n)``
    samples, at most ``max_retries`` times per group. FedDF asserts K >= 10; here a group is simply
    smaller when K < ``group_size``. Each client's indices come class by class, shuffled within a class.
    """
    group_size = _check_positive_int("group_size", group_size)
    max_retries = _check_positive_int("max_retries", max_retries)
    if (
        isinstance(min_fraction, bool)
        or not isinstance(min_fraction, int | float)
        or not 0 <= min_fraction <= 1
    ):
        raise UserError(f"min_fraction must be a number in [0, 1] (got {min_fraction!r})")
    rng = _rng(seed)
    n = labels.size
    order = rng.permutation(n)
    groups = [min(group_size, num_clients - start) for start in range(0, num_clients, group_size)]
    parts: list[np.ndarray] = []
    begin = 0
    for g, size in enumerate(groups):
        end = n if g == len(groups) - 1 else begin + int(size / num_clients * n)
        members = order[begin:end]
        parts += _feddf_group(
            members, labels[members], size, alpha, num_classes, rng, float(min_fraction), max_retries, g
        )
        begin = end
    return parts


def _feddf_group(
    members: np.ndarray,
    labels: np.ndarray,
    n: int,
    alpha: float,
    num_classes: int,
    rng: np.random.Generator,
    min_fraction: float,
    max_retries: int,
    group: int,
) -> list[np.ndarray]:
    """Redraw one FedDF client group until its smallest client is large enough."""
    total = members.size
    need = int(min_fraction * total / n)
    by_class = [members[labels == c] for c in range(num_classes)]
    for _ in range(max_retries):
        parts = _balanced_class_split(by_class, n, alpha, total / n, rng, shuffle_members=False)
        if parts is not None and min(p.size for p in parts) >= need:
            return parts
    raise PartitionError(
        f"partitioner 'dirichlet-balanced' could not give every client of group {group} at least {need} "
        f"samples after {max_retries} attempts (alpha={alpha}, {n} clients sharing {total} samples); "
        "raise alpha, lower min_fraction or the number of clients, or raise max_retries"
    )


@_register("dirichlet-equal", dirichlet=True)
def dirichlet_equal(
    labels: np.ndarray, num_clients: int, *, alpha: float, seed: int, num_classes: int
) -> list[np.ndarray]:
    """FedMD-CG's ``non_iid_dirichlet_balanced`` (its default): equal-sized, label-skewed clients.

    For each client in turn draw q ~ Dir(alpha·1_C), weight every not-yet-assigned sample of class c by
    q[c], and draw exactly floor(N/K) of them without replacement proportionally to the weights
    (exponential-key sampling, the same successive-sampling law as ``torch.multinomial``). When fewer
    samples than that carry a nonzero weight, the client takes every remaining sample, as in the
    original; later clients may then be left short or empty (empty raises PartitionError). The
    N mod K samples left over at the end are not used, as in the original. Indices are shuffled.
    """
    rng = _rng(seed)
    n = labels.size
    quota = n // num_clients
    free = np.ones(n, dtype=bool)
    parts = []
    for _ in range(num_clients):
        prior = rng.dirichlet(np.full(num_classes, alpha))
        weights = prior[labels] * free
        keys = rng.exponential(size=n)
        with np.errstate(divide="ignore", over="ignore"):
            keys = np.where(weights > 0, keys / weights, np.inf)
        if np.count_nonzero(np.isfinite(keys)) < quota:
            take = np.flatnonzero(free)
        else:
            take = np.argpartition(keys, quota - 1)[:quota]
        free[take] = False
        parts.append(rng.permutation(take))
    return parts


@_register("dirichlet-unbalanced", dirichlet=True)
def dirichlet_unbalanced(
    labels: np.ndarray,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    num_classes: int,
    min_size: int = 10,
    max_retries: int = 1000,
) -> list[np.ndarray]:
    """FedMD-CG's ``non_iid_dirichlet_unbalanced`` (the NIID-Bench split).

    Per class, shuffle the class's indices, draw Dir(alpha) over all K clients, zero clients already
    holding >= N/K samples, renormalise and cut; redraw everything until every client holds at least
    ``min_size`` samples (at most ``max_retries`` times). Indices are shuffled within each client.
    """
    min_size = _check_positive_int("min_size", min_size, minimum=0)
    max_retries = _check_positive_int("max_retries", max_retries)
    rng = _rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in range(num_classes)]
    cap = labels.size / num_clients
    for _ in range(max_retries):
        parts = _balanced_class_split(by_class, num_clients, alpha, cap, rng, shuffle_members=True)
        if parts is not None and min(p.size for p in parts) >= min_size:
            return [rng.permutation(p) for p in parts]
    raise PartitionError(
        f"partitioner 'dirichlet-unbalanced' could not give every one of {num_clients} clients at least "
        f"{min_size} samples after {max_retries} attempts (alpha={alpha}, {labels.size} samples); "
        "raise alpha, lower min_size or the number of clients, or raise max_retries"
    )


@_register("dirichlet-flwr", dirichlet=True)
def dirichlet_flwr(
    labels: np.ndarray,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    num_classes: int,
    min_partition_size: int = 10,
    self_balancing: bool = False,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """flwr-datasets' ``DirichletPartitioner`` on an in-memory index table (needs the ``flower`` extra).

    Offered so that results can be compared with Flower baselines using the same partitioner. Its own
    10-attempt limit on ``min_partition_size`` becomes a PartitionError. Indices are shuffled within each
    client when ``shuffle`` is true (the default), otherwise grouped by class in file order.
    """
    try:
        from datasets import Dataset
        from flwr_datasets.partitioner import DirichletPartitioner
    except ImportError as exc:
        raise UserError(
            "partitioner 'dirichlet-flwr' needs flwr-datasets; install the flower extra with "
            "`pip install -e .[flower]`, or pick another partitioner"
        ) from exc
    min_partition_size = _check_positive_int("min_partition_size", min_partition_size, minimum=0)
    table = Dataset.from_dict({"idx": np.arange(labels.size, dtype=np.int64), "label": labels})
    partitioner = DirichletPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=min_partition_size,
        self_balancing=bool(self_balancing),
        shuffle=bool(shuffle),
        seed=seed,
    )
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The specified min_partition_size")
            return [
                partitioner.load_partition(k).with_format("arrow")["idx"].to_numpy()
                for k in range(num_clients)
            ]
    except ValueError as exc:
        if "max number of attempts" not in str(exc):
            raise
        raise PartitionError(
            f"partitioner 'dirichlet-flwr' could not give every one of {num_clients} clients at least "
            f"{min_partition_size} samples in 10 attempts (alpha={alpha}, {labels.size} samples); "
            "raise alpha, lower min_partition_size or the number of clients, or pick another partitioner"
        ) from exc


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


# --------------------------------------------------------------------------------------------------
# holdout, IID shards, counts


def holdout(
    labels: Any, fraction: float, *, seed: int, mode: str = "random"
) -> tuple[np.ndarray, np.ndarray]:
    """Split off a validation set; returns ``(train_idx, holdout_idx)``, both sorted ascending.

    ``mode="tail"`` takes the last ``floor(fraction·N)`` samples in file order, as FedDF's code does
    (``val_data_ratio``); ``mode="random"`` (the default) a seeded stratified random holdout of the same
    size, whose per-class counts follow the class frequencies (largest remainder). ``fraction=0`` gives
    an empty holdout.
    """
    y = _as_labels(labels, None)
    try:
        fraction = float(fraction)
    except (TypeError, ValueError):
        raise UserError(f"val fraction must be a number in [0, 1) (got {fraction!r})") from None
    if not 0 <= fraction < 1:
        raise UserError(f"val fraction must lie in [0, 1) (got {fraction}); use e.g. 0.1, or 0 for none")
    n = y.size
    size = min(math.floor(fraction * n + 1e-9), max(n - 1, 0))
    if mode == "tail":
        return np.arange(n - size, dtype=np.int64), np.arange(n - size, n, dtype=np.int64)
    if mode != "random":
        raise UserError(f"unknown holdout mode {mode!r}; valid: random, tail")
    rng = _rng(_check_seed(seed))
    classes, counts = np.unique(y, return_counts=True)
    per_class = _largest_remainder(counts * fraction, size)
    chosen = [rng.permutation(np.flatnonzero(y == c))[:m] for c, m in zip(classes, per_class, strict=True)]
    held = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
    mask = np.ones(n, dtype=bool)
    mask[held] = False
    return np.flatnonzero(mask).astype(np.int64), held.astype(np.int64)


def _largest_remainder(quotas: np.ndarray, total: int) -> np.ndarray:
    """Integer counts close to ``quotas`` that sum to ``total`` (ties go to the earlier class)."""
    base = np.floor(quotas).astype(np.int64)
    extra = total - int(base.sum())
    if extra > 0:
        order = np.argsort(-(quotas - base), kind="stable")
        base[order[:extra]] += 1
    return base


def iid_shards(labels: Any, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """Per-client IID shards of an evaluation set: each class split evenly, indices shuffled.

    FedMD-CG splits the global test set this way for its "local accuracy". An empty set gives empty
    shards; a non-empty set needs at least one sample per client.
    """
    y = _as_labels(labels, None)
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise PartitionError(f"num_clients must be a positive integer (got {num_clients!r})")
    if 0 < y.size < num_clients:
        raise PartitionError(
            f"cannot give each of {num_clients} clients an evaluation shard from {y.size} samples; "
            "use fewer clients or a larger validation fraction (or 0 for no validation set)"
        )
    return _deal_by_class(y, int(num_clients), _rng(_check_seed(seed)))


def class_counts(labels: Any, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Samples per client and class, shape (K, C), int64."""
    y = _as_labels(labels, num_classes)
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for k, part in enumerate(parts):
        counts[k] = np.bincount(y[np.asarray(part, dtype=np.int64)], minlength=num_classes)
    return counts


# --------------------------------------------------------------------------------------------------
# the full federated split and its files


@dataclass
class FederatedSplit:
    """Who holds which sample, for one experiment.

    ``client_train``, ``client_val`` and ``server_val`` index the original training set (``client_val``
    are IID shards of the held-out ``server_val``); ``client_test`` indexes the test set.
    """

    method: str
    alpha: float | None
    seed: int
    num_classes: int
    client_train: list[np.ndarray]
    client_val: list[np.ndarray]
    server_val: np.ndarray
    client_test: list[np.ndarray]
    train_counts: np.ndarray
    options: dict[str, Any] = field(default_factory=dict)
    val_fraction: float = 0.1
    val_mode: str = "random"

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    def parameters(self) -> dict[str, Any]:
        """Everything that, together with the data, determines the split."""
        return {
            "method": self.method,
            "alpha": self.alpha,
            "seed": self.seed,
            "num_classes": self.num_classes,
            "num_clients": self.num_clients,
            "options": self.options,
            "val_fraction": self.val_fraction,
            "val_mode": self.val_mode,
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """All index and count arrays, named, in the canonical order used for files and the hash."""
        named = [(f"client_train_{k}", a) for k, a in enumerate(self.client_train)]
        named += [(f"client_val_{k}", a) for k, a in enumerate(self.client_val)]
        named.append(("server_val", self.server_val))
        named += [(f"client_test_{k}", a) for k, a in enumerate(self.client_test)]
        named.append(("train_counts", self.train_counts))
        return [(name, np.ascontiguousarray(a, dtype="<i8")) for name, a in named]

    def hash(self) -> str:
        """SHA-256 over the parameters and every array (little-endian int64, with names and shapes)."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.parameters(), sort_keys=True).encode())
        for name, array in self.arrays():
            digest.update(f"\n{name}{array.shape}\n".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def to_json(self) -> dict[str, Any]:
        """Sizes, per-class counts, parameters and hash; no indices."""
        return {
            "format": _SPLIT_FORMAT,
            "version": _SPLIT_VERSION,
            **self.parameters(),
            "hash": self.hash(),
            "client_train_sizes": [int(a.size) for a in self.client_train],
            "client_val_sizes": [int(a.size) for a in self.client_val],
            "server_val_size": int(self.server_val.size),
            "client_test_sizes": [int(a.size) for a in self.client_test],
            "train_counts": self.train_counts.tolist(),
        }


def make_split(
    train_labels: Any,
    test_labels: Any,
    num_clients: int,
    *,
    method: str,
    alpha: float | None,
    seed: int,
    num_classes: int,
    val_fraction: float = 0.1,
    val_mode: str = "random",
    **options: Any,
) -> FederatedSplit:
    """Hold out a validation set, partition the rest, and shard the holdout and the test set IID.

    The holdout, the partition and the two shardings each get their own stream derived from ``seed``
    (``numpy.random.SeedSequence``), so changing one stage's size does not shift another's draws.
    """
    partitioner = get_partitioner(method)
    seed = _check_seed(seed)
    y_train = _as_labels(train_labels, num_classes, "train_labels")
    y_test = _as_labels(test_labels, num_classes, "test_labels")
    s_hold, s_part, s_val, s_test = (int(s) for s in np.random.SeedSequence(seed).generate_state(4))
    train_pos, held = holdout(y_train, val_fraction, seed=s_hold, mode=val_mode)
    parts = partitioner(
        y_train[train_pos], num_clients, alpha=alpha, seed=s_part, num_classes=num_classes, **options
    )
    client_train = [train_pos[p] for p in parts]
    client_val = [held[s] for s in iid_shards(y_train[held], num_clients, seed=s_val)]
    return FederatedSplit(
        method=method,
        alpha=None if alpha is None else float(alpha),
        seed=seed,
        num_classes=int(num_classes),
        client_train=client_train,
        client_val=client_val,
        server_val=held,
        client_test=iid_shards(y_test, num_clients, seed=s_test),
        train_counts=class_counts(y_train, client_train, num_classes),
        options={key: np.asarray(value).item() for key, value in options.items()},
        val_fraction=float(val_fraction),
        val_mode=val_mode,
    )


def save_split(split: FederatedSplit, directory: str | Path) -> None:
    """Write ``partition.npz`` (int64 index arrays) and ``partition.json`` (sizes, counts, hash)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "partition.npz", **dict(split.arrays()))
    text = json.dumps(split.to_json(), indent=1)
    (directory / "partition.json").write_text(text + "\n", encoding="utf-8")


def load_split(directory: str | Path) -> FederatedSplit:
    """Read a split written by ``save_split`` and check that the arrays still match the recorded hash."""
    directory = Path(directory)
    meta_path, npz_path = directory / "partition.json", directory / "partition.npz"
    for path in (meta_path, npz_path):
        if not path.is_file():
            raise DataError(f"{path} does not exist; create the split first (save_split)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        k = int(meta["num_clients"])
        with np.load(npz_path, allow_pickle=False) as npz:
            arrays = {name: npz[name].astype(np.int64) for name in npz.files}
        split = FederatedSplit(
            method=meta["method"],
            alpha=meta["alpha"],
            seed=meta["seed"],
            num_classes=meta["num_classes"],
            client_train=[arrays[f"client_train_{i}"] for i in range(k)],
            client_val=[arrays[f"client_val_{i}"] for i in range(k)],
            server_val=arrays["server_val"],
            client_test=[arrays[f"client_test_{i}"] for i in range(k)],
            train_counts=arrays["train_counts"],
            options=meta["options"],
            val_fraction=meta["val_fraction"],
            val_mode=meta["val_mode"],
        )
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise DataError(
            f"the split in {directory} is incomplete or corrupt ({type(exc).__name__}: {exc}); "
            "delete partition.npz and partition.json and create the split again"
        ) from exc
    actual = split.hash()
    if actual != meta.get("hash"):
        raise DataError(
            f"partition.npz in {directory} does not match partition.json (hash {actual[:12]}... != "
            f"{str(meta.get('hash'))[:12]}...); the files were modified or come from different splits: "
            "delete both and create the split again"
        )
    return split
