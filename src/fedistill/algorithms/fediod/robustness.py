"""FedIOD against one poisoning site (`RobustnessOptions`): the plausibility screen on the sites' logits,
input-gradients and class counts, and the ensemble's combine. With the defaults (checks on,
`ensemble_combine = "mean"`) an honest federation trains exactly as without them: the checks only ever
drop replies."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.option_groups import RobustnessOptions
from fedistill.algorithms.shared.weight_average import robust_combine
from fedistill.federation.fleet import Fleet, Reply
from fedistill.federation.messages import Message
from fedistill.federation.plausibility import GRADIENTS, count_faults, magnitude_faults, norm_faults, screen
from fedistill.federation.reply_spec import NUM_SAMPLES


def screened_logits(
    options: RobustnessOptions, fleet: Fleet, sent: Mapping[int, Reply], step: int | None = None
) -> dict[int, Reply]:
    """`sent` less the replies whose logits are implausible next to the other sites' (dropped as invalid)."""
    if not options.plausibility_checks:
        return dict(sent)
    return screen(fleet, sent, magnitude_faults, step)


def screened_gradients(
    options: RobustnessOptions, fleet: Fleet, sent: Mapping[int, Reply], step: int | None = None
) -> dict[int, Reply]:
    """`sent` less the replies whose input-gradients are far larger than the other sites' (dropped)."""
    if not options.plausibility_checks:
        return dict(sent)
    return screen(fleet, sent, lambda messages: norm_faults(messages, "input-gradients", GRADIENTS), step)


def screened_counts(options: RobustnessOptions, fleet: Fleet, sent: Mapping[int, Reply]) -> dict[int, Reply]:
    """`sent` less the stage-1 replies whose class counts exceed or do not sum to their sample count
    (classification: one label per sample)."""
    if not options.plausibility_checks:
        return dict(sent)
    return screen(fleet, sent, _count_faults)


def _count_faults(messages: Mapping[int, Message]) -> dict[int, str]:
    counts = {
        c: m.array("label-statistics", "class_counts")
        for c, m in messages.items()
        if "class_counts" in m.arrays.get("label-statistics", {})
    }
    return count_faults(counts, {c: float(messages[c].scalar("metrics", NUM_SAMPLES)) for c in counts})


def combined_ensemble(
    options: RobustnessOptions, logits: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """The ensemble's logits (B, C) from the teachers' (K, B, C) and their weights: Eq. 9's weighted sum
    (`mean`), or the weighted median or trimmed mean of their probabilities, clipped at `combine_clip`,
    renormalised and taken back to centred log-probabilities."""
    if options.ensemble_combine == "mean":
        return L.ensemble_logits(logits, weights)
    probabilities = torch.softmax(logits, dim=-1)
    combined = robust_combine(probabilities, weights, options.ensemble_combine, options.combine_trim)
    combined = combined.clamp(options.combine_clip, 1.0)
    log_p = (combined / combined.sum(-1, keepdim=True)).log()
    return log_p - log_p.mean(-1, keepdim=True)
