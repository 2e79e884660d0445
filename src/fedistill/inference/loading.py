"""Rebuilding the model a run exported (`<run>/<algorithm>/models/<name>.safetensors`, engine/loop.py)
from the run's saved config.toml: the same architecture, norm and model options for the dataset's facts.

Which file: each algorithm's server exports its models by name (`ServerLogic.models()`): FedAvg and its
kin, FedDF and the one-shot baselines a `global` model (FedDF with several architectures one
`global_<model>` each), FedIOD, DENSE, Co-Boosting and FedKD a `student`, AsynDGAN a `segmenter`, beside
generators. The first of those is the one a user predicts with; `name=` picks another whole model. Parts
of a model (FedPer's shared extractor, FedMD-CG's classifier head) and generators are not task models.

Which architecture: the run's model, or the algorithm's `student` or FedDF's `groups` where they name
another one; the first whose parameters match the file in names and shapes is rebuilt.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import RunDirError
from fedistill.inference.run_folder import finished_dir
from fedistill.inference.selection import which_model
from fedistill.inference.trained_model import TrainedModel

if TYPE_CHECKING:
    from fedistill.config import RunConfig
    from fedistill.tasks import Task

#: The exported models a user predicts with, in the order one is picked when `name` is not given.
PREFERRED = ("global", "student", "segmenter")
GROUP_PREFIX = "global_"


def model_files(run_dir: Path) -> dict[str, Path]:
    """The models an algorithm's folder exported, by name."""
    folder = run_dir / "models"
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    return {path.name.removesuffix(".safetensors"): path for path in files}


def choose_model(files: dict[str, Path], algorithm: str, model: str, name: str | None) -> str:
    """The exported model to load: `name`, else the first of PREFERRED, else FedDF's group of the run's
    model (or its first group)."""
    listed = ", ".join(files) if files else "none"
    if name is not None:
        if name not in files:
            raise RunDirError(f"{algorithm} exported no model {name!r} (it exported: {listed})")
        return name
    for preferred in PREFERRED:
        if preferred in files:
            return preferred
    from fedistill.models import model_names

    groups = [n for n in files if n.startswith(GROUP_PREFIX) and n[len(GROUP_PREFIX) :] in model_names()]
    if groups:
        return f"{GROUP_PREFIX}{model}" if f"{GROUP_PREFIX}{model}" in groups else groups[0]
    raise RunDirError(
        f"{algorithm} exported no whole model to predict with (it exported: {listed}); "
        "its task models stay with the sites"
    )


def candidate_architectures(name: str, model: str, options: object) -> list[str]:
    """The registry names the exported model `name` may have been built as, most likely first."""
    from fedistill.models import model_names

    known = model_names()
    if name.startswith(GROUP_PREFIX) and name[len(GROUP_PREFIX) :] in known:
        return [name[len(GROUP_PREFIX) :]]
    student = str(getattr(options, "student", "") or "")
    groups = str(getattr(options, "groups", "") or "").split(",")
    names = [n.strip() for n in (student, *groups, model)]
    return [n for n in dict.fromkeys(names) if n in known]


def read_model_file(
    path: Path,
) -> tuple[dict[str, torch.Tensor], DatasetInfo | None, dict[str, Any] | None, dict[str, str]]:
    """A safetensors file's tensors, the dataset facts the run saved in its header (normalisation, size,
    classes, task), the task's options it trained under (each None for a file saved without them) and the
    whole header, read in one opening of the file. RunDirError when the file is damaged."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = handle.get_tensors()
    except Exception as exc:  # a truncated or overwritten file: safetensors raises its own error types
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RunDirError(f"{path} is damaged ({reason}); run the algorithm again to export it") from None
    return (
        state,
        _dataset_info(metadata.get("dataset_info")),
        _recorded_task_options(path, metadata),
        metadata,
    )


def _recorded_task_options(path: Path, metadata: dict[str, str]) -> dict[str, Any] | None:
    """The task options a file's header records (None without a record); RunDirError when the record
    cannot be read, since guessing them would change what the model predicts."""
    text = metadata.get("task_options")
    if text is None:
        return None
    try:
        options = json.loads(text)
    except ValueError:
        options = None
    if not isinstance(options, dict):
        raise RunDirError(f"{path}: its record of the task options is damaged; run the algorithm again")
    return options


def _task_options(config: RunConfig, recorded: dict[str, Any] | None, info: DatasetInfo) -> dict[str, Any]:
    """The options of the task the model trained under: those its file recorded, else the run's `[task]`
    table; a reconstruction model saved before `output_scale` existed took its net's output as it is."""
    if recorded is not None:
        return recorded
    options = dict(config.options.get("task", {}))
    if info.task == "reconstruction":
        options.setdefault("output_scale", "none")
    return options


def _task(path: Path, info: DatasetInfo, options: dict[str, Any], recorded: dict[str, Any] | None) -> Task:
    """The model's task with its options; RunDirError when the file records options this version's task
    lacks (a file written by a newer version), where the run's config would be blamed otherwise."""
    from fedistill.tasks import make_task, task_class

    if recorded is not None:
        known = {field.name for field in dataclasses.fields(task_class(info))}
        unknown = sorted(set(recorded) - known)
        if unknown:
            raise RunDirError(
                f"{path} records task option(s) {', '.join(unknown)} that this version's {info.task} task "
                "does not have: it was written by a newer version of fedistill; load it with that version"
            )
    return make_task(info, options)


def _dataset_info(text: str | None) -> DatasetInfo | None:
    """The recorded dataset facts; None when there is no record or it cannot be read (the data is then
    loaded instead)."""
    if text is None:
        return None
    try:
        return DatasetInfo.from_json(text)
    except Exception:
        return None


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in state.items()}


def load_model(
    run_dir: str | Path,
    algorithm: str | None = None,
    *,
    name: str | None = None,
    device: str | torch.device = "cpu",
    data_dir: str | Path | None = None,
) -> TrainedModel:
    """The model `algorithm` trained in `run_dir` (a run directory, or one algorithm's folder of one; the
    algorithm may be left out when the run holds one), in eval mode on `device`.

    The dataset's facts (normalisation, image size, classes) are read from the model file, where the run
    recorded them: no data is needed, and a `data_dir` is not read. Only models saved before that record
    existed take them from loading the dataset the run used (from `data_dir`, or the run's own)."""
    from fedistill.config import read_config
    from fedistill.data.registry import load_dataset
    from fedistill.engine.setup import resolve
    from fedistill.engine.summary import read_summary

    folder = finished_dir(run_dir, algorithm)
    if not (folder / "models").is_dir():  # every finished algorithm writes one, empty when no model leaves
        raise RunDirError(
            f"{folder} has no models/ folder, which every finished run writes: it was deleted or left out of "
            "a copy; copy it from the original run, or run the algorithm again"
        )
    files = model_files(folder)
    own = folder / "config.toml"
    config_path = own if own.is_file() else folder.parent / "config.toml"
    resolved = resolve(read_config(config_path), folder.name)  # the algorithm's own config and options
    config, options = resolved.config, resolved.options
    chosen = choose_model(files, folder.name, config.model, name)
    if "generator" in chosen:
        raise RunDirError(f"{chosen} is {folder.name}'s generator, not a model of the task; pick another")
    state, recorded, task_options, header = read_model_file(files[chosen])
    info = recorded  # the training's own facts: a dataset read now may have changed since
    if info is None:  # a model saved before its dataset's facts were recorded beside it
        dataset = load_dataset(
            config.dataset,
            config.data_dir if data_dir is None else data_dir,
            **config.options.get(config.dataset, {}),
        )
        info = dataset.info
    candidates = candidate_architectures(chosen, config.model, options)
    for architecture in candidates:
        module = _architecture(config, info, architecture, header)
        if _shapes(module.state_dict()) == _shapes(state):
            module.load_state_dict(state)
            return TrainedModel(
                module=_ready(module, device),
                task=_task(files[chosen], info, _task_options(config, task_options, info), task_options),
                info=info,
                algorithm=folder.name,
                config=config,
                name=chosen,
                architecture=architecture,
                run_dir=folder,
                selection=which_model(read_summary(folder)),
            )
    raise RunDirError(
        f"{files[chosen]} is not a whole {' or '.join(candidates)} as the run's config.toml builds it "
        "(a part of a model, or a damaged file); pick another name"
    )


def _architecture(
    config: RunConfig, info: DatasetInfo, architecture: str, header: dict[str, str]
) -> nn.Module:
    """`architecture` as the run built it: from the file's own record where the model needs one (a
    DistilBERT fine-tuned from a folder the loading machine may lack), else from the run's config."""
    from fedistill.algorithms.shared.training import new_model
    from fedistill.models import distilbert

    if architecture == "distilbert" and distilbert.RECORD_KEY in header:
        return distilbert.from_record(info, header[distilbert.RECORD_KEY])
    return new_model(config, info, architecture)


def _ready(module: nn.Module, device: str | torch.device) -> nn.Module:
    from fedistill import devices

    return module.to(devices.resolve(device)).eval()  # a device this machine lacks: a ConfigError
