"""`fedistill run --dry-run`: every check a run makes before it writes its folder, then the plan of what it
would run, and nothing written: no run folder, no stage-1 cache, no lock, no downloaded file.

A new run goes through `start_suite`'s checks up to the folder's creation (its name, a folder that holds a
run, `validate_setup`); a resume through `continue_suite`'s and `run_algorithm`'s (the folder, its config
against each checkpoint's record, the partition it saved), reading its checkpoints without sweeping or
writing them. Why: a long job on a queue should not be the first to meet a misspelt key.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import torch

from fedistill import devices
from fedistill.algorithms.shared.training import new_model
from fedistill.config import RunConfig, for_algorithm, read_config, toml_literal
from fedistill.data.partition import DIRICHLET
from fedistill.data.partition.split import load_split
from fedistill.engine import suite_dir as folder
from fedistill.engine.launch import check_transport, new_suite_dir
from fedistill.engine.resume import check_finished_settings, check_same_settings, resume_point
from fedistill.engine.setup import Prepared, Resolved, canonical_dataset, resolve, validate_setup
from fedistill.engine.site_data import check_sites
from fedistill.engine.summary import read_summary
from fedistill.errors import ConfigError, RunDirError

#: Clients listed one by one; more are summed up as min / median / max.
LISTED_CLIENTS = 20


def plan_new(config: RunConfig, resume_hint: str = "") -> str:
    """The plan of a new run of `config`, after every check `start_suite` makes before its folder exists;
    `resume_hint` as `start_suite` takes it."""
    config = canonical_dataset(config)
    suite_dir = new_suite_dir(config, resume_hint)
    data = validate_setup(config.replace(download=False), simulation=True)  # a dry run fetches no file
    folder.check_creatable(suite_dir)
    check_transport(config)
    where = str(suite_dir) if config.name else f"{suite_dir} (the time it starts; -2, -3, ... if taken)"
    return _plan(config, data, f"run folder: {where}")


def plan_resume(run_dir: Path, device: str | None = None) -> str:
    """The plan of `--resume run_dir`: `continue_suite`'s checks, then each algorithm's checkpoint and
    settings as `run_algorithm` reads them, and the round each goes on after."""
    suite_dir = folder.resume_target(Path(run_dir).expanduser())
    folder.check_writable(suite_dir, probe=False)
    config = canonical_dataset(read_config(suite_dir / "config.toml"))
    if device is not None:
        config = config.replace(device=device)
    data = validate_setup(config.replace(download=False), resume=True, simulation=True)
    folder.check_unlocked(suite_dir)  # the lock a resume would take
    folder.check_algorithms_kept(suite_dir, config.algorithms)
    check_transport(config)
    lines = [f"resumes: {suite_dir}"]
    for name in config.algorithms:
        lines.append(f"  {name}: {_resume_state(suite_dir / name, for_algorithm(config, name), data)}")
    return _plan(config, data, "\n".join(lines))


def _resume_state(run_dir: Path, config: RunConfig, data: Prepared) -> str:
    """Where one algorithm of a resumed run stands: finished, going on after round N, or starting over."""
    damaged = ""
    if (run_dir / "summary.json").is_file():
        check_finished_settings(run_dir, config)
        try:
            read_summary(run_dir)
            return "finished (its summary stands)"
        except RunDirError:  # as a resume does: finished again from its last checkpoint
            damaged = "summary damaged, finished again: "
    point = resume_point(run_dir) if run_dir.is_dir() else None
    if point is None:
        return f"{damaged}starts at round 1 (no checkpoint yet)"
    checkpoint, state = point
    check_same_settings(run_dir, state["runner"].get("settings"), config)
    if load_split(run_dir).hash() != data.split.hash():
        raise ConfigError(
            f"{run_dir}: the saved partition differs from the one this config makes; cannot resume"
        )
    check_sites(data, run_dir)  # a site's own records, as the resume checks them
    return f"{damaged}continues after round {int(state['runner']['round'])} (from {checkpoint.name})"


def _plan(config: RunConfig, data: Prepared, where: str) -> str:
    """The plan's lines: each algorithm, the data, the partition, the device and where the run goes."""
    lines: list[str] = []
    counted: dict[str, int] = {}
    for name in config.algorithms:
        resolved = resolve(config, name)
        own = resolved.config
        steps = (
            f"local_steps {own.local_steps}" if own.local_steps > 0 else f"local_epochs {own.local_epochs}"
        )
        lines.append(
            f"[{name}]  rounds {own.rounds}, {steps}, batch_size {own.batch_size}, lr {own.lr}, "
            f"model {own.model} ({_parameters(own, data, counted):,} parameters)"
        )
        lines += _options(_after_preset(resolved, data), name)
    train, test = data.dataset.train, data.dataset.test
    held = "the server's: " if data.own_data else ""
    lines.append(f"dataset: {config.dataset} ({held}train {len(train):,}, test {len(test):,})")
    how = config.partition  # alpha only where the partition draws with it: "iid, alpha 0.5" reads as skewed
    if config.partition in DIRICHLET:
        how += f", alpha {config.alpha}"
    if data.own_data:
        how = f"each site's own data ({config.site_data_dir})"
    sizes = _client_sizes(data)
    lines.append(f"partition: {config.clients} clients, {how}; training samples per client: {sizes}")
    lines.append(f"model: {config.model} ({_parameters(config, data, counted):,} parameters)")
    threads = config.threads if config.threads > 0 else torch.get_num_threads()
    lines.append(f"device: {devices.resolve(config.device)}; threads: {threads}")
    lines.append(where)
    return "\n".join(lines)


def _after_preset(resolved: Resolved, data: Prepared) -> Any:
    """The options as the algorithm runs them: its `resolve_options` (a preset applied to the keys the
    config leaves unset), or as the config gives them."""
    resolve_options = resolved.algorithm.resolve_options
    if resolve_options is None:
        return resolved.options
    return resolve_options(resolved.config, resolved.options, data.dataset.info)


def _options(options: Any, name: str) -> list[str]:
    """The algorithm's options that the config or a preset set away from their defaults, spelt as a config
    file and `fedistill list --options` spell them; the rest are counted."""
    if options is None or not dataclasses.is_dataclass(options):
        return []
    fresh = type(options)()
    fields = [f.name for f in dataclasses.fields(options) if f.init]
    changed = [key for key in fields if getattr(options, key) != getattr(fresh, key)]
    lines = [f"  {key} = {toml_literal(getattr(options, key))}" for key in changed]
    if rest := len(fields) - len(changed):
        lines.append(f"  ({rest} more at their defaults: fedistill list --options {name})")
    return lines


def _client_sizes(data: Prepared) -> str:
    """Each client's training-sample count, or their min / median / max for many clients."""
    sizes = data.client_sizes()
    if sizes is None:
        return "counted by each site's Flower node when the run starts"
    if len(sizes) <= LISTED_CLIENTS:
        return " ".join(str(n) for n in sizes)
    return f"min {min(sizes)}, median {statistics.median(sizes):g}, max {max(sizes)}"


def _parameters(config: RunConfig, data: Prepared, counted: dict[str, int]) -> int:
    """How many parameters the run's model has, built as a run builds it (nothing is trained); `counted`
    keeps each model's count, so that algorithms sharing a model build it once."""
    key = repr((config.model, config.norm, config.group_norm_groups, config.options.get("model_options")))
    if key not in counted:
        counted[key] = sum(p.numel() for p in new_model(config, data.dataset.info).parameters())
    return counted[key]
