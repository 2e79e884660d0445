"""A target's runs at one scale as jobs: each (run, seed) with its resolved config and its folder.

A folder's name ends with a digest of the resolved config (placement keys aside: where the run goes, where
its data lies), so a finished run is reused only when it ran exactly these settings; a target whose
settings change gets new folders instead of stale numbers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from fedistill.config import RunConfig, build_config, load_toml, parse_assignment
from fedistill.reproduce.target_spec import Run, Target

#: Keys that say where a run goes, not what it computes: left out of the digest.
PLACEMENT = ("out", "name", "data_dir", "download")


@dataclass(frozen=True)
class Job:
    """One `fedistill run` of a target: its config and the suite folder it writes."""

    run: str
    seed: int
    config: RunConfig
    folder: Path

    @property
    def algorithms(self) -> list[str]:
        return self.config.algorithms


def digest(config: RunConfig) -> str:
    settings = {k: v for k, v in config.to_dict().items() if k not in PLACEMENT}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]


def resolve(run: Run, seed: int, runs_dir: Path, data_dir: str, threads: int = 0) -> Job:
    """The run's config file, its `sets`, then the seed and the data folder; its folder under `runs_dir`.
    `threads` (> 0): the torch threads an in-process run that leaves `threads = 0` will run on, written
    into its config, so that the digest tells runs of another thread count apart (the count changes the
    numbers: a convolution's gradient sums in another order)."""
    layers = [load_toml(run.config_path()), dict(parse_assignment(s) for s in run.sets)]
    config = build_config(RunConfig(), *layers, {"seed": seed, "data_dir": data_dir})
    if threads > 0 and config.threads == 0 and config.transport == "inprocess":
        config = config.replace(threads=threads)
    folder = runs_dir / f"{run.name}-seed{seed}-{digest(config)}"
    config = config.replace(out=str(runs_dir), name=folder.name)
    return Job(run.name, seed, config, folder)


def plan(
    target: Target,
    scale: str,
    runs_dir: Path,
    data_dir: str,
    seeds: tuple[int, ...] | None = None,
    *,
    threads: int = 0,
) -> list[Job]:
    """Every (run, seed) of the target at `scale`; `seeds` replace every run's own; `threads`: see
    `resolve`."""
    spec = target.scales[scale]
    runs = [(run, seed) for run in spec.runs for seed in spec.seeds_of(run, seeds)]
    return [resolve(run, seed, runs_dir, data_dir, threads) for run, seed in runs]
