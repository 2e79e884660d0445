"""Differential privacy inside a federated algorithm: the options, one client's budget, refusals.

* `DPOptions`: the ``dp_*`` keys an algorithm's options table gains (``[fediod] dp_enabled = true``);
  they map one-to-one onto `DPConfig`'s fields.
* `ClientBudget`: what one client keeps, on its own side of the boundary: its `ClientAccountant` and
  the noise multiplier it applies (configured, or calibrated once for the planned number of steps).
  It goes into the client's ``state_dict``, so a resumed run continues the same budget.
* Refusals: a client whose next release would take it past its target epsilon answers with a
  *refusal* (a normal reply carrying the `PrivacyBudgetExceeded` message) instead of the release; the
  server sees it with `refusals` and ends the run cleanly. A refusal is not a failure: the client is
  not marked as dropped and nothing private is in it.
* `query.privacy`: a message that asks every client for its epsilon at the end of a run
  (`privacy_request`, `epsilons_of`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from fedistill.errors import ConfigError
from fedistill.federation import reply_spec
from fedistill.federation.fleet import Reply
from fedistill.federation.messages import Message
from fedistill.privacy.accounting import (
    ACCOUNTANTS,
    NOISE_SEEDS,
    ClientAccountant,
    DPConfig,
    PrivacyBudgetExceeded,
    calibrate_noise,
)
from fedistill.seeding import torch_generator

__all__ = [
    "PRIVACY_QUERY",
    "REFUSED",
    "ClientBudget",
    "DPOptions",
    "epsilon_summary",
    "epsilons_of",
    "privacy_request",
    "refusal",
    "refusal_reason",
    "refusals",
    "stop_reason",
    "warn_if_delta_too_large",
]

log = logging.getLogger(__name__)

REFUSED = reply_spec.REFUSED  # "privacy_budget_refused"
"""Metrics flag of a refusal reply."""

PRIVACY_QUERY = "query.privacy"
"""Message type: bring the accountant up to date (to a round) and report epsilon."""


@dataclass(frozen=True)
class DPOptions:
    """The ``dp_*`` options of an algorithm that can sanitise what its clients release.

    ``dp_enabled = true`` with ``dp_noise_multiplier > 0`` applies that noise and tracks epsilon; add
    ``dp_target_epsilon > 0`` to also stop the run before any client exceeds it. With only a target
    (noise 0), each client calibrates its noise up front for the planned number of steps.
    """

    dp_enabled: bool = False  # clip and noise what each client releases, and account its epsilon
    dp_clip_norm: float = 1.0  # L2 bound on what one client releases (its update, or a per-sample gradient)
    dp_noise_multiplier: float = 0.0  # Gaussian noise std / clip norm; 0 with a target: calibrated per client
    # epsilon a client must not exceed: the run stops before it would (with noise 0: the noise is calibrated
    # to reach it); 0: not set
    dp_target_epsilon: float = 0.0
    dp_delta: float = 1e-5  # the delta of the (epsilon, delta) each client reports
    dp_accountant: str = "rdp"  # rdp | prv (Opacus' accountants)
    dp_noise_seed: str = "secret"  # secret (each client's, never sent) | run (reproducible, not private)

    @property
    def dp(self) -> DPConfig:
        """The `dp_*` keys as the DPConfig the privacy engine and the accountant take."""
        return DPConfig(
            enabled=self.dp_enabled,
            clip_norm=self.dp_clip_norm,
            noise_multiplier=self.dp_noise_multiplier,
            target_epsilon=self.dp_target_epsilon,
            delta=self.dp_delta,
            accountant=self.dp_accountant,
            noise_seed=self.dp_noise_seed,
        )

    def validate_dp(self) -> None:
        """`DPConfig.validate` with the keys named as they are written here (``dp_clip_norm``); a misspelt
        choice under its table's name (``fedavg.dp_accountant``), with the values it takes."""
        table = getattr(self, "section", "")  # the config table an algorithm's options are read from
        for key, valid in (("dp_accountant", ACCOUNTANTS), ("dp_noise_seed", NOISE_SEEDS)):
            if getattr(self, key) not in valid:
                named = f"{table}.{key}" if table else key
                raise ConfigError(f"{named} must be one of {', '.join(valid)}; got {getattr(self, key)!r}")
        try:
            self.dp.validate()
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("dp.", "dp_")) from None
        if not self.dp_enabled and (self.dp_noise_multiplier > 0 or self.dp_target_epsilon > 0):
            raise ConfigError(
                "dp_noise_multiplier or dp_target_epsilon is set but dp_enabled = false; "
                "set dp_enabled = true to apply differential privacy, or remove them"
            )


#: Every ``dp_*`` key, for an options class that inherits them but offers no differential privacy (its
#: ``refused_keys``).
DP_KEYS = tuple(item.name for item in fields(DPOptions))


class ClientBudget:
    """One client's privacy: the noise it applies, where that noise comes from, and what it has spent (an
    Opacus accountant).

    The Gaussian mechanism protects only against whoever cannot predict the noise. With ``noise_seed =
    "secret"`` (the default) the client draws a seed from the operating system when it is created and
    keeps it in its own state (its checkpoint, on its own side of the boundary; never in a message), and
    every release takes the next stream of it, so no two releases share noise, not even a round the server
    asks for twice. A resumed run reads the seed and the count back and draws the same noise. With
    ``"run"`` the noise is derived from the run seed, the client and the step the server names: the same
    on every run and transport, and regenerable by the server, which holds the run seed.
    """

    def __init__(self, config: DPConfig, client: int, run_seed: int) -> None:
        self.config = config
        self.client = client
        self.run_seed = run_seed
        self.accountant = ClientAccountant(client, config.accountant)
        self.noise: float | None = config.noise_multiplier or None  # None: not calibrated yet
        self.secret = secrets.randbits(63) if config.noise_seed == "secret" else None
        self.releases = 0  # noise streams drawn from the secret so far

    def noise_generator(self, purpose: str, step: int) -> torch.Generator:
        """The generator of one release's noise: from the client's secret and its count of releases, or
        (``noise_seed = "run"``) from the run seed, the client and the server's `step`."""
        if self.secret is None:
            return torch_generator(self.run_seed, purpose, self.client, step)
        self.releases += 1
        return torch_generator(self.secret, purpose, self.releases)

    def noise_multiplier(self, sample_rate: float, planned_steps: int, scale: float = 1.0) -> float:
        """The noise multiplier to apply: the configured one, or, on first use, ``scale`` times the one
        that spends exactly the target in ``planned_steps`` steps at ``sample_rate`` (`calibrate_noise`).

        ``scale`` relates the applied noise to the accountant's (a mechanism of L2 sensitivity
        ``scale * clip_norm`` has the accountant's noise multiplier ``applied / scale``).
        """
        if self.noise is None:
            c = self.config
            self.noise = scale * calibrate_noise(
                c.target_epsilon, c.delta, sample_rate, max(1, planned_steps), c.accountant
            )
        return self.noise

    def spend(
        self, noise_multiplier: float, sample_rate: float, steps: int = 1, *, enforce: bool = True
    ) -> float:
        """Record ``steps`` releases; with a target (and `enforce`), raise `PrivacyBudgetExceeded`
        (recording nothing) if they would take epsilon past it. Returns epsilon after the steps.

        ``enforce=False`` records steps that already happened (a late catch-up), whatever they cost.
        """
        c = self.config
        if steps <= 0:
            return self.epsilon()
        if c.target_epsilon > 0 and enforce:
            target, delta = c.target_epsilon, c.delta
            return self.accountant.step_within(target, delta, noise_multiplier, sample_rate, steps)
        self.accountant.step(noise_multiplier, sample_rate, steps)
        return self.epsilon()

    def epsilon(self) -> float:
        """The epsilon this client has spent so far, at the configured delta."""
        return self.accountant.epsilon(self.config.delta)

    def state_dict(self) -> dict[str, Any]:
        """The accountant's history, the noise multiplier and the noise's secret seed and count, so a resumed
        run spends the same budget with the same noise. This is the client's own state, never sent."""
        return {
            "accountant": self.accountant.state_dict(),
            "noise": self.noise,
            "secret": self.secret,
            "releases": self.releases,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` saved (a state without a secret keeps the one drawn at creation)."""
        self.accountant.load_state_dict(dict(state["accountant"]))
        noise = state.get("noise")
        self.noise = None if noise is None else float(noise)
        if self.secret is not None and state.get("secret") is not None:
            self.secret = int(state["secret"])
            self.releases = int(state.get("releases", 0))


def warn_if_delta_too_large(delta: float, individuals: int, what: str) -> None:
    """Log a warning when ``delta >= 1 / individuals``: an (epsilon, delta) guarantee with such a delta
    is also met by a mechanism that publishes one of the `individuals` (a record, or a whole client) in
    the clear, so it protects no one in particular. `what` names them (e.g. "client 3's training
    records")."""
    if individuals > 0 and delta >= 1 / individuals:
        log.warning(
            "dp_delta = %g is not below 1/%d for %s: a delta that large allows releasing one of them "
            "outright; set dp_delta well below 1/%d (e.g. 1e-5)",
            delta,
            individuals,
            what,
            individuals,
        )


# --------------------------------------------------------------------------------------------------
# refusals and the final report
# --------------------------------------------------------------------------------------------------


def refusal(message_type: str, exc: PrivacyBudgetExceeded, epsilon: float) -> Message:
    """The reply of a client that refuses a release: its epsilon so far and why (no data in it)."""
    return Message.build(
        message_type,
        scalars={
            "metrics": {
                REFUSED: True,
                "epsilon": float(epsilon),
                "epsilon_would_be": float(exc.epsilon),
                "target_epsilon": float(exc.target_epsilon),
                "reason": str(exc),
            }
        },
    )


def refusals(replies: Mapping[int, Reply]) -> dict[int, Message]:
    """The replies that are refusals, by client."""
    return {
        cid: reply.message
        for cid, reply in replies.items()
        if reply.message is not None and bool(reply.message.scalars.get("metrics", {}).get(REFUSED, False))
    }


def refusal_reason(replies: Mapping[int, Reply], where: str) -> str | None:
    """None when no reply is a refusal; else one line for the log and the summary (who, where, why)."""
    refused = refusals(replies)
    return stop_reason(refused, where) if refused else None


def stop_reason(refused: Mapping[int, Message], where: str) -> str:
    """One line for the log and the summary: who refused, where, and what to change."""
    clients = ", ".join(str(cid) for cid in sorted(refused))
    first = str(refused[min(refused)].scalar("metrics", "reason"))
    return f"stopped at {where}: client(s) {clients} refused to exceed their privacy budget; {first}"


def privacy_request(round: int) -> Message:
    """The request that asks every client for the epsilon it has spent after `round`."""
    return Message.build(PRIVACY_QUERY, scalars={"config": {"round": int(round)}})


def epsilons_of(replies: Mapping[int, Reply]) -> dict[int, float]:
    """Each answering client's reported epsilon (replies without one are left out)."""
    out = {}
    for cid, reply in replies.items():
        if reply.message is not None and "epsilon" in reply.message.scalars.get("metrics", {}):
            out[cid] = float(reply.message.scalar("metrics", "epsilon"))
    return out


def epsilon_summary(epsilons: Mapping[int, float], delta: float) -> dict[str, float]:
    """``epsilon_client_<k>`` for every client, ``epsilon_max`` and the delta they hold at."""
    if not epsilons:
        return {}
    values = {f"epsilon_client_{cid}": float(eps) for cid, eps in sorted(epsilons.items())}
    return values | {"epsilon_max": float(max(epsilons.values())), "dp_delta": float(delta)}
