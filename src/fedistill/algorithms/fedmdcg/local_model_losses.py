"""FedMD-CG client, stage 1: the local model's loss (Eq. 1-4) and the λ-ramp over rounds.

Notation as in :mod:`losses`: F_i the local extractor, D_i the local head, Ĝ the received global
generator; the ramped terms bring Ĝ's knowledge in at the logit and the feature level.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from fedistill.algorithms.fedmdcg.loss_checks import (
    check_lambda,
    check_same_shape,
    check_temperature,
    kl_batchmean,
)
from fedistill.errors import ConfigError
from fedistill.models.base import unknown_choice

CLIENT_TEMPERATURE: float = 10.0
"""T_c of the client's logit-level KD from the global generator (stage 1)."""

RAMP_SCHEDULES: tuple[str, ...] = ("cubic", "none")
"""``cubic``: λ(t) = λ⁰·(t/(R−1))^p (the code, p = 3); ``none``: λ(t) = λ⁰ from round 1 on."""


def local_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Eq. 1: CE(D_i(F_i(x)), y), batch mean; the ordinary supervised loss on private data."""
    return F.cross_entropy(logits, labels)


def logit_kd_from_global(
    local_logits: torch.Tensor, generated_logits: torch.Tensor, temperature: float = CLIENT_TEMPERATURE
) -> torch.Tensor:
    """Eq. 2, L_kl (λ_kl_F): KL_batchmean(softmax(D_i(Ĝ(y,ε))/T) ‖ softmax(D_i(F_i(x))/T)).

    Brings the global generator's knowledge in at the logit level: Ĝ's features for the same labels,
    read by the *current local head*, are the (detached) target. T_c = 10, no T² factor.
    """
    check_temperature(temperature)
    check_same_shape("local logits", local_logits, "generated logits", generated_logits)
    target = torch.softmax(generated_logits.detach() / temperature, dim=-1)
    return kl_batchmean(torch.log_softmax(local_logits / temperature, dim=-1), target)


def generated_ce(generated_logits: torch.Tensor, sampled_labels: torch.Tensor) -> torch.Tensor:
    """Eq. 3, L_ce^G (λ_ce_G): CE(D_i(Ĝ(ŷ,ε)), ŷ) with ŷ drawn ∝ the global label counts.

    The extra classification loss: the local head also learns from generated features of classes the
    client may lack (draw ŷ with :func:`label_statistics.sample_labels`).
    """
    return F.cross_entropy(generated_logits, sampled_labels)


def feature_kd_to_global(local_features: torch.Tensor, generated_features: torch.Tensor) -> torch.Tensor:
    """Eq. 2, L_mse^→ (λ_mse_F): MSE(F_i(x), Ĝ(y,ε).detach()), mean over batch and feature dims.

    Feature-level KD that pulls the local extractor towards the global generator: same y, and the same
    draw Ĝ(y, ε) whose reading by the local head is L_kl's target.
    """
    check_same_shape("local features", local_features, "generated features", generated_features)
    return F.mse_loss(local_features.flatten(1), generated_features.detach().flatten(1))


def distillation_active(round_index: int) -> bool:
    """The switch: in round 0 there is no trained global generator yet, so the local loss is CE only."""
    return round_index > 0


def ramp_factor(round_index: int, rounds: int, schedule: str = "cubic", power: float = 3.0) -> float:
    """The factor on λ1..λ3 in round t of R: 0 in round 0, then (t/(R−1))^p (``cubic``) or 1 (``none``).

    The code's cubic ramp goes from 0 at t = 0 to λ⁰ at the last round (≈0.13·λ⁰ at t = 50 of 100);
    the paper says only that the weights start at 0 and grow with the round at a rate set by p. With
    ``none`` the switch of :func:`distillation_active` still keeps round 0 at CE only.
    """
    if schedule not in RAMP_SCHEDULES:
        raise unknown_choice("lambda ramp schedule", schedule, RAMP_SCHEDULES)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds must be a positive integer, got {rounds!r}")
    if not 0 <= round_index < rounds:
        raise ValueError(f"round index must be in 0..{rounds - 1}, got {round_index!r}")
    if not power > 0:
        raise ConfigError(f"ramp power must be > 0, got {power!r}")
    if not distillation_active(round_index):
        return 0.0
    if schedule == "none":
        return 1.0
    return (round_index / (rounds - 1)) ** power


@dataclass(frozen=True)
class LocalModelLambdas:
    """λ⁰ of Eq. 4 (the code's λ_kl_F, λ_ce_G, λ_mse_F); :meth:`at_round` applies the ramp."""

    kl: float = 1.0
    ce_gen: float = 1.0
    mse: float = 0.1

    def __post_init__(self) -> None:
        for name in ("kl", "ce_gen", "mse"):
            check_lambda(name, getattr(self, name))

    def at_round(
        self, round_index: int, rounds: int, schedule: str = "cubic", power: float = 3.0
    ) -> LocalModelLambdas:
        """These weights times :func:`ramp_factor` for round ``round_index`` of ``rounds``."""
        f = ramp_factor(round_index, rounds, schedule, power)
        return replace(self, kl=self.kl * f, ce_gen=self.ce_gen * f, mse=self.mse * f)


def local_model_objective(
    ce: torch.Tensor,
    kl: torch.Tensor | None,
    ce_gen: torch.Tensor | None,
    mse: torch.Tensor | None,
    lambdas: LocalModelLambdas,
) -> torch.Tensor:
    """Eq. 4: CE + λ1·L_kl + λ2·L_ce^G + λ3·L_mse^→, with ``lambdas`` already ramped.

    Terms passed as None (round 0, when they are not computed) are left out.
    """
    total = ce
    for weight, term in ((lambdas.kl, kl), (lambdas.ce_gen, ce_gen), (lambdas.mse, mse)):
        if term is not None:
            total = total + weight * term
    return total
