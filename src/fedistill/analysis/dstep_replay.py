"""FedIOD's one channel from a private batch into a client's reply, replayed: the discriminator step.

FedIOD's client never sends a gradient of its parameters. Its reply holds its logits T_k(x) and density
ratios on the server's own synthetic x, and the input-gradient of its local terms at x. The private batch
enters only through the one Adam step of D_k on the real batch and x that precedes the answer, and the
mean score of the real batch in the density ratio. `DStepReplay` rebuilds that answer from a guess of the
real batch, so a white-box attacker (given T_k, more than the threat model grants, and D_k's weights
before the step, which the server rebuilds from the run seed before D_k's first step only) can search
for a batch that reproduces the observed reply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedistill.algorithms import fediod

FL = fediod.losses  # FedIOD's public loss terms (Eq. 2-11)


class DStepReplay:
    """Replays a FedIOD client's answer to one G-step from a guess of its real batch.

    The client: one Adam step (fresh state, betas (0.5, 0.999)) of D_k on
    ``discriminator_loss(D(real), D(x))``; ``real_mean`` = mean patch score of D(real) before the step;
    ratio = patch scores of the stepped D on x / real_mean; input-gradient = d/dx of
    ``c_gan L_gan(D'(x)) + c_conf H(T(x)) + <output_gradient, T(x)>``.
    """

    def __init__(
        self,
        d0: nn.Module,
        teacher: nn.Module,
        x: torch.Tensor,
        output_gradient: torch.Tensor,
        cfg: Mapping[str, Any],
    ):
        self.d = d0.train()
        self.params = {n: p.detach().clone() for n, p in d0.named_parameters()}
        self.buffers = {n: b.detach().clone() for n, b in d0.named_buffers()}
        self.teacher = teacher
        for p in teacher.parameters():
            p.requires_grad_(False)
        self.x = x
        self.gz = output_gradient
        self.lr = float(cfg["lr_discriminator"])
        self.c_gan, self.c_conf = float(cfg["c_gan"]), float(cfg["c_conf"])
        self.tau, self.gan_loss = float(cfg["tau"]), str(cfg["gan_loss"])

    def _d(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        buffers = {n: b.clone() for n, b in self.buffers.items()}  # BatchNorm runs on batch statistics
        return functional_call(self.d, (dict(params), buffers), (x,))

    def simulate(self, real: torch.Tensor, kappa: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's reply (input-gradient, density ratios) from ``real``; ``kappa`` > 0 relaxes
        Adam's sign-like first step so gradients reach the real batch."""
        p0 = {n: p.clone().requires_grad_(True) for n, p in self.params.items()}
        real_logits = self._d(p0, real)
        d_loss = FL.discriminator_loss(real_logits, self._d(p0, self.x))
        grads = torch.autograd.grad(d_loss, list(p0.values()), create_graph=True)
        p1 = {}
        for (name, p), g in zip(p0.items(), grads, strict=True):
            if kappa > 0:
                soft = kappa * g.detach().pow(2).mean().sqrt()
                step = g / (torch.sqrt(g * g + soft * soft) + 1e-8)
            else:  # Adam's first step, exactly: lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps)
                step = g / (g.abs() + 1e-8)
            p1[name] = p - self.lr * step
        real_mean = FL.patch_scores(real_logits).mean()
        x = self.x.clone().requires_grad_(True)
        fake = self._d(p1, x)
        logits = self.teacher(x)
        local = (
            self.c_gan * FL.generator_gan_loss(fake, mode=self.gan_loss)
            + self.c_conf * FL.entropy(logits, self.tau).mean()
        )
        (gx,) = torch.autograd.grad(local + (logits * self.gz).sum(), x, create_graph=True)
        ratio = FL.density_ratio(FL.patch_scores(fake), real_mean)
        return gx, ratio

    def objective(
        self, real: torch.Tensor, observed: Mapping[str, torch.Tensor], kappa: float
    ) -> torch.Tensor:
        """Relative squared error of the replayed reply against the observed one."""
        gx, ratio = self.simulate(real, kappa)
        g_obs, r_obs = observed["input_gradient"], observed["ratio"]
        return ((gx - g_obs) ** 2).sum() / (g_obs**2).sum() + ((ratio - r_obs) ** 2).sum() / (r_obs**2).sum()

    def error(self, real: torch.Tensor, observed: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Relative error of the exact replay from the true batch: ~0 proves the attacker's model is right."""
        gx, ratio = (t.detach() for t in self.simulate(real, 0.0))
        g_obs, r_obs = observed["input_gradient"], observed["ratio"]
        return {
            "input_gradient": float((gx - g_obs).norm() / g_obs.norm()),
            "ratio": float((ratio - r_obs).norm() / r_obs.norm()),
        }

    def invert(
        self,
        observed: Mapping[str, torch.Tensor],
        shape: torch.Size,
        *,
        iterations: int,
        kappa: float,
        seed: int,
    ) -> tuple[torch.Tensor, float]:
        """Adam on a dummy real batch against the relaxed replay; returns the iterate with the lowest exact
        (kappa = 0) objective among those checked, and that objective."""
        dummy = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed)).requires_grad_(True)
        optimizer = torch.optim.Adam([dummy], lr=0.05)
        best, best_value = dummy.detach().clone(), math.inf
        for it in range(iterations):
            if it % 10 == 0 or it == iterations - 1:
                value = float(self.objective(dummy, observed, 0.0).detach())
                if value < best_value:
                    best, best_value = dummy.detach().clone(), value
            loss = self.objective(dummy, observed, kappa)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        value = float(self.objective(dummy, observed, 0.0).detach())
        if value < best_value:
            best, best_value = dummy.detach().clone(), value
        return best, best_value
