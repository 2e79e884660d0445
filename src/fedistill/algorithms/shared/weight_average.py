"""An exponential moving average of a model's weights (Polyak averaging), kept beside the model that
trains. The average of a stream of noisy steps on ever-new synthetic batches sits nearer the middle of
what they agree on than the last step does; it costs one copy of the model and a lerp per step."""

from __future__ import annotations

import copy

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
