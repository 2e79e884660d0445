"""PATE aggregators and their RDP analysis, checked against direct high-precision evaluation.

The reference values are computed here with mpmath straight from the published formulas (plain
probabilities, no log-space tricks), and the data-dependent bounds are checked to lie above the exact
Rényi divergence of two-outcome mechanisms, which mpmath can evaluate exactly.
"""

import math

import numpy as np
import pytest
from opacus.accountants.analysis.rdp import get_privacy_spent

from fedistill.privacy.pate import (
    DEFAULT_ORDERS,
    calibrate_sigma,
    confident_gnmax,
    confident_gnmax_rdp,
    gnmax_aggregate,
    gnmax_rdp,
    log_pr_answered,
    log_q_gnmax,
    rdp_gnmax_data_dependent,
    rdp_gnmax_data_independent,
    rdp_threshold_data_dependent,
    rdp_threshold_data_independent,
    rdp_to_epsilon,
)

mp = pytest.importorskip("mpmath").mp
mp.dps = 60

ORDERS = np.array([1.5, 2.0, 5.0, 10.0, 20.0, 40.0, 100.0])


# --------------------------------------------------------------------------------------------------
# direct evaluation of the paper's formulas
# --------------------------------------------------------------------------------------------------


def q_direct(votes: list[float], sigma: float):
    """Proposition 7: sum over i != i* of 0.5 erfc((n_i* - n_i) / (2 sigma)), capped at 1 - 1/C."""
    top = max(range(len(votes)), key=lambda i: (votes[i], -i))
    q = mp.fsum(
        mp.erfc((mp.mpf(votes[top]) - votes[i]) / (2 * mp.mpf(sigma))) / 2
        for i in range(len(votes))
        if i != top
    )
    return min(q, 1 - mp.mpf(1) / len(votes))


def theorem6_direct(q, sigma: float, lam: float):
    """Theorem 6 with mu2 = sigma sqrt(log 1/q), mu1 = mu2 + 1; data-independent where it does not apply."""
    q, sigma, lam = mp.mpf(q), mp.mpf(sigma), mp.mpf(lam)
    baseline = lam / sigma**2
    mu2 = sigma * mp.sqrt(mp.log(1 / q))
    mu1 = mu2 + 1
    eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
    if not (mu2 > 1 and q * mp.exp(eps2) < 1 and lam <= mu1):
        return baseline
    if q > mp.exp((mu2 - 1) * eps2) / (mu1 / (mu1 - 1) * mu2 / (mu2 - 1)) ** mu2:
        return baseline
    a = (1 - q) / (1 - (q * mp.exp(eps2)) ** ((mu2 - 1) / mu2))
    b = mp.exp(eps1) / q ** (1 / (mu1 - 1))
    bound = mp.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)
    return min(bound, baseline)


def binary_renyi(p, p_other, lam: float):
    """Exact D_lambda between two-outcome distributions (p, 1-p) and (p', 1-p')."""
    lam = mp.mpf(lam)
    total = p**lam * p_other ** (1 - lam) + (1 - p) ** lam * (1 - p_other) ** (1 - lam)
    return mp.log(total) / (lam - 1)


# --------------------------------------------------------------------------------------------------
# aggregators
# --------------------------------------------------------------------------------------------------


def test_gnmax_without_noise_is_the_plurality() -> None:
    rng = np.random.default_rng(0)
    votes = rng.multinomial(25, np.full(10, 0.1), size=200)
    assert np.array_equal(gnmax_aggregate(votes, 0.0, rng), np.argmax(votes, axis=1))


def test_gnmax_noise_scale_is_sigma() -> None:
    # Two classes, gap 1: class 0 wins when N(0, 2 sigma^2) < 1, with probability Phi(1 / (sqrt(2) sigma)).
    votes = np.tile([10.0, 9.0], (20_000, 1))
    labels = gnmax_aggregate(votes, 2.0, np.random.default_rng(1))
    expected = 0.5 * math.erfc(-1 / (2 * 2.0))
    assert np.mean(labels == 0) == pytest.approx(expected, abs=0.015)


def test_gnmax_is_reproducible_with_the_same_generator_seed() -> None:
    votes = np.random.default_rng(0).multinomial(20, np.full(5, 0.2), size=50)
    a = gnmax_aggregate(votes, 3.0, np.random.default_rng(7))
    b = gnmax_aggregate(votes, 3.0, np.random.default_rng(7))
    assert np.array_equal(a, b)


def test_confident_gnmax_answers_only_above_the_threshold() -> None:
    votes = np.array([[9, 1, 0], [4, 3, 3], [0, 2, 8]])
    answered, labels = confident_gnmax(votes, 6, 0.0, 0.0, np.random.default_rng(0))
    assert answered.tolist() == [True, False, True]
    assert labels.tolist() == [0, -1, 2]
    answered, labels = confident_gnmax(votes, 1e9, 1.0, 1.0, np.random.default_rng(0))
    assert not answered.any() and (labels == -1).all()


# --------------------------------------------------------------------------------------------------
# GNMax RDP
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.5, 4.0, 40.0])
def test_data_independent_rdp_is_order_over_sigma_squared(sigma: float) -> None:
    assert np.allclose(rdp_gnmax_data_independent(sigma, ORDERS), ORDERS / sigma**2, rtol=1e-15)
    assert np.allclose(rdp_threshold_data_independent(sigma, ORDERS), ORDERS / (2 * sigma**2), rtol=1e-15)
    independent = gnmax_rdp(np.ones((7, 3)), sigma, ORDERS, data_dependent=False)
    assert np.allclose(independent, 7 * ORDERS / sigma**2, rtol=1e-14)


@pytest.mark.parametrize(
    ("votes", "sigma"),
    [
        ([100] + [0] * 9, 10.0),
        ([90, 10], 20.0),
        ([40, 30, 20, 10], 5.0),
        ([3, 25, 5, 17], 2.0),
        ([30, 25, 20, 10, 5, 5, 5, 0, 0, 0], 10.0),
    ],
)
def test_log_q_and_data_dependent_rdp_match_direct_evaluation(votes: list[int], sigma: float) -> None:
    q = q_direct(votes, sigma)
    log_q = log_q_gnmax(votes, sigma)
    assert log_q.shape == (1,)
    assert log_q[0] == pytest.approx(float(mp.log(q)), rel=1e-10)
    rdp = rdp_gnmax_data_dependent(log_q, sigma, ORDERS)[0]
    expected = [float(theorem6_direct(q, sigma, lam)) for lam in ORDERS]
    assert rdp == pytest.approx(expected, rel=1e-8, abs=1e-300)


def test_data_dependent_never_exceeds_data_independent() -> None:
    rng = np.random.default_rng(0)
    votes = np.concatenate(
        [rng.multinomial(50, rng.dirichlet(np.full(10, alpha)), size=100) for alpha in (0.05, 0.5, 5.0)]
    )
    for sigma in (1.0, 5.0, 20.0, 50.0):
        dependent = rdp_gnmax_data_dependent(log_q_gnmax(votes, sigma), sigma)
        independent = rdp_gnmax_data_independent(sigma)
        assert np.isfinite(dependent).all() and (dependent >= 0).all()
        assert (dependent <= independent * (1 + 1e-12)).all()
        threshold = rdp_threshold_data_dependent(log_pr_answered(votes, 30.0, sigma), sigma)
        assert (threshold <= rdp_threshold_data_independent(sigma) * (1 + 1e-12)).all()


def test_data_dependent_is_much_smaller_for_a_strong_consensus() -> None:
    orders = np.arange(2.0, 21.0)
    dependent = rdp_gnmax_data_dependent(log_q_gnmax([100] + [0] * 9, 10.0), 10.0, orders)[0]
    assert (dependent < 1e-3 * rdp_gnmax_data_independent(10.0, orders)).all()
    # A split vote gets no discount.
    split = rdp_gnmax_data_dependent(log_q_gnmax([50, 50, 0], 10.0), 10.0, orders)[0]
    assert np.array_equal(split, rdp_gnmax_data_independent(10.0, orders))


@pytest.mark.parametrize(("votes", "sigma"), [((90, 10), 20.0), ((60, 40), 3.0), ((30, 20), 2.0)])
def test_data_dependent_bound_is_above_the_exact_divergence(votes: tuple[int, int], sigma: float) -> None:
    # With two classes GNMax outputs class 0 with probability Phi(gap / (sqrt(2) sigma)); moving one
    # vote changes the gap by 2.
    def p0(gap: float):
        return mp.ncdf(mp.mpf(gap) / (mp.sqrt(2) * sigma))

    gap = votes[0] - votes[1]
    bound = rdp_gnmax_data_dependent(log_q_gnmax(votes, sigma), sigma, ORDERS)[0]
    assert (bound < ORDERS / sigma**2).any()  # the data-dependent branch is exercised
    for lam, b in zip(ORDERS, bound, strict=True):
        exact = max(binary_renyi(p0(gap), p0(gap + d), lam) for d in (-2, 2))
        assert b >= float(exact) * (1 - 1e-9)


def test_single_class_or_certain_outcome_costs_nothing() -> None:
    assert np.isneginf(log_q_gnmax([[5], [7]], 1.0)).all()
    assert np.array_equal(gnmax_rdp([[5], [7]], 1.0, ORDERS), np.zeros(len(ORDERS)))


# --------------------------------------------------------------------------------------------------
# threshold check and Confident-GNMax
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_votes", "threshold", "sigma1"), [(180, 300, 40.0), (290, 200, 30.0), (250, 250, 50.0)]
)
def test_threshold_rdp_matches_direct_evaluation(max_votes: int, threshold: float, sigma1: float) -> None:
    votes = [max_votes, 300 - max_votes]
    p = mp.erfc((mp.mpf(threshold) - max_votes) / (mp.sqrt(2) * sigma1)) / 2
    log_p = log_pr_answered(votes, threshold, sigma1)
    assert log_p[0] == pytest.approx(float(mp.log(p)), rel=1e-10)
    rdp = rdp_threshold_data_dependent(log_p, sigma1, ORDERS)[0]
    expected = [float(theorem6_direct(min(p, 1 - p), mp.sqrt(2) * sigma1, lam)) for lam in ORDERS]
    assert rdp == pytest.approx(expected, rel=1e-8)


@pytest.mark.parametrize(("max_votes", "threshold", "sigma1"), [(100, 300, 40.0), (300, 150, 30.0)])
def test_threshold_bound_is_above_the_exact_divergence(max_votes: int, threshold: float, sigma1: float):
    # The check answers with probability Phi((max - T) / sigma1); one client moves max by at most 1.
    def p(m: float):
        return mp.ncdf((mp.mpf(m) - threshold) / sigma1)

    log_p = log_pr_answered([max_votes, 0], threshold, sigma1)
    bound = rdp_threshold_data_dependent(log_p, sigma1, ORDERS)[0]
    assert (bound < ORDERS / (2 * sigma1**2)).any()
    for lam, b in zip(ORDERS, bound, strict=True):
        exact = max(binary_renyi(p(max_votes), p(max_votes + d), lam) for d in (-1, 1))
        assert b >= float(exact) * (1 - 1e-9)


def test_confident_gnmax_rdp_composes_threshold_and_answered_queries() -> None:
    votes = np.array([[240, 5, 5], [100, 90, 60], [200, 50, 0], [90, 80, 80]])
    answered = np.array([True, False, True, False])
    independent = confident_gnmax_rdp(votes, answered, 150, 50.0, 20.0, ORDERS, data_dependent=False)
    assert np.allclose(independent, 4 * ORDERS / (2 * 50.0**2) + 2 * ORDERS / 20.0**2)
    dependent = confident_gnmax_rdp(votes, answered, 150, 50.0, 20.0, ORDERS)
    parts = rdp_threshold_data_dependent(log_pr_answered(votes, 150, 50.0), 50.0, ORDERS).sum(0)
    parts = parts + rdp_gnmax_data_dependent(log_q_gnmax(votes[answered], 20.0), 20.0, ORDERS).sum(0)
    assert np.allclose(dependent, parts, rtol=1e-12)
    assert (dependent <= independent * (1 + 1e-12)).all()
    with pytest.raises(ValueError, match="answered"):
        confident_gnmax_rdp(votes, answered[:2], 150, 50.0, 20.0)


# --------------------------------------------------------------------------------------------------
# RDP -> (epsilon, delta)
# --------------------------------------------------------------------------------------------------


def test_epsilon_uses_opacus_conversion() -> None:
    # 1000 GNMax queries at sigma = 40, data-independent.
    rdp = gnmax_rdp(np.tile([100, 0, 0], (1000, 1)), 40.0, data_dependent=False)
    eps, order = rdp_to_epsilon(rdp, 1e-5)
    ref_eps, ref_order = get_privacy_spent(orders=DEFAULT_ORDERS, rdp=rdp, delta=1e-5)
    assert (eps, order) == (pytest.approx(float(ref_eps)), float(ref_order))
    # Balle et al. (2020), Theorem 21, evaluated here on its own.
    direct = min(
        1000 * a / 1600 - (math.log(1e-5) + math.log(a)) / (a - 1) + math.log((a - 1) / a)
        for a in DEFAULT_ORDERS
    )
    assert eps == pytest.approx(direct, rel=1e-12)
    with pytest.raises(ValueError, match="orders"):
        rdp_to_epsilon(rdp[:3], 1e-5)


def test_calibrated_gnmax_noise_spends_the_target_and_no_more() -> None:
    votes = np.array([[7, 2, 1], [4, 3, 3], [10, 0, 0], [5, 5, 0]] * 25)

    def epsilon_of(sigma: float) -> float:
        return rdp_to_epsilon(gnmax_rdp(votes, sigma), 1e-5)[0]

    sigma = calibrate_sigma(epsilon_of, 6.0)
    assert epsilon_of(sigma) <= 6.0
    assert epsilon_of(sigma * 0.999) > 6.0  # the smallest such noise, to the bisection's precision
    # Data-independent check at the same noise: 100 queries of lambda / sigma^2 each, converted.
    independent = rdp_to_epsilon(len(votes) * DEFAULT_ORDERS / sigma**2, 1e-5)[0]
    assert independent >= epsilon_of(sigma) - 1e-9


def test_calibration_refuses_an_unreachable_budget() -> None:
    with pytest.raises(ValueError, match="out of reach"):
        calibrate_sigma(lambda sigma: 10.0, 6.0)
