"""Per-client privacy accounting on top of Opacus' accountants, used standalone.

Each client that answers with sanitised gradients keeps its own `ClientAccountant`: privacy is a
property of one site's data, so the budget is spent and checked per client, never pooled. The
accountant only records ``(noise_multiplier, sample_rate, steps)`` phases; Opacus turns them into an
epsilon (RDP by default, PRV on request). The history is plain JSON so a resumed run continues the
same budget instead of starting a fresh one.

Opacus is imported inside the functions that need it: it is slow to import and most runs never
touch differential privacy.
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedistill.errors import ConfigError, UserError, unknown_name

__all__ = [
    "ACCOUNTANTS",
    "ClientAccountant",
    "DPConfig",
    "PrivacyBudgetExceeded",
    "calibrate_noise",
]

ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv")
"""Accountant names: Opacus' `RDPAccountant` ("rdp", default) and `PRVAccountant` ("prv")."""

PRV_EPS_ERROR: float = 0.01
"""Precision asked of the PRV accountant; it reports the upper end of its epsilon interval."""


class PrivacyBudgetExceeded(UserError):
    """A client would spend more privacy than its target epsilon allows.

    It is a user error: the fix is a larger target epsilon, more noise or fewer steps.
    """

    def __init__(self, client: str, epsilon: float, target_epsilon: float, delta: float) -> None:
        self.client = client
        self.epsilon = epsilon
        self.target_epsilon = target_epsilon
        self.delta = delta
        super().__init__(
            f"client {client}: privacy budget exceeded, epsilon would reach {epsilon:.4g} "
            f"> target {target_epsilon:.4g} (delta={delta:g}); raise the target epsilon, "
            "raise the noise multiplier or run fewer steps"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Keeps the error picklable across process boundaries despite the custom signature.
        return (type(self), (self.client, self.epsilon, self.target_epsilon, self.delta))


# --------------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------------


#: Where a client's DP noise comes from: "secret", a seed the client draws from the operating system and
#: never sends (the default: the server cannot reproduce the noise), or "run", the run seed (reproducible
#: across runs and transports, for tests and for repeating a record; the server holds that seed, so it can
#: regenerate the noise and take it off: no privacy against the server).
NOISE_SEEDS = ("secret", "run")


@dataclass(frozen=True)
class DPConfig:
    """Differential-privacy options for what a client releases.

    ``target_epsilon = 0`` means "not set". With DP enabled, give a noise multiplier (the budget is
    then only tracked, or also enforced when a target is set too) or only a target epsilon (the noise
    is then calibrated to reach it with `calibrate_noise`).
    """

    enabled: bool = False
    clip_norm: float = 1.0
    noise_multiplier: float = 0.0
    target_epsilon: float = 0.0
    delta: float = 1e-5
    accountant: str = "rdp"
    noise_seed: str = "secret"

    def validate(self) -> None:
        """Raise `ConfigError` naming the first invalid field, its value and what to use instead."""
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"dp.enabled must be true or false, got {self.enabled!r}")
        if self.accountant not in ACCOUNTANTS:
            raise unknown_name("dp.accountant", self.accountant, list(ACCOUNTANTS), ConfigError)
        if self.noise_seed not in NOISE_SEEDS:
            raise unknown_name("dp.noise_seed", self.noise_seed, list(NOISE_SEEDS), ConfigError)
        _check_number("dp.clip_norm", self.clip_norm, "> 0", lambda x: x > 0)
        _check_number("dp.noise_multiplier", self.noise_multiplier, ">= 0", lambda x: x >= 0)
        _check_number("dp.target_epsilon", self.target_epsilon, ">= 0 (0 = not set)", lambda x: x >= 0)
        _check_number("dp.delta", self.delta, "in (0, 1)", lambda x: 0 < x < 1)
        if self.enabled and self.noise_multiplier == 0 and self.target_epsilon == 0:
            raise ConfigError(
                "dp.enabled = true needs dp.noise_multiplier > 0 or dp.target_epsilon > 0 "
                "(the noise is then calibrated to reach it); both are 0"
            )


def _check_number(name: str, value: object, rule: str, ok: Callable[[float], bool]) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value) or not ok(value):
        raise ConfigError(f"{name} must be a finite number {rule}, got {value!r}")


# --------------------------------------------------------------------------------------------------
# accountant
# --------------------------------------------------------------------------------------------------

Phase = tuple[float, float, int]
"""One accounting phase: ``(noise_multiplier, sample_rate, steps)``, as in Opacus' history."""


def _check_phase(noise_multiplier: float, sample_rate: float, steps: int) -> None:
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier!r}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _append(history: list[Phase], noise_multiplier: float, sample_rate: float, steps: int) -> None:
    """Add a phase, merging it into the last one when the parameters match (as Opacus' `step` does)."""
    if steps == 0:
        return
    if history and history[-1][:2] == (noise_multiplier, sample_rate):
        history[-1] = (noise_multiplier, sample_rate, history[-1][2] + steps)
    else:
        history.append((noise_multiplier, sample_rate, steps))


def _epsilon(history: list[Phase], delta: float, accountant: str) -> float:
    """Epsilon of a history, computed by a fresh Opacus accountant of the given kind."""
    if not history:
        return 0.0
    from opacus.accountants import PRVAccountant, RDPAccountant

    if accountant == "prv":
        prv = PRVAccountant()
        prv.history = list(history)
        # at sample rate 1 Opacus takes log(1 - q) = log(0) inside a `where` that discards it
        try:
            with np.errstate(divide="ignore"):
                return float(prv.get_epsilon(delta=delta, eps_error=PRV_EPS_ERROR))
        except MemoryError:  # its discretised privacy loss grows as the noise shrinks
            smallest = min(noise for noise, _, _ in history)
            raise UserError(
                f"the PRV accountant ran out of memory at an accounted noise multiplier of {smallest:.4g} "
                "(it needs gigabytes at small noise); use dp_accountant = 'rdp', or more noise"
            ) from None
    from opacus.accountants.analysis.rdp import get_privacy_spent

    # What `RDPAccountant.get_epsilon` computes, with the per-step RDP of each (noise, rate) computed
    # once: Opacus re-derives it for every call, which made a DP run's per-step budget check cost
    # more than its training. RDP composes additively, so a phase is its per-step vector x steps.
    orders = RDPAccountant.DEFAULT_ALPHAS
    total = [0.0] * len(orders)
    for noise_multiplier, sample_rate, steps in history:
        per_step = _rdp_per_step(noise_multiplier, sample_rate)
        total = [t + r * steps for t, r in zip(total, per_step, strict=True)]
    epsilon, _ = get_privacy_spent(orders=orders, rdp=total, delta=delta)
    return float(epsilon)


@functools.lru_cache(maxsize=1024)
def _rdp_per_step(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """RDP of one subsampled Gaussian release at each of Opacus' default orders."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=orders)
    return tuple(float(r) for r in rdp)


class ClientAccountant:
    """The privacy one client has spent so far, as a list of Gaussian-mechanism phases."""

    def __init__(self, client: str | int = "client", accountant: str = "rdp") -> None:
        if accountant not in ACCOUNTANTS:
            raise unknown_name("accountant", accountant, list(ACCOUNTANTS), ConfigError)
        self.client = str(client)
        self.accountant = accountant
        self._history: list[Phase] = []

    @property
    def history(self) -> list[Phase]:
        """A copy of the recorded phases."""
        return list(self._history)

    @property
    def steps(self) -> int:
        """Total number of noisy steps recorded."""
        return sum(phase[2] for phase in self._history)

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record `steps` releases, each a Gaussian mechanism with Poisson sampling at `sample_rate`."""
        _check_phase(noise_multiplier, sample_rate, steps)
        _append(self._history, float(noise_multiplier), float(sample_rate), int(steps))

    def epsilon(self, delta: float = 1e-5) -> float:
        """Epsilon spent so far at this delta (0 before the first step)."""
        _check_delta(delta)
        return _epsilon(self._history, delta, self.accountant)

    def epsilon_after(self, delta: float, noise_multiplier: float, sample_rate: float, steps: int) -> float:
        """Epsilon the client would reach after `steps` more releases; the accountant is not changed."""
        _check_delta(delta)
        _check_phase(noise_multiplier, sample_rate, steps)
        history = copy.copy(self._history)
        _append(history, float(noise_multiplier), float(sample_rate), int(steps))
        return _epsilon(history, delta, self.accountant)

    def would_exceed(
        self, target_epsilon: float, delta: float, noise_multiplier: float, sample_rate: float, steps: int = 1
    ) -> bool:
        """Whether `steps` more releases would take epsilon strictly above `target_epsilon`."""
        return self.epsilon_after(delta, noise_multiplier, sample_rate, steps) > target_epsilon

    def step_within(
        self, target_epsilon: float, delta: float, noise_multiplier: float, sample_rate: float, steps: int = 1
    ) -> float:
        """Record the steps if they keep epsilon within the target, else raise `PrivacyBudgetExceeded`.

        The check comes first, so nothing is spent (or released) on a refused request. Returns the new
        epsilon.
        """
        epsilon = self.epsilon_after(delta, noise_multiplier, sample_rate, steps)
        if epsilon > target_epsilon:
            raise PrivacyBudgetExceeded(self.client, epsilon, target_epsilon, delta)
        self.step(noise_multiplier, sample_rate, steps)
        return epsilon

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state: client, accountant kind and the phase history."""
        return {
            "client": self.client,
            "accountant": self.accountant,
            "history": [[nm, sr, n] for nm, sr, n in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`; refuses one of another client or accountant kind."""
        for key in ("client", "accountant", "history"):
            if key not in state:
                raise ValueError(f"accountant state has no {key!r} key (keys: {sorted(state)})")
        if str(state["client"]) != self.client or state["accountant"] != self.accountant:
            raise ValueError(
                f"accountant state is for client {state['client']} ({state['accountant']}), "
                f"not for client {self.client} ({self.accountant})"
            )
        history: list[Phase] = []
        for entry in state["history"]:
            if len(entry) != 3:
                raise ValueError(f"accountant history entry must be [noise, rate, steps], got {entry!r}")
            noise_multiplier, sample_rate, steps = float(entry[0]), float(entry[1]), int(entry[2])
            _check_phase(noise_multiplier, sample_rate, steps)
            history.append((noise_multiplier, sample_rate, steps))
        self._history = history

    def __repr__(self) -> str:
        return f"ClientAccountant(client={self.client!r}, accountant={self.accountant!r}, steps={self.steps})"


@functools.lru_cache(maxsize=256)
def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
) -> float:
    """The noise multiplier that spends `target_epsilon` in `steps` releases (Opacus' binary search).

    The result errs on the safe side: its epsilon is at most the target and within
    `epsilon_tolerance` of it. Cached: clients of equal data size share one (slow) search.
    """
    if accountant not in ACCOUNTANTS:
        raise unknown_name("accountant", accountant, list(ACCOUNTANTS), ConfigError)
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ConfigError(f"target epsilon must be a finite number > 0, got {target_epsilon!r}")
    _check_delta(delta)
    _check_phase(1.0, sample_rate, steps)
    if steps == 0:
        raise ValueError("steps must be >= 1 to calibrate noise")
    from opacus.accountants.utils import get_noise_multiplier

    try:
        with warnings.catch_warnings(), np.errstate(divide="ignore"):  # PRV at rate 1: see _epsilon
            # The binary search visits very large noise levels, where Opacus warns that the best order
            # is its largest one; that says nothing about the answer.
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
            sigma = get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=accountant,
                epsilon_tolerance=epsilon_tolerance,
            )
    except ValueError as exc:
        hint = "Raise the target epsilon or run fewer steps."
        floor = _rdp_floor(delta) if accountant == "rdp" else 0.0
        if target_epsilon <= floor:
            hint = (
                f"The RDP accountant cannot certify less than about {floor:.3g} at this delta, whatever the "
                "noise and the number of steps (its largest Renyi order bounds it): raise the target epsilon "
                "or use dp_accountant = 'prv'."
            )
        raise ConfigError(
            f"cannot reach target epsilon {target_epsilon:g} (delta={delta:g}) in {steps} steps at sample "
            f"rate {sample_rate:g}: {exc} {hint}"
        ) from None
    return float(sigma)


def _rdp_floor(delta: float) -> float:
    """The smallest epsilon the RDP accountant reports at `delta`: its conversion of a zero RDP curve, the
    limit of infinite noise, set by its largest order."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import get_privacy_spent

    orders = RDPAccountant.DEFAULT_ALPHAS
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        epsilon, _ = get_privacy_spent(orders=orders, rdp=[0.0] * len(orders), delta=delta)
    return float(epsilon)
