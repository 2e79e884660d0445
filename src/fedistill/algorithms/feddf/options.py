"""FedDF's `[feddf]` options and the architecture group each client belongs to."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from fedistill.algorithms.base import model_cycle
from fedistill.algorithms.shared.distillation_data import check_source, check_source_run
from fedistill.algorithms.shared.option_checks import (
    check_choices,
    check_dp_without_batchnorm,
    check_model_names,
)
from fedistill.algorithms.shared.training import new_model
from fedistill.algorithms.shared.weight_average import COMBINES
from fedistill.config import RunConfig
from fedistill.errors import ConfigError
from fedistill.models.binary import has_binary_layers
from fedistill.privacy.budget import DPOptions

if TYPE_CHECKING:
    from fedistill.data.base import DatasetInfo
    from fedistill.tasks.base import Task

LOSSES = ("avg-logits", "avg-probs", "avg-losses")
DROP_WORST = ("off", "drop", "weighted")
#: The choices `distill` itself reads (it checks them: a caller may skip `validate`)
DISTILL_CHOICES = {
    "loss": LOSSES,
    "schedule": ("cosine", "constant"),
    "student_bn": ("adapt", "frozen"),
    "distill_optimizer": ("adam", "sgd"),
}


@dataclass(frozen=True)
class FedDFOptions(DPOptions):
    """`[feddf]` options. Local training uses the common keys (lr, local_epochs, batch_size, ...).

    The ``dp_*`` options (`DPOptions`) clip and noise each client's update, as for FedAvg.
    """

    groups: str = ""  # comma list of model names cycled over clients (client k: k % len); "" = `model`
    source: str = "noise"  # noise | holdout | dataset:<name> | generator:<path to .safetensors>
    source_size: int = 10000  # images drawn from a `dataset:` source (<= 0: all of its training images)
    holdout_val_share: float = 0.02  # holdout: the held-out share kept labelled to validate on
    # a `generator:` source's second upsampling: bilinear (FedIOD's) | nearest (MosaicKD's)
    generator_upsample: str = "bilinear"
    steps: int = 500  # distillation steps per group and round (the paper: 10^4)
    distill_batch_size: int = 64  # the README runs' 64 (the paper: 128 in all experiments)
    distill_lr: float = 1e-3  # the distillation optimiser's learning rate (the paper's Adam 1e-3)
    distill_optimizer: str = "adam"  # adam (the paper) | sgd (momentum 0.9, same schedule: its Table 7)
    schedule: str = "cosine"  # cosine (annealed to 0 over `steps`) | constant
    loss: str = "avg-logits"  # avg-logits (AVGLOGITS, the paper) | avg-probs | avg-losses
    temperature: float = 1.0  # softmax temperature of the ensemble and the student in the distillation KL
    t_squared: bool = False  # multiply the KL by T^2 (Hinton et al.); the released code does not
    clip_grad_norm: float = 5.0  # max gradient norm of the student in distillation; 0: no clipping
    eval_every_steps: int = 50  # distillation steps between the student's validations (the code: 100)
    patience: int = 4  # evaluations without improvement before stopping (the code: 1000 steps = 10)
    # True: the averaged model itself competes for "best" (the code's return_best_model_on_val, off there)
    fallback_to_average: bool = False
    # frozen: BatchNorm layers stay in eval mode and keep the averaged clients' statistics, so
    # distillation data unlike the clients' cannot overwrite them; adapt: they follow the distillation
    # data (the released code).
    student_bn: str = "frozen"
    # False: no distillation, each group's average goes back as it is (per-group FedAvg, the baseline
    # FedDF's heterogeneous experiments compare against)
    distill: bool = True
    drop_worst: str = "off"  # off | drop | weighted (ensemble weights proportional to validation accuracy)
    weighting: str = "samples"  # student initialisation: samples (Algorithm 1) | uniform (the code)
    # model: each group's student computes as its clients' model does; full: groups of binary models
    # (resnet8-binary) are distilled into the full-precision network of their latent weights, which goes
    # back to the clients to be binarized again (FedDF Table 4)
    fuse_precision: str = "model"
    # average: each round's student starts from the average of its group's received models (Algorithm 1);
    # previous: from the group's fused model of the previous round (the paper's Table 5 ablation)
    student_init: str = "average"
    prox_mu: float = 0.0  # FedProx's proximal term in the clients' local training (the paper's Table 8)
    # drop, as an invalid reply, a model whose parameter norm is far beyond the other models' of its
    # architecture in the same round (federation/plausibility.py); false: accept every finite model
    plausibility_checks: bool = True
    # each group's student initialisation: mean (the weighted average, Algorithm 1) | median | trimmed-mean
    # (coordinate-wise, weighted: one site cannot move a coordinate far, whatever it sends)
    aggregate: str = "mean"
    aggregate_trim: float = 0.2  # trimmed-mean: the share of sites cut at each end (one at least from 3 up)

    #: The config table these options are read from, which every message names (the one-shot baselines
    #: reuse the class)
    section: ClassVar[str] = "feddf"
    #: The options that name models (`check_model_names`; the run checks each serves its task)
    model_keys: ClassVar[str] = "groups"

    def validate(self) -> None:
        """Check the DP keys, the choices and the ranges of FedDF's distillation keys."""
        self.validate_dp()
        s = self.section
        choices = {
            **DISTILL_CHOICES,
            "drop_worst": DROP_WORST,
            "weighting": ("samples", "uniform"),
            "generator_upsample": ("bilinear", "nearest"),
            "fuse_precision": ("model", "full"),
            "student_init": ("average", "previous"),
            "aggregate": COMBINES,
        }
        check_choices(s, self, choices)
        check_model_names(s, self, self.model_keys)
        check_source(self.source, f"{s}.source")
        for key in ("steps", "distill_batch_size", "eval_every_steps", "patience"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{s}.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("distill_lr", "temperature"):
            if not 0 < getattr(self, key) < math.inf:
                raise ConfigError(f"{s}.{key} must be > 0 and finite, got {getattr(self, key)}")
        if not 0 <= self.prox_mu < math.inf:
            raise ConfigError(f"{s}.prox_mu must be >= 0 and finite, got {self.prox_mu}")
        if not 0 <= self.clip_grad_norm < math.inf:
            raise ConfigError(
                f"{s}.clip_grad_norm must be >= 0 and finite (0: off), got {self.clip_grad_norm}"
            )
        if not 0 <= self.aggregate_trim < 0.5:
            raise ConfigError(f"{s}.aggregate_trim must be in [0, 0.5), got {self.aggregate_trim}")
        if not 0 < self.holdout_val_share < 1:
            raise ConfigError(f"{s}.holdout_val_share must be in (0, 1), got {self.holdout_val_share}")
        if not self.distill and self.student_init == "previous":
            raise ConfigError(
                f"{s}.student_init = 'previous' with {s}.distill = false would never change the models: "
                "the group's average is skipped and nothing is distilled, so the clients' training is "
                "thrown away every round; use student_init = 'average' (per-group FedAvg) or distill"
            )

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        check_dp_without_batchnorm(self.section, self.dp_enabled, group_names(self, config), config.norm)
        check_source_run(self.source, f"{self.section}.source", config.dataset)
        if config.val_fraction == 0:
            raise ConfigError(
                f"{self.section} needs the server's validation split (model selection and early stopping): "
                "set val_fraction > 0"
            )

    def check_task(self, config: RunConfig, task: Task, info: DatasetInfo) -> None:
        """What the options rule out on the dataset, checked before the run writes anything: fusing in full
        precision needs a group of binary models (built here to look)."""
        if self.fuse_precision == "full":
            names = dict.fromkeys(group_names(self, config))
            check_full_precision(self, {name: new_model(config, info, name) for name in names})


def check_full_precision(options: FedDFOptions, group_models: dict[str, nn.Module]) -> None:
    """`fuse_precision = "full"` fuses binary models through their latent weights: some group must be one."""
    if options.fuse_precision == "full" and not any(map(has_binary_layers, group_models.values())):
        raise ConfigError(
            f"{options.section}.fuse_precision = 'full' fuses binary models in full precision, but no group "
            f"({', '.join(group_models)}) has binary layers; use one such as resnet8-binary"
        )


def group_names(options: FedDFOptions, config: RunConfig) -> list[str]:
    """The per-client cycle of model names, as given (a name may repeat to weight the cycle)."""
    return model_cycle(options.groups, config.model, key=f"{options.section}.groups")


def group_of(options: FedDFOptions, config: RunConfig, client_id: int) -> str:
    """The architecture group of client `client_id`: `feddf.groups` cycled over the clients."""
    names = group_names(options, config)
    return names[client_id % len(names)]
