"""FedCG's conditional GAN on a client: a feature discriminator D_k tells the extractor's features from
G_k's, so that G_k learns to draw F_k's features for a label."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.algorithms.base import ClientContext
from fedistill.algorithms.fedmdcg.fedcg_options import DISCRIMINATOR_ACTIVATIONS, FedCGOptions
from fedistill.algorithms.shared.training import check_finite
from fedistill.errors import ConfigError
from fedistill.models.feature_generator import FeatureGenerator
from fedistill.models.lenet import fedmdcg_widths
from fedistill.seeding import seeded


class FeatureDiscriminator(nn.Module):
    """D(h[, y]) → one logit: Linear(feature_dim [+ C], hidden) → [LeakyReLU] → Linear(hidden, 1).

    The sigmoid is in the loss. Without the activation (the FedMD-CG code's classifier-shaped D) D is
    linear in h, so it can only compare feature means along one direction, and an appended label
    only adds a per-class bias: conditioning needs ``activation = "leaky-relu"`` to matter.
    """

    def __init__(self, feature_dim: int, hidden: int, num_classes: int = 0, activation: str = "none") -> None:
        super().__init__()
        if activation not in DISCRIMINATOR_ACTIVATIONS:
            raise ConfigError(
                f"discriminator activation must be one of {', '.join(DISCRIMINATOR_ACTIVATIONS)}, "
                f"got {activation!r}"
            )
        self.num_classes = num_classes  # > 0: conditional, the one-hot label is appended to h
        self.fc1 = nn.Linear(feature_dim + num_classes, hidden)
        self.act = nn.LeakyReLU(0.2) if activation == "leaky-relu" else nn.Identity()
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.num_classes:
            if labels is None:
                raise ValueError("a conditional discriminator needs the labels")
            features = torch.cat((features, F.one_hot(labels, self.num_classes).to(features.dtype)), dim=1)
        return self.fc2(self.act(self.fc1(features))).squeeze(1)


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """−mean[log D(F(x))] − mean[log(1 − D(G(y)))], with D = sigmoid(logit)."""
    return -(F.logsigmoid(real_logits).mean() + F.logsigmoid(-fake_logits).mean())


def generator_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    """−mean[log D(G(y))] (the non-saturating GAN loss)."""
    return -F.logsigmoid(fake_logits).mean()


def build_discriminator(ctx: ClientContext, feature_dim: int, options: FedCGOptions) -> FeatureDiscriminator:
    """A client's seeded feature discriminator, its width from the options or FedMD-CG's table, conditioned
    on the class if asked."""
    hidden = options.discriminator_hidden or fedmdcg_widths(ctx.info.name)[2]
    classes = ctx.info.num_classes if options.conditional_discriminator else 0
    return seeded(
        ctx.config.seed,
        lambda: FeatureDiscriminator(feature_dim, hidden, classes, options.discriminator_activation),
        "feature-discriminator-init",
    )


def train_gan(
    extractor: nn.Module,
    generator: FeatureGenerator,
    discriminator: FeatureDiscriminator,
    g_optimizer: torch.optim.Optimizer,
    d_optimizer: torch.optim.Optimizer,
    cache: list[tuple[torch.Tensor, torch.Tensor]],
    rng: torch.Generator,
    passes: int = 1,
) -> dict[str, float]:
    """One D step then one G step per cached batch, `passes` times; ε is drawn once per batch.

    The extractor is frozen in eval mode: its features of the cached real batches are what G imitates.
    """
    extractor.eval()
    with torch.no_grad():
        real = [extractor(x) for x, _ in cache]
    noises = [generator.sample_noise(len(y), rng) for _, y in cache]
    conditional = discriminator.num_classes > 0
    generator.train()
    discriminator.train()
    d_sum, g_sum, n = 0.0, 0.0, 0
    for _ in range(passes):
        for (_, y), h, eps in zip(cache, real, noises, strict=True):
            labels = y if conditional else None
            with torch.no_grad():
                fake = generator(y, eps)
            d_loss = discriminator_loss(discriminator(h, labels), discriminator(fake, labels))
            check_finite(d_loss, "FedCG's discriminator", n)
            d_optimizer.zero_grad(set_to_none=True)
            d_loss.backward()
            d_optimizer.step()
            g_loss = generator_loss(discriminator(generator(y, eps), labels))
            check_finite(g_loss, "FedCG's generator", n)
            g_optimizer.zero_grad(set_to_none=True)
            d_optimizer.zero_grad(set_to_none=True)
            g_loss.backward()
            g_optimizer.step()
            d_sum += d_loss.item()
            g_sum += g_loss.item()
            n += 1
    d_optimizer.zero_grad(set_to_none=True)
    return {"discriminator_loss": d_sum / max(n, 1), "generator_loss": g_sum / max(n, 1)}
