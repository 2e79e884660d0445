"""Tasks by name: what a target is, how a model trains on it and how it is scored (see `base.Task`).

`make_task(info, options)` builds the task a dataset declares (`DatasetInfo.task`) with the options of
the run's `[task]` config table.
"""

from __future__ import annotations

import dataclasses
import math
import typing
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
    hints = typing.get_type_hints(cls)
    for key, value in options.items():
        _check_type(key, value, hints[key])
    return cls(**options)


def _check_type(key: str, value: Any, hint: Any) -> None:
    """ConfigError unless `value` is of the option's declared type (a bool is no number, and a number is
    finite), as the algorithms' options are checked: `--set task.hd95=False` arrives as the text 'False'."""
    if hint is bool:
        ok, want = isinstance(value, bool), "true or false (lower case, as TOML writes them)"
    elif hint is int:
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif hint is float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        ok, want = number and math.isfinite(value), "a finite number"
    elif hint is str:
        ok, want = isinstance(value, str), "text"
    else:
        return
    if not ok:
        raise ConfigError(f"task.{key} must be {want}, got {value!r}")


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
