"""Starting a suite on the config's transport: what the CLI and the Python API call.

In-process, the suite runs here; with `transport = "flower"`, Flower's simulation engine starts and
its ServerApp runs the same suite over its Grid. Transports never import this module back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedistill.config import RunConfig, read_config
from fedistill.engine import suite_dir as folder
from fedistill.engine.setup import Prepared, canonical_dataset, validate_setup
from fedistill.engine.suite import default_name, run_algorithms
from fedistill.errors import ConfigError, RunDirError


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
    config = canonical_dataset(config)  # config.toml and the summaries name the dataset one way
    if resume:
        folder.check_algorithms_kept(suite_dir, config.algorithms)
    data = validate_setup(config, resume=resume, simulation=True) if data is None else data
    check_transport(config)
    if config.transport == "flower":
        from fedistill.engine.flower.simulation import run_simulation_suite

        return run_simulation_suite(config, suite_dir, resume=resume, progress=progress)
    return run_algorithms(config, suite_dir, data, resume=resume, progress=progress)


def check_transport(config: RunConfig) -> None:
    """ConfigError when the config's transport needs a package that is not installed (Flower)."""
    if config.transport != "flower":
        return
    try:
        import fedistill.engine.flower.simulation  # noqa: F401
    except ImportError:
        raise ConfigError(
            "transport = flower needs Flower: pip install -e '.[flower]' (or fedistill[flower])"
        ) from None


def resume_suite(suite_dir: Path, *, progress: bool = True) -> list[dict[str, Any]]:
    """Resume the suite in `suite_dir` from its config.toml and latest checkpoints; ConfigError if it is not
    one."""
    if not (suite_dir / "config.toml").is_file():
        raise ConfigError(f"{suite_dir} is not a run directory (no config.toml); nothing to resume")
    folder.check_writable(suite_dir)
    return run_suite(read_config(suite_dir / "config.toml"), suite_dir, resume=True, progress=progress)


Started = Callable[[Path], None]


def start_suite(
    config: RunConfig, *, progress: bool = True, resume_hint: str = "", started: Started | None = None
) -> tuple[Path, list[dict[str, Any]]]:
    """Run `config` in a new run directory (`out`/`name`, `~` standing for the home folder as it does for
    `data_dir`: a shell does not expand it inside `--out=~/runs` or a config file): the setup is validated
    before anything is written, and the directory's lock is held while the run writes it. `resume_hint`
    ends the message when the directory already holds a run (`{dir}` stands for it); `started` hears of
    the directory before the run begins."""
    config = canonical_dataset(config)  # the default name spells the dataset one way
    suite_dir = new_suite_dir(config, resume_hint)
    data = validate_setup(config, simulation=True)  # nothing is written before the setup is valid
    if not config.name:  # a run started in the same second may hold the default name: take the next
        suite_dir = folder.claim(suite_dir)
    folder.create(suite_dir)
    if started is not None:
        started(suite_dir)
    with folder.locked(suite_dir):
        return suite_dir, run_suite(config, suite_dir, progress=progress, data=data)


def new_suite_dir(config: RunConfig, resume_hint: str = "") -> Path:
    """Where a new run of `config` goes, `out`/`name` (a default name may still move to -2, -3, ... when the
    run starts): RunDirError when the name is no folder name, or names a folder that holds a run."""
    folder.check_name(config.name)
    suite_dir = Path(config.out).expanduser() / (config.name or default_name(config))
    if config.name and folder.run_started(suite_dir):
        hint = resume_hint.format(dir=suite_dir) or "resume it or choose another name"
        raise RunDirError(f"{suite_dir} already holds a run; {hint}")
    return suite_dir


def continue_suite(
    run_dir: Path, *, device: str | None = None, progress: bool = True, started: Started | None = None
) -> tuple[Path, list[dict[str, Any]]]:
    """Continue a run directory from its last checkpoint with its saved config.toml, on `device` if given
    (checkpoints load anywhere; the rest of the run stays as it was)."""
    suite_dir = folder.resume_target(Path(run_dir).expanduser())
    folder.check_writable(suite_dir)
    config = read_config(suite_dir / "config.toml")
    if device is not None:
        config = config.replace(device=device)
    data = validate_setup(config, resume=True, simulation=True)
    if started is not None:
        started(suite_dir)
    with folder.locked(suite_dir):
        return suite_dir, run_suite(config, suite_dir, resume=True, progress=progress, data=data)
