"""Flower's simulation engine (Ray) in this process: one virtual SuperNode per site, Flower's home
and logging kept out of the user's way, Ctrl-C (and the command line's SIGTERM) left to the run loop, Ray's
processes ended with the run, and Flower's errors about Ray's workers kept quiet once the run is stopping."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedistill import interrupt
from fedistill.errors import ConfigError
from fedistill.transports.flower.ray_session import own_ray_session


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else all): a job given
    a few cores of a large machine must not start a Ray worker per core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


# A scheduler's SIGTERM to the whole job (SLURM, systemd) stops Ray's processes with the run, whose own stop
# then shuts Ray down. Ray's control process declares the (one, local) node dead after this many missed
# health checks, 3 s apart (Ray's default: 5), and Ray's driver then ends this process at once with exit
# code 1: the stop must not lose that race on a loaded machine.
RAY_HEALTH_CHECK_FAILURES = 60
# How long Ray's shutdown tries to send its task events (for Ray's dashboard, not used here) to a control
# process that may be gone: with Ray's default such a stop took 11 s on two idle cores, with 0.2 s 4 s,
# and a scheduler kills a job that has not stopped within its grace period (often 30 s).
RAY_EVENTS_FLUSH_MS = 200


def backend_config(ray_root: Path, threads: int = 1) -> dict[str, Any]:
    """`threads` CPUs per virtual node (the torch threads each node trains on, at most the usable cores),
    so Ray runs as many nodes at once as the cores hold; Ray without its dashboard, quiet, with its
    session under `ray_root` (how its processes are found when they must be ended), slow to declare its
    node dead and quick to shut down (see RAY_HEALTH_CHECK_FAILURES)."""
    cpus = usable_cores()
    return {
        "client_resources": {"num_cpus": max(1, min(int(threads), cpus)), "num_gpus": 0.0},
        "init_args": {
            "num_cpus": cpus,
            "include_dashboard": False,
            "logging_level": "error",
            "log_to_driver": False,
            "_temp_dir": str(ray_root),
            "_system_config": {
                "health_check_failure_threshold": RAY_HEALTH_CHECK_FAILURES,
                "task_events_shutdown_flush_timeout_ms": RAY_EVENTS_FLUSH_MS,
            },
        },
    }


@contextmanager
def sigterm_kept_from_ray() -> Iterator[None]:
    """While the body runs, Ray leaves the command line's SIGTERM handler in place in this process. Why:
    `ray.init` puts in its own, which exits in the middle of a step (`sys.exit`), and its core worker a
    crash reporter that prints a stack dump on SIGTERM and aborts the process 3 s later (exit 134)
    however cleanly the run stops. A library caller's handler is Ray's to replace, as before."""
    if not interrupt.takes_sigterm():
        yield
        return
    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    kept = [(ray_utils, "set_sigterm_handler", lambda handler: None)]
    kept.append((ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", True))  # read by this process only
    before = [(module, name, getattr(module, name)) for module, name, _ in kept if hasattr(module, name)]
    for module, name, value in kept:
        if hasattr(module, name):  # another Ray may lack one: nothing known to keep it from
            setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in before:
            setattr(module, name, value)


def quiet_once_stopping(record: logging.LogRecord) -> bool:
    """A filter for Flower's logger: nothing once the run was asked to stop. A scheduler that stops a whole
    job (SLURM, systemd) sends SIGTERM to Ray's workers too, and Flower would log a traceback for every
    message a worker held when it died, after the run's own line that it is stopping."""
    return not interrupt.stop_requested()


def simulate(server_app: Any, client_app: Any, num_supernodes: int, home: Path, *, threads: int = 1) -> None:
    """Run `server_app` against `num_supernodes` virtual nodes of `client_app`, each given `threads` CPUs
    (the torch threads its client trains on). Flower's home (apps,
    state) is `home` unless the user chose one (FLWR_HOME). No Ray process outlives the call: not after
    an error, a second Ctrl-C or SIGTERM either."""
    try:
        from flwr.simulation import run_simulation
    except ImportError:
        raise ConfigError(
            "transport = flower needs Flower: pip install -e '.[flower]' (or fedistill[flower])"
        ) from None
    if importlib.util.find_spec("ray") is None:  # Flower would log its own message and exit the process
        raise ConfigError(
            "transport = flower needs Ray for Flower's simulation engine (flwr[simulation]): "
            "pip install -e '.[flower]' (or fedistill[flower])"
        )
    flower_logger = logging.getLogger("flwr")
    level = flower_logger.level
    flower_logger.setLevel(logging.ERROR)
    flower_logger.addFilter(quiet_once_stopping)
    own_home = "FLWR_HOME" not in os.environ
    if own_home:
        os.environ["FLWR_HOME"] = str(home)
    try:
        with (
            interrupt.deferred_to_run_loop(),
            sigterm_kept_from_ray(),
            interrupt.sigterm_ends_at_once(),
            own_ray_session() as ray_root,
        ):
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=num_supernodes,
                backend_config=backend_config(ray_root, threads),  # type: ignore[arg-type]
            )
    finally:
        flower_logger.setLevel(level)
        flower_logger.removeFilter(quiet_once_stopping)
        if own_home:
            del os.environ["FLWR_HOME"]
