"""`fedistill run --transport flower`: the suite on Flower's simulation engine (Ray), one process.

The ServerApp and ClientApp are the ones `flwr run .` uses, built around this run's config; the
ServerApp's main is the ordinary run loop over a `GridFleet`. One virtual SuperNode per client.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from fedistill.errors import ConfigError, FederationError, RunDirError
from fedistill.experiment import interrupt
from fedistill.experiment.config import RunConfig

log = logging.getLogger(__name__)


def backend_config(config: RunConfig) -> dict[str, Any]:
    cpus = os.cpu_count() or 1
    return {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {
            "num_cpus": cpus,
            "include_dashboard": False,
            "logging_level": "error",
            "log_to_driver": False,
        },
    }


def restart_unfinished(config: RunConfig, suite_dir: Path) -> None:
    """`--resume` of a Flower run: finished algorithms are kept, unfinished federated ones start again.

    Their clients' state lives on the nodes, saved after every message, so it may be ahead of the
    server's last checkpoint; no consistent pair exists to resume from. Pooled algorithms run
    in-process and resume from their checkpoint as usual."""
    from fedistill.algorithms.base import get_algorithm

    for name in config.algorithms:
        run_dir = suite_dir / name
        if get_algorithm(name).pooled or not run_dir.exists() or _finished(run_dir):
            continue
        log.warning(
            "%s ran on Flower and did not finish: its clients' state cannot be matched to the server's "
            "checkpoint, so it starts again from round 1",
            name,
        )
        shutil.rmtree(run_dir)
    shutil.rmtree(suite_dir / ".node-state", ignore_errors=True)


def _finished(run_dir: Path) -> bool:
    from fedistill.experiment.summary import read_summary

    try:
        read_summary(run_dir)
    except (RunDirError, OSError):
        return False
    return True


def run_simulation_suite(
    config: RunConfig, suite_dir: Path, *, resume: bool = False, progress: bool = True
) -> list[dict[str, Any]]:
    if resume:
        restart_unfinished(config, suite_dir)
    try:
        from flwr.simulation import run_simulation
    except ImportError:
        raise ConfigError(
            "transport = flower needs Flower: pip install -e '.[flower]' (or fedistill[flower])"
        ) from None

    from fedistill.flower.apps import make_client_app, make_server_app

    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    server_app = make_server_app(config, suite_dir, results, errors, progress=progress, resume=resume)
    client_app = make_client_app(config, state_root=suite_dir / ".node-state")
    flower_logger = logging.getLogger("flwr")
    level = flower_logger.level
    flower_logger.setLevel(logging.ERROR)
    # Flower's home (apps, state) inside the run's own folder unless the user chose one
    own_home = "FLWR_HOME" not in os.environ
    if own_home:
        os.environ["FLWR_HOME"] = str(suite_dir / ".flwr")
    try:
        with interrupt.deferred_to_run_loop():
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=config.clients,
                backend_config=backend_config(config),  # type: ignore[arg-type]
            )
    finally:
        flower_logger.setLevel(level)
        if own_home:
            del os.environ["FLWR_HOME"]
    if errors:
        raise errors[0]
    if not results:
        raise FederationError("the Flower simulation ended without results; see the run's run.log")
    return results
