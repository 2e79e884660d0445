"""Starting a suite on the config's transport: what the CLI and the Python API call.

In-process, the suite runs here; with `transport = "flower"`, Flower's simulation engine starts and
its ServerApp runs the same suite over its Grid. Transports never import this module back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedistill.config import RunConfig, read_config
from fedistill.engine.setup import Prepared, validate_setup
from fedistill.engine.suite import run_algorithms
from fedistill.errors import ConfigError


def run_suite(
    config: RunConfig,
    suite_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    data: Prepared | None = None,
) -> list[dict[str, Any]]:
    """Run every algorithm named in the config side by side on the same partition, on the config's
    transport. The setup is validated before anything is written (`validate_setup`, or the caller
    passes the `data` it validated)."""
    data = validate_setup(config) if data is None else data
    if config.transport == "flower":
        try:
            from fedistill.engine.flower.simulation import run_simulation_suite
        except ImportError:
            raise ConfigError(
                "transport = flower needs Flower: pip install -e '.[flower]' (or fedistill[flower])"
            ) from None
        return run_simulation_suite(config, suite_dir, resume=resume, progress=progress)
    return run_algorithms(config, suite_dir, data, resume=resume, progress=progress)


def resume_suite(suite_dir: Path, *, progress: bool = True) -> list[dict[str, Any]]:
    """Resume the suite in `suite_dir` from its config.toml and latest checkpoints; ConfigError if it is not
    one."""
    if not (suite_dir / "config.toml").is_file():
        raise ConfigError(f"{suite_dir} is not a run directory (no config.toml); nothing to resume")
    return run_suite(read_config(suite_dir / "config.toml"), suite_dir, resume=True, progress=progress)
