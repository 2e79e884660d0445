"""FedAvg's options, shared by FedProx and FedAvgM: weighting, the proximal term, server momentum,
FedDF's drop-worst filter, and what one misbehaving site can do to the average (plausibility checks and a
robust, coordinate-wise aggregate)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from fedistill.algorithms.shared.option_checks import check_choices, check_dp_without_batchnorm
from fedistill.algorithms.shared.training import average_states
from fedistill.algorithms.shared.weight_average import COMBINES, robust_average_states
from fedistill.errors import ConfigError
from fedistill.privacy.budget import DPOptions

if TYPE_CHECKING:
    from fedistill.config import RunConfig
    from fedistill.data.base import DatasetInfo
    from fedistill.tasks.base import Task


@dataclass(frozen=True)
class FedAvgOptions(DPOptions):
    """The ``dp_*`` options (`DPOptions`) clip and noise each client's update (module docstring)."""

    weighting: str = "samples"  # samples | uniform (FedDF's code averages uniformly)
    mu: float = 0.0  # FedProx proximal weight; 0 is plain FedAvg
    server_momentum: float = 0.0  # FedAvgM's beta; 0 is plain FedAvg
    server_lr: float = 1.0  # FedAvgM: the server's step size on the averaged update; 1: plain FedAvg
    # FedDF's drop-worst filter (drop_worst.py): leave out models below 1.2x chance on the server's
    # validation split (or, if none is, below the mean - 1.5 std of the accuracies less the best one)
    drop_worst: bool = False
    # drop, as an invalid reply, a model whose parameter norm is far beyond the other sites' in the same
    # round (federation/plausibility.py); false: accept every finite model
    plausibility_checks: bool = True
    # mean (the weighted average) | median | trimmed-mean (coordinate-wise, weighted: one site cannot move
    # a coordinate far, whatever it sends)
    aggregate: str = "mean"
    aggregate_trim: float = 0.2  # trimmed-mean: the share of sites cut at each end (one at least from 3 up)

    #: The config table these options are read from, which every message names (the class is shared)
    section: ClassVar[str] = "fedavg"

    def validate(self) -> None:
        """Check the DP keys, the weighting and the ranges of mu, server momentum and server learning rate."""
        self.validate_dp()
        s = self.section
        if self.weighting not in ("samples", "uniform"):
            raise ConfigError(f"{s}.weighting must be 'samples' or 'uniform', got {self.weighting!r}")
        if not 0 <= self.mu < math.inf:  # NaN fails both comparisons
            raise ConfigError(f"{s}.mu must be >= 0 and finite, got {self.mu}")
        if not 0 <= self.server_momentum < 1:
            raise ConfigError(f"{s}.server_momentum must be in [0, 1), got {self.server_momentum}")
        if not 0 < self.server_lr < math.inf:
            raise ConfigError(f"{s}.server_lr must be > 0 and finite, got {self.server_lr}")
        check_choices(s, self, {"aggregate": COMBINES})
        if not 0 <= self.aggregate_trim < 0.5:
            raise ConfigError(f"{s}.aggregate_trim must be in [0, 0.5), got {self.aggregate_trim}")

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        check_dp_without_batchnorm(self.section, self.dp_enabled, [config.model], config.norm)
        if self.drop_worst and config.val_fraction == 0:
            raise ConfigError(
                f"{self.section}.drop_worst needs the server's validation split: set val_fraction > 0"
            )

    def check_task(self, config: RunConfig, task: Task, info: DatasetInfo) -> None:
        """What the options rule out on the dataset's task, checked before the run writes anything."""
        if self.drop_worst and task.per_pixel:
            raise ConfigError(
                f"{self.section}.drop_worst ranks models by validation accuracy: classification only, "
                f"not {task.name}"
            )

    def combine(self, states: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]) -> dict:
        """The round's global state from the kept sites' states (`aggregate`)."""
        if self.aggregate == "mean":
            return average_states(list(states), list(weights))
        return robust_average_states(states, weights, self.aggregate, self.aggregate_trim)


@dataclass(frozen=True)
class FedProxOptions(FedAvgOptions):
    """FedAvg's options with FedProx's proximal term on by default (mu 0.01)."""

    mu: float = 0.01
    section: ClassVar[str] = "fedprox"


@dataclass(frozen=True)
class FedAvgMOptions(FedAvgOptions):
    """FedAvg's options with FedAvgM's server momentum on by default (0.9)."""

    server_momentum: float = 0.9
    section: ClassVar[str] = "fedavgm"
