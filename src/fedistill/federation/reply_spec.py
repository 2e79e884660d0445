"""What a server expects back: declared once per request, checked by the fleet on receipt.

Every invalid reply is treated alike, whatever is wrong with it (a wrong shape or dtype, a missing
array or metric, a NaN, an oversize payload, a negative sample count or density ratio): the fleet
turns it into a failed reply naming the client and the fault, the ledger records it as `invalid`, the
client is listed among the dropped ones in the summary, and the run goes on while at least
`min_clients` answered. Server code therefore only ever reads replies that match what it asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fedistill.federation.messages import ArraySpec, Message, expect_arrays

#: The scalar every training reply carries: the weight of the client in averages.
NUM_SAMPLES = "num_samples"
#: What every local-training reply reports (its loss too, except under DP, which keeps it home), and
#: what a reply with local evaluation adds.
TRAIN_METRICS = (NUM_SAMPLES,)
TRAIN_LOSS = "train_loss"
LOCAL_METRICS = ("local_accuracy", "local_count")
#: The metrics that count samples: the weights of averages, so never below 0.
COUNTS = frozenset({NUM_SAMPLES, "local_count"})
#: A client's refusal to exceed its privacy budget (privacy/budget.py): a valid answer where the request's
#: spec is `refusable` (the server then stops the run with the client's reason), invalid elsewhere.
REFUSED = "privacy_budget_refused"
#: What a refusal carries, and nothing else (privacy/budget.py `refusal`): numbers and the reason.
REFUSAL_NUMBERS = ("epsilon", "epsilon_would_be", "target_epsilon")


@dataclass(frozen=True)
class ReplySpec:
    """Arrays per kind (exact: no other names under that kind, unless listed in `open_kinds`), and the
    `metrics` scalars that must be there as finite numbers; the counts (`COUNTS`) must also be >= 0.
    Every other metric a reply carries must be a number too (bool counts). `refusable`: a privacy-budget
    refusal (only its own scalars) is also a valid answer; elsewhere it is an invalid reply,
    so a flag cannot carry arrays past these checks to a server that never reads refusals. `non_negative`:
    the kinds whose every value must be >= 0 (density ratios, class counts): a negative one is no honest
    site's output, and the server's weighting would stop the run on it."""

    arrays: Mapping[str, Mapping[str, ArraySpec]] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    open_kinds: frozenset[str] = frozenset()
    refusable: bool = False
    non_negative: frozenset[str] = frozenset()

    def check(self, message: Message) -> None:
        """FederationError saying what is wrong with `message`; nothing when it is as expected."""
        if message.scalars.get("metrics", {}).get(REFUSED) is True:
            if not self.refusable:
                raise _fault(message, "a privacy-budget refusal, which this request does not take")
            check_refusal(message)
            return
        for kind, specs in self.arrays.items():
            expect_arrays(message, kind, specs, exact=kind not in self.open_kinds)
        for kind in self.non_negative:
            for name in message.arrays.get(kind, {}):
                lowest = message.array(kind, name).min(initial=0)
                if lowest < 0:
                    raise _fault(message, f"{kind}/{name} has a negative value ({lowest:.3g})")
        metrics = message.scalars.get("metrics", {})
        for name, value in metrics.items():  # servers read any metric they find with float()
            if not isinstance(value, int | float):
                raise _fault(message, f"metric {name!r} is {value!r}, not a number")
        for name in self.metrics:
            if name not in metrics:
                raise _fault(message, f"missing metric {name!r}")
            value = metrics[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise _fault(message, f"metric {name!r} is {value!r}, not a finite number")
            if name in COUNTS and value < 0:
                raise _fault(message, f"metric {name!r} is {value}, a negative sample count")

    def __or__(self, other: ReplySpec) -> ReplySpec:
        """Both specs at once: the arrays of both (under a kind both name, each one's names), the metrics,
        open kinds and non-negative kinds of both, refusable if either is."""
        kinds = dict.fromkeys([*self.arrays, *other.arrays])
        return ReplySpec(
            {kind: {**self.arrays.get(kind, {}), **other.arrays.get(kind, {})} for kind in kinds},
            tuple(dict.fromkeys(self.metrics + other.metrics)),
            self.open_kinds | other.open_kinds,
            self.refusable or other.refusable,
            self.non_negative | other.non_negative,
        )


def check_refusal(message: Message) -> None:
    """A refusal is its flag, finite epsilons and a reason: no arrays, no other scalars."""
    if message.arrays:
        raise _fault(message, f"a privacy-budget refusal that carries arrays ({sorted(message.arrays)})")
    extra = set(message.scalars) - {"metrics"}
    metrics = message.scalars.get("metrics", {})
    extra |= set(metrics) - {REFUSED, "reason", *REFUSAL_NUMBERS}
    if extra:
        raise _fault(message, f"a privacy-budget refusal with other scalars ({sorted(extra)})")
    for name in REFUSAL_NUMBERS:
        value = metrics.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _fault(message, f"a privacy-budget refusal whose {name!r} is {value!r}, not a number")
    if not isinstance(metrics.get("reason"), str):
        raise _fault(message, "a privacy-budget refusal without its reason")


def _fault(message: Message, what: str) -> Exception:
    from fedistill.errors import FederationError

    return FederationError(f"{message.type}: {what}")


Expectation = ReplySpec | Mapping[int, ReplySpec] | None


def spec_for(expect: Expectation, client: int) -> ReplySpec | None:
    """The reply spec that applies to `client`: the one spec, its entry in a per-client map, or None."""
    if expect is None or isinstance(expect, ReplySpec):
        return expect
    return expect.get(client)
