"""Putting teachers of different architectures on one logit scale before they form an ensemble.

A ResNet-8's logits are 2-5 times larger than a LeNet's on the same inputs, so in a sum of logits the
larger-scaled teachers decide every sample, and in the heterogeneous Fashion-MNIST run the ensemble
called almost every early synthetic sample one class. `teacher_logits = "scaled"` divides each
teacher's logits by its mean per-sample standard deviation over the classes, taken over the batch and
held constant (detached): within a teacher, confident and unsure samples keep their relative scale;
across teachers, the scales match. `"raw"` (the paper) leaves the logits as the clients sent them.
"""

from __future__ import annotations

import torch

TEACHER_LOGITS = ("raw", "scaled")


def calibrated(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """`logits` (K, B, C), rescaled per teacher for `mode = "scaled"`; unchanged for `"raw"`."""
    if mode == "raw":
        return logits
    if mode != "scaled":
        raise ValueError(f"unknown teacher_logits mode {mode!r} (valid: {', '.join(TEACHER_LOGITS)})")
    scale = logits.detach().std(dim=-1, unbiased=False).mean(dim=-1).clamp_min(1e-6)  # (K,)
    return logits / scale[:, None, None]
