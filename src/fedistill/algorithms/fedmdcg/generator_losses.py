"""FedMD-CG client, stage 2: the local generator's loss (Eq. 5-9), with the diversity constraints.

G_i learns to imitate the trained local model: the logit- and feature-level KD from F_i and D_i, the
CE through D_i, and a diversity term that keeps it from collapsing to one point per class (FedGen's
server uses div0 too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedistill.algorithms.fedmdcg.loss_checks import (
    check_lambda,
    check_same_shape,
    check_temperature,
    kl_batchmean,
)
from fedistill.models.base import unknown_choice

DIVERSITY_TYPES: tuple[str, ...] = ("div0", "div1", "div2", "none")
"""The diversity constraints; ``none`` leaves it out of the generator objective."""


def generator_ce(generated_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Eq. 6 (λ_ce_G_g): CE(D_i(G_i(y,ε)), y); G_i must produce features the local head reads as y."""
    return F.cross_entropy(generated_logits, labels)


def logit_kd_from_local(
    generated_logits: torch.Tensor, local_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Eq. 5, L_kl^G (λ_kl): KL_batchmean(softmax(D_i(F_i(x))) ‖ softmax(D_i(G_i(y,ε)))), T = 1.

    Logit-level KD from the trained local model into G_i on paired samples (G_i gets x's label y);
    the local model's prediction is the detached target.
    """
    check_temperature(temperature)
    check_same_shape("generated logits", generated_logits, "local logits", local_logits)
    target = torch.softmax(local_logits.detach() / temperature, dim=-1)
    return kl_batchmean(torch.log_softmax(generated_logits / temperature, dim=-1), target)


def feature_kd_from_local(generated_features: torch.Tensor, local_features: torch.Tensor) -> torch.Tensor:
    """Eq. 5, L_mse^← (λ_mse_G): MSE(G_i(y,ε), F_i(x).detach()), mean over batch and feature dims.

    Feature-level KD: G_i imitates the local extractor's feature of the paired real sample.
    """
    check_same_shape("generated features", generated_features, "local features", local_features)
    return F.mse_loss(generated_features.flatten(1), local_features.detach().flatten(1))


def pairwise_distance(x: torch.Tensor, metric: str = "l2") -> torch.Tensor:
    """(B, B) matrix of mean_j (x_a,j − x_b,j)² (``l2``) or mean_j |x_a,j − x_b,j| (``l1``).

    Means over the dimensions, not sums (as the code computes them); rows are flattened first.
    """
    if metric not in ("l1", "l2"):
        raise unknown_choice("distance metric", metric, ("l1", "l2"))
    x = x.flatten(1)
    diff = x.unsqueeze(0) - x.unsqueeze(1)
    return (diff.abs() if metric == "l1" else diff.pow(2)).mean(dim=2)


def _check_batch(**tensors: torch.Tensor) -> None:
    sizes = {name: int(x.shape[0]) for name, x in tensors.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"diversity inputs need one row per sample, got batch sizes {sizes}")


def diversity_div0(noise: torch.Tensor, features: torch.Tensor, feature_metric: str = "l2") -> torch.Tensor:
    """Eq. 7, div0 (label-agnostic): exp(−mean_{a,b} d_ε(a,b)·d_G(a,b)) over all B×B pairs.

    Rewards output spread in proportion to noise distance, so G cannot collapse to one point per
    class. It is 1 (its maximum) when all outputs coincide. FedGen uses ``feature_metric="l1"``.
    """
    _check_batch(noise=noise, features=features)
    weighted = pairwise_distance(noise, "l2") * pairwise_distance(features, feature_metric)
    return torch.exp(-weighted.mean())


def diversity_div1(
    noise: torch.Tensor, label_code: torch.Tensor, features: torch.Tensor, feature_metric: str = "l2"
) -> torch.Tensor:
    """div1 (the paper's variant right after Eq. 7): div0 with ε replaced by concat(ε, label code).

    Pairs of different labels are farther apart in the input, so their output distance gets more
    weight than that of same-label pairs.
    """
    _check_batch(noise=noise, label_code=label_code, features=features)
    return diversity_div0(
        torch.cat((noise.flatten(1), label_code.flatten(1)), dim=1), features, feature_metric
    )


def diversity_div2(
    noise: torch.Tensor, label_code: torch.Tensor, features: torch.Tensor, feature_metric: str = "l2"
) -> torch.Tensor:
    """Eq. 8, div2 (the paper's new one, the code's default): exp(−mean d_ε·d_G·exp(d_y)).

    d_y = mean_c |code_a − code_b| is 0 for equal labels and 2/C for different one-hot labels, so
    inter-class output distances weigh exp(2/C) times more than intra-class ones.
    """
    _check_batch(noise=noise, label_code=label_code, features=features)
    weighted = (
        pairwise_distance(noise, "l2")
        * pairwise_distance(features, feature_metric)
        * torch.exp(pairwise_distance(label_code, "l1"))
    )
    return torch.exp(-weighted.mean())


def diversity_loss(
    kind: str,
    noise: torch.Tensor,
    features: torch.Tensor,
    label_code: torch.Tensor | None = None,
    feature_metric: str = "l2",
) -> torch.Tensor:
    """The diversity constraint ``kind`` (``div0``, ``div1``, ``div2``, or ``none`` = a zero)."""
    if kind not in DIVERSITY_TYPES:
        raise unknown_choice("diversity loss type", kind, DIVERSITY_TYPES)
    if kind == "none":
        return features.new_zeros(())
    if kind == "div0":
        return diversity_div0(noise, features, feature_metric)
    if label_code is None:
        raise ValueError(
            f"diversity loss {kind!r} needs the label code (one-hot or embedding) of each sample"
        )
    if kind == "div1":
        return diversity_div1(noise, label_code, features, feature_metric)
    return diversity_div2(noise, label_code, features, feature_metric)


@dataclass(frozen=True)
class GeneratorLambdas:
    """Weights of Eq. 9 (the code's λ_ce_G_g, λ_kl, λ_mse_G, λ_div); constant across rounds."""

    ce: float = 1.0
    kl: float = 1.0
    mse: float = 1.0
    div: float = 1.0

    def __post_init__(self) -> None:
        for name in ("ce", "kl", "mse", "div"):
            check_lambda(name, getattr(self, name))


def generator_objective(
    ce: torch.Tensor,
    kl: torch.Tensor,
    mse: torch.Tensor,
    div: torch.Tensor | None,
    lambdas: GeneratorLambdas | None = None,
) -> torch.Tensor:
    """Eq. 9: λ4·CE + λ5·L_kl^G + λ6·L_mse^← + λ_div·L_div (``div`` None: diversity left out).

    ``lambdas`` None means the code's defaults, all 1.
    """
    lambdas = GeneratorLambdas() if lambdas is None else lambdas
    total = lambdas.ce * ce + lambdas.kl * kl + lambdas.mse * mse
    return total if div is None else total + lambdas.div * div
