"""The adversarial terms of the methods that train a generator against the sites' patch
discriminators (FedIOD's Eq. 2, AsynDGAN)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

GAN_MODES: tuple[str, ...] = ("non-saturating", "minimax")
"""The modes `generator_gan_loss` accepts."""


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """Standard discriminator objective on patch logits of any shape ``(B, ...)``, a scalar.

    ``mean BCEWithLogits(real, 1) / 2 + mean BCEWithLogits(fake, 0) / 2``, averaged over patches and
    batch. (The released code sums over patches and divides by ``2B``: the same up to the patch count.)
    """
    real = F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
    fake = F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
    return 0.5 * real + 0.5 * fake


def generator_gan_loss(fake_logits: torch.Tensor, mode: str = "non-saturating") -> torch.Tensor:
    """Generator's GAN term against one discriminator ``D_k``, a scalar (minimised by G).

    * ``"non-saturating"``: ``mean BCEWithLogits(fake, 1) = mean -log sigmoid(fake)`` (the released code
      and most GANs).
    * ``"minimax"``: ``mean log(1 - sigmoid(fake)) = -mean BCEWithLogits(fake, 0)``, the paper's literal
      Eq. 2 form for G: minimising it maximises the discriminator's error.

    Eq. 2 weighs each client's GAN term by ``pi_k``; that weighting is the caller's (the server's), and
    the "plain average" ablation uses ``1/K`` instead.
    """
    if mode == "non-saturating":
        return F.softplus(-fake_logits).mean()
    if mode == "minimax":
        return -F.softplus(fake_logits).mean()
    raise ValueError(f"unknown generator GAN mode {mode!r} (valid: {', '.join(GAN_MODES)})")
