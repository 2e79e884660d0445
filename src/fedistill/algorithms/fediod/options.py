"""FedIOD's options: the paper's settings, the released code's preset, and the stabilisers (the default
on classification)."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import torch

from fedistill.algorithms.base import (
    model_cycle,
)
from fedistill.algorithms.fediod.calibration import TEACHER_LOGITS
from fedistill.algorithms.option_checks import check_choices
from fedistill.errors import ConfigError
from fedistill.experiment.config import RunConfig
from fedistill.models.generator import check_upsamples
from fedistill.privacy.budget import (
    DPOptions,
)

log = logging.getLogger(__name__)


PRESETS = ("auto", "paper", "official-code", "stable")
WEIGHTINGS = ("eq8", "class-share", "uniform")
MIMIC_MODES = ("l2", "kl", "kl-official", "l1")
SELECTIONS = ("validation", "last", "best-on-test")
DP_ACCOUNTINGS = ("d-step", "release")


@dataclass(frozen=True)
class FedIODOptions(DPOptions):
    """Every key's default is the paper's; the default `preset = "auto"` then applies `STABLE` (the
    stabilisers measured on digits, MNIST and Fashion-MNIST) to the keys a user did not set on
    classification, and nothing on segmentation and reconstruction, where they are not measured.
    `preset = "paper"` keeps the paper's settings everywhere, `"official-code"` takes the released
    code's choices, `"stable"` the stabilisers on any task.

    The ``dp_*`` options (see `DPOptions` and the module docstring) sanitise the input-gradients.
    """

    # auto (stable on classification, paper on dense tasks) | paper | official-code | stable
    preset: str = "auto"
    teachers: str = ""  # one model name for all clients, or a comma list cycled over clients; "" = `model`
    student: str = ""  # "" = `model`
    teacher_epochs: int = 30  # stage 1: local epochs of each teacher (uses the common lr/batch/optimizer)
    # synthetic batch, and each client's real batch for D_k (named apart from the common `batch_size`,
    # which an algorithm table overrides for local training: here, stage 1)
    synthetic_batch_size: int = 64
    iters_per_epoch: int | str = "max"  # max | min (over clients of ceil(n_k / batch)), or a number
    student_steps: int = 5  # S-steps per G-step (the released code's 5)
    # Carry step t's S-step inputs in step t+1's query.generate (clients answer them before their
    # D-step): the same arithmetic with 2 instead of 3 exchanges per G-step, plus one per epoch.
    merge_student_queries: bool = True
    latent_dim: int = 100
    # 0 (auto): the paper's 64 and 128 for images above 16 px, 32 and 32 up to 16 px (see `network_widths`)
    generator_width: int = 0
    # G builds its image at image_size / 2**generator_upsamples, then upsamples it that often: 0, 1, 2 (the
    # paper) or auto, the paper's 2 unless its base grid would be under 4 px (generator.resolve_upsamples)
    generator_upsamples: int | str = "auto"
    discriminator_width: int = 0
    lr_generator: float = 1e-3  # the paper: Adam, cosine from 1e-3 to 0, for G, D_k and S
    lr_discriminator: float = 2e-4  # 1e-3 lets every D_k win within an epoch on small data
    lr_student: float = 1e-3
    student_optimizer: str = "adam"  # adam | sgd (sgd: momentum 0.9, weight decay 3e-5 as the code)
    schedule: str = "cosine"  # cosine | constant
    gan_weighting: str = "pi"  # pi (Eq. 2) | average (Table 6 ablation)
    gan_loss: str = "non-saturating"  # non-saturating | minimax
    ensemble_weighting: str = "eq8"  # eq8 | class-share (the code) | uniform (Table 6 ablation)
    mimic: str = "l2"  # l2 (tau -> infinity, Eq. 10) | kl (temperature tau) | kl-official | l1
    tau: float = 1.0
    use_conf: bool = True
    use_unique: bool = True
    js: str = "paper"  # paper (-JSD, Eq. 4-5) | official (the code's + (1/K) sum KL(M || P_k), clamped)
    w_gan: float = 1.0
    w_conf: float = 1.0
    w_unique: float = 1.0
    # Eq. 11 weighs every term 1. Measured on digits (K=5, 160 G-steps): with w_adv = 1 and no balance
    # term G collapsed onto 1-2 classes and S stayed at chance (10%); with w_adv = 0.2 and the released
    # code's class-balance term (w_balance = 10) every class stayed covered and S reached 62%.
    # Set w_adv = 1, w_balance = 0 for the paper's literal weights.
    w_adv: float = 0.2  # weight of -L_mimic in G's loss (G searches inputs where S lags)
    w_balance: float = 10.0  # the released code's class-balance term (not in the paper)
    # teachers: the code's per-teacher class marginals; ensemble: the weighted ensemble's (Eq. 9) marginal.
    # Measured on digits (K=10, alpha 0.5, lenet-fedmdcg, 100 G-steps; S test %, teachers -> ensemble):
    # 30 teacher epochs 44.4 -> 41.7, with lr_student = lr_generator = 3e-3 54.7 -> 61.9, 60 teacher
    # epochs 10.0 (G collapsed onto one class in epoch 1) -> 24.4. Not yet measured on MNIST-size data.
    balance: str = "teachers"
    selection: str = "validation"  # validation | last | best-on-test (only with the official-code preset)
    collapse_share: float = 0.5  # warn when one class takes more than this share of G's samples
    # > 0: after this many epochs in a row with a collapsed G, stop cleanly with the best validated
    # student instead of spending the remaining epochs on one class (0: warn only, the default)
    collapse_patience: int = 0
    samples_every: int = 1  # save a grid of synthetic samples every N epochs (0: never)
    dp_accounting: str = "d-step"  # d-step (q = B / n_k per D-step, the paper's) | release (worst case)
    # The bound is on each returned per-sample input-gradient (a batch-mean loss's, so ~1/B of a
    # per-sample loss gradient). Measured on digits (B = 64, lenet-fedmdcg teachers, first epoch):
    # median norm 0.005, 90th percentile 0.01, max 0.02.
    dp_clip_norm: float = 0.01
    # Stabilisers from the one-shot literature (0 = off, the paper). Measured on the digits demo (K = 10,
    # alpha 0.5, lenet-fedmdcg, 100 G-steps, seeds 0-2; README "FedIOD" section): see `pool_size`.
    w_bn: float = 0.0  # DeepInversion batch-norm statistic matching on each teacher (bn_matching.py)
    pool_size: int = 0  # synthetic samples kept with their ensemble targets for replay (0: no pool)
    pool_steps: int = 0  # extra S-steps per G-step on batches drawn from the pool
    pool_batch_size: int = 0  # samples per replay step (0: synthetic_batch_size)
    # The G-step's own batch joins the pool too, with the ensemble targets its query already returned:
    # more distinct labelled samples at no extra query (classification only; false: only the S-steps')
    pool_generator_batch: bool = False
    student_noise: float = 0.0  # std of Gaussian noise on G's samples for the S-steps (normalised units)
    # Before the clients label them for the S-steps, G's samples may also be moved by a random offset of up
    # to `student_shift` pixels each way (edges repeated), then mixed in pairs with a Beta(a, a) weight,
    # a = `student_mixup` (0: neither, the paper); classification only. Measured on the digits demo (K = 10,
    # paired seeds; benchmarks/results/fediod_demo_variants_aug*.md): shift 1 and mixup 0.4 +0.74 points at
    # alpha 0.5 (seeds 3-11, the best of nine variants there), but 0.00 on seeds 0-2, -0.21 at alpha 0.1,
    # -0.56 at alpha 1 and -0.28 at K = 5: not a default.
    student_shift: int = 0
    student_mixup: float = 0.0
    # > 0: the student that is validated, selected and handed over is an exponential moving average of the
    # trained student's weights with this decay per S-step (0: the trained student itself, the paper).
    # On the digits demo (K = 10, alpha 0.5, seeds 3-5) decays 0.99 / 0.995 / 0.998 gave -0.09 / -0.19 /
    # -0.19 points: the student plateaus from epoch 5 and the average plateaus with it.
    student_ema: float = 0.0
    # raw (the paper) | scaled (mixed architectures) | centred (one-class sites) | auto (centred if any)
    teacher_logits: str = "raw"
    # shared (the paper): one G whose every sample must fool every D_k (Eq. 2), which pulls G towards what
    # all sites' data have in common. per-client: G(z, one-hot k) draws a mixture, a share pi_k of each
    # batch meant for site k; D_k, its L_gan, L_conf and batch-norm terms see only those samples, so the
    # mixture approximates the union of the sites' data, sum_k pi_k P_k. Every teacher still labels every
    # sample. Each client receives which samples are its own (a 0/1 vector); nothing else changes.
    generator_mixture: str = "shared"
    # Dense tasks (segmentation, reconstruction; see task_view.py): G is pix2pix's ResNet generator on the
    # one-hot label mask (plus `noise_channels` of seeded noise), D_k the conditional PatchGAN.
    mask_source: str = "clients"  # clients (AsynDGAN and the paper: masks cross, kind label-masks) | prior
    mask_pool: int = 0  # masks a site uploads once (0: all of its training masks)
    generator_blocks: int = 9  # ResNet blocks of the conditional G (the paper's 9)
    noise_channels: int = 2  # noise next to the one-hot mask (pix2pix's dropout noise is not seeded)
    discriminator_layers: int = 3  # the 70 x 70 PatchGAN
    # the perceptual term the paper adds to L_gan (Johnson et al.): features of the site's own T_k
    # encoder, between G(m) and the real image of m, so only with masks the site uploaded
    w_perceptual: float = 1.0
    reference_samples: int = 0  # test samples the ensemble ceiling is measured on (0: all)
    # Stage 2's convolutions in channels-last memory layout (T_k after stage 1, D_k, G, S): the same
    # arithmetic in another order. Measured on the Fashion-MNIST K = 10 step (LeNet-5, one thread):
    # 1.129 s and 60% of the single-thread matmul peak, against 1.728 s and 39% in the default layout
    # (max-pooling and small convolutions gain most). false: the default layout, as runs before it
    channels_last: bool = True

    def validate(self) -> None:
        self.validate_dp()
        choices = {
            "preset": PRESETS,
            "ensemble_weighting": WEIGHTINGS,
            "mimic": MIMIC_MODES,
            "selection": SELECTIONS,
            "gan_weighting": ("pi", "average"),
            "gan_loss": ("non-saturating", "minimax"),
            "js": ("paper", "official"),
            "schedule": ("cosine", "constant"),
            "student_optimizer": ("adam", "sgd"),
            "balance": ("ensemble", "teachers"),
            "dp_accounting": DP_ACCOUNTINGS,
            "teacher_logits": TEACHER_LOGITS,
            "generator_mixture": ("shared", "per-client"),
            "mask_source": ("clients", "prior"),
        }
        check_choices("fediod", self, choices)
        if self.selection == "best-on-test" and self.preset != "official-code":
            raise ConfigError(
                "fediod.selection = 'best-on-test' selects on the test set; it exists only to reproduce the "
                "released code (set fediod.preset = 'official-code')"
            )
        if self.iters_per_epoch not in ("max", "min") and not (
            isinstance(self.iters_per_epoch, int) and self.iters_per_epoch >= 1
        ):
            raise ConfigError(
                f"fediod.iters_per_epoch must be max, min or a number; got {self.iters_per_epoch!r}"
            )
        for key in (
            "teacher_epochs",
            "synthetic_batch_size",
            "student_steps",
            "latent_dim",
            "generator_blocks",
            "discriminator_layers",
        ):
            if getattr(self, key) < 1:
                raise ConfigError(f"fediod.{key} must be >= 1")
        for key in ("lr_generator", "lr_discriminator", "lr_student", "tau"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"fediod.{key} must be > 0")
        check_upsamples("fediod.generator_upsamples", self.generator_upsamples)
        if not 0.0 <= self.student_ema < 1.0:
            raise ConfigError(f"fediod.student_ema is a decay in [0, 1); got {self.student_ema}")
        for key in (
            "generator_width",
            "discriminator_width",
            "w_bn",
            "pool_size",
            "pool_steps",
            "pool_batch_size",
            "student_noise",
            "student_shift",
            "student_mixup",
            "collapse_patience",
            "mask_pool",
            "noise_channels",
            "w_perceptual",
            "reference_samples",
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"fediod.{key} must be >= 0")
        self.check_combinations(preset_fills=True)

    def check_combinations(self, *, preset_fills: bool = False) -> None:
        """Rules across keys. Before the preset is applied (`preset_fills`), a key the preset sets counts
        as set, so a user may change the preset's replay steps without repeating its pool size;
        `resolve_options` checks again once the preset's keys are in."""
        filled = PRESET_CHANGES[effective_preset(self.preset, dense=False)] if preset_fills else {}
        if self.pool_steps and not (self.pool_size or filled.get("pool_size", 0)):
            raise ConfigError("fediod.pool_steps replays the pool: set fediod.pool_size > 0 too")
        if self.pool_generator_batch and not (self.pool_size or filled.get("pool_size", 0)):
            raise ConfigError("fediod.pool_generator_batch adds to the pool: set fediod.pool_size > 0 too")

    @property
    def needs_label_counts(self) -> bool:
        return self.ensemble_weighting in ("eq8", "class-share")


#: What `preset = "official-code"` changes (notes §2.5-2.9): only keys the user did not set.
OFFICIAL_CODE = {
    "teachers": "resnet8-wide",
    "student": "resnet8-wide",
    "ensemble_weighting": "class-share",
    "mimic": "kl-official",
    "js": "official",
    "w_unique": 5.0,
    "w_adv": 0.2,
    "w_balance": 10.0,
    "balance": "teachers",
    "lr_generator": 1e-4,
    "lr_discriminator": 1e-4,
    "lr_student": 5e-3,
    "student_optimizer": "sgd",
    "iters_per_epoch": "max",
    "selection": "best-on-test",
}


#: What `preset = "stable"` changes: the one-shot literature's stabilisers, the student budget and the
#: learning rates the digits demo chose (README "FedIOD": seeds 0-2, student as a fraction of its
#: ensemble, none 0.65, w_bn 0.79, + pool and KL 0.84; 2 fresh S-steps and 30 replay steps at tau 3 added
#: 3.9 points). On Fashion-MNIST (K = 10, alpha 0.1, lenet-fedmdcg, 240 G-steps) the rates and the
#: ensemble's balance target raised the best validation accuracy from 71.32% to 77.35%.
STABLE = {
    "lr_student": 3e-3,
    "lr_generator": 3e-3,
    "balance": "ensemble",
    "w_bn": 10.0,
    "pool_size": 20000,
    "pool_steps": 30,
    "mimic": "kl",
    "tau": 3.0,
    "student_steps": 2,
    # G-steps per epoch: the paper's "max" (one pass over the largest site's data) gives 4 on digits, where
    # `fedistill run --algorithm fediod` (ResNet-8, 10 epochs) then ended at 0.81 of its ensemble; 12 gave
    # 0.92 in 60 s on 2 cores (the demo's 12 beat 10 there too: 88.71 against 87.22%)
    "iters_per_epoch": 12,
    # centred logits only when a site saw a single class: digits alpha 0.1, K = 5 / 10 / 20, student at
    # 0.960 / 0.906 / 0.957 of its ensemble against 0.853 / 0.901 / 0.779 raw (calibration.py)
    "teacher_logits": "auto",
}

PRESET_CHANGES = {"paper": {}, "official-code": OFFICIAL_CODE, "stable": STABLE}


def effective_preset(preset: str, *, dense: bool) -> str:
    """The preset a run applies: `"auto"` is `"stable"` on classification and `"paper"` on dense tasks.

    Why: with the paper's settings `fedistill run --algorithm fediod` on digits (40 G-steps) ended at
    19.72%, 0.21 of its ensemble, and with the stabilisers at 77.78% (0.81); the stabilisers are measured
    on classification only."""
    if preset == "auto":
        return "paper" if dense else "stable"
    return preset


def resolve_options(config: RunConfig, options: FedIODOptions, *, dense: bool) -> FedIODOptions:
    """Apply the preset's changes to every key the user did not set; `preset` names the one applied."""
    preset = effective_preset(options.preset, dense=dense)
    for key in ("pool_generator_batch", "student_shift", "student_mixup"):
        if dense and getattr(options, key):
            raise ConfigError(f"fediod.{key} is for classification; this task is dense")
    changes = PRESET_CHANGES[preset]
    if not changes:
        return dataclasses.replace(options, preset=preset)
    explicit = set(config.options.get("fediod", {}))
    taken = {k: v for k, v in changes.items() if k not in explicit}
    resolved = dataclasses.replace(options, preset=preset, **taken)
    try:  # the preset's keys next to the user's (e.g. its pool_steps with a user's pool_size = 0)
        resolved.validate()
        resolved.check_combinations()
    except ConfigError as error:
        preset_keys = ", ".join(f"{k} = {v!r}" for k, v in taken.items())
        raise ConfigError(f"{error} (fediod.preset = {preset!r} sets {preset_keys})") from error
    return resolved


SMALL_IMAGE_PX = 16


def network_widths(options: FedIODOptions, image_size: int) -> tuple[int, int]:
    """The widths of G and of every D_k: the options', or for 0 (auto) the paper's 64 and 128, except on
    images of at most 16 px (8x8 digits), where 32 and 32 suffice: a G of width 64 and a D_k of 128 there
    cost most of a G-step for samples that the teachers see at 8x8."""
    small = image_size <= SMALL_IMAGE_PX
    return (
        options.generator_width or (32 if small else 64),
        options.discriminator_width or (32 if small else 128),
    )


def teacher_name(options: FedIODOptions, config: RunConfig, client_id: int) -> str:
    names = model_cycle(options.teachers, config.model, key="fediod.teachers")
    return names[client_id % len(names)]


def cosine_lr(base: float, step: int, total: int, schedule: str) -> float:
    if schedule == "constant" or total <= 0:
        return base
    return 0.5 * base * (1.0 + math.cos(math.pi * min(step, total) / total))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
