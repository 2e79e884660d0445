"""The Python API: run experiments, read their results, load the models they trained.

    import fedistill

    result = fedistill.run(algorithm="fedavg", rounds=1, out="runs", name="a", quiet=True)
    result["fedavg"].final["test_accuracy"]          # the run's final metrics
    result.table()                                    # the rows `fedistill summary` prints
    model = fedistill.load_model(result.run_dir, "fedavg")
    model.predict(images)                             # class ids, masks or images

`run` takes the keys of the command line and of a config file: common keys (`rounds=2`), dotted keys
(`**{"fediod.rounds": 2}`) and tables (`fediod={"rounds": 2}`), layered over a TOML file given as
`config`. It validates the setup before writing anything and holds the run directory's lock, exactly as
`fedistill run` does; mistakes raise `fedistill.errors.UserError` subclasses with a one-line message.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from fedistill.config import RunConfig, build_config, load_toml
from fedistill.errors import ConfigError, UserError
from fedistill.inference import RunResult, TrainedModel, load_model, read_run

__all__ = ["RunResult", "TrainedModel", "load_model", "resume_run", "run", "start_run", "summary"]

log = logging.getLogger("fedistill")

#: What `run()` runs when given no experiment keys: the main job on the embedded digits data.
DEMO_CONFIG = Path(__file__).parent / "engine" / "demo.toml"
#: Keys that say where and how a run goes, not what it runs: with only these, `run()` runs the demo.
PLACEMENT_KEYS = frozenset({"out", "name", "transport", "device", "track"})


def run(
    config: str | Path | RunConfig | None = None,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    **keys: Any,
) -> RunResult:
    """Run every algorithm the keys name side by side and return their results.

    `config`: a TOML file (or a RunConfig) the keys are layered over; with neither a config nor any
    experiment key, the demo runs. `quiet`: no progress bars. `resume`: a run directory to continue
    from its last checkpoint with its saved config.toml (only `device` may change). Keys set to None
    are left out, as flags that are not given; a folder (`out`, `data_dir`, ...) may be a Path."""
    keys = {key: value for key, value in keys.items() if value is not None}
    if resume is not None:
        device = keys.pop("device", None)
        if keys or config is not None:
            raise UserError(
                "resume continues with the run's saved config.toml; drop the other keys "
                f"({', '.join(sorted(keys)) or 'config'}) (only device may change: a run resumes anywhere)"
            )
        return read_run(resume_run(resume, device=device, progress=not quiet))
    return read_run(start_run(run_config(config, keys), progress=not quiet))


def summary(run_dir: str | Path) -> RunResult:
    """The results of a finished run directory (or of one algorithm's folder of one)."""
    return read_run(run_dir, stacklevel=3)


def run_config(config: str | Path | RunConfig | None, keys: dict[str, Any]) -> RunConfig:
    """The run's config: the defaults (or the demo's, when nothing says what to run), the file, the keys."""
    if config is not None and not isinstance(config, str | Path | RunConfig):
        raise ConfigError(
            f"config must be a TOML file's path or a RunConfig, not {type(config).__name__} ({config!r})"
        )
    from fedistill.engine.key_homes import key_homes

    keys = {key: _as_text(value) for key, value in keys.items()}
    base = config if isinstance(config, RunConfig) else RunConfig()
    layers: list[dict[str, Any]] = []
    if config is None and not set(keys) - PLACEMENT_KEYS:
        log.info("no experiment keys given, running the demo: %s", DEMO_CONFIG)
        layers.append(load_toml(DEMO_CONFIG))
    elif config is not None and not isinstance(config, RunConfig):
        layers.append(load_toml(config))
    return build_config(base, *layers, keys, homes=key_homes)


def _as_text(value: Any) -> Any:
    """A Path (any os.PathLike) as the text a config file holds, in a table's values too; others as given."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {key: _as_text(item) for key, item in value.items()}
    return value


def start_run(config: RunConfig, *, progress: bool = True) -> Path:
    """Run `config` in a new run directory (`out`/`name`) and return it (`engine.launch.start_suite`)."""
    from fedistill.engine.launch import start_suite

    hint = "pass resume='{dir}' or another name"
    return start_suite(config, progress=progress, resume_hint=hint)[0]


def resume_run(run_dir: str | Path, *, device: str | None = None, progress: bool = True) -> Path:
    """Continue a run directory from its last checkpoint and return it (`engine.launch.continue_suite`)."""
    from fedistill.engine.launch import continue_suite

    return continue_suite(Path(run_dir), device=device, progress=progress)[0]
