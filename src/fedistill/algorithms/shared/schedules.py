"""Learning rates set by hand, step by step, for the loops that drive their own optimisers (the
generator-based methods: FedIOD, DENSE, Co-Boosting, AsynDGAN)."""

from __future__ import annotations

import math

import torch


def cosine_lr(base: float, step: int, total: int, schedule: str) -> float:
    """`base` decayed along half a cosine over `total` steps (`schedule` "cosine"), or `base` ("constant")."""
    if schedule == "constant" or total <= 0:
        return base
    return 0.5 * base * (1.0 + math.cos(math.pi * min(step, total) / total))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group of `optimizer`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
