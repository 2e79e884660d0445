"""The folder a `fedistill run` writes: which names make one, when it holds a run, and its lock.

Two processes must never write one run: each run and each `--resume` holds an exclusive lock on
`<run>/.lock` for as long as it writes, released by the operating system when the process ends, even
on `kill -9`. A second process gets a clear message instead of garbling the first one's files, and a
reader of an unfinished run (`still_running`) says it is being trained rather than advising `--resume`.
"""

from __future__ import annotations

import itertools
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from fedistill import disk
from fedistill.errors import ConfigError, RunDirError

LOCK = ".lock"
OWNER = ".lock-owner"


def check_name(name: str) -> None:
    """A run name is one plain folder name under --out, never a path."""
    if not name:
        return
    if name in (".", "..") or "/" in name or os.sep in name or (os.altsep and os.altsep in name):
        raise RunDirError(
            f"--name {name!r} must be one plain folder name (no '/', not '.' or '..'); "
            "put the parent folder in --out"
        )


def run_started(suite_dir: Path) -> bool:
    """Whether `suite_dir` holds a run that did some work (a checkpoint, a summary or a metrics row).

    A folder whose run failed before its first round holds none, and a new run may take its name."""
    try:
        return _did_work(suite_dir)
    except OSError:  # a name too long for the file system, a file in the way: `create` says which
        return False


def _did_work(suite_dir: Path) -> bool:
    if not (suite_dir / "config.toml").is_file():
        return False
    return any(_algorithm_did_work(child) for child in suite_dir.iterdir() if child.is_dir())


def _algorithm_did_work(folder: Path) -> bool:
    """Whether one algorithm's folder holds work: a summary, a checkpoint or a metrics row."""
    if (folder / "summary.json").is_file() or (folder / "checkpoints" / "latest").is_file():
        return True
    metrics = folder / "metrics.jsonl"
    return metrics.is_file() and metrics.stat().st_size > 0


def resume_target(path: Path) -> Path:
    """The suite folder `--resume PATH` means, or a message saying what PATH is and what to pass."""
    if not path.is_dir():
        raise RunDirError(f"{path} is not a folder; pass the run directory that `fedistill run` printed")
    parent = path.parent
    if (parent / "config.toml").is_file() and (
        (path / "metrics.jsonl").exists() or path.name in _algorithms_of(parent / "config.toml")
    ):
        raise RunDirError(
            f"{path} is the {path.name} folder of the run {parent}; resume the run: --resume {parent}"
        )
    if not (path / "config.toml").is_file():
        raise RunDirError(f"{path} is not a run directory (no config.toml); nothing to resume")
    return path


def check_algorithms_kept(suite_dir: Path, algorithms: list[str]) -> None:
    """Before a `--resume`: ConfigError when config.toml no longer names an algorithm whose folder holds a
    run (its config.toml and some work), instead of going on without it and leaving a folder that
    `fedistill summary` no longer shows. An algorithm added to the list has no folder yet: it runs; the
    folders of an earlier run under this name that never did any work are not this run's."""
    dropped = [
        child.name
        for child in sorted(suite_dir.iterdir())
        if child.name not in algorithms and (child / "config.toml").is_file() and _algorithm_did_work(child)
    ]
    if dropped:
        whose = "whose folder holds its run" if len(dropped) == 1 else "whose folders hold their runs"
        raise ConfigError(
            f"{suite_dir}: config.toml no longer names {', '.join(dropped)}, {whose} (algorithm = "
            f"{','.join(algorithms)!r}); a resume continues with the algorithms the run started with: undo "
            "the edit, or start a new run under another --name"
        )


def _algorithms_of(config_file: Path) -> list[str]:
    """The algorithms a run's config.toml names (none when it cannot be read): an algorithm's folder inside a
    run has a config.toml of its own, and no metrics.jsonl before its first round."""
    try:
        with config_file.open("rb") as file:
            value = tomllib.load(file).get("algorithm", "")
    except (OSError, ValueError):
        return []
    return [name.strip() for name in value.split(",")] if isinstance(value, str) else []


def _unwritable(folder: Path) -> str | None:
    """Why `folder` cannot be written (a few words), or None when a probe file can be written there."""
    try:
        probe = folder / f".write-test-{os.getpid()}"  # two processes probing at once: one file each
        disk.write_bytes(probe, b"")
        probe.unlink()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def claim(base: Path) -> Path:
    """The first of `base`, `base-2`, `base-3`, ... that this call creates (a default name is the second a
    run started: a loop of short runs, or two processes, start several in one); on another error, `base`,
    whose `create` says why it cannot be written."""
    for count in itertools.count(1):
        candidate = base if count == 1 else base.with_name(f"{base.name}-{count}")
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError:
            return base
        return candidate
    raise AssertionError("unreachable")


def create(suite_dir: Path) -> None:
    """Create the run folder, or say in one line why it cannot be written."""
    try:
        suite_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason: str | None = exc.strerror or type(exc).__name__
    else:
        reason = _unwritable(suite_dir)
    if reason is not None:
        raise RunDirError(
            f"cannot write the run directory {suite_dir}: {reason}; choose another --out or --name"
        )


def check_creatable(suite_dir: Path) -> None:
    """`create`'s refusal without creating anything (a dry run): the nearest existing folder on the way to
    `suite_dir` is one this process may write."""
    existing = suite_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    reason = _access_denied(existing) if existing.is_dir() else "Not a directory"
    if reason is not None:
        raise RunDirError(
            f"cannot write the run directory {suite_dir}: {reason}; choose another --out or --name"
        )


def _access_denied(folder: Path) -> str | None:
    """ "Permission denied" when this process may not create files in `folder`, else None; writes nothing."""
    return None if os.access(folder, os.W_OK | os.X_OK) else "Permission denied"


def check_writable(suite_dir: Path, *, probe: bool = True) -> None:
    """Before a `--resume`: the run folder and its algorithms' folders can be written, or one line saying
    which cannot and what to do. `probe`: by writing a file in each (a read-only mount shows only then);
    else by their permissions alone (a dry run)."""
    for folder in [suite_dir, *(d for d in sorted(suite_dir.iterdir()) if (d / "config.toml").is_file())]:
        reason = _unwritable(folder) if probe else _access_denied(folder)
        if reason is not None:
            raise RunDirError(
                f"cannot resume {suite_dir}: {folder} cannot be written ({reason}); make it writable, "
                "or copy the run to a writable place and --resume the copy"
            )


@contextmanager
def locked(suite_dir: Path) -> Iterator[None]:
    """Hold the run's lock while the body writes it; RunDirError when another process holds it."""
    lock = FileLock(str(suite_dir / LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise _being_written(suite_dir) from None
    try:
        disk.write_text(suite_dir / OWNER, str(os.getpid()))
        yield
    finally:
        lock.release()


def _being_written(suite_dir: Path) -> RunDirError:
    """The refusal of a run folder whose lock another process holds."""
    return RunDirError(
        f"{suite_dir} is being written by another fedistill process (pid {_owner(suite_dir) or '?'}); "
        "wait for it to finish, or stop it and continue with --resume"
    )


def check_unlocked(suite_dir: Path) -> None:
    """`locked`'s refusal without taking the lock or writing anything (a dry run of a resume)."""
    if still_running(suite_dir) is not None:
        raise _being_written(suite_dir)


def still_running(suite_dir: Path) -> str | None:
    """'it is still running (pid N); wait for it to finish' while a live process holds the run's lock;
    None when none does (no lock, or a stale one a killed process left), and `--resume` finishes the run.

    The probe takes a shared lock on a read-only descriptor: it writes nothing, works on a read-only copy,
    and a lock file the file system cannot lock reads as not held."""
    path = suite_dir / LOCK
    try:
        if not path.is_file() or not _held(path):
            return None
        owner = _owner(suite_dir)
    except OSError:
        return None
    by = f"pid {owner}" if owner else "another process holds its lock"
    return f"it is still running ({by}); wait for it to finish"


def _owner(suite_dir: Path) -> str:
    """The process id the lock's holder wrote beside it; "" when none is recorded."""
    owner = suite_dir / OWNER
    return owner.read_text(encoding="utf-8").strip() if owner.is_file() else ""


def _held(path: Path) -> bool:
    """Whether another open lock of `path` holds it now."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): try the writers' own lock, and let it go at once
        lock = FileLock(str(path), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return True
        lock.release()
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets the shared lock go
    return False
