"""Every config the project ships loads and passes every check a run makes before it reads data: keys,
types, ranges, tables, each algorithm's options, model names and norms, and the dataset's, partitioner's,
task's and model's option names. No run starts and no dataset file is needed."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from fedistill.config import RunConfig, build_config, load_toml
from fedistill.data.partition import PARTITIONERS
from fedistill.data.registry import dataset_options
from fedistill.engine.setup import canonical_dataset, check_algorithm, check_sections, resolve
from fedistill.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
#: Sidecars beside the configs that are not run configs (paper values and tolerances per config).
SIDECARS = {"expected.toml"}
SHIPPED = sorted(
    [p for p in (ROOT / "configs").rglob("*.toml") if p.name not in SIDECARS]
    + [ROOT / "src" / "fedistill" / "engine" / "demo.toml"]
)


def test_the_configs_are_found():
    assert len(SHIPPED) > 100 and all(p.is_file() for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shipped_config_builds_and_validates(path):
    config = canonical_dataset(build_config(RunConfig(), load_toml(path)))
    check_sections(config)  # every table known, every algorithm table's options checked
    unknown = set(config.options.get(config.dataset, {})) - set(dataset_options(config.dataset))
    assert not unknown, f"dataset {config.dataset} takes no {sorted(unknown)}"
    assert config.partition in PARTITIONERS, config.partition
    partitioner = inspect.signature(inspect.unwrap(PARTITIONERS[config.partition])).parameters
    assert set(config.options.get("partition_options", {})) <= set(partitioner)
    task_keys = {f.name for task in TASKS.values() for f in dataclasses.fields(task)}
    assert set(config.options.get("task", {})) <= task_keys
    for name in config.algorithms:
        check_algorithm(resolve(config, name))  # models' norms and options; options with the run's keys
