"""FedMD-CG loss terms, weight schedule and server helpers as pure functions on tensors.

Notation: a client i has a feature extractor F_i, a classifier head D_i (= C_i on the server) and a
local feature generator G_i; the server holds the global pair (G_g, C_g), and Ĝ is the global
generator a client received. ``B`` samples, ``C`` classes, ``K`` clients.

Equation numbers are the FedMD-CG paper's as its surviving prose places them (the formulas themselves
were lost in extraction; every formula here is the released code's, read from the reference notes):

* client, stage 1 (local model): Eq. 1 CE, Eq. 2 the feature-level MSE to Ĝ and the logit-level KL
  through the local head, Eq. 3 the extra CE on Ĝ's features for sampled labels, Eq. 4 their sum;
* client, stage 2 (local generator): Eq. 5 the logit-level KL and feature-level MSE from the local
  model, Eq. 6 the generator CE, Eq. 7 the diversity loss div0 (div1 is defined just after it),
  Eq. 8 div2, Eq. 9 their sum;
* server: Eq. 10 L1, Eq. 11 L2 and L3, Eq. 12 their sum.

Where the released code differs from its evident intent, the code's form is an explicit argument that
is off by default:

* ``server_l3(..., official_softmax_bug=True)``: the code feeds a softmax where KLDivLoss expects a
  log-softmax;
* uniform noise ε ~ U[0, 1) instead of N(0, I): ``noise="uniform"`` of
  :class:`fedistill.models.feature_generator.FeatureGenerator`.

Two more of the code's behaviours belong to the client loop, not to these functions, and become
options of the FedMD-CG algorithm module: its cache of real batches is never cleared (a typo clears
the noise cache twice), so G_i's steps per round and the uploaded label counts grow with every round
(``clear_cache``); and the uploaded label counts start from a floor of 0 in round 0 and 1 afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fedistill.errors import ConfigError
from fedistill.models.base import unknown_choice

__all__ = [
    "CLIENT_TEMPERATURE",
    "DIVERSITY_TYPES",
    "RAMP_SCHEDULES",
    "SERVER_TEMPERATURE",
    "CrossedDistillation",
    "GeneratorLambdas",
    "LocalModelLambdas",
    "crossed_distillation",
    "distillation_active",
    "diversity_div0",
    "diversity_div1",
    "diversity_div2",
    "diversity_loss",
    "feature_kd_from_local",
    "feature_kd_to_global",
    "generated_ce",
    "generator_ce",
    "generator_objective",
    "label_distribution",
    "label_weights",
    "local_ce",
    "local_model_objective",
    "logit_kd_from_global",
    "logit_kd_from_local",
    "pairwise_distance",
    "per_sample_label_weights",
    "ramp_factor",
    "sample_labels",
    "server_kd_term",
    "server_l1",
    "server_l2",
    "server_l3",
    "weighted_average",
]

CLIENT_TEMPERATURE: float = 10.0
"""T_c of the client's logit-level KD from the global generator (stage 1)."""

SERVER_TEMPERATURE: float = 10.0
"""T_s of the server's crossed distillation."""

RAMP_SCHEDULES: tuple[str, ...] = ("cubic", "none")
"""``cubic``: λ(t) = λ⁰·(t/(R−1))^p (the code, p = 3); ``none``: λ(t) = λ⁰ from round 1 on."""

DIVERSITY_TYPES: tuple[str, ...] = ("div0", "div1", "div2", "none")
"""The diversity constraints; ``none`` leaves it out of the generator objective."""


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")


def _check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def _check_lambda(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"loss weight {name} must be a finite number >= 0, got {value!r}")


def _kl_batchmean(student_log_probs: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) summed over classes, averaged over the batch (KLDivLoss "batchmean")."""
    return F.kl_div(student_log_probs, teacher_probs, reduction="batchmean")


# --------------------------------------------------------------------------------------------------
# client, stage 1: local model update (Eq. 1-4)
# --------------------------------------------------------------------------------------------------


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
    _check_temperature(temperature)
    _check_same_shape("local logits", local_logits, "generated logits", generated_logits)
    target = torch.softmax(generated_logits.detach() / temperature, dim=-1)
    return _kl_batchmean(torch.log_softmax(local_logits / temperature, dim=-1), target)


def generated_ce(generated_logits: torch.Tensor, sampled_labels: torch.Tensor) -> torch.Tensor:
    """Eq. 3, L_ce^G (λ_ce_G): CE(D_i(Ĝ(ŷ,ε)), ŷ) with ŷ drawn ∝ the global label counts.

    The extra classification loss: the local head also learns from generated features of classes the
    client may lack (draw ŷ with :func:`sample_labels`).
    """
    return F.cross_entropy(generated_logits, sampled_labels)


def feature_kd_to_global(local_features: torch.Tensor, generated_features: torch.Tensor) -> torch.Tensor:
    """Eq. 2, L_mse^→ (λ_mse_F): MSE(F_i(x), Ĝ(y,ε).detach()), mean over batch and feature dims.

    Feature-level KD that pulls the local extractor towards the global generator (same y, fresh ε).
    """
    _check_same_shape("local features", local_features, "generated features", generated_features)
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
            _check_lambda(name, getattr(self, name))

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


# --------------------------------------------------------------------------------------------------
# client, stage 2: local generator update (Eq. 5-9)
# --------------------------------------------------------------------------------------------------


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
    _check_temperature(temperature)
    _check_same_shape("generated logits", generated_logits, "local logits", local_logits)
    target = torch.softmax(local_logits.detach() / temperature, dim=-1)
    return _kl_batchmean(torch.log_softmax(generated_logits / temperature, dim=-1), target)


def feature_kd_from_local(generated_features: torch.Tensor, local_features: torch.Tensor) -> torch.Tensor:
    """Eq. 5, L_mse^← (λ_mse_G): MSE(G_i(y,ε), F_i(x).detach()), mean over batch and feature dims.

    Feature-level KD: G_i imitates the local extractor's feature of the paired real sample.
    """
    _check_same_shape("generated features", generated_features, "local features", local_features)
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
            _check_lambda(name, getattr(self, name))


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


# --------------------------------------------------------------------------------------------------
# label statistics and averaging
# --------------------------------------------------------------------------------------------------


def _counts(label_counts: torch.Tensor) -> torch.Tensor:
    counts = torch.as_tensor(label_counts, dtype=torch.float64)
    if counts.dim() not in (1, 2):
        raise ValueError(f"label counts must have shape (C,) or (K, C), got {tuple(counts.shape)}")
    if bool((~(counts >= 0)).any()):
        raise ValueError("label counts must be non-negative (and not NaN)")
    return counts


def label_distribution(label_counts: torch.Tensor) -> torch.Tensor:
    """Global label distribution p(c) = Σ_i cnt_{i,c} / Σ_{i,c'} cnt_{i,c'} from (C,) or (K, C) counts."""
    counts = _counts(label_counts)
    per_class = counts.sum(dim=0) if counts.dim() == 2 else counts
    total = per_class.sum()
    if not total > 0:
        raise ValueError("label counts are all zero: there is no label distribution to sample from")
    return (per_class / total).float()


def sample_labels(
    label_counts: torch.Tensor, batch_size: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``batch_size`` labels (int64) drawn with replacement ∝ the global label counts.

    Used for ŷ in Eq. 3 and for y in every server step (Eq. 10-12).
    """
    probs = label_distribution(label_counts)
    draws = torch.multinomial(probs.cpu(), batch_size, replacement=True, generator=generator)  # CPU stream
    return draws.to(probs.device)


def label_weights(label_counts: torch.Tensor) -> torch.Tensor:
    """(K, C) per-class client weights w_{i,c} = cnt_{i,c} / Σ_j cnt_{j,c} (server, Eq. 10-11).

    A client is trusted on a class in proportion to how many of its samples it holds. A class no
    client holds gets weight 0 everywhere (the code would divide by zero; such labels are never drawn).
    """
    counts = _counts(label_counts)
    if counts.dim() != 2:
        raise ValueError(f"label counts for client weights must have shape (K, C), got {tuple(counts.shape)}")
    total = counts.sum(dim=0, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return (counts / safe).float()


def per_sample_label_weights(weights: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(K, B) weights w_{i,y_b} for a batch of labels, from (K, C) :func:`label_weights`."""
    return weights[:, labels]


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | torch.Tensor
) -> dict[str, torch.Tensor]:
    """Σ_i w_i·state_i / Σ_i w_i per entry: the FedAvg initialisation of (G_g, C_g).

    The code weighs by each client's number of local training samples n_i. Integer buffers (BatchNorm's
    ``num_batches_tracked``) are averaged and truncated back to their dtype, as the code does.
    """
    w = torch.as_tensor(weights, dtype=torch.float64).flatten()
    if len(states) == 0 or w.numel() != len(states):
        raise ValueError(
            f"need one weight per state and at least one state, got {len(states)} and {w.numel()}"
        )
    if bool((~(w >= 0)).any()) or not w.sum() > 0:
        raise ValueError(f"averaging weights must be non-negative with a positive sum, got {w.tolist()}")
    keys = list(states[0])
    for i, state in enumerate(states[1:], start=1):
        if list(state) != keys:
            raise ValueError(
                f"state {i} has different entries from state 0: {sorted(set(state) ^ set(keys))}"
            )
    w = w / w.sum()
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        ref = states[0][key]
        acc = sum(wi * s[key].detach().to(torch.float64) for wi, s in zip(w.tolist(), states, strict=True))
        out[key] = acc.to(ref.dtype) if ref.is_floating_point() else acc.trunc().to(ref.dtype)
    return out


# --------------------------------------------------------------------------------------------------
# server: crossed distillation (Eq. 10-12)
# --------------------------------------------------------------------------------------------------


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
    _check_temperature(temperature)
    _check_same_shape("student logits", student_logits, "teacher logits", teacher_logits)
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
    (K, B) = w_{i,y_b} (:func:`per_sample_label_weights`).
    """
    k = local_pair_logits.shape[0]
    for name, t in (
        ("global head on local features", global_head_on_local_logits),
        ("local heads on global features", local_head_on_global_logits),
    ):
        _check_same_shape(name, t, "local pair logits", local_pair_logits)
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
