"""The trivial predictor's scores beside a run's own (the zero-filled input of a reconstruction): a number a
reader can hold every method against without another run."""

from __future__ import annotations

from typing import Any

from fedistill.algorithms.shared.training import evaluate_model, test_metrics
from fedistill.data.base import LoadedDataset
from fedistill.tasks.base import Task


def floor_scores(task: Task, dataset: LoadedDataset, sources: list[str] | None) -> dict[str, Any] | None:
    """{"label": ..., "test_<metric>": ...} of the task's trivial baseline on the whole test set, scored
    exactly as a run's final model is; None when the task names no baseline."""
    baseline = task.trivial_baseline()
    if baseline is None:
        return None
    label, model, scoring_task = baseline
    result = evaluate_model(
        model, dataset.test, dataset.info, task=scoring_task, meta=dataset.test_meta, groups=sources
    )
    return {"label": label, **test_metrics(result)}
