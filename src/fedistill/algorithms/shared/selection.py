"""Model selection for the methods that train one model at the server (FedIOD, DENSE, AsynDGAN): the
clients score it on their own validation splits, returning metrics only, and the best validated epoch is
the one handed over. The test set is never read here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import nn

from fedistill.algorithms.base import clone_state
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message
from fedistill.federation.reply_spec import ReplySpec


def nothing_selected() -> dict[str, Any]:
    """The record before the first evaluation: any score beats it."""
    return {"score": -1.0, "epoch": 0, "state": None}


def keep_if_best(best: dict[str, Any], score: float, epoch: int, module: nn.Module) -> dict[str, Any]:
    """Model selection's record after an epoch scored `score`: this epoch's state if it scores at least as
    well as the best so far, else the record unchanged.

    A tie goes to the later epoch: with the same validated score, the later model has trained on more
    distinct samples (and, under a cosine schedule, at a smaller rate). Validation splits of a few hundred
    images tie often (docs/results/tuning-history.md has the comparison)."""
    if score >= best["score"]:
        return {"score": score, "epoch": epoch, "state": clone_state(module)}
    return best


def with_selected_score(final: dict[str, Any], best: dict[str, Any], key: str) -> dict[str, Any]:
    """`final` (the last epoch's metrics, the selected epoch's test metrics put in) with `key`, the validation
    metric selection ranked the epochs by, as the selected epoch's score: left as it was, it is the last
    epoch's, beside a test metric of another epoch."""
    return final | {key: best["score"]} if best["state"] is not None else final


def clients_validation_score(
    fleet: Fleet,
    kind: str,
    module: nn.Module,
    metric: str,
    *,
    clients: list[int] | None = None,
    timeout: float | None = None,
    encodings: Mapping[str, str] | None = None,
) -> float:
    """Send `module` to the clients in a `kind` message; each returns `metric` on its validation split
    and the split's size (`val_count`). The score is their size-weighted mean (0 if no client has one).
    `encodings`: the wire encoding of the parameters (`{"parameters": ...}`; default: as they are)."""
    request = Message.build(kind, arrays={"parameters": module.state_dict()}, encodings=encodings)
    replies = successful(
        fleet.broadcast(request, clients, timeout=timeout, expect=ReplySpec(metrics=(metric, "val_count"))),
        what="validation metrics",
    )
    counts = np.array([float(r.scalar("metrics", "val_count")) for r in replies.values()])
    scores = np.array([float(r.scalar("metrics", metric)) for r in replies.values()])
    return float(np.average(scores, weights=counts)) if counts.sum() > 0 else 0.0
