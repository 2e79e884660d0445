"""Batch-norm statistic matching (DeepInversion, Yin et al. 2020; the stabiliser DENSE and Co-Boosting
use): synthetic inputs should excite a trained model's BatchNorm layers with the batch statistics it saw
on its real data, which its running mean and variance record.

    L_bn(x) = sum_l ||mean_l(x) - running_mean_l||_2 + ||var_l(x) - running_var_l||_2  (l: BatchNorm layers)

where mean_l and var_l (biased) are taken over the batch and, for images, the spatial positions of the
layer's input. In FedIOD the term is computed on the client, through its own teacher, and reaches the
generator only as part of the input-gradient the client already returns: the running statistics never
leave the site.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from fedistill.models.norm import norm_layers


@contextmanager
def batchnorm_statistics_loss(
    model: nn.Module, rows: torch.Tensor | None = None
) -> Iterator[list[torch.Tensor]]:
    """While active, every forward pass of `model` appends L_bn's per-layer terms to the yielded list.

    Use: ``with batchnorm_statistics_loss(teacher) as terms: logits = teacher(x)``; then ``sum(terms)``.
    A model without BatchNorm layers yields no terms (the loss is 0). `rows` (a boolean mask over the
    batch) takes the statistics over those samples only: FedIOD's per-client mixture matches a
    teacher's statistics on the samples meant for its site.
    """
    terms: list[torch.Tensor] = []

    def hook(
        module: nn.modules.batchnorm._BatchNorm, args: tuple[torch.Tensor, ...], _: torch.Tensor
    ) -> None:
        h = args[0] if rows is None else args[0][rows]
        dims = [0, *range(2, h.dim())]
        mean, var = h.mean(dims), h.var(dims, unbiased=False)
        assert module.running_mean is not None and module.running_var is not None
        terms.append(
            torch.linalg.vector_norm(mean - module.running_mean)
            + torch.linalg.vector_norm(var - module.running_var)
        )

    handles = [m.register_forward_hook(hook) for m in norm_layers(model).values()]
    try:
        yield terms
    finally:
        for handle in handles:
            handle.remove()
