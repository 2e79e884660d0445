"""FedIOD loss terms as pure functions on tensors (no modules, no state).

Shapes: ``K`` local teachers, ``B`` samples, ``C`` classes. Teacher logits are stacked as ``(K, B, C)``;
``pi`` is the ``(K,)`` vector of client weights ``pi_k = n_k / sum_j n_j``.

Equation numbers refer to the FedIOD paper ("Approach" section). Where the released code computes a
term differently, both forms are here and the docstring says which is which:

* ``unique_loss`` (paper Eq. 4-5, G maximises the locals' disagreement) vs. ``official_js_loss``
  (code, added with a + sign, so G *minimises* their disagreement);
* ``importance_weights`` with discriminator density ratios (paper Eq. 8) vs. without (code);
* ``mimic_loss`` "l2" (paper Eq. 10) vs. "kl-official" (code: KD at T = 10001).
"""

from __future__ import annotations

import torch

from fedistill.algorithms.shared.gan_losses import GAN_MODES, discriminator_loss, generator_gan_loss

__all__ = [
    "DENSITY_RATIO_FLOOR",
    "GAN_MODES",
    "MIMIC_MODES",
    "OFFICIAL_JS_CLAMP",
    "OFFICIAL_KD_TEMPERATURE",
    "balance_loss",
    "class_share",
    "confidence_loss",
    "density_ratio",
    "discriminator_loss",
    "ensemble_logits",
    "entropy",
    "generator_gan_loss",
    "importance_weights",
    "jsd",
    "marginal_balance_loss",
    "mimic_loss",
    "official_js_loss",
    "patch_scores",
    "softmax_t",
    "uniform_weights",
    "unique_loss",
]

MIMIC_MODES: tuple[str, ...] = ("l2", "kl", "kl-official", "l1")
"""The modes `mimic_loss` accepts."""


OFFICIAL_KD_TEMPERATURE: float = 10001.0
"""The KD temperature every released FedIOD script uses (effectively the Hinton L2 limit)."""

OFFICIAL_JS_CLAMP: tuple[float, float] = (0.01, 0.99)
"""The released code clamps probabilities to this range before its JS-style KL."""

DENSITY_RATIO_FLOOR: float = 1e-6
"""Smallest denominator `density_ratio` divides by."""


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def _check_tau(tau: float) -> None:
    if not tau > 0:
        raise ValueError(f"temperature tau must be > 0, got {tau!r}")


def _check_teachers(teacher_logits: torch.Tensor, pi: torch.Tensor | None = None) -> None:
    if teacher_logits.dim() != 3:
        raise ValueError(f"teacher logits must have shape (K, B, C), got {tuple(teacher_logits.shape)}")
    if pi is not None and (pi.dim() != 1 or pi.shape[0] != teacher_logits.shape[0]):
        raise ValueError(f"pi must have shape (K,) = ({teacher_logits.shape[0]},), got {tuple(pi.shape)}")


def _check_non_negative(name: str, x: torch.Tensor) -> None:
    # `~(x >= 0)` also catches NaN.
    if bool((~(x >= 0)).any()):
        raise ValueError(f"{name} must be non-negative (and not NaN)")


def _normalise_over_k(x: torch.Tensor) -> torch.Tensor:
    """Divide by the sum over dim 0; where that sum is 0 the column becomes uniform 1/K."""
    total = x.sum(dim=0, keepdim=True)
    has_mass = total > 0
    safe_total = torch.where(has_mass, total, torch.ones_like(total))
    uniform = torch.full_like(x, 1.0 / x.shape[0])
    return torch.where(has_mass, x / safe_total, uniform)


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


# --------------------------------------------------------------------------------------------------
# probabilities, entropy, generator regularisers (Eq. 1, 3, 4, 5 and the code's variants)
# --------------------------------------------------------------------------------------------------


def softmax_t(logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Tempered softmax ``p_tau(z) = softmax(z / tau)`` along the last axis (Eq. 1)."""
    _check_tau(tau)
    return torch.softmax(logits / tau, dim=-1)


def entropy(logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Shannon entropy in nats of ``softmax(logits / tau)`` along the last axis, shape ``(...,)``.

    Computed from ``log_softmax`` so that tiny probabilities do not produce ``0 * log 0`` NaNs
    (logits must be finite).
    """
    _check_tau(tau)
    log_p = torch.log_softmax(logits / tau, dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def confidence_loss(teacher_logits: torch.Tensor, pi: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``L_conf`` (Eq. 3): batch mean of ``sum_k pi_k H(T_k(x; tau))``.

    Minimised by G so that every local model is confident on the synthetic data. The released code's
    ``L_align`` is the same term at ``tau = 1`` (its ``--gen_loss_avg`` passes ``pi = 1/K``).
    """
    _check_teachers(teacher_logits, pi)
    per_teacher = entropy(teacher_logits, tau)  # (K, B)
    return (pi.to(per_teacher.dtype)[:, None] * per_teacher).sum(dim=0).mean()


def jsd(teacher_logits: torch.Tensor, pi: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Weighted Jensen-Shannon divergence (Eq. 4) per sample, shape ``(B,)``.

    ``JSD = H(sum_k pi_k q_k) - sum_k pi_k H(q_k)`` with ``q_k = softmax(z_k / tau)``, in nats. The
    mixture's log-probabilities are taken with ``logsumexp`` over ``log pi_k + log q_k`` so that no
    log of a zero probability is ever formed. It is 0 when all teachers agree (up to rounding).
    """
    _check_teachers(teacher_logits, pi)
    _check_tau(tau)
    log_q = torch.log_softmax(teacher_logits / tau, dim=-1)  # (K, B, C)
    weights = pi.to(log_q.dtype)
    log_mix = torch.logsumexp(torch.log(weights)[:, None, None] + log_q, dim=0)  # (B, C)
    mixture_entropy = -(log_mix.exp() * log_mix).sum(dim=-1)  # (B,)
    member_entropy = -(log_q.exp() * log_q).sum(dim=-1)  # (K, B)
    return mixture_entropy - (weights[:, None] * member_entropy).sum(dim=0)


def unique_loss(teacher_logits: torch.Tensor, pi: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``L_unique`` (Eq. 5): ``-mean_b JSD``. G minimises it, i.e. maximises the locals' disagreement."""
    return -jsd(teacher_logits, pi, tau).mean()


def official_js_loss(teacher_logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """The released code's JS-style term (``--use_jsdiv``), a scalar.

    ``(1/K) sum_k KL(M || P_k)`` with ``P_k = softmax(z_k / tau)`` and ``M = mean_k P_k``, where both
    ``P_k`` and ``M`` are clamped to ``[0.01, 0.99]`` (not renormalised) before the KL; the KL is summed
    over classes and averaged over the batch. The code uses ``tau = 1``, unweighted teachers, and the
    reversed direction ``KL(M || P_k)`` (the textbook JSD uses ``KL(P_k || M)``).

    Sign: the code ADDS this term to the generator loss, so G *minimises* the locals' disagreement
    (consensus) -- the opposite of the paper's ``L_unique`` (Eq. 5), which G minimises as ``-JSD``.
    """
    _check_teachers(teacher_logits)
    probs = softmax_t(teacher_logits, tau)  # (K, B, C)
    low, high = OFFICIAL_JS_CLAMP
    mixture = probs.mean(dim=0).clamp(low, high)  # (B, C)
    members = probs.clamp(low, high)
    kl = (mixture[None] * (torch.log(mixture)[None] - torch.log(members))).sum(dim=-1)  # (K, B)
    return kl.mean(dim=1).mean(dim=0)


def balance_loss(
    teacher_logits: torch.Tensor, pi: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """The released code's ``L_balance``: ``sum_k pi_k sum_c pbar_kc log2 pbar_kc``.

    ``pbar_k`` is the batch-mean softmax (``tau = 1``) of teacher ``k``, so each term is the negative
    entropy, in bits, of that teacher's predicted class marginal; minimising it balances the classes of
    the synthetic batch. Zero marginals contribute 0 (the log argument is floored). ``rows`` (K, B), where
    given, marks the rows each teacher answered for (`fediod.owner_queries`): its mean runs over those.
    """
    _check_teachers(teacher_logits, pi)
    if rows is None:
        marginal = torch.softmax(teacher_logits, dim=-1).mean(dim=1)  # (K, C)
    else:
        mine = rows.to(teacher_logits.dtype)[..., None]
        marginal = (torch.softmax(teacher_logits, dim=-1) * mine).sum(1) / mine.sum(1).clamp_min(1.0)
    tiny = torch.finfo(marginal.dtype).tiny
    neg_entropy_bits = (marginal * torch.log2(marginal.clamp_min(tiny))).sum(dim=-1)  # (K,)
    return (pi.to(marginal.dtype) * neg_entropy_bits).sum()


def marginal_balance_loss(logits: torch.Tensor) -> torch.Tensor:
    """``sum_c pbar_c log2 pbar_c`` for one set of logits ``(B, C)``: the ensemble's class marginal.

    With non-IID clients every teacher predicts mostly its own classes, so balancing each teacher's
    marginal (`balance_loss`) cannot stop G from collapsing onto the classes the ensemble favours;
    balancing the ensemble's marginal targets that collapse directly.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, C), got {tuple(logits.shape)}")
    marginal = torch.softmax(logits, dim=-1).mean(dim=0)
    tiny = torch.finfo(marginal.dtype).tiny
    return (marginal * torch.log2(marginal.clamp_min(tiny))).sum()


# --------------------------------------------------------------------------------------------------
# importance weights and the ensemble (Eq. 8, 9)
# --------------------------------------------------------------------------------------------------


def class_share(counts: torch.Tensor) -> torch.Tensor:
    """Client k's share of all class-c training samples, ``n_kc / sum_j n_jc``, shape ``(K, C)``.

    This is the label term of Eq. 8 read as the paper's "number of samples from class c used to train the
    model at the local node k", and the released code's static weights. It is ``pi_k P_Y'_k(c) / P_Y'(c)``
    with ``pi_k = n_k / N``: the ratio the paper names, times the site's size, which the normalisation
    over k does not remove (`class_frequencies` gives the ratio alone). A class that no client holds gets a
    uniform ``1/K`` column: there is no information to prefer any client, and it avoids 0/0.
    """
    counts = _as_float(torch.as_tensor(counts))
    if counts.dim() != 2:
        raise ValueError(f"counts must have shape (K, C), got {tuple(counts.shape)}")
    _check_non_negative("counts", counts)
    return _normalise_over_k(counts)


def class_frequencies(counts: torch.Tensor) -> torch.Tensor:
    """Each client's class frequencies ``n_kc / n_k``, shape ``(K, C)``: with `class_share` on top, Eq. 8's
    label term as the ratio ``P_Y'_k(c) / P_Y'(c)`` the paper says it corresponds to (normalised over k).
    A client with no samples keeps a row of zeros."""
    counts = _as_float(torch.as_tensor(counts))
    if counts.dim() != 2:
        raise ValueError(f"counts must have shape (K, C), got {tuple(counts.shape)}")
    _check_non_negative("counts", counts)
    return counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)


def importance_weights(
    share: torch.Tensor,
    density_ratio: torch.Tensor | None,
    *,
    batch_size: int | None = None,
) -> torch.Tensor:
    """Per-sample, per-class teacher weights ``pi_k^c(x)`` (Eq. 8 and its normalisation), ``(K, B, C)``.

    ``pi_hat_k^c(x) = share[k, c] * density_ratio[k, b]`` and ``pi_k^c(x) = pi_hat_k^c(x) / sum_k'
    pi_hat_k'^c(x)``; they sum to 1 over k for every (b, c). A column whose unnormalised weights are all 0
    (e.g. all ratios 0) falls back to the normalised share column, and to uniform ``1/K`` if that is 0
    too.

    With ``density_ratio=None`` the result is the released code's class-share-only weights, identical for
    every sample: shape ``(K, 1, C)`` (broadcasts over B), or ``(K, batch_size, C)`` if given.
    Both inputs must be non-negative (``ValueError`` otherwise).
    """
    share = _as_float(torch.as_tensor(share))
    if share.dim() != 2:
        raise ValueError(f"share must have shape (K, C), got {tuple(share.shape)}")
    _check_non_negative("share", share)
    fallback = _normalise_over_k(share)[:, None, :]  # (K, 1, C)
    if density_ratio is None:
        if batch_size is not None:
            return fallback.expand(-1, batch_size, -1).clone()
        return fallback
    if density_ratio.dim() != 2 or density_ratio.shape[0] != share.shape[0]:
        raise ValueError(
            f"density_ratio must have shape (K, B) with K = {share.shape[0]}, "
            f"got {tuple(density_ratio.shape)}"
        )
    if batch_size is not None and batch_size != density_ratio.shape[1]:
        raise ValueError(f"batch_size={batch_size} does not match density_ratio's B={density_ratio.shape[1]}")
    _check_non_negative("density_ratio", density_ratio)
    unnormalised = share[:, None, :] * density_ratio.to(share.dtype)[:, :, None]  # (K, B, C)
    total = unnormalised.sum(dim=0, keepdim=True)
    has_mass = total > 0
    safe_total = torch.where(has_mass, total, torch.ones_like(total))
    return torch.where(has_mass, unnormalised / safe_total, fallback.expand_as(unnormalised))


def owner_weights(owner: torch.Tensor, fallback: torch.Tensor, rows_per_sample: int = 1) -> torch.Tensor:
    """Each sample's weight all on its owner's teacher, ``(K, B * rows_per_sample, C)``.

    ``owner`` (B,) holds each sample's teacher index among the K answering teachers, or -1 where its site
    did not answer; those samples keep the ``fallback`` weights ``(K, 1 or B * rows, C)``. A per-pixel
    sample's rows (its pixels, consecutive) share its owner.
    """
    k, _, c = fallback.shape
    rows = owner.repeat_interleave(rows_per_sample).to(fallback.device)
    onehot = torch.nn.functional.one_hot(rows.clamp(min=0), k).T[:, :, None].to(fallback.dtype)
    onehot = onehot.expand(k, len(rows), c)
    return torch.where((rows >= 0)[None, :, None], onehot, fallback.expand(k, len(rows), c))


def uniform_weights(
    K: int,
    B: int,
    C: int,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The "plain weighting" ablation: ``1/K`` everywhere, shape ``(K, B, C)`` (average of logits)."""
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    return torch.full((K, B, C), 1.0 / K, dtype=dtype, device=device)


def ensemble_logits(teacher_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The weighted ensemble ``A = sum_k pi_k(x) ⊙ z_k`` on logits (Eq. 9), shape ``(B, C)``.

    ``weights`` is ``(K, B, C)`` or anything that broadcasts to it (e.g. ``(K, 1, C)``).
    """
    _check_teachers(teacher_logits)
    if weights.dim() != 3 or weights.shape[0] != teacher_logits.shape[0]:
        raise ValueError(
            f"weights must have shape (K, B, C) (or broadcast to it), got {tuple(weights.shape)}"
        )
    return (weights.to(teacher_logits.dtype) * teacher_logits).sum(dim=0)


# --------------------------------------------------------------------------------------------------
# student-ensemble mimicry (Eq. 6, 10)
# --------------------------------------------------------------------------------------------------


def _kd(student_logits: torch.Tensor, target_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """``tau^2 * KL(softmax(a / tau) || softmax(s / tau))``, batch mean."""
    log_p_target = torch.log_softmax(target_logits / tau, dim=-1)
    log_p_student = torch.log_softmax(student_logits / tau, dim=-1)
    kl = (log_p_target.exp() * (log_p_target - log_p_student)).sum(dim=-1)
    return kl.mean() * (tau * tau)


def mimic_loss(
    student_logits: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    mode: str = "l2",
    tau: float = 1.0,
) -> torch.Tensor:
    """``L_mimic`` between student logits ``s`` and ensemble logits ``a``, both ``(B, C)``; a scalar.

    Modes:

    * ``"l2"`` (paper Eq. 10, the ``tau -> inf`` limit of KD): ``mean_b sum_c (s - a)^2``.
    * ``"kl"``: ``tau^2 * KL(softmax(a / tau) || softmax(s / tau))``, batch mean (Eq. 6; ``tau = 1`` is
      the Table 6 ablation).
    * ``"kl-official"``: the released code's KD at ``T = 10001`` (``tau`` is ignored), computed in float64
      and cast back. It approaches the Hinton limit ``(1 / 2C) mean_b ||(s - mean s) - (a - mean a)||^2``,
      i.e. a mean-centred logit L2 scaled by ``1 / 2C``.
    * ``"l1"``: ``mean_b sum_c |s - a|`` (the code's ``--use_l1_loss``; its ``nn.L1Loss`` also averages
      over classes, i.e. it is this value divided by C).

    G maximises this term (adversarial mimicry) and S minimises it; the sign is the caller's.
    """
    if mode not in MIMIC_MODES:
        raise ValueError(f"unknown mimic mode {mode!r} (valid: {', '.join(MIMIC_MODES)})")
    if student_logits.shape != target_logits.shape or student_logits.dim() != 2:
        raise ValueError(
            "student and target logits must both have shape (B, C), got "
            f"{tuple(student_logits.shape)} and {tuple(target_logits.shape)}"
        )
    if mode == "l2":
        return (student_logits - target_logits).pow(2).sum(dim=-1).mean()
    if mode == "l1":
        return (student_logits - target_logits).abs().sum(dim=-1).mean()
    if mode == "kl":
        _check_tau(tau)
        return _kd(student_logits, target_logits, tau)
    # "kl-official"
    value = _kd(student_logits.double(), target_logits.double(), OFFICIAL_KD_TEMPERATURE)
    return value.to(student_logits.dtype)


# --------------------------------------------------------------------------------------------------
# GAN terms and the discriminator density ratio (Eq. 2, 8)
# --------------------------------------------------------------------------------------------------


def patch_scores(d_logits: torch.Tensor) -> torch.Tensor:
    """Per-sample ``D_k(x)`` of Eq. 8: the mean over patches of ``sigmoid(logit)``, shape ``(B,)``."""
    if d_logits.dim() < 1:
        raise ValueError("discriminator logits must have a batch dimension")
    return torch.sigmoid(d_logits).reshape(d_logits.shape[0], -1).mean(dim=1)


def density_ratio(fake_scores: torch.Tensor, real_mean: float | torch.Tensor) -> torch.Tensor:
    """``D_k(x) / E_{x' in X'_k} D_k(x')`` (the second factor of Eq. 8), shape ``(B,)``.

    The paper says it approximates ``P_X(x) / P_X'_k(x)`` (Eq. 7). A discriminator trained to tell k's
    real data from G's samples grows with ``P_X'_k(x) / P_X(x)`` instead (the optimal one is
    ``P_k / (P_k + P_G)``), so the ratio as Eq. 8 writes it, which this computes, weighs a teacher up where
    the sample looks like its own data: the weight a mixture of experts gives its members, the inverse of
    Eq. 7's derivation. The denominator is floored at ``1e-6``.
    """
    denominator = torch.as_tensor(real_mean, dtype=fake_scores.dtype, device=fake_scores.device)
    if bool(torch.isnan(denominator).any()):
        raise ValueError("real_mean is NaN")
    return fake_scores / denominator.clamp_min(DENSITY_RATIO_FLOOR)
