"""A suite: every algorithm of a config side by side on the same partition, in one run directory,
in-process or over a Flower Grid (the ServerApp calls `run_algorithms` with its grid)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from fedistill import devices
from fedistill.config import RunConfig, for_algorithm, write_config
from fedistill.engine.loop import run_algorithm
from fedistill.engine.resume import check_finished_settings
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import Prepared, resolve
from fedistill.engine.summary import read_summary, write_suite_results
from fedistill.errors import FederationError, RunDirError

log = logging.getLogger("fedistill")


def default_name(config: RunConfig) -> str:
    """A suite directory's default name: the dataset and the local date and time it started."""
    return f"{config.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_algorithms(
    config: RunConfig,
    suite_dir: Path,
    data: Prepared,
    *,
    resume: bool = False,
    progress: bool = True,
    grid: Any = None,
) -> list[dict[str, Any]]:
    """Run every algorithm of `config` in `suite_dir` with validated `data`: in-process, or with the
    clients on the nodes of a Flower `grid`. Pooled algorithms (Centralized) are not federated: they
    always run in-process. On resume, an algorithm with a summary is done; one whose summary is
    damaged is finished again from its last checkpoint, which gives the same summary. A `threads`
    setting holds for this suite only: a later run with `threads = 0` keeps the process's own count
    (thread counts change float rounding, so a leaked one would change its numbers)."""
    before = torch.get_num_threads()
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    try:
        return _run_algorithms(config, suite_dir, data, resume=resume, progress=progress, grid=grid)
    finally:
        torch.set_num_threads(before)


def _run_algorithms(
    config: RunConfig, suite_dir: Path, data: Prepared, *, resume: bool, progress: bool, grid: Any
) -> list[dict[str, Any]]:
    devices.use(config.device)
    suite_dir.mkdir(parents=True, exist_ok=True)
    write_config(config, suite_dir / "config.toml")
    summaries = []
    for name in config.algorithms:
        run_dir = suite_dir / name
        if resume and (run_dir / "summary.json").is_file():
            check_finished_settings(run_dir, for_algorithm(config, name))
            try:
                summaries.append(read_summary(run_dir))
                continue
            except RunDirError as exc:
                log.warning("%s; finishing %s again from its last checkpoint", exc, name)
        on_grid = grid if not resolve(config, name).algorithm.pooled else None
        try:
            summaries.append(
                run_algorithm(
                    for_algorithm(config, name), run_dir, data, resume=resume, progress=progress, grid=on_grid
                )
            )
        except FederationError as exc:  # in a suite, say whose clients stopped it
            if len(config.algorithms) == 1:
                raise
            raise FederationError(f"{name}: {exc}") from exc
    curves = {s["algorithm"]: read_jsonl(suite_dir / s["algorithm"] / "metrics.jsonl") for s in summaries}
    write_suite_results(suite_dir, summaries, curves)
    return summaries
