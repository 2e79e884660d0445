"""Averages of weights: an exponential moving average of a model's weights (Polyak averaging), kept
beside the model that trains, and robust coordinate-wise combines of several sites' values.

The moving average of a stream of noisy steps on ever-new synthetic batches sits nearer the middle of
what they agree on than the last step does; it costs one copy of the model and a lerp per step. The
median and trimmed mean of the sites' values (`robust_combine`) keep one site from moving a coordinate
wherever it likes, which a mean cannot."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import nn


class WeightAverage:
    """`model` holds the average; `update` moves it a share `1 - decay` towards the trained model's
    weights. Floating-point buffers (batch-norm running statistics) are averaged the same way, the others
    (batch counters) copied. Not torch's `AveragedModel`: its first update replaces the average by the
    trained weights instead of averaging from the starting copy, and with `use_buffers` it averages the
    integer batch counters too."""

    def __init__(self, trained: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must lie in (0, 1); got {decay}")
        self.decay = decay
        self.model = copy.deepcopy(trained)
        self.model.requires_grad_(False)
        self.model.eval()

    @torch.no_grad()
    def update(self, trained: nn.Module) -> None:
        """Move the average toward `trained`'s parameters and floating-point buffers by 1 - decay."""
        weight = 1.0 - self.decay
        for mine, theirs in zip(self.model.parameters(), trained.parameters(), strict=True):
            mine.lerp_(theirs.detach(), weight)
        for mine, theirs in zip(self.model.buffers(), trained.buffers(), strict=True):
            if mine.is_floating_point():
                mine.lerp_(theirs, weight)
            else:
                mine.copy_(theirs)


#: How a server combines the sites' values coordinate by coordinate: their weighted mean (the default,
#: what every recorded run used), their weighted median, or their weighted mean once the highest and the
#: lowest values are cut. The last two bound what a minority of sites can move any coordinate by.
COMBINES = ("mean", "median", "trimmed-mean")


def robust_combine(values: torch.Tensor, weights: torch.Tensor, mode: str, trim: float = 0.2) -> torch.Tensor:
    """Combine `values` over dim 0 (one row per site) with non-negative `weights` that broadcast to them:
    the weighted mean, the weighted median (the value at half of the cumulative weight, in sorted order;
    the plain median where the weights are all 0), or the trimmed mean: the `max(1, trim * K)` highest
    and lowest of the K values cut (from three sites up), the weighted mean of the rest (their plain mean
    where their weights are all 0). Differentiable in `values` (the median's gradient goes to the chosen
    site)."""
    tiny = torch.finfo(values.dtype).tiny
    w = (weights.to(values.dtype) * torch.ones_like(values)).clamp_min(0)
    if mode == "mean":
        return (w * values).sum(0) / w.sum(0).clamp_min(tiny)
    ordered, order = values.sort(dim=0)
    w = w.gather(0, order)
    if mode == "median":
        w = torch.where(w.sum(0, keepdim=True) > 0, w, torch.ones_like(w))  # no weight at all: plain median
        upper = w.cumsum(0) / w.sum(0, keepdim=True)
        chosen = upper >= 0.5
        chosen &= chosen.cumsum(0) == 1  # the first site whose cumulative weight reaches half
        return (chosen.to(values.dtype) * ordered).sum(0)
    if mode == "trimmed-mean":
        if not 0.0 <= trim < 0.5:
            raise ValueError(f"trim must lie in [0, 0.5); got {trim}")
        k = len(values)
        # rounded first: 0.29 * 100 is 28.999... in floating point, and 29 sites are what was asked for
        cut = max(1, int(round(trim * k, 9))) if k >= 3 else 0
        rank = torch.arange(k, device=values.device).view(-1, *([1] * (values.dim() - 1)))
        kept = ((rank >= cut) & (rank < k - cut)).to(values.dtype)
        mass = (kept * w).sum(0)
        weighted = (kept * w * ordered).sum(0) / mass.clamp_min(tiny)
        return torch.where(mass > 0, weighted, (kept * ordered).sum(0) / kept.sum(0))
    raise ValueError(f"unknown combine {mode!r}; choose one of {', '.join(COMBINES)}")


def robust_average_states(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float], mode: str, trim: float = 0.2
) -> dict[str, torch.Tensor]:
    """State dicts combined coordinate-wise (`robust_combine`, in float64); integer buffers (BatchNorm's
    batch counter) take the first state's value, as in the plain weighted average."""
    share = torch.tensor([float(w) for w in weights], dtype=torch.float64)
    out: dict[str, torch.Tensor] = {}
    for name, first in states[0].items():
        if not first.is_floating_point():
            out[name] = first.clone()
            continue
        stacked = torch.stack([s[name].to(torch.float64) for s in states])
        w = share.to(stacked.device).view(-1, *([1] * first.dim()))
        out[name] = robust_combine(stacked, w, mode, trim).to(first.dtype)
    return out
