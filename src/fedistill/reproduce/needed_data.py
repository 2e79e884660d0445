"""The dataset folders a target's runs read, checked before any run starts.

Installed from a wheel there is no dataset folder beside the package; a target whose data is missing stops
with one line that says how to point at it (`--data-dir` or `FEDISTILL_DATA`) rather than failing every
run on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedistill.data.catalog import ALIASES, DATASETS
from fedistill.errors import UserError
from fedistill.reproduce.paths import DATA_ENV
from fedistill.reproduce.plan import Job

#: How a config names a second dataset (FedKD's public images, say): `public = "dataset:cifar10"`.
DATASET_PREFIX = "dataset:"


def named_datasets(settings: Mapping[str, Any]) -> Iterator[str]:
    """The run's dataset, then every `dataset:NAME` value of its algorithm tables."""
    yield str(settings.get("dataset", ""))
    for value in settings.values():
        if isinstance(value, Mapping):
            yield from (
                v.removeprefix(DATASET_PREFIX)
                for v in value.values()
                if isinstance(v, str) and v.startswith(DATASET_PREFIX)
            )


def dataset_folder(name: str, data_dir: Path) -> Path | None:
    """Where dataset `name` keeps its files under `data_dir`; None when it needs none (or is unknown: the
    run's own setup check names it)."""
    key = name.strip().lower().replace("_", "-")
    entry = DATASETS.get(ALIASES.get(key, key))
    if entry is None or entry.subdir is None:
        return None
    return data_dir / entry.subdir if entry.subdir else data_dir


def require_data(jobs: Sequence[Job], data_dir: str) -> None:
    """A one-line UserError naming `--data-dir` and `FEDISTILL_DATA` when a dataset the jobs read has no
    folder under `data_dir`: every missing folder at once (with the first run that reads it), so a table
    over two datasets does not stop on the second only after the first is in place."""
    root = Path(data_dir).expanduser()
    missing: dict[Path, str] = {}
    for job in jobs:
        for name in named_datasets(job.config.to_dict()):
            folder = dataset_folder(name, root)
            if folder is not None and not folder.is_dir() and folder not in missing:
                missing[folder] = f"run {job.run!r} reads dataset {name!r} from {folder}"
    if missing:
        which, them = ("which does not exist", "it") if len(missing) == 1 else ("which do not exist", "them")
        raise UserError(
            f"{'; '.join(missing.values())}, {which}: "
            f"pass --data-dir DIR or set {DATA_ENV} to the folder that holds {them}"
        )
