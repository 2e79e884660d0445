"""`[task] decision_threshold = "validation"`: after the last round, the threshold of a two-class
segmentation is chosen on the sites' validation splits (algorithms/shared/decision_threshold.py), the
final test metrics are scored at it, and the task the exported models record carries it, so
`load_model`, `fedistill predict` and `fedistill export` apply it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from torch import nn

from fedistill.algorithms.base import Algorithm, ServerLogic
from fedistill.algorithms.shared.decision_threshold import ThresholdCounts, validation_threshold
from fedistill.algorithms.shared.training import test_metrics
from fedistill.config import RunConfig
from fedistill.errors import ConfigError
from fedistill.federation.fleet import Fleet
from fedistill.tasks import Task

log = logging.getLogger(__name__)

#: The exported models a threshold is chosen for, the first a server has (inference/loading.py's order).
THRESHOLDED = ("global", "student", "segmenter")


def exported_architecture(config: RunConfig, options: Any, name: str) -> str:
    """The architecture of the exported model `name`: a student's own (FedIOD's `student` option) or the
    run's model; what a site builds to load the parameters it is sent."""
    return (getattr(options, "student", "") or config.model) if name == "student" else config.model


def wants_validation(task: Task) -> bool:
    return getattr(task, "decision_threshold", 0.5) == "validation"


def check_algorithm(task: Task, algorithm: Algorithm) -> None:
    """ConfigError before round 1 when the threshold is to be chosen on validation splits whose sites
    cannot count it."""
    if wants_validation(task) and not issubclass(algorithm.client, ThresholdCounts):
        raise ConfigError(
            f'task.decision_threshold = "validation" needs sites that count their validation pixels; '
            f"{algorithm.name}'s do not: give a number instead"
        )


def decide(
    task: Task,
    config: RunConfig,
    options: Any,
    server: ServerLogic,
    fleet: Fleet,
    final: dict[str, Any],
    score: Callable[[nn.Module, Task], dict[str, float]],
) -> tuple[Task, dict[str, Any]]:
    """The task at the threshold the sites' validation counts choose for the server's exported model, and
    the final metrics with its test scores at it and `decision_threshold`; both unchanged unless the task
    asks for "validation"."""
    if not wants_validation(task):
        return task, final
    models = server.models()
    name = next((n for n in THRESHOLDED if n in models), None)
    if name is None:
        log.warning("decision_threshold: the run exports no model to choose a threshold for; 0.5 stays")
        return dataclasses.replace(task, decision_threshold=0.5), final
    architecture = exported_architecture(config, options, name)
    threshold = validation_threshold(fleet, models[name], architecture, config.timeout or None)
    chosen = dataclasses.replace(task, decision_threshold=threshold)
    log.info("decision threshold chosen on the sites' validation splits: %s", threshold)
    return chosen, final | test_metrics(score(models[name], chosen)) | {"decision_threshold": threshold}
