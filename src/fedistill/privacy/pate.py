"""PATE on client votes: the GNMax and Confident-GNMax aggregators and their Rényi-DP analysis.

Reference: Papernot, Song, Mironov, Raghunathan, Talwar, Erlingsson, "Scalable Private Learning with
PATE", ICLR 2018 (arXiv:1802.08908). Each row of ``votes`` is one query: how many clients (teachers)
vote for each of ``C`` classes. One client changing its vote moves one count down and another up.

* GNMax releases ``argmax_j (n_j + N(0, sigma^2))``. Data-independent: ``(lambda, lambda/sigma^2)``-RDP
  for every order ``lambda`` (the count vector has L2 sensitivity sqrt(2)).
* Data-dependent (Theorem 6): when the plurality ``i*`` wins with probability ``1 - q`` and ``q`` is
  small, the RDP at order ``lambda`` is bounded by
  ``1/(lambda-1) * log((1-q) A^(lambda-1) + q B^(lambda-1))`` with
  ``A = (1-q) / (1 - (q e^eps2)^((mu2-1)/mu2))`` and ``B = e^eps1 / q^(1/(mu1-1))``, where
  ``(mu_i, eps_i)`` are two points of the data-independent curve (``eps_i = mu_i / sigma^2``). The
  theorem needs ``lambda <= mu1`` and ``q <= e^((mu2-1) eps2) / (mu1/(mu1-1) * mu2/(mu2-1))^mu2``;
  ``A`` also needs ``q e^eps2 < 1``. The orders are chosen as in the paper's appendix,
  ``mu2 = sigma sqrt(log(1/q))`` and ``mu1 = mu2 + 1``. Where a condition fails the data-independent
  bound is used, and the result is always the minimum of the two.
* ``q`` is bounded (Proposition 7) by the union bound
  ``q <= sum_{i != i*} 0.5 erfc((n_i* - n_i) / (2 sigma))``, capped at ``1 - 1/C`` (the plurality is
  the likeliest outcome, so it wins with probability at least ``1/C``).
* Confident-GNMax first releases whether ``max_j n_j + N(0, sigma1^2) >= T`` and answers with GNMax
  (``sigma2``) only then. The threshold check is a Gaussian mechanism on ``max_j n_j`` (sensitivity 1):
  ``lambda / (2 sigma1^2)``-RDP, i.e. the GNMax curve at ``sqrt(2) sigma1``. Its output is binary, so
  Theorem 6 applies with ``q`` = the probability of the less likely outcome,
  ``min(Pr[answer], 1 - Pr[answer])`` with ``Pr[answer] = 0.5 erfc((T - max_j n_j) / (sqrt(2) sigma1))``.

RDP composes by adding the curves of all queries at each order; `rdp_to_epsilon` converts the total to
``(epsilon, delta)`` with Opacus' conversion. Note that a data-dependent epsilon is itself a function of
the private votes: publishing it needs a further smooth-sensitivity analysis (paper Section 4.2), which
this module does not do.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import log_ndtr, logsumexp

__all__ = [
    "DEFAULT_ORDERS",
    "calibrate_sigma",
    "confident_gnmax",
    "confident_gnmax_rdp",
    "gnmax_aggregate",
    "gnmax_rdp",
    "log_pr_answered",
    "log_q_gnmax",
    "rdp_data_dependent",
    "rdp_gnmax_data_dependent",
    "rdp_gnmax_data_independent",
    "rdp_threshold_data_dependent",
    "rdp_threshold_data_independent",
    "rdp_to_epsilon",
]

DEFAULT_ORDERS: np.ndarray = np.array(
    [1 + x / 10 for x in range(1, 100)]
    + list(range(12, 64))
    + [64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024],
    dtype=float,
)
"""Rényi orders: Opacus' defaults plus large ones, where strong-consensus PATE costs are optimal."""


# --------------------------------------------------------------------------------------------------
# input checks and helpers
# --------------------------------------------------------------------------------------------------


def _votes(votes: ArrayLike) -> np.ndarray:
    """Votes as a float ``(N, C)`` array; one query ``(C,)`` becomes ``(1, C)``."""
    array = np.asarray(votes, dtype=float)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(f"votes must have shape (N, C) with C >= 1, got {np.shape(votes)}")
    if not np.isfinite(array).all():
        raise ValueError("votes must be finite")
    return array


def _orders(orders: ArrayLike | None) -> np.ndarray:
    array = DEFAULT_ORDERS if orders is None else np.atleast_1d(np.asarray(orders, dtype=float))
    if array.ndim != 1 or not (array > 1).all() or not np.isfinite(array).all():
        raise ValueError(f"Rényi orders must be finite numbers > 1, got {orders!r}")
    return array


def _check_sigma(name: str, sigma: float, allow_zero: bool = False) -> None:
    ok = sigma >= 0 if allow_zero else sigma > 0
    if not (math.isfinite(sigma) and ok):
        raise ValueError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {sigma!r}")


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate near both ends."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x < -math.log(2), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


# --------------------------------------------------------------------------------------------------
# aggregators
# --------------------------------------------------------------------------------------------------


def gnmax_aggregate(votes: ArrayLike, sigma: float, generator: np.random.Generator) -> np.ndarray:
    """GNMax: the class with the largest noisy count, ``argmax_j (n_j + N(0, sigma^2))``, per query.

    With ``sigma = 0`` this is the plurality vote (ties go to the lowest class index).
    """
    counts = _votes(votes)
    _check_sigma("sigma", sigma, allow_zero=True)
    noisy = counts + sigma * generator.standard_normal(counts.shape)
    return np.argmax(noisy, axis=1)


def confident_gnmax(
    votes: ArrayLike, threshold: float, sigma1: float, sigma2: float, generator: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Confident-GNMax: answer a query only if ``max_j n_j + N(0, sigma1^2) >= threshold``.

    Returns the ``(N,)`` boolean mask of answered queries and the ``(N,)`` labels (GNMax with
    ``sigma2``; -1 where not answered). Noise for both steps is drawn for every query, so the random
    stream does not depend on the votes.
    """
    counts = _votes(votes)
    _check_sigma("sigma1", sigma1, allow_zero=True)
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    answered = counts.max(axis=1) + sigma1 * generator.standard_normal(len(counts)) >= threshold
    labels = gnmax_aggregate(counts, sigma2, generator)
    return answered, np.where(answered, labels, -1)


# --------------------------------------------------------------------------------------------------
# RDP of GNMax
# --------------------------------------------------------------------------------------------------


def log_q_gnmax(votes: ArrayLike, sigma: float) -> np.ndarray:
    """Upper bound on ``log Pr[GNMax != plurality]`` per query (Proposition 7), shape ``(N,)``.

    ``0.5 erfc(g / (2 sigma))`` is the Gaussian tail at ``g / (sqrt(2) sigma)``: the difference of two
    independent N(0, sigma^2) draws exceeds the gap ``g``. The union bound is capped at ``1 - 1/C``.
    """
    counts = _votes(votes)
    _check_sigma("sigma", sigma)
    n, c = counts.shape
    if c == 1:
        return np.full(n, -np.inf)
    top = np.argmax(counts, axis=1)
    gaps = counts[np.arange(n), top][:, None] - counts
    log_tail = log_ndtr(-gaps / (math.sqrt(2) * sigma))
    log_tail[np.arange(n), top] = -np.inf
    return np.minimum(logsumexp(log_tail, axis=1), math.log1p(-1 / c))


def rdp_gnmax_data_independent(sigma: float, orders: ArrayLike | None = None) -> np.ndarray:
    """RDP of one GNMax query regardless of the votes: ``lambda / sigma^2`` at each order."""
    _check_sigma("sigma", sigma)
    return _orders(orders) / sigma**2


def rdp_data_dependent(log_q: ArrayLike, sigma: float, orders: ArrayLike | None = None) -> np.ndarray:
    """Theorem 6 for a mechanism whose data-independent RDP is ``lambda / sigma^2``.

    `log_q` bounds the log-probability of any outcome other than the likely one, one value per
    query (any shape ``S``). Returns RDP of shape ``S + (len(orders),)``, never above the
    data-independent curve, and 0 where ``q = 0``.
    """
    _check_sigma("sigma", sigma)
    lam = _orders(orders)
    log_q = np.asarray(log_q, dtype=float)[..., None]
    if (log_q > 0).any() or np.isnan(log_q).any():
        raise ValueError("log_q must be <= 0 (a log-probability)")
    variance = sigma**2
    baseline = np.broadcast_to(lam / variance, log_q.shape[:-1] + lam.shape)
    with np.errstate(all="ignore"):
        mu2 = sigma * np.sqrt(-log_q)
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / variance, mu2 / variance
        q_small = log_q <= (mu2 - 1) * eps2 - mu2 * (np.log(mu1 / (mu1 - 1)) + np.log(mu2 / (mu2 - 1)))
        applies = (mu2 > 1) & (-log_q > eps2) & q_small & (lam <= mu1)
        log_1mq = _log1mexp(log_q)
        log_a = log_1mq - _log1mexp((log_q + eps2) * (mu2 - 1) / mu2)
        log_b = eps1 - log_q / (mu1 - 1)
        bound = np.logaddexp(log_1mq + (lam - 1) * log_a, log_q + (lam - 1) * log_b) / (lam - 1)
    rdp = np.where(applies, np.minimum(bound, baseline), baseline)
    rdp = np.where(np.isneginf(log_q), 0.0, rdp)
    return np.maximum(rdp, 0.0)


def rdp_gnmax_data_dependent(log_q: ArrayLike, sigma: float, orders: ArrayLike | None = None) -> np.ndarray:
    """Data-dependent RDP of GNMax queries given their `log_q_gnmax` bounds, shape ``(N, orders)``."""
    return rdp_data_dependent(log_q, sigma, orders)


def gnmax_rdp(
    votes: ArrayLike, sigma: float, orders: ArrayLike | None = None, data_dependent: bool = True
) -> np.ndarray:
    """Total RDP of answering every query in `votes` with GNMax, summed over queries at each order."""
    counts = _votes(votes)
    if not data_dependent:
        return len(counts) * rdp_gnmax_data_independent(sigma, orders)
    return rdp_gnmax_data_dependent(log_q_gnmax(counts, sigma), sigma, orders).sum(axis=0)


# --------------------------------------------------------------------------------------------------
# RDP of the threshold check and of Confident-GNMax
# --------------------------------------------------------------------------------------------------


def log_pr_answered(votes: ArrayLike, threshold: float, sigma1: float) -> np.ndarray:
    """``log Pr[max_j n_j + N(0, sigma1^2) >= threshold]`` per query, shape ``(N,)``."""
    counts = _votes(votes)
    _check_sigma("sigma1", sigma1)
    return log_ndtr((counts.max(axis=1) - threshold) / sigma1)


def rdp_threshold_data_independent(sigma1: float, orders: ArrayLike | None = None) -> np.ndarray:
    """RDP of one threshold check: a sensitivity-1 Gaussian, ``lambda / (2 sigma1^2)``."""
    _check_sigma("sigma1", sigma1)
    return _orders(orders) / (2 * sigma1**2)


def rdp_threshold_data_dependent(
    log_pr_answer: ArrayLike, sigma1: float, orders: ArrayLike | None = None
) -> np.ndarray:
    """Theorem 6 for the threshold check, ``q`` being the less likely of "answer" and "no answer"."""
    _check_sigma("sigma1", sigma1)
    log_p = np.asarray(log_pr_answer, dtype=float)
    log_q = np.minimum(log_p, _log1mexp(log_p))
    return rdp_data_dependent(log_q, math.sqrt(2) * sigma1, orders)


def confident_gnmax_rdp(
    votes: ArrayLike,
    answered: ArrayLike,
    threshold: float,
    sigma1: float,
    sigma2: float,
    orders: ArrayLike | None = None,
    data_dependent: bool = True,
) -> np.ndarray:
    """Total RDP of Confident-GNMax: a threshold check for every query plus GNMax for answered ones."""
    counts = _votes(votes)
    mask = np.asarray(answered, dtype=bool)
    if mask.shape != (len(counts),):
        raise ValueError(f"answered must have shape ({len(counts)},), got {mask.shape}")
    if not data_dependent:
        check = len(counts) * rdp_threshold_data_independent(sigma1, orders)
        return check + int(mask.sum()) * rdp_gnmax_data_independent(sigma2, orders)
    log_p = log_pr_answered(counts, threshold, sigma1)
    check = rdp_threshold_data_dependent(log_p, sigma1, orders).sum(axis=0)
    if not mask.any():
        return check
    return check + gnmax_rdp(counts[mask], sigma2, orders, data_dependent=True)


# --------------------------------------------------------------------------------------------------
# conversion
# --------------------------------------------------------------------------------------------------


def rdp_to_epsilon(rdp: ArrayLike, delta: float, orders: ArrayLike | None = None) -> tuple[float, float]:
    """``(epsilon, best order)`` for a total RDP curve at `delta`, with Opacus' RDP-to-DP conversion."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    lam = _orders(orders)
    curve = np.atleast_1d(np.asarray(rdp, dtype=float))
    if curve.shape != lam.shape:
        raise ValueError(f"rdp has {curve.shape[0]} values but there are {lam.shape[0]} orders")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    with warnings.catch_warnings():
        # With a tiny RDP (strong consensus) the largest order is simply the best one; a best order
        # at the small end still warns, because there a wider range of orders would help.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        epsilon, order = get_privacy_spent(orders=lam, rdp=curve, delta=delta)
    return max(float(epsilon), 0.0), float(order)


def calibrate_sigma(
    epsilon_of: Callable[[float], float],
    target_epsilon: float,
    low: float = 0.05,
    high: float = 1e5,
    iterations: int = 60,
) -> float:
    """The smallest noise in ``[low, high]`` whose ``epsilon_of(sigma)`` is at most `target_epsilon`.

    Bisection on ``log sigma``; `epsilon_of` is any epsilon-versus-noise curve, e.g. GNMax's
    ``lambda s: rdp_to_epsilon(gnmax_rdp(votes, s), delta)[0]``, which falls as the noise grows. The
    answer errs on the safe side (its epsilon never exceeds the target). Raises `ValueError` when even
    `high` spends more than the target (for Confident-GNMax: the threshold checks alone).
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target epsilon must be a finite number > 0, got {target_epsilon!r}")
    with warnings.catch_warnings():
        # The search probes extreme noise levels, where the best Rényi order sits at either end of
        # the range; that says nothing about the answer.
        warnings.filterwarnings("ignore", message="Optimal order is the")
        return _bisect_sigma(epsilon_of, target_epsilon, low, high, iterations)


def _bisect_sigma(
    epsilon_of: Callable[[float], float], target_epsilon: float, low: float, high: float, iterations: int
) -> float:
    if epsilon_of(high) > target_epsilon:
        raise ValueError(f"epsilon {target_epsilon:g} is out of reach even with sigma {high:g}")
    if epsilon_of(low) <= target_epsilon:
        return low
    log_low, log_high = math.log(low), math.log(high)
    for _ in range(iterations):
        mid = (log_low + log_high) / 2
        if epsilon_of(math.exp(mid)) > target_epsilon:
            log_low = mid
        else:
            log_high = mid
    return math.exp(log_high)
