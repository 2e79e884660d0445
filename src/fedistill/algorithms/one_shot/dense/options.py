"""DENSE's options: the released code's defaults (its README's distillation command), named.

Sources: DENSE's `loop_df_fl.py` and README (``--g_steps 30 --lr_g 1e-3 --bn 1.0 --oh 1.0 --adv 1
--T 20 --lr 0.005 --batch_size 256 --synthesis_batch_size 256``, ``nz = 256``, ``ngf = 64``; the
generator's adversarial KL at temperature 1, the student's SGD with momentum 0.9 and no schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedistill.algorithms.base import model_cycle
from fedistill.algorithms.shared.option_checks import (
    check_choices,
    check_model_names,
    check_nonnegative,
    check_positive,
)
from fedistill.config import RunConfig
from fedistill.errors import ConfigError
from fedistill.models.generator import GENERATOR_LAYOUTS, check_upsamples

SELECTIONS = ("clients", "server", "last")


@dataclass(frozen=True)
class DenseOptions:
    """Stage 1 as FedIOD's (same `teachers`, `teacher_epochs` and cache entry); stage 2 as DENSE's code."""

    # --- stage 1: the local models, exactly FedIOD's teachers (algorithms/shared/stage1.py `train_teacher`)
    teachers: str = ""  # one model name, or a comma list cycled over the clients; "" = `model`
    student: str = ""  # the student's architecture; "" = `model`
    teacher_epochs: int = 30  # FedIOD's default, so both distil the same local models
    #: The options that name models (`check_model_names`; the run checks each serves its task)
    model_keys: ClassVar[str] = "teachers student"
    # --- data generation: one synthetic batch per epoch, `g_steps` Adam steps on G and its latents
    synthetic_batch_size: int = 256  # samples G draws per epoch, one batch; --synthesis_batch_size
    g_steps: int = 30  # Adam steps on G and its latents per epoch; --g_steps
    latent_dim: int = 256  # length of G's latent z; nz
    generator_width: int = 64  # ngf (FedIOD's generator with nearest upsampling, see dense/server.py)
    # fediod (default, as recorded): FedIOD's G, 4w/2w/w channels (256/128/64 at width 64); dense: the
    # released code's G, 2w/2w/w (4,581,955 against 2,328,899 parameters at 32x32x3, nz 256, ngf 64)
    generator_layout: str = "fediod"
    # how often G upsamples its base grid: 0, 1, 2 (the code's) or auto, 2 unless the grid would be under
    # 4 px (8x8 digits: 1), as FedIOD's (`models.generator.resolve_upsamples`)
    generator_upsamples: int | str = "auto"
    lr_generator: float = 1e-3  # --lr_g; Adam, betas (0.5, 0.999), for G and the latents alike
    # false (default): one G trained across the epochs (the paper's Algorithm 1); true: the released code
    # re-initialises G (N(0, 0.02)) before every epoch's synthesis. Why false: the reset cost the student
    # on digits (K = 5, seed 0: 71.94% against one G's 81.67%, 0.80 and 0.91 of the ensemble; records
    # dense-reset-generator-digits-k5-seed0 and dense-coboosting-digits-k5-seed0 in
    # benchmarks/results/recorded/)
    reset_generator: bool = False
    w_ce: float = 1.0  # --oh: cross-entropy of the ensemble against the sampled labels
    w_bn: float = 1.0  # --bn: batch-norm statistic matching, summed over every teacher's BatchNorm layers
    w_adv: float = 1.0  # --adv: -KL(ensemble || student), on the samples where they disagree (`adv_mask`)
    adv_temperature: float = 1.0  # T of that KL (T^2 KL of the T-softened softmaxes); 1: the code's
    adv_mask: bool = True  # only samples whose argmax differs between S and the ensemble
    generator_clip: float = 0.0  # max gradient norm of G (0: none, as DENSE's code)
    # --- distillation: the student on the pool of every synthetic batch so far
    kd_batch_size: int = 256  # pool samples per student step; --batch_size
    kd_temperature: float = 20.0  # T of the student's T^2 KL to the ensemble; --T
    kd_steps: int = 0  # 0: one pass over the whole pool per epoch (the code); N: N batches drawn at random
    pool_size: int = 0  # 0: keep every synthetic batch (the code); N: the newest N samples
    lr_student: float = 0.005  # --lr of the README's distillation command; SGD
    student_momentum: float = 0.9  # the student's SGD momentum (the code's)
    student_weight_decay: float = 0.0  # the student's SGD weight decay
    schedule: str = "constant"  # constant | cosine (over the epochs)
    student_clip: float = 0.0  # max gradient norm of S (0: none)
    # --- model selection (never the test set): `clients` sends S down to the clients, which score it on
    # their validation splits and return metrics only (as FedIOD); `server` scores it on the server's
    # held-out split (the union of those splits, no message); `last` keeps the last epoch's S
    selection: str = "clients"
    samples_every: int = 1  # save a grid of the epoch's synthetic batch every N epochs (0: never)

    section = "dense"

    def validate(self) -> None:
        """Check the choices and that the epochs, sizes, steps and rates are in range."""
        s = self.section
        check_choices(
            s,
            self,
            {
                "schedule": ("constant", "cosine"),
                "selection": SELECTIONS,
                "generator_layout": GENERATOR_LAYOUTS,
            },
        )
        check_model_names(s, self, self.model_keys)
        for key in ("teacher_epochs", "g_steps", "latent_dim", "generator_width"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{s}.{key} must be >= 1, got {getattr(self, key)!r}")
        if self.kd_batch_size < 2:
            raise ConfigError(f"{s}.kd_batch_size must be >= 2 (BatchNorm needs two samples)")
        if self.synthetic_batch_size < 2:
            raise ConfigError(
                f"{s}.synthetic_batch_size must be >= 2, got {self.synthetic_batch_size!r}: with one sample "
                "the first epoch's pool holds no batch the student can train on (BatchNorm needs two)"
            )
        check_upsamples(f"{s}.generator_upsamples", self.generator_upsamples)
        check_positive(s, self, "lr_generator lr_student adv_temperature kd_temperature")
        check_nonnegative(
            s,
            self,
            "w_ce w_bn w_adv generator_clip student_clip student_momentum student_weight_decay",
        )
        for key in ("kd_steps", "pool_size", "samples_every"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{s}.{key} must be >= 0, got {getattr(self, key)!r}")
        if 0 < self.pool_size < self.synthetic_batch_size:
            raise ConfigError(
                f"{s}.pool_size = {self.pool_size} cannot hold one synthetic batch "
                f"({s}.synthetic_batch_size = {self.synthetic_batch_size}); use 0 (no limit) or more"
            )

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        if self.selection != "last" and config.val_fraction == 0:
            raise ConfigError(
                f"{self.section}.selection = {self.selection!r} needs validation splits: set "
                f"val_fraction > 0 or {self.section}.selection = 'last'"
            )


def teacher_of(options: DenseOptions, config: RunConfig, client_id: int) -> str:
    """Client `client_id`'s architecture: `teachers` cycled over the clients (FedIOD's rule)."""
    names = model_cycle(options.teachers, config.model, key=f"{options.section}.teachers")
    return names[client_id % len(names)]
