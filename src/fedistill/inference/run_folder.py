"""Finding one algorithm's folder in a run directory, with a one-line message for every way a path can
be the wrong one: not a folder, not a run, an algorithm the run does not hold, a run not finished.

A run directory (a suite) holds config.toml and one folder per algorithm, each with its own config.toml,
metrics.jsonl, summary.json and models/ (engine/rundir.py); either folder may be passed.
"""

from __future__ import annotations

from pathlib import Path

from fedistill.engine.suite_dir import still_running
from fedistill.errors import RunDirError


def is_algorithm_dir(path: Path) -> bool:
    """Whether `path` is one algorithm's folder of a run (not the run's own folder)."""
    started = (path / "metrics.jsonl").is_file() or (path / "summary.json").is_file()
    return started and (path.parent / "config.toml").is_file()


def is_run_root(path: Path) -> bool:
    """Whether `path` is a run's own folder: its config.toml and an algorithm's folder, and no algorithm's
    folder itself."""
    if not (path / "config.toml").is_file() or is_algorithm_dir(path):
        return False
    return any(is_algorithm_dir(child) for child in path.iterdir() if child.is_dir())


def algorithms_in(suite_dir: Path) -> list[str]:
    """The algorithms of a run that have a folder, in the run's order (its config.toml) where it reads."""
    present = sorted(child.name for child in suite_dir.iterdir() if is_algorithm_dir(child))
    order = planned_algorithms(suite_dir)
    return [name for name in order if name in present] + [name for name in present if name not in order]


def planned_algorithms(suite_dir: Path) -> list[str]:
    """The algorithms the run's config.toml names; none when it is missing or unreadable."""
    from fedistill.config import read_config
    from fedistill.errors import UserError

    try:
        return read_config(suite_dir / "config.toml").algorithms
    except (OSError, UserError):
        return []


def check_run_dir(path: Path) -> Path:
    """`path` as a run directory or one algorithm's folder of one; RunDirError saying what it is not."""
    if path.is_file():  # a model file, or an export of one: its run, where it lies inside one
        run = next((p for p in path.parents if is_run_root(p)), None)
        where = f"the run {run} that holds it" if run else "a run directory written by `fedistill run`"
        raise RunDirError(f"{path} is a file, not a run directory; pass {where}")
    if not path.is_dir():
        raise RunDirError(f"{path} is not a folder; pass a run directory written by `fedistill run`")
    if not (path / "config.toml").is_file():
        raise RunDirError(f"{path} is not a run directory (no config.toml); pass one `fedistill run` wrote")
    return path


def algorithm_dir(run_dir: str | Path, algorithm: str | None = None) -> Path:
    """The folder of `algorithm` in `run_dir` (a run, or one algorithm's folder of a run); `algorithm`
    may be left out when the run holds a single one."""
    path = check_run_dir(Path(run_dir))
    if is_algorithm_dir(path):
        if algorithm is not None and algorithm != path.name:
            raise RunDirError(
                f"{path} is the {path.name} folder of the run {path.parent}, not {algorithm}'s; "
                f"pass the run {path.parent}"
            )
        return path
    present = algorithms_in(path)
    if algorithm is None:
        # a run that plans more algorithms than have started (one killed early) holds more than it shows
        unstarted = [name for name in planned_algorithms(path) if name not in present]
        if not present:  # nothing to choose between
            plans = f" (it plans {', '.join(unstarted)})" if unstarted else ""
            advice = still_running(path) or f"finish the run with `fedistill run --resume {path}`"
            raise RunDirError(f"no algorithm has started in {path} yet{plans}; {advice}")
        if len(present) == 1 and not unstarted:
            return path / present[0]
        which = ", ".join(present)
        which += f"; not started: {', '.join(unstarted)}" if unstarted else ""
        count = len(present) + len(unstarted)
        raise RunDirError(
            f"{path} holds {count} algorithms ({which}); name the one to use (--algorithm, or "
            "load_model's second argument)"
        )
    if algorithm in present:
        return path / algorithm
    if algorithm in planned_algorithms(path):
        advice = still_running(path) or f"finish the run with `fedistill run --resume {path}`"
        raise RunDirError(f"{algorithm} has not started in {path} yet; {advice}")
    held = ", ".join(present) if present else "none"
    raise RunDirError(f"the run {path} holds no {algorithm!r} (it holds: {held})")


def finished_dir(run_dir: str | Path, algorithm: str | None = None) -> Path:
    """`algorithm_dir`, and RunDirError when that algorithm has not finished (no summary.json)."""
    path = algorithm_dir(run_dir, algorithm)
    if not (path / "summary.json").is_file():
        advice = still_running(path.parent) or f"finish it with `fedistill run --resume {path.parent}`"
        raise RunDirError(f"{path.name} in {path.parent} has not finished (no summary.json); {advice}")
    return path
