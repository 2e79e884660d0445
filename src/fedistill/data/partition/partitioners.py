"""The partitioners, each registered under its name in ``PARTITIONERS`` (see the package's docstring)."""

from __future__ import annotations

import warnings

import numpy as np

from fedistill.data.partition.checks import check_bool, check_positive_int, seeded_rng
from fedistill.data.partition.registry import register
from fedistill.errors import PartitionError, UserError

# --------------------------------------------------------------------------------------------------
# shared building blocks


def deal_by_class(y: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
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


@register("iid", dirichlet=False)
def iid(
    labels: np.ndarray, num_clients: int, *, alpha: float | None, seed: int, num_classes: int
) -> list[np.ndarray]:
    """Class-stratified equal split; ``alpha`` is ignored. Indices are shuffled within each client.

    FedMD-CG's ``iid`` mode, with integer dealing instead of float cut points so that no client is short
    by a sample because of rounding.
    """
    return deal_by_class(labels, num_clients, seeded_rng(seed))


@register("natural", dirichlet=False)
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


@register("dirichlet", dirichlet=True)
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
    shuffle_within_class = check_bool("shuffle_within_class", shuffle_within_class)
    rng = seeded_rng(seed)
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


@register("dirichlet-balanced", dirichlet=True)
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
    group_size = check_positive_int("group_size", group_size)
    max_retries = check_positive_int("max_retries", max_retries)
    if (
        isinstance(min_fraction, bool)
        or not isinstance(min_fraction, int | float)
        or not 0 <= min_fraction <= 1
    ):
        raise UserError(f"min_fraction must be a number in [0, 1] (got {min_fraction!r})")
    rng = seeded_rng(seed)
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


@register("dirichlet-equal", dirichlet=True)
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
    rng = seeded_rng(seed)
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
            take = np.sort(np.argpartition(keys, quota - 1)[:quota])  # its order follows the CPU
        free[take] = False
        parts.append(rng.permutation(take))
    return parts


@register("dirichlet-unbalanced", dirichlet=True)
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
    min_size = check_positive_int("min_size", min_size, minimum=0)
    max_retries = check_positive_int("max_retries", max_retries)
    rng = seeded_rng(seed)
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


@register("dirichlet-flwr", dirichlet=True)
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
    min_partition_size = check_positive_int("min_partition_size", min_partition_size, minimum=0)
    self_balancing = check_bool("self_balancing", self_balancing)
    shuffle = check_bool("shuffle", shuffle)
    table = Dataset.from_dict({"idx": np.arange(labels.size, dtype=np.int64), "label": labels})
    partitioner = DirichletPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=min_partition_size,
        self_balancing=self_balancing,
        shuffle=shuffle,
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
