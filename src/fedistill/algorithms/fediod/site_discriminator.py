"""A site's discriminator D_k and its Adam state, built when the site is first asked for a G-step.

Why: with `sites_per_step` a G-step asks a sample of the sites, and at 1,000 sites most of them may not
have been asked yet; building every D_k and its optimiser up front made memory grow with sites that
had nothing to do. D_k is initialised from the run seed alone (`discriminator-init`) and Adam holds no
state before its first step, so a D_k built on first use is the D_k an eager build gave, bit for bit.
A checkpoint of a site whose D_k was never built records the state a build would have, without
keeping it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedistill.algorithms.base import clone_state
from fedistill.seeding import seeded


class SiteDiscriminator:
    """D_k (`module`) and its optimiser (`optimizer`), built from the run seed on first use."""

    def __init__(self, seed: int, build: Callable[[], nn.Module], lr: float, channels_last: bool) -> None:
        self.seed, self.build, self.lr, self.channels_last = seed, build, lr, channels_last
        self._module: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    @property
    def held(self) -> bool:
        """Whether this site has built its D_k."""
        return self._module is not None

    def _fresh(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        module = seeded(self.seed, self.build, "discriminator-init")
        if self.channels_last:
            module.to(memory_format=torch.channels_last)
        optimizer = torch.optim.Adam(module.parameters(), lr=self.lr, betas=(0.5, 0.999))
        return module, optimizer

    @property
    def module(self) -> nn.Module:
        """D_k, built if the site holds none yet."""
        if self._module is None:
            self._module, self._optimizer = self._fresh()
        return self._module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """D_k's Adam, built with D_k."""
        self.module  # noqa: B018 - builds both
        assert self._optimizer is not None
        return self._optimizer

    def state_dict(self) -> tuple[dict, dict]:
        """D_k's parameters and its optimiser's state; for an unbuilt D_k those of a fresh build, not kept."""
        module, optimizer = (self._module, self._optimizer) if self.held else self._fresh()
        assert module is not None and optimizer is not None
        return clone_state(module), optimizer.state_dict()

    def load_state_dict(self, module_state: dict, optimizer_state: dict) -> None:
        """Restore D_k and its optimiser. A D_k that never took a step (no Adam state) is a fresh build's,
        bit for bit: the site stays without one until it is asked."""
        if not optimizer_state.get("state") and not self.held:
            return
        self.module.load_state_dict(module_state)
        self.optimizer.load_state_dict(optimizer_state)
