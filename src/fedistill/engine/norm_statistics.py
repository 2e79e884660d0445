"""`recalibrate_norm = true`: after the last round, the BatchNorm statistics of the model the server exports
are recomputed over the sites' training splits (algorithms/shared/norm_statistics.py), the final test
metrics are scored with them, and the exported model carries them, so `load_model`, `fedistill predict` and
`fedistill export` use them. Off by default: the papers' FedAvg keeps its averaged statistics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import nn

from fedistill.algorithms.base import Algorithm, ServerLogic
from fedistill.algorithms.shared.norm_statistics import NormStatistics, recalibrate
from fedistill.algorithms.shared.training import test_metrics
from fedistill.config import RunConfig
from fedistill.engine.decision_threshold import THRESHOLDED, exported_architecture
from fedistill.errors import ConfigError
from fedistill.federation.fleet import Fleet
from fedistill.models.norm import norm_layers
from fedistill.models.registry import builds_batchnorm
from fedistill.tasks import Task

log = logging.getLogger(__name__)


def check_algorithm(config: RunConfig, algorithm: Algorithm, options: Any) -> None:
    """ConfigError before round 1 when the statistics are to be recomputed by sites that cannot, under
    differential privacy, or for a model without BatchNorm."""
    if not config.recalibrate_norm:
        return
    what = "recalibrate_norm = true recomputes, over the sites' training splits, the BatchNorm statistics"
    if not issubclass(algorithm.client, NormStatistics) or hasattr(algorithm.server, "not_recalibrated"):
        why = getattr(algorithm.server, "not_recalibrated", "its sites do not compute them")
        raise ConfigError(
            f"{what} of a model trained on their data; {algorithm.name} does not take it ({why}): set it in "
            "the tables of the algorithms that do ([fedavg] recalibrate_norm = true)"
        )
    if getattr(getattr(options, "dp", None), "enabled", False):
        raise ConfigError(
            f"{what} of {algorithm.name}'s model, which its differential privacy does not account for: "
            "turn one of them off"
        )
    if not builds_batchnorm(config.model, config.norm):
        raise ConfigError(
            f"{what} of {algorithm.name}'s model, and model {config.model!r} with norm = {config.norm!r} has "
            "no BatchNorm layer: leave it false"
        )


def recalibrated(
    config: RunConfig,
    options: Any,
    server: ServerLogic,
    fleet: Fleet,
    task: Task,
    final: dict[str, Any],
    score: Callable[[nn.Module, Task], dict[str, float]],
) -> dict[str, Any]:
    """The final metrics with the exported model's test scores after its statistics are recomputed (in
    place) and `norm_statistics_samples`, the training samples they cover; unchanged unless the run asks."""
    if not config.recalibrate_norm:
        return final
    models = server.models()
    name = next((n for n in THRESHOLDED if n in models and norm_layers(models[n])), None)
    if name is None:
        log.warning("recalibrate_norm: the run exports no model with BatchNorm layers; nothing recomputed")
        return final
    samples = recalibrate(
        fleet, models[name], exported_architecture(config, options, name), config.timeout or None
    )
    log.info("BatchNorm statistics of %s recomputed over the sites' %d training samples", name, samples)
    return final | test_metrics(score(models[name], task)) | {"norm_statistics_samples": samples}
