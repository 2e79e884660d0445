"""`fedistill run --transport flower`: the suite on Flower's simulation engine, one process.
The ServerApp and ClientApp are the ones `flwr run .` uses, built around this run's config; the
ServerApp's main is the ordinary run loop over a `GridFleet`. One virtual SuperNode per client.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from fedistill.algorithms.registry import get_algorithm
from fedistill.config import RunConfig
from fedistill.engine.flower.apps import make_client_app, make_server_app
from fedistill.engine.summary import read_summary
from fedistill.errors import FederationError, RunDirError
from fedistill.transports.flower.simulation import simulate

log = logging.getLogger(__name__)


def restart_unfinished(config: RunConfig, suite_dir: Path) -> None:
    """`--resume` of a Flower run: finished algorithms are kept, unfinished federated ones start again.
    Their clients' state lives on the nodes, saved after every message, so it may be ahead of the
    server's last checkpoint; no consistent pair exists to resume from. Pooled algorithms run
    in-process and resume from their checkpoint as usual."""
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
    try:
        read_summary(run_dir)
    except (RunDirError, OSError):
        return False
    return True


def run_simulation_suite(
    config: RunConfig, suite_dir: Path, *, resume: bool = False, progress: bool = True
) -> list[dict[str, Any]]:
    """Run the suite's algorithms in Flower's simulation engine; the first error a server app met is raised
    again here."""
    if resume:
        restart_unfinished(config, suite_dir)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    server_app = make_server_app(config, suite_dir, results, errors, progress=progress, resume=resume)
    client_app = make_client_app(config, state_root=suite_dir / ".node-state")
    # each node trains on `threads` torch threads, one if it is 0 (node.py): Ray reserves as many cores
    simulate(server_app, client_app, config.clients, suite_dir / ".flwr", threads=config.threads or 1)
    if errors:
        raise errors[0]
    if not results:
        raise FederationError("the Flower simulation ended without results; see the run's run.log")
    return results
