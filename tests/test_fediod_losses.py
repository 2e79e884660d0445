"""FedIOD loss functions and generation metrics against hand-computed tiny cases.

Every expected value is computed here with Python's `math` module straight from the formula, never by
calling the torch code under test. Logits such as ``[0, ln 3]`` are chosen so that the softmax is exact
(``(1/4, 3/4)``).
"""

from __future__ import annotations

import math

import pytest
import torch

from fedistill.algorithms.fediod.losses import (
    MIMIC_MODES,
    balance_loss,
    class_share,
    confidence_loss,
    density_ratio,
    discriminator_loss,
    ensemble_logits,
    entropy,
    generator_gan_loss,
    importance_weights,
    jsd,
    marginal_balance_loss,
    mimic_loss,
    official_js_loss,
    owner_weights,
    patch_scores,
    softmax_t,
    uniform_weights,
    unique_loss,
)
from fedistill.metrics.generation import adapted_inception_score, class_coverage, inception_score

LN2 = math.log(2.0)
LN3 = math.log(3.0)
LN9 = math.log(9.0)
TOL = 1e-6


def _t(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _h(*p: float) -> float:
    """Shannon entropy in nats of a probability vector, written with math."""
    return -sum(x * math.log(x) for x in p if x > 0)


def _kl(p: list[float], q: list[float]) -> float:
    """KL(p || q) in nats, written with math."""
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True) if a > 0)


def _close(actual: torch.Tensor | float, expected: float, tol: float = TOL) -> None:
    value = float(actual.detach()) if isinstance(actual, torch.Tensor) else float(actual)
    assert abs(value - expected) <= tol, f"{value} != {expected}"


# ------------------------------------------------------------------------------------------------
# softmax, entropy
# ------------------------------------------------------------------------------------------------


def test_softmax_t_divides_by_temperature() -> None:
    probs = softmax_t(_t([1.0, 2.0, 3.0]), tau=2.0)
    e = [math.exp(0.5), math.exp(1.0), math.exp(1.5)]
    total = e[0] + e[1] + e[2]
    for got, want in zip(probs.tolist(), [e[0] / total, e[1] / total, e[2] / total], strict=True):
        _close(got, want)
    with pytest.raises(ValueError, match=r"tau must be > 0, got 0\.0"):
        softmax_t(_t([1.0]), tau=0.0)


def test_entropy_hand_case_and_temperature() -> None:
    # softmax([0, ln 3]) = (1/4, 3/4); H = -(1/4 ln 1/4 + 3/4 ln 3/4)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    _close(entropy(_t([0.0, LN3])), expected)
    # tau = 2 on [0, 2 ln 3] gives the same probabilities
    _close(entropy(_t([0.0, 2 * LN3]), tau=2.0), expected)
    # uniform over 4 classes: ln 4
    _close(entropy(_t([5.0, 5.0, 5.0, 5.0])), math.log(4.0))


def test_entropy_shape_and_stability() -> None:
    assert entropy(torch.zeros(2, 3, 4)).shape == (2, 3)
    value = entropy(torch.tensor([0.0, 1000.0, -1000.0]))
    assert torch.isfinite(value)
    _close(value, 0.0)


# ------------------------------------------------------------------------------------------------
# L_conf, JSD, L_unique, the official JS term, L_balance
# ------------------------------------------------------------------------------------------------


def test_confidence_loss_hand_case() -> None:
    # teacher 0: b0 -> (1/4, 3/4), b1 -> (1/10, 9/10); teacher 1: b0 -> (1/2, 1/2), b1 -> (3/4, 1/4)
    logits = _t([[[0.0, LN3], [0.0, LN9]], [[0.0, 0.0], [LN3, 0.0]]])
    pi = _t([0.25, 0.75])
    h_quarter = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    h_tenth = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    b0 = 0.25 * h_quarter + 0.75 * LN2
    b1 = 0.25 * h_tenth + 0.75 * h_quarter
    _close(confidence_loss(logits, pi), (b0 + b1) / 2)
    # tau = 2 on doubled logits gives the same probabilities
    _close(confidence_loss(2 * logits, pi, tau=2.0), (b0 + b1) / 2)
    with pytest.raises(ValueError, match=r"pi must have shape \(K,\) = \(2,\), got \(1,\)"):
        confidence_loss(logits, _t([1.0]))


def test_jsd_hand_case() -> None:
    # q1 = (1/4, 3/4), q2 = (1/2, 1/2), pi = (1/4, 3/4)
    # qbar = 1/4 (1/4, 3/4) + 3/4 (1/2, 1/2) = (1/16 + 3/8, 3/16 + 3/8) = (7/16, 9/16)
    logits = _t([[[0.0, LN3]], [[0.0, 0.0]]])
    pi = _t([0.25, 0.75])
    h_mix = -(7 / 16 * math.log(7 / 16) + 9 / 16 * math.log(9 / 16))
    h_q1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    expected = h_mix - (0.25 * h_q1 + 0.75 * LN2)
    value = jsd(logits, pi)
    assert value.shape == (1,)
    _close(value[0], expected)
    assert expected > 0


def test_jsd_zero_when_teachers_agree_and_positive_when_they_differ() -> None:
    agree = _t([[[0.3, -1.0, 2.0], [1.0, 1.0, 0.0]]] * 3)
    pi = _t([0.2, 0.3, 0.5])
    values = jsd(agree, pi)
    assert values.shape == (2,)
    assert float(values.abs().max()) < 1e-12
    differ = agree.clone()
    differ[1, 0] = _t([2.0, 0.0, -1.0])
    values = jsd(differ, pi)
    assert float(values[0]) > 1e-3
    assert abs(float(values[1])) < 1e-12


def test_jsd_equals_textbook_jsd_for_two_teachers_with_equal_weights() -> None:
    # P = softmax([0, ln 3]) = (1/4, 3/4); Q = softmax([ln 9, 0]) = (9/10, 1/10); M = (P + Q) / 2
    p = [0.25, 0.75]
    q = [0.9, 0.1]
    m = [(p[0] + q[0]) / 2, (p[1] + q[1]) / 2]
    textbook = 0.5 * _kl(p, m) + 0.5 * _kl(q, m)
    value = jsd(_t([[[0.0, LN3]], [[LN9, 0.0]]]), _t([0.5, 0.5]))
    _close(value[0], textbook)
    _close(value[0], _h(*m) - 0.5 * _h(*p) - 0.5 * _h(*q))


def test_jsd_with_a_zero_weight_is_zero_and_finite() -> None:
    logits = _t([[[0.0, LN3]], [[LN9, 0.0]]]).requires_grad_(True)
    value = jsd(logits, _t([1.0, 0.0]))
    _close(value[0], 0.0, 1e-12)
    value.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_jsd_temperature() -> None:
    pi = _t([0.5, 0.5])
    # tau = 2 on doubled logits: q1 = (1/4, 3/4), q2 = (9/10, 1/10), equal weights
    mix = [(0.25 + 0.9) / 2, (0.75 + 0.1) / 2]
    expected = _h(*mix) - 0.5 * _h(0.25, 0.75) - 0.5 * _h(0.9, 0.1)
    _close(jsd(_t([[[0.0, 2 * LN3]], [[2 * LN9, 0.0]]]), pi, tau=2.0)[0], expected)


def test_unique_loss_is_minus_mean_jsd() -> None:
    logits = _t([[[0.0, LN3], [0.0, 0.0]], [[0.0, 0.0], [LN9, 0.0]]])
    pi = _t([0.25, 0.75])
    # sample 0: q1 = (1/4, 3/4), q2 = (1/2, 1/2) -> qbar = (7/16, 9/16)
    jsd0 = _h(7 / 16, 9 / 16) - 0.25 * _h(0.25, 0.75) - 0.75 * LN2
    # sample 1: q1 = (1/2, 1/2), q2 = (9/10, 1/10) -> qbar = (1/8 + 27/40, 1/8 + 3/40) = (4/5, 1/5)
    jsd1 = _h(0.8, 0.2) - 0.25 * LN2 - 0.75 * _h(0.9, 0.1)
    _close(unique_loss(logits, pi), -(jsd0 + jsd1) / 2)
    _close(unique_loss(logits, pi), -float(jsd(logits, pi).mean()))


def test_official_js_loss_clamps_and_uses_kl_m_to_p() -> None:
    # sample 0: P1 = softmax([0, ln 999]) = (0.001, 0.999) -> clamped (0.01, 0.99); P2 = (0.5, 0.5)
    #           M = ((0.001 + 0.5) / 2, (0.999 + 0.5) / 2) = (0.2505, 0.7495), inside the clamp range
    # sample 1: both teachers (0.5, 0.5) -> KL 0
    logits = _t([[[0.0, math.log(999.0)], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    m = [0.2505, 0.7495]
    kl_1 = m[0] * math.log(m[0] / 0.01) + m[1] * math.log(m[1] / 0.99)
    kl_2 = m[0] * math.log(m[0] / 0.5) + m[1] * math.log(m[1] / 0.5)
    sample0 = (kl_1 + kl_2) / 2
    _close(official_js_loss(logits), (sample0 + 0.0) / 2)


def test_balance_loss_hand_case() -> None:
    # teacher 0: (1/4, 3/4) and (3/4, 1/4) -> pbar (1/2, 1/2) -> sum pbar log2 pbar = -1
    # teacher 1: (1/4, 3/4) and (1/2, 1/2) -> pbar (3/8, 5/8)
    logits = _t([[[0.0, LN3], [LN3, 0.0]], [[0.0, LN3], [0.0, 0.0]]])
    pi = _t([0.25, 0.75])
    t0 = 0.5 * math.log2(0.5) + 0.5 * math.log2(0.5)
    t1 = 3 / 8 * math.log2(3 / 8) + 5 / 8 * math.log2(5 / 8)
    _close(balance_loss(logits, pi), 0.25 * t0 + 0.75 * t1)
    _close(t0, -1.0)


def test_balance_loss_guards_log_zero() -> None:
    # exp(-1e4) underflows to exactly 0: the marginal has a zero entry
    logits = torch.tensor([[[0.0, -1e4], [0.0, -1e4]]], requires_grad=True)
    value = balance_loss(logits, torch.tensor([1.0]))
    assert torch.isfinite(value)
    _close(value, 0.0)
    value.backward()
    assert torch.isfinite(logits.grad).all()


# ------------------------------------------------------------------------------------------------
# class shares, importance weights, ensemble
# ------------------------------------------------------------------------------------------------


def test_class_share_and_uniform_column_for_a_missing_class() -> None:
    share = class_share(torch.tensor([[3, 0, 0], [1, 2, 0]]))
    expected = [[3 / 4, 0 / 2, 1 / 2], [1 / 4, 2 / 2, 1 / 2]]
    assert share.shape == (2, 3)
    for row, want_row in zip(share.tolist(), expected, strict=True):
        for got, want in zip(row, want_row, strict=True):
            _close(got, want)
    with pytest.raises(ValueError, match="counts must be non-negative"):
        class_share(torch.tensor([[1, -1], [1, 1]]))


def test_importance_weights_hand_case_upweights_the_teacher_its_discriminator_likes() -> None:
    share = _t([[0.75, 0.25], [0.25, 0.75]])
    ratio = _t([[2.0, 1.0], [1.0, 1.0]])  # sample 0 looks like client 0's data
    weights = importance_weights(share, ratio)
    assert weights.shape == (2, 2, 2)
    # sample 0: pi_hat_0 = (1.5, 0.5), pi_hat_1 = (0.25, 0.75)
    # class 0: 1.5 / 1.75 = 6/7, 0.25 / 1.75 = 1/7; class 1: 0.5 / 1.25 = 2/5, 0.75 / 1.25 = 3/5
    _close(weights[0, 0, 0], 6 / 7)
    _close(weights[1, 0, 0], 1 / 7)
    _close(weights[0, 0, 1], 2 / 5)
    _close(weights[1, 0, 1], 3 / 5)
    # sample 1: equal ratios -> the class shares
    _close(weights[0, 1, 0], 0.75)
    _close(weights[1, 1, 1], 0.75)
    # client 0's weight rises above its plain class share for the sample its D likes
    assert float(weights[0, 0, 0]) > 0.75
    assert float(weights[0, 0, 1]) > 0.25


def test_importance_weights_sum_to_one_and_reduce_to_class_share() -> None:
    gen = torch.Generator().manual_seed(0)
    share = class_share(torch.randint(0, 5, (4, 6), generator=gen))
    ratio = torch.rand(4, 3, generator=gen, dtype=torch.float64) * 2
    weights = importance_weights(share, ratio)
    assert weights.shape == (4, 3, 6)
    assert torch.allclose(weights.sum(dim=0), torch.ones(3, 6, dtype=weights.dtype), atol=1e-6)
    equal = importance_weights(share, torch.full((4, 3), 0.37, dtype=torch.float64))
    assert torch.allclose(equal, share[:, None, :].expand(4, 3, 6).to(equal.dtype), atol=1e-6)


def test_importance_weights_without_ratios_and_fallbacks() -> None:
    share = _t([[0.75, 0.0], [0.25, 0.0]])
    plain = importance_weights(share, None)
    assert plain.shape == (2, 1, 2)
    _close(plain[0, 0, 0], 0.75)
    _close(plain[0, 0, 1], 0.5)  # all-zero share column -> uniform
    assert importance_weights(share, None, batch_size=3).shape == (2, 3, 2)
    # all ratios 0 for sample 0 -> the (normalised) share column; zero share column -> uniform
    weights = importance_weights(share, _t([[0.0, 1.0], [0.0, 3.0]]))
    _close(weights[0, 0, 0], 0.75)
    _close(weights[1, 0, 0], 0.25)
    _close(weights[0, 0, 1], 0.5)
    _close(weights[0, 1, 0], 0.75 * 1.0 / (0.75 * 1.0 + 0.25 * 3.0))
    assert torch.isfinite(weights).all()
    with pytest.raises(ValueError, match="density_ratio must be non-negative"):
        importance_weights(share, _t([[-1.0], [1.0]]))
    with pytest.raises(ValueError, match="share must be non-negative"):
        importance_weights(_t([[-0.5, 1.0], [1.5, 0.0]]), None)


def test_uniform_weights_and_ensemble_logits() -> None:
    weights = uniform_weights(4, 2, 3)
    assert weights.shape == (4, 2, 3)
    _close(weights[3, 1, 2], 0.25)
    # Eq. 9 by hand: z0 = [1, 2], z1 = [3, 4], weights (0.25, 0.6) and (0.75, 0.4)
    logits = _t([[[1.0, 2.0]], [[3.0, 4.0]]])
    ensemble = ensemble_logits(logits, _t([[[0.25, 0.6]], [[0.75, 0.4]]]))
    assert ensemble.shape == (1, 2)
    _close(ensemble[0, 0], 0.25 * 1.0 + 0.75 * 3.0)
    _close(ensemble[0, 1], 0.6 * 2.0 + 0.4 * 4.0)
    # plain weighting = mean of logits; (K, 1, C) weights broadcast over the batch
    mean = ensemble_logits(logits, uniform_weights(2, 1, 2, dtype=torch.float64))
    _close(mean[0, 0], 2.0)
    _close(mean[0, 1], 3.0)


# ------------------------------------------------------------------------------------------------
# L_mimic
# ------------------------------------------------------------------------------------------------


def test_mimic_l2_and_l1_hand_cases() -> None:
    s = _t([[1.0, 2.0], [0.0, 0.0]])
    a = _t([[0.0, 0.0], [1.0, 1.0]])
    # l2: sample 0: 1^2 + 2^2 = 5, sample 1: 1 + 1 = 2 -> mean 3.5
    _close(mimic_loss(s, a, mode="l2"), (5.0 + 2.0) / 2)
    # l1: sample 0: 1 + 2 = 3, sample 1: 1 + 1 = 2 -> mean 2.5
    _close(mimic_loss(s, a, mode="l1"), (3.0 + 2.0) / 2)


def test_mimic_kl_matches_hand_kl() -> None:
    # a = [0, ln 3] -> (1/4, 3/4); s = [0, 0] -> (1/2, 1/2)
    kl = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    _close(mimic_loss(_t([[0.0, 0.0]]), _t([[0.0, LN3]]), mode="kl", tau=1.0), kl)
    # tau = 2 on doubled target logits: same distributions, times tau^2 = 4
    _close(mimic_loss(_t([[0.0, 0.0]]), _t([[0.0, 2 * LN3]]), mode="kl", tau=2.0), 4 * kl)


def test_mimic_kl_official_approaches_the_hinton_l2_limit() -> None:
    s_rows = [[0.3, -1.2, 2.0], [1.0, 0.5, -0.5]]
    a_rows = [[1.5, 0.2, -0.7], [-2.0, 0.0, 1.0]]
    num_classes = 3
    total = 0.0
    for s, a in zip(s_rows, a_rows, strict=True):
        s_mean = sum(s) / num_classes
        a_mean = sum(a) / num_classes
        total += sum(((si - s_mean) - (ai - a_mean)) ** 2 for si, ai in zip(s, a, strict=True))
    expected = total / len(s_rows) / (2 * num_classes)
    s32 = torch.tensor(s_rows, dtype=torch.float32)
    value = mimic_loss(s32, torch.tensor(a_rows, dtype=torch.float32), mode="kl-official")
    assert value.dtype == torch.float32
    assert abs(float(value) - expected) <= 1e-3 * expected


def test_mimic_unknown_mode_lists_the_modes() -> None:
    with pytest.raises(ValueError) as info:
        mimic_loss(_t([[0.0]]), _t([[0.0]]), mode="cosine")
    for mode in MIMIC_MODES:
        assert mode in str(info.value)
    with pytest.raises(ValueError, match=r"must both have shape \(B, C\), got \(1, 2\) and \(1, 1\)"):
        mimic_loss(_t([[0.0, 1.0]]), _t([[0.0]]))


# ------------------------------------------------------------------------------------------------
# GAN terms, patch scores, density ratio
# ------------------------------------------------------------------------------------------------


def test_discriminator_loss_hand_case() -> None:
    real = _t([[0.0, LN3]])  # two patches of one sample
    fake = _t([[LN3, 0.0]])
    # BCE(x, 1) = log(1 + e^-x); BCE(x, 0) = log(1 + e^x)
    real_mean = (math.log(1 + 1.0) + math.log(1 + 1 / 3)) / 2
    fake_mean = (math.log(1 + 3.0) + math.log(1 + 1.0)) / 2
    _close(discriminator_loss(real, fake), real_mean / 2 + fake_mean / 2)


def test_generator_gan_loss_modes() -> None:
    fake = _t([[0.0, LN3]])
    # non-saturating: mean -log sigmoid(x) = mean log(1 + e^-x)
    _close(generator_gan_loss(fake), (math.log(2.0) + math.log(1 + 1 / 3)) / 2)
    # minimax: mean log(1 - sigmoid(x)); sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4
    _close(generator_gan_loss(fake, mode="minimax"), (math.log(1 - 0.5) + math.log(1 - 0.75)) / 2)
    with pytest.raises(
        ValueError, match=r"unknown generator GAN mode 'wasserstein' \(valid: non-saturating, minimax\)"
    ):
        generator_gan_loss(fake, mode="wasserstein")


def test_patch_scores_and_density_ratio() -> None:
    # sample 0: sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4 -> 5/8; sample 1: 1/4, 1/2 -> 3/8
    d_logits = _t([[[[0.0, LN3]]], [[[-LN3, 0.0]]]])  # (B=2, 1, 1, 2)
    scores = patch_scores(d_logits)
    assert scores.shape == (2,)
    _close(scores[0], 5 / 8)
    _close(scores[1], 3 / 8)
    ratio = density_ratio(scores, 0.5)
    _close(ratio[0], (5 / 8) / 0.5)
    _close(ratio[1], (3 / 8) / 0.5)
    _close(density_ratio(scores, 0.0)[0], (5 / 8) / 1e-6, 1e-3)
    _close(density_ratio(scores, torch.tensor(0.25))[1], (3 / 8) / 0.25)


# ------------------------------------------------------------------------------------------------
# gradients
# ------------------------------------------------------------------------------------------------


def test_gradcheck_jsd_entropy_mimic() -> None:
    gen = torch.Generator().manual_seed(1)
    teachers = torch.randn(2, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    pi = _t([0.3, 0.7])
    assert torch.autograd.gradcheck(lambda z: jsd(z, pi, tau=1.5), (teachers,), fast_mode=True)
    logits = torch.randn(2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: entropy(z, tau=0.7), (logits,), fast_mode=True)
    student = torch.randn(2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    for mode in ("l2", "kl", "l1"):
        assert torch.autograd.gradcheck(
            lambda s, a, mode=mode: mimic_loss(s, a, mode=mode, tau=2.0), (student, target), fast_mode=True
        )


# ------------------------------------------------------------------------------------------------
# generation metrics
# ------------------------------------------------------------------------------------------------


def test_inception_score_extremes_and_hand_case() -> None:
    same = _t([[0.2, 0.5, 0.3]] * 5)
    _close(inception_score(same), 1.0)
    num_classes = 4
    one_hot = torch.eye(num_classes, dtype=torch.float64).repeat(2, 1)  # 8 samples, 2 per class
    _close(inception_score(one_hot), float(num_classes))
    # p(y|x) = (1/4, 3/4) and (1/2, 1/2); p(y) = (3/8, 5/8)
    kl1 = 0.25 * math.log(0.25 / 0.375) + 0.75 * math.log(0.75 / 0.625)
    kl2 = 0.5 * math.log(0.5 / 0.375) + 0.5 * math.log(0.5 / 0.625)
    _close(inception_score(_t([[0.25, 0.75], [0.5, 0.5]])), math.exp((kl1 + kl2) / 2))


def test_inception_score_refuses_rows_that_are_not_distributions() -> None:
    # Positive logits (or scores) are not probabilities: taken as they were, they gave a number silently.
    with pytest.raises(ValueError, match="sum to 1"):
        inception_score(_t([[2.0, 1.0, 0.5], [0.1, 3.0, 1.0]]))
    with pytest.raises(ValueError, match="sum to 1"):
        inception_score(_t([[math.inf, 0.0], [0.5, 0.5]]))
    # float32 softmax output is accepted despite its rounding
    probs = torch.softmax(torch.randn(64, 10, generator=torch.Generator().manual_seed(0)), dim=1)
    assert 1.0 <= inception_score(probs) <= 10.0


def test_inception_score_takes_half_precision_softmax_output() -> None:
    # bfloat16 keeps 8 bits of mantissa: its softmax rows sum to 1 within 2^-7, and were refused at 1e-3
    logits = torch.randn(256, 10, generator=torch.Generator().manual_seed(0))
    exact = inception_score(torch.softmax(logits, dim=1))
    for dtype in (torch.float16, torch.bfloat16):
        assert inception_score(torch.softmax(logits, dim=1).to(dtype)) == pytest.approx(exact, rel=0.02)
    with pytest.raises(ValueError, match="sum to 1"):
        inception_score(torch.tensor([[0.55, 0.47], [0.5, 0.5]], dtype=torch.bfloat16))


def test_adapted_inception_score_averages_over_local_models() -> None:
    # teacher 0: probabilities (1/4, 3/4) and (1/2, 1/2); teacher 1: identical predictions -> IS 1
    logits = _t([[[0.0, LN3], [0.0, 0.0]], [[1.0, 2.0], [1.0, 2.0]]])
    kl1 = 0.25 * math.log(0.25 / 0.375) + 0.75 * math.log(0.75 / 0.625)
    kl2 = 0.5 * math.log(0.5 / 0.375) + 0.5 * math.log(0.5 / 0.625)
    _close(adapted_inception_score(logits), (math.exp((kl1 + kl2) / 2) + 1.0) / 2)


def test_class_coverage_counts() -> None:
    logits = _t([[5, 0, 0], [4, 1, 0], [3, 0, 1], [0, 2, 1], [0, 3, 1]])  # argmax 0, 0, 0, 1, 1
    report = class_coverage(logits)
    assert report["shares"] == pytest.approx([0.6, 0.4, 0.0])
    assert report["classes_covered"] == 2
    _close(report["normalised_entropy"], -(0.6 * math.log(0.6) + 0.4 * math.log(0.4)) / math.log(3))
    _close(report["max_share"], 0.6)
    assert class_coverage(logits, min_share=0.5)["classes_covered"] == 1
    balanced = class_coverage(torch.eye(3))
    _close(balanced["normalised_entropy"], 1.0)


def test_marginal_balance_loss_hand_case() -> None:
    # rows (1/4, 3/4) and (1/2, 1/2) -> marginal (3/8, 5/8)
    logits = _t([[0.0, LN3], [0.0, 0.0]])
    _close(marginal_balance_loss(logits), 3 / 8 * math.log2(3 / 8) + 5 / 8 * math.log2(5 / 8))
    # a balanced marginal is the minimum: -log2(C)
    _close(marginal_balance_loss(_t([[0.0, LN3], [LN3, 0.0]])), -1.0)
    with pytest.raises(ValueError, match=r"\(B, C\)"):
        marginal_balance_loss(_t([[[0.0, 1.0]]]))


def test_owner_weights_put_each_samples_weight_on_its_owner_and_fall_back_where_it_did_not_answer() -> None:
    # two teachers, three samples of two rows (pixels) each; sample 1's site did not answer
    fallback = torch.tensor([[[0.25, 0.5, 1.0]], [[0.75, 0.5, 0.0]]])
    w = owner_weights(torch.tensor([1, -1, 0]), fallback, rows_per_sample=2)
    assert w.shape == (2, 6, 3)
    want_t0 = [[0, 0, 0]] * 2 + [[0.25, 0.5, 1.0]] * 2 + [[1, 1, 1]] * 2
    want_t1 = [[1, 1, 1]] * 2 + [[0.75, 0.5, 0.0]] * 2 + [[0, 0, 0]] * 2
    assert w.tolist() == [want_t0, want_t1]
    z = torch.randn(2, 6, 3)
    ensemble = ensemble_logits(z, w)
    assert torch.equal(ensemble[0], z[1, 0]) and torch.equal(ensemble[5], z[0, 5])
