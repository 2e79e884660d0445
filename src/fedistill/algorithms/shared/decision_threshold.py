"""`decision_threshold = "validation"`: the sites' side, and the server's request.

At the end of a run the server sends the model it exports to every site (`evaluate.threshold`, the
model's parameters and its architecture's name); each site answers with the pixel counts of its
validation split at every threshold (`metrics/thresholds.py`: 3 x 19 numbers, no image) and the split's
size. The server adds the counts and picks the threshold (`chosen_threshold`). A client logic takes part
by inheriting `ThresholdCounts`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from fedistill.algorithms.shared.training import new_model, task_of
from fedistill.federation.client import handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import ReplySpec
from fedistill.metrics.thresholds import THRESHOLDS, chosen_threshold, threshold_counts

THRESHOLD_QUERY = "evaluate.threshold"


class ThresholdCounts:
    """A site's answer to `evaluate.threshold`: its validation split's pixel counts at every threshold."""

    ctx: Any  # the site's ClientContext

    @handles(THRESHOLD_QUERY, read_only=True)
    def threshold_counts(self, message: Message) -> Message:
        """The received model's true-positive, false-positive and false-negative pixels on this site's
        validation split, at each threshold; the model is dropped after it."""
        ctx = self.ctx
        model = new_model(ctx.config, ctx.info, str(message.scalar("config", "model")))
        model.load_state_dict(message.tensors("parameters"))
        task = task_of(ctx.config, ctx.info)
        if len(ctx.val):
            counts = threshold_counts(task.outputs(model, ctx.val, ctx.info).cpu(), ctx.val.y)
        else:
            counts = np.zeros((3, len(THRESHOLDS)), dtype=np.int64)
        return Message.build(
            THRESHOLD_QUERY,
            arrays={"metrics": {"threshold_counts": counts}},
            scalars={"metrics": {"val_count": len(ctx.val)}},
        )


def validation_threshold(
    fleet: Fleet, model: nn.Module, architecture: str, timeout: float | None = None
) -> float:
    """The threshold the sites' summed validation counts of `model` choose (every site asked)."""
    request = Message.build(
        THRESHOLD_QUERY,
        arrays={"parameters": model.state_dict()},
        scalars={"config": {"model": architecture}},
    )
    spec = {"threshold_counts": ArraySpec("int64", (3, len(THRESHOLDS)))}
    expect = ReplySpec({"metrics": spec}, ("val_count",), non_negative=frozenset({"metrics"}))
    replies = successful(
        fleet.broadcast(request, timeout=timeout, expect=expect), what="validation threshold counts"
    )
    total = sum(np.asarray(r.array("metrics", "threshold_counts")) for r in replies.values())
    return chosen_threshold(total)
