"""Tasks by name: what a target is, how a model trains on it and how it is scored (see `base.Task`).

`make_task(info, options)` builds the task a dataset declares (`DatasetInfo.task`) with the options of
the run's `[task]` config table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError, unknown_name
from fedistill.tasks.base import Inputs, Task
from fedistill.tasks.classification import Classification
from fedistill.tasks.conditions import Condition
from fedistill.tasks.reconstruction import Reconstruction
from fedistill.tasks.segmentation import InstanceSegmentation, SemanticSegmentation
from fedistill.tasks.text import TextClassification

TASKS: dict[str, type[Task]] = {
    task.name: task
    for task in (
        Classification,
        SemanticSegmentation,
        InstanceSegmentation,
        Reconstruction,
        TextClassification,
    )
}


def task_class(info: DatasetInfo) -> type[Task]:
    """The kind of task dataset `info` declares, before any option is applied (what depends on the kind
    alone, as `Task.partition_labels`, asks it); ConfigError on an unknown task."""
    if info.task not in TASKS:
        raise unknown_name("task", info.task, list(TASKS), ConfigError)
    return TASKS[info.task]


def make_task(info: DatasetInfo, options: Mapping[str, Any] | None = None) -> Task:
    """The task of dataset `info` with `options` (the `[task]` table); ConfigError on unknown options."""
    cls = task_class(info)
    options = dict(options or {})
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        takes = f"it takes {', '.join(allowed)}" if allowed else "it takes none"
        raise ConfigError(
            f"task {info.task!r} (dataset {info.name!r}) has no option(s) {', '.join(unknown)}; {takes}"
        )
    return cls(**options)


__all__ = [
    "TASKS",
    "Classification",
    "Condition",
    "Inputs",
    "InstanceSegmentation",
    "Reconstruction",
    "SemanticSegmentation",
    "Task",
    "TextClassification",
    "make_task",
    "task_class",
]
