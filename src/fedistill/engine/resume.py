"""Where a killed run can go on from: the newest checkpoint that is intact and that the streamed
records (metrics.jsonl, ledger.jsonl) fully cover.

Checkpoints carry a manifest of sha256 digests (checkpoint.py), and the two newest are kept. A damaged
newest checkpoint, or one whose rounds the metrics or the ledger lost, falls back to the one before
with a warning; when none is usable the resume is refused with a message, never restarted silently.
Each checkpoint records the settings it was written under, and a config.toml edited since is refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from fedistill.algorithms.registry import ALGORITHMS
from fedistill.config import RunConfig, read_config
from fedistill.engine.checkpoint import (
    DamagedCheckpoint,
    checkpoints,
    latest_checkpoint,
    load_state,
    verify_checkpoint,
)
from fedistill.errors import ConfigError, RunDirError

log = logging.getLogger(__name__)


def intact_lines(path: Path) -> int:
    """How many leading lines of a JSON-lines file are complete records (a torn last line is not)."""
    if not path.is_file():
        return 0
    count = 0
    for line in path.read_bytes().split(b"\n"):
        if not line.strip():
            break
        try:
            json.loads(line)
        except ValueError:
            break
        count += 1
    return count


def resume_point(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume `run_dir` from and its state; None when the run never checkpointed."""
    directory = run_dir / "checkpoints"
    found = checkpoints(directory)
    rows = {
        "metrics": intact_lines(run_dir / "metrics.jsonl"),
        "ledger": intact_lines(run_dir / "ledger.jsonl"),
    }
    problems: list[str] = []
    for path in found:
        try:
            state = verify_checkpoint(path)
        except DamagedCheckpoint as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        runner = state["runner"]
        short = [f"{name}.jsonl holds {rows[name]} records, the checkpoint needs {runner[name]}"
                 for name in rows if int(runner[name]) > rows[name]]  # fmt: skip
        if short:
            problems.append(f"{path.name}: {'; '.join(short)}")
            continue
        if problems:
            log.warning(
                "%s: resuming from %s (round %d): %s",
                run_dir,
                path.name,
                int(runner["round"]),
                "; ".join(problems),
            )
        return path, state
    if found or (directory / "latest").is_file():
        what = "; ".join(problems) if problems else "the checkpoint folders are gone"
        raise RunDirError(
            f"{run_dir} cannot be resumed without losing rounds ({what}); "
            "start the run again under another --name"
        )
    return None


def warn_of_changes(name: str, runner: dict[str, Any], machines: list[str], codes: list[str]) -> None:
    """A resumed run whose machine or code is not the one it stopped on says so: its later rounds may
    round (another core count, kernel path) or compute (another code) differently from an uninterrupted
    run's; the summary lists each in `machine_history` and `code_history`."""
    for what, history, now in (
        ("ran on", runner.get("machines"), machines),
        ("ran code", runner.get("codes"), codes),
    ):
        if history and history[-1] != now[-1]:
            log.warning(
                "%s %s %s until round %d and continues with %s: its later rounds may differ from an "
                "uninterrupted run's (the summary lists both)",
                name, what, history[-1], runner["round"], now[-1],
            )  # fmt: skip


#: What a resume may change: where the run computes, where its folder and data are, what it logs to, and
#: how long and for how many sites it waits (the fixes after a stop for too few answers).
RESUME_MAY_CHANGE = ("device", "out", "name", "data_dir", "site_data_dir", "download", "cache_dir", "track",
                     "timeout", "min_clients", "connect_timeout")  # fmt: skip


def resumable_settings(config: RunConfig) -> dict[str, Any]:
    """The config a checkpoint was written under (as JSON reads it back), less what a resume may change."""
    settings = {k: v for k, v in config.to_dict().items() if k not in RESUME_MAY_CHANGE}
    return json.loads(json.dumps(settings, default=str))


def check_same_settings(run_dir: Path, saved: dict[str, Any] | None, config: RunConfig) -> None:
    """ConfigError naming the keys when config.toml no longer says what the checkpoint was written under
    (an edited file would go on with other settings, silently), nor the algorithm's own config.toml (the
    one its models are loaded with); checkpoints that predate the record pass."""
    if saved is None:
        return
    own = run_dir / "config.toml"
    for where, now in ((f"{run_dir}: config.toml", config), (str(own), own)):
        if isinstance(now, Path):
            if not now.is_file():
                continue
            now = read_config(now)
        changed = _changed(saved, now, config.algorithm)
        if changed:
            raise ConfigError(
                f"{where} differs from the settings its checkpoint was written under "
                f"({', '.join(changed)}); a resume continues with those (it may change only "
                f"{', '.join(RESUME_MAY_CHANGE)}): undo the edit, or start a new run under another --name"
            )


def _changed(saved: dict[str, Any], config: RunConfig, algorithm: str) -> list[str]:
    """The keys whose values `config` and a checkpoint's record differ in, this algorithm's alone: another
    algorithm's table (`[fedprox] mu` for FedAvg's run) is none of its settings."""
    others = set(ALGORITHMS) - {algorithm}
    then, now = ({k: v for k, v in s.items() if k not in others} for s in (saved, resumable_settings(config)))
    return sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))


def check_finished_settings(run_dir: Path, config: RunConfig) -> None:
    """`check_same_settings` for an algorithm that finished: its last checkpoint's record against config.toml,
    so that a resume does not hand back the old summary under a config that says otherwise (more rounds,
    another lr). A run without a readable checkpoint (one stopped before its first) passes."""
    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        return
    try:
        runner = load_state(latest / "runner")
    except Exception:  # a damaged checkpoint of a finished run: its summary stands on its own
        return
    check_same_settings(run_dir, runner.get("settings") if isinstance(runner, dict) else None, config)
