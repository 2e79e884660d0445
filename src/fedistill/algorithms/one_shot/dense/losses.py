"""DENSE's loss terms and ensemble, as pure functions (Co-Boosting reuses them with its switches).

Generator (one synthetic batch x = G(z) with sampled labels y, ensemble logits E(x), student S(x)):

    L_G = w_ce * mean_i[(1 - p_E(y_i | x_i))^h * CE(E(x_i), y_i)]       (h = 0: DENSE's plain CE;
                                                                           h > 0: Co-Boosting's hard samples)
        + w_bn * L_bn(x)                                                  (DeepInversion, every teacher)
        - w_adv * mean_i[m_i * T^2 KL(softmax(E(x_i) / T) || softmax(S(x_i) / T))]

with m_i = 1 where S and E disagree on x_i (DENSE's mask, `adv_mask = true`, the default of both
`dense` and `coboosting`; Co-Boosting's released code, its `preset = "official-code"`: m_i = 1
everywhere). The hard-sample weight (1 - p)^h is held constant (no gradient through it), as in
Co-Boosting's code.
Student: T^2 KL(softmax(E(x) / T) || softmax(S(x) / T)), batch mean, at the distillation temperature.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: A model, or an ensemble, as a function from inputs to logits.
Logits = Callable[[torch.Tensor], torch.Tensor]


def kl_to_ensemble(student: torch.Tensor, ensemble: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-sample T^2 KL(softmax(ensemble / T) || softmax(student / T)), shape (B,)."""
    log_q = F.log_softmax(student / temperature, dim=1)
    p = F.softmax(ensemble / temperature, dim=1)
    return F.kl_div(log_q, p, reduction="none").sum(1) * temperature**2


def distillation_loss(student: torch.Tensor, ensemble: torch.Tensor, temperature: float) -> torch.Tensor:
    """The student's loss: the batch mean of `kl_to_ensemble`."""
    return kl_to_ensemble(student, ensemble, temperature).mean()


def generator_losses(
    ensemble: torch.Tensor,
    student: torch.Tensor,
    labels: torch.Tensor,
    bn: torch.Tensor,
    *,
    w_ce: float,
    w_bn: float,
    w_adv: float,
    temperature: float,
    mask: bool,
    hard_power: float = 0.0,
) -> dict[str, torch.Tensor]:
    """The module docstring's L_G and its terms: `ce`, `bn`, `adv` (already negative) and `total`."""
    per_sample = F.cross_entropy(ensemble, labels, reduction="none")
    if hard_power:
        p_true = F.softmax(ensemble, dim=1).gather(1, labels[:, None]).squeeze(1)
        per_sample = (1.0 - p_true.detach()).pow(hard_power) * per_sample
    ce = per_sample.mean()
    kl = kl_to_ensemble(student, ensemble, temperature)
    if mask:
        kl = kl * (student.argmax(1) != ensemble.argmax(1)).to(kl.dtype)
    adv = -kl.mean()
    return {"ce": ce, "bn": bn, "adv": adv, "total": w_ce * ce + w_bn * bn + w_adv * adv}


def weighted_logits(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The ensemble of (K, B, C) teacher logits: sum_k w_k z_k / sum_k w_k (uniform w: their mean)."""
    return (weights[:, None, None] * logits).sum(0) / weights.sum()


class Ensemble(nn.Module):
    """The teachers as one classifier (for the evaluation harness): `weighted_logits` of their outputs."""

    def __init__(self, teachers: list[nn.Module], weights: torch.Tensor) -> None:
        super().__init__()
        self.teachers = nn.ModuleList(teachers)
        self.register_buffer("weights", weights.detach().clone())

    def train(self, mode: bool = True) -> Ensemble:
        """The teachers stay frozen in eval mode (an evaluation harness restores the mode it found)."""
        self.training = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return weighted_logits(torch.stack([t(x) for t in self.teachers]), self.weights)


def reset_generator(generator: nn.Module) -> None:
    """DENSE's and Co-Boosting's `reset_model`: convolution and linear weights N(0, 0.02), biases 0,
    BatchNorm scales N(1, 0.02) and shifts 0 (from torch's global stream: call it under `seeded`)."""
    for m in generator.modules():
        if isinstance(m, nn.Conv2d | nn.ConvTranspose2d | nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0.0)
        if isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.constant_(m.bias, 0.0)
