"""AsynDGAN's options, with where each default comes from.

Sources: pix2pix (Isola et al., CVPR 2017; its released `train_options`/`base_options`), from which
AsynDGAN's released code takes G, D and the optimiser, and AsynDGAN's own released code (its training
script runs ``--netG resnet_9blocks --lambda_L1 100 --batch_size 1`` with one sample per site per step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedistill.algorithms.shared.option_checks import (
    check_choices,
    check_iters_per_epoch,
    check_nonnegative,
    check_positive,
)
from fedistill.config import RunConfig
from fedistill.errors import ConfigError

SELECTIONS = ("validation", "last")
SITE_SHARES = ("pi", "uniform")
SCHEDULES = ("linear", "constant")


@dataclass(frozen=True)
class AsynDGANOptions:
    """G (the server's) against one D_k per site; then S on G's pairs. See the package docstring."""

    # --- G: pix2pix's ResNet generator on the one-hot label mask
    generator_width: int = 64  # G's base channel width; ngf
    generator_blocks: int = 9  # ResNet blocks of G; --netG resnet_9blocks
    # pix2pix's only noise: dropout 0.5 in G's blocks, kept on when G draws (as pix2pix at test time).
    # Here its masks come from a stream seeded by (seed, step), so a run is reproducible and resumable
    dropout: bool = True
    noise_channels: int = 0  # seeded N(0, 1) channels next to the mask (pix2pix: none)
    # --- D_k: the conditional PatchGAN, one per site
    discriminator_width: int = 64  # every D_k's base channel width; ndf
    discriminator_layers: int = 3  # every D_k's depth; n_layers_D, 3: the 70 x 70 PatchGAN
    # --- optimisation: Adam for G and every D_k (pix2pix: lr 2e-4, beta1 0.5)
    lr_generator: float = 2e-4  # G's Adam learning rate (pix2pix's 2e-4)
    lr_discriminator: float = 2e-4  # every D_k's Adam learning rate
    beta1: float = 0.5  # Adam's beta1 for G and every D_k
    # linear: pix2pix's lr_policy (constant for the first half of the rounds, then linearly to 0 over
    # the second half, as its niter = niter_decay = 100 epochs); constant: no decay
    schedule: str = "linear"
    # --- G's loss at site k: GAN + w_l1 * L1(G(m), x) (+ w_perceptual * VGG-16 perceptual)
    w_l1: float = 100.0  # lambda_L1 (pix2pix's and AsynDGAN's script), L1 on images in [-1, 1]
    # the released code adds a VGG-16 perceptual term (weight 1, relu1_2..relu4_3, ImageNet weights); the
    # paper's objective has none. > 0 needs `vgg16_weights` at every site (models/perceptual.py)
    w_perceptual: float = 0.0
    vgg16_weights: str = ""  # safetensors file of torchvision's vgg16 state dict
    # --- what a G-step draws: `synthetic_batch_size` uploaded masks, a share of them per site
    synthetic_batch_size: int = 16
    # pi: site k gets a share n_k / n of each batch (G learns the mixture of the sites' data, the paper's
    # analysis); uniform: as many per site (the released code: one sample per site per step)
    site_shares: str = "pi"
    # G-steps per round: max | min over the sites of the steps that draw as many masks as the site
    # uploaded (the code's epoch: max), or a number
    iters_per_epoch: int | str = "max"
    mask_pool: int = 0  # masks a site uploads once (0: all of its training masks)
    # --- S: the run's `model`, trained at the server on fresh pairs (G(m), m), with the run's optimizer,
    # lr, batch_size, momentum and weight_decay and the task's loss, as a site trains its local model
    segmenter_steps: int = 0  # S-steps per round (0: as many batches as the sites uploaded masks)
    segmenter_start: int = 1  # first round that trains S (its rounds before train G alone)
    # --- model selection (never the test set): validation sends S down to the sites, which return
    # their validation metrics; last keeps the last round's S
    selection: str = "validation"
    samples_every: int = 1  # a grid of masks and G's images every N rounds (0: never)

    section = "asyndgan"

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        if self.selection == "validation" and config.val_fraction == 0:
            raise ConfigError(
                "asyndgan.selection = 'validation' needs validation splits: set val_fraction > 0 "
                "or asyndgan.selection = 'last'"
            )
        if self.synthetic_batch_size < config.clients:
            raise ConfigError(
                f"asyndgan.synthetic_batch_size = {self.synthetic_batch_size} is below the number of "
                f"sites ({config.clients}); every G-step draws at least one mask per site"
            )
        if self.segmenter_start > config.rounds:
            raise ConfigError(
                f"asyndgan.segmenter_start = {self.segmenter_start} is after the last round "
                f"(rounds = {config.rounds}): S would never train"
            )

    def validate(self) -> None:
        """Check the choices and that the widths, layers, sizes and rates are in range."""
        s = self.section
        check_choices(s, self, {"selection": SELECTIONS, "site_shares": SITE_SHARES, "schedule": SCHEDULES})
        for key in ("generator_width", "discriminator_width", "discriminator_layers", "synthetic_batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{s}.{key} must be >= 1, got {getattr(self, key)!r}")
        for key in ("generator_blocks", "noise_channels", "mask_pool", "segmenter_steps", "samples_every"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{s}.{key} must be >= 0, got {getattr(self, key)!r}")
        if self.segmenter_start < 1:
            raise ConfigError(
                f"{s}.segmenter_start must be >= 1 (a round number), got {self.segmenter_start}"
            )
        check_positive(s, self, "lr_generator lr_discriminator")
        check_nonnegative(s, self, "w_l1 w_perceptual")
        if not (0 <= self.beta1 < 1 and math.isfinite(self.beta1)):
            raise ConfigError(f"{s}.beta1 must be in [0, 1), got {self.beta1!r}")
        check_iters_per_epoch(s, self.iters_per_epoch)
        if self.w_perceptual > 0 and not self.vgg16_weights:
            raise ConfigError(
                f"{s}.w_perceptual = {self.w_perceptual} needs {s}.vgg16_weights: a safetensors file of "
                f"torchvision's vgg16 weights at every site (or set {s}.w_perceptual = 0)"
            )


def lr_factor(schedule: str, round: int, rounds: int) -> float:
    """pix2pix's linear policy at round `round` (1-based) of `rounds`: 1 for the first ceil(rounds / 2),
    then 1 - j / (decay + 1) in the j-th of the `decay` = rounds // 2 others."""
    if schedule == "constant":
        return 1.0
    constant = rounds - rounds // 2
    return 1.0 - max(0, round - constant) / (rounds // 2 + 1)
