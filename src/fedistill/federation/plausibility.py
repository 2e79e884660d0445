"""Plausibility: what a server checks on one round's replies together, after each passed its spec.

A reply can have the right structure, size and finite values and still poison a federation: teacher
logits scaled by 1e30 outvote every honest site, one parameter of 1e30 makes every average useless, and
class counts larger than the site itself buy a site any share of the ensemble. The rules here judge each
site against the *other* sites of the same request, with statistics one site cannot move once there are
three others (their median and median absolute deviation; with one or two others a site can: a two-site
federation's poisoner that sends zeros leaves the honest site only the floor), and never below an
absolute floor, so an honest but unusual site (skewed labels, a small data set, a confident teacher) is
not flagged. A site with no peer to compare with is flagged only beyond `Bound.cap`, far from anything a
float32 network computes.

Each rule returns `{client: why}`; `Fleet.reject` turns those replies into failed ones exactly as an
invalid reply is (ledger status `invalid`, the client among the dropped ones, the run goes on while
`min_clients` answered). The rules name no algorithm; the servers pick the ones that fit their replies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from fedistill.federation.fleet import Fleet, Reply
from fedistill.federation.messages import Message


@dataclass(frozen=True)
class Bound:
    """When a site's value is implausible next to the others': above `floor`, above `ratio` times their
    median and above their median + `spread` times their median absolute deviation, all three; or,
    whatever the others say, above `cap`."""

    floor: float
    ratio: float = 10.0
    spread: float = 10.0
    cap: float = 1e8

    def limit(self, others: Iterable[float]) -> float:
        """The largest plausible value next to `others` (the cap when there is no other)."""
        values = np.asarray(list(others), dtype=np.float64)
        if values.size == 0:
            return self.cap
        median = float(np.median(values))
        mad = float(np.median(np.abs(values - median)))
        return min(self.cap, max(self.floor, self.ratio * median, median + self.spread * mad))


#: The largest |logit|: honest teachers stay within a few tens; a thousand is no network's own doing.
LOGITS = Bound(floor=1000.0)
#: The L2 norm of a model's floating-point parameters and buffers: every site starts from the same model.
PARAMETERS = Bound(floor=100.0)
#: The L2 norm of a gradient: these vary more between honest sites (a confident discriminator gives
#: small ones), so only a hundredfold excess counts.
GRADIENTS = Bound(floor=100.0, ratio=100.0, spread=100.0)


def largest_magnitude(arrays: Iterable[np.ndarray]) -> float:
    """The largest |value| over the floating-point arrays (0 when there is none)."""
    peaks = [float(np.abs(a).max(initial=0.0)) for a in arrays if a.dtype.kind == "f"]
    return max(peaks, default=0.0)


def l2_norm(arrays: Iterable[np.ndarray]) -> float:
    """The L2 norm of the floating-point arrays together, accumulated in float64 (no overflow)."""
    total = 0.0
    for a in arrays:
        if a.dtype.kind == "f":
            flat = a.astype(np.float64, copy=False).ravel()
            total += float(flat @ flat)
    return float(np.sqrt(total))


def outliers(values: Mapping[int, float], bound: Bound) -> dict[int, float]:
    """The clients whose value exceeds `bound.limit` of the other clients' values, with that limit."""
    flagged = {}
    for client, value in values.items():
        limit = bound.limit(v for c, v in values.items() if c != client)
        if value > limit:
            flagged[client] = limit
    return flagged


def decoded(message: Message, kind: str) -> dict[str, np.ndarray]:
    """The arrays of content `kind` as the receiver reads them (decoded from a compact wire encoding)."""
    return {name: message.array(kind, name) for name in message.arrays.get(kind, {})}


def magnitude_faults(
    messages: Mapping[int, Message], kind: str = "logits", bound: Bound = LOGITS
) -> dict[int, str]:
    """Sites whose largest |value| of content `kind` is far beyond the other sites'."""
    peaks = {c: largest_magnitude(decoded(m, kind).values()) for c, m in messages.items()}
    return {
        c: f"{kind}: max |value| {peaks[c]:.3g} is beyond the plausible {limit:.3g} of this round's sites"
        for c, limit in outliers(peaks, bound).items()
    }


def norm_faults(messages: Mapping[int, Message], kind: str, bound: Bound) -> dict[int, str]:
    """Sites whose L2 norm of content `kind` is far beyond that of the other sites sending the same
    arrays (names and shapes: one architecture is compared only with itself)."""
    groups: dict[tuple, dict[int, float]] = {}
    for client, message in messages.items():
        named = decoded(message, kind)
        signature = tuple(sorted((name, a.shape) for name, a in named.items()))
        groups.setdefault(signature, {})[client] = l2_norm(named.values())
    faults = {}
    for norms in groups.values():
        for client, limit in outliers(norms, bound).items():
            faults[client] = (
                f"{kind}: norm {norms[client]:.3g} is beyond the plausible {limit:.3g} of this round's sites"
            )
    return faults


def count_faults(counts: Mapping[int, np.ndarray], samples: Mapping[int, float]) -> dict[int, str]:
    """Sites whose class counts are negative, exceed their declared sample count, or do not sum to it."""
    faults = {}
    for client, row in counts.items():
        row, total = np.asarray(row), float(samples[client])
        if (row < 0).any():
            faults[client] = "label-statistics: a negative class count"
        elif float(row.max(initial=0)) > total:
            faults[client] = f"label-statistics: a class count {row.max()} exceeds the {total:g} samples"
        elif float(row.sum()) != total:
            faults[client] = f"label-statistics: class counts sum to {row.sum()}, not the {total:g} samples"
    return faults


def probability_faults(probabilities: Mapping[int, np.ndarray], tolerance: float = 1e-3) -> dict[int, str]:
    """Sites whose probabilities (classes on the last axis) leave [0, 1] or do not sum to 1 per row."""
    faults = {}
    for client, p in probabilities.items():
        p = np.asarray(p, dtype=np.float64)
        if p.size and (p.min() < -tolerance or p.max() > 1 + tolerance):
            faults[client] = f"probabilities in [{p.min():.3g}, {p.max():.3g}], outside [0, 1]"
        elif p.size and np.abs(p.sum(axis=-1) - 1.0).max() > tolerance * max(1, p.shape[-1]):
            worst = float(np.abs(p.sum(axis=-1) - 1.0).max())
            faults[client] = f"probabilities whose rows miss a sum of 1 by up to {worst:.3g}"
    return faults


def merged(*faults: Mapping[int, str]) -> dict[int, str]:
    """Each client's first fault over several rules."""
    out: dict[int, str] = {}
    for found in faults:
        for client, why in found.items():
            out.setdefault(client, why)
    return out


def screen(
    fleet: Fleet,
    replies: Mapping[int, Reply],
    rule: Callable[[dict[int, Message]], Mapping[int, str]],
    step: int | None = None,
) -> dict[int, Reply]:
    """`replies` with those `rule` finds implausible, judged together, turned into failed replies."""
    messages = {c: r.message for c, r in replies.items() if r.message is not None}
    return fleet.reject(replies, rule(messages), step)


def screen_parameters(fleet: Fleet, replies: Mapping[int, Reply]) -> dict[int, Reply]:
    """`replies` carrying models, those whose parameter norm is far beyond their architecture's others
    turned into failed replies (FedAvg's, FedDF's and the one-shot baselines' `plausibility_checks`)."""
    return screen(fleet, replies, lambda messages: norm_faults(messages, "parameters", PARAMETERS))
