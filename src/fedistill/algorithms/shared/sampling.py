"""Which clients take part in a round, and the mean of a metric over the replies: the same rules for
every method that samples a fraction of its sites per round."""

from __future__ import annotations

import numpy as np

from fedistill.federation.messages import Message
from fedistill.seeding import numpy_generator


def sample_clients(clients: list[int], fraction: float, seed: int, round: int) -> list[int]:
    """max(1, round(fraction * K)) clients without replacement, drawn from (seed, round) alone."""
    count = max(1, round_half_up(fraction * len(clients)))
    if count >= len(clients):
        return list(clients)
    chosen = numpy_generator(seed, "client-sampling", round).choice(len(clients), size=count, replace=False)
    return sorted(clients[i] for i in chosen)


def round_half_up(value: float) -> int:
    """`value` rounded to the nearest integer, halves up (Python's round() rounds halves to even)."""
    return int(np.floor(value + 0.5))


def sampling_rate(fraction: float, clients: int) -> float:
    """The share of the K clients `sample_clients` picks per round: m / K (1 when all take part)."""
    return min(clients, max(1, round_half_up(fraction * clients))) / clients


def mean_metric(replies: dict[int, Message], name: str, weights: list[float] | None = None) -> float:
    """The (weighted) mean of a metric over the replies that report it; nan when none does."""
    pairs = [
        (float(r.scalar("metrics", name)), 1.0 if weights is None else weights[i])
        for i, r in enumerate(replies.values())
        if name in r.scalars.get("metrics", {})
    ]
    if not pairs:
        return float("nan")
    return float(np.average([v for v, _ in pairs], weights=[w for _, w in pairs]))
