"""What the FedMD-CG loss terms share: their argument checks and the batch-mean KL of both client stages."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedistill.errors import ConfigError


def check_temperature(temperature: float) -> None:
    """ValueError unless a distillation temperature is positive."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")


def check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """ValueError unless the two tensors have the same shape (the loss terms compare them element-wise)."""
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_lambda(name: str, value: float) -> None:
    """ConfigError unless a loss weight is a finite number of at least 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"loss weight {name} must be a finite number >= 0, got {value!r}")


def kl_batchmean(student_log_probs: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) summed over classes, averaged over the batch (KLDivLoss "batchmean")."""
    return F.kl_div(student_log_probs, teacher_probs, reduction="batchmean")
