"""FedMD-CG server: the crossed data-free distillation of the global pair (Eq. 10-12).

The frozen local pairs (G_i, C_i) teach the global pair (G_g, C_g) three ways, each weighted by the
teacher client's share w_{i,y} of the sample's class: L1 the global pair, L2 the global head on G_i's
features, L3 every local head on G_g's features.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from fedistill.algorithms.fedmdcg.loss_checks import check_same_shape, check_temperature

SERVER_TEMPERATURE: float = 10.0
"""T_s of the server's crossed distillation."""


def server_kd_term(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    sample_weights: torch.Tensor,
    temperature: float = SERVER_TEMPERATURE,
    *,
    official_softmax_bug: bool = False,
) -> torch.Tensor:
    """The weighted server KD: mean_b[ w_b · mean_c p_c·(log p_c − log q_c) ].

    p = softmax(teacher/T) (detached), q = softmax(student/T). That is KL(p ‖ q)/C per sample (the code
    averages KLDivLoss over classes, no T²), weighted by the
    teacher client's share w_{i,y_b} of the sample's class. ``official_softmax_bug=True`` puts q
    where log q belongs (the code's L3): p·(log p − q).
    """
    check_temperature(temperature)
    check_same_shape("student logits", student_logits, "teacher logits", teacher_logits)
    if sample_weights.shape != student_logits.shape[:1]:
        raise ValueError(
            f"sample weights must have shape ({student_logits.shape[0]},), got {tuple(sample_weights.shape)}"
        )
    target = torch.softmax(teacher_logits.detach() / temperature, dim=-1)
    student = student_logits / temperature
    inputs = torch.softmax(student, dim=-1) if official_softmax_bug else torch.log_softmax(student, dim=-1)
    per_sample = F.kl_div(inputs, target, reduction="none").mean(dim=-1)
    return (per_sample * sample_weights.to(per_sample.dtype)).mean()


def server_l1(
    global_pair_logits: torch.Tensor,
    local_pair_logits: torch.Tensor,
    sample_weights: torch.Tensor,
    temperature: float = SERVER_TEMPERATURE,
) -> torch.Tensor:
    """Eq. 10, L1 for client i: C_g(G_g(y)) mimics C_i(G_i(y)); trains the global pair together."""
    return server_kd_term(global_pair_logits, local_pair_logits, sample_weights, temperature)


def server_l2(
    global_head_on_local_logits: torch.Tensor,
    local_pair_logits: torch.Tensor,
    sample_weights: torch.Tensor,
    temperature: float = SERVER_TEMPERATURE,
) -> torch.Tensor:
    """Eq. 11, L2 for client i: C_g(G_i(y)) mimics C_i(G_i(y)); C_g learns to read G_i's features."""
    return server_kd_term(global_head_on_local_logits, local_pair_logits, sample_weights, temperature)


def server_l3(
    local_head_on_global_logits: torch.Tensor,
    local_pair_logits: torch.Tensor,
    sample_weights: torch.Tensor,
    temperature: float = SERVER_TEMPERATURE,
    *,
    official_softmax_bug: bool = False,
) -> torch.Tensor:
    """Eq. 11, L3 for client i: C_i(G_g(y)) mimics C_i(G_i(y)); G_g must be read right by every C_i.

    ``official_softmax_bug=True`` reproduces the released code, which computes Σ p·(log p − q) here.
    """
    return server_kd_term(
        local_head_on_global_logits,
        local_pair_logits,
        sample_weights,
        temperature,
        official_softmax_bug=official_softmax_bug,
    )


class CrossedDistillation(NamedTuple):
    """The three server terms, each already summed over clients; ``total`` is Eq. 12."""

    l1: torch.Tensor
    l2: torch.Tensor
    l3: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        """The server's loss: the sum of the three terms (Eq. 12)."""
        return self.l1 + self.l2 + self.l3


def crossed_distillation(
    global_pair_logits: torch.Tensor,
    global_head_on_local_logits: torch.Tensor,
    local_head_on_global_logits: torch.Tensor,
    local_pair_logits: torch.Tensor,
    sample_weights: torch.Tensor,
    temperature: float = SERVER_TEMPERATURE,
    *,
    official_softmax_bug: bool = False,
) -> CrossedDistillation:
    """Eq. 12: Σ_i (L1 + L2 + L3) for one server step.

    Shapes: ``global_pair_logits`` (B, C) = C_g(G_g(y)), shared by all clients; the other logits are
    stacked per client as (K, B, C): C_g(G_i(y)), C_i(G_g(y)), C_i(G_i(y)); ``sample_weights`` is
    (K, B) = w_{i,y_b} (:func:`label_statistics.per_sample_label_weights`).
    """
    k = local_pair_logits.shape[0]
    for name, t in (
        ("global head on local features", global_head_on_local_logits),
        ("local heads on global features", local_head_on_global_logits),
    ):
        check_same_shape(name, t, "local pair logits", local_pair_logits)
    if sample_weights.shape != local_pair_logits.shape[:2]:
        raise ValueError(
            f"sample weights must have shape (K, B) = {tuple(local_pair_logits.shape[:2])}, "
            f"got {tuple(sample_weights.shape)}"
        )
    zero = global_pair_logits.new_zeros(())
    l1, l2, l3 = zero, zero, zero
    for i in range(k):
        teacher, w = local_pair_logits[i], sample_weights[i]
        l1 = l1 + server_l1(global_pair_logits, teacher, w, temperature)
        l2 = l2 + server_l2(global_head_on_local_logits[i], teacher, w, temperature)
        l3 = l3 + server_l3(
            local_head_on_global_logits[i], teacher, w, temperature, official_softmax_bug=official_softmax_bug
        )
    return CrossedDistillation(l1, l2, l3)
