"""Every config table and the keys it takes, read from the registries: what lets an unknown key's error
say where the key belongs (`teacher_epochs` at the top level is `fediod.teacher_epochs`). config.py
imports no registry, so the command line, the Python API, Flower's apps and the setup hand it this."""

from __future__ import annotations

import dataclasses


def key_homes(dataset: str = "") -> dict[str, tuple[str, ...]]:
    """Each table's name -> the keys it takes: every algorithm's options (in the registry's order, so that
    a family's main method comes before its variants), every dataset's, and the keys any model, partitioner
    or task takes ([model_options], [partition_options], [task]). The run's `dataset` table is named as the
    run spells it (`fmnist`), as its config may write it. Read anew each call: an algorithm registered
    later is in it. The registries are imported here, not above: a config with no unknown key never pays
    for torch."""
    from fedistill.algorithms.registry import ALGORITHMS
    from fedistill.data.partition import PARTITIONERS
    from fedistill.data.partition.registry import own_options
    from fedistill.data.registry import dataset_names, dataset_options
    from fedistill.models import model_names, model_options
    from fedistill.tasks import TASKS

    homes = {name: tuple(f.name for f in dataclasses.fields(a.options)) for name, a in ALGORITHMS.items()}
    homes.update({name: dataset_options(name) for name in dataset_names()})
    canonical = _canonical(dataset)
    if canonical is not None and canonical != dataset:
        homes[dataset] = homes.pop(canonical)
    homes["model_options"] = tuple(dict.fromkeys(key for m in model_names() for key in model_options(m)))
    homes["partition_options"] = tuple(
        dict.fromkeys(key for p in PARTITIONERS.values() for key in own_options(p))
    )
    homes["task"] = tuple(dict.fromkeys(f.name for task in TASKS.values() for f in dataclasses.fields(task)))
    return homes


def _canonical(dataset: str) -> str | None:
    """The registered name `dataset` spells (an alias, another case); None when it names none."""
    from fedistill.data.registry import canonical_dataset_name
    from fedistill.errors import UserError

    try:
        return canonical_dataset_name(dataset) if dataset else None
    except UserError:
        return None
