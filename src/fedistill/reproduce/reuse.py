"""Which finished runs `--reuse` (and `fedistill reproduce`) may keep: only those this code made.

A run folder is named by its settings, not by the code that ran them, so a finished run from before a change
to the library (a preset's new default, a fixed loss) would otherwise stand in a table made after it. Each
summary records the fingerprint of the code that made it (`versions.code`, `fedistill.version`); a run with
another, or none, is set aside (its folder renamed `<name>.other-code-<fingerprint>`, nothing deleted) and
made again. Comments and docstrings are not part of the fingerprint, so editing them keeps every run.

`FEDISTILL_REUSE_OTHER_CODE=1` keeps such runs anyway, with a warning naming each: for a change the user
knows leaves the numbers alone (a refactoring, a new option off by default).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from fedistill.errors import RunDirError
from fedistill.version import code_fingerprint

log = logging.getLogger(__name__)

#: The environment variable that keeps finished runs whatever code made them.
KEEP_OTHER_CODE = "FEDISTILL_REUSE_OTHER_CODE"


def made_by(summary_path: Path) -> str | None:
    """The code fingerprint a summary records (None: none recorded, or the file does not read); a run
    resumed by other code than it began with, every fingerprint it ran with, joined by `+`."""
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    history = summary.get("code_history") if isinstance(summary, dict) else None
    if isinstance(history, list) and len(history) > 1:
        return "+".join(map(str, history))
    versions = summary.get("versions") if isinstance(summary, dict) else None
    return versions.get("code") if isinstance(versions, dict) else None


def current(summary_path: Path) -> bool:
    """Whether a finished run's summary is there and this code made it (nothing is moved)."""
    return summary_path.is_file() and made_by(summary_path) == code_fingerprint()


def set_aside(suite: Path, code: str | None) -> Path:
    """Rename the run folder `suite` out of the way (`<name>.other-code-<code>`, numbered if taken)."""
    base = f"{suite.name}.other-code-{code or 'unrecorded'}"
    target = suite.with_name(base)
    number = 1
    while target.exists():
        number += 1
        target = suite.with_name(f"{base}-{number}")
    try:
        suite.rename(target)
    except OSError as exc:
        raise RunDirError(
            f"{suite} was made by other code and cannot be set aside as {target.name} ({exc.strerror}); "
            f"move it away, or set {KEEP_OTHER_CODE}=1 to keep it"
        ) from exc
    return target


def kept(summaries: Iterable[Path]) -> bool:
    """Whether every summary in `summaries` exists and this code made it (or `FEDISTILL_REUSE_OTHER_CODE`
    keeps it). A run folder holding a summary another code made is set aside, so the caller runs it again
    in its place (the folder is the summary's grandparent: `<out>/<name>/<algorithm>/summary.json`)."""
    now, paths = code_fingerprint(), list(summaries)
    for path in paths:
        code = made_by(path) if path.is_file() else now
        if code == now:
            continue
        suite = path.parent.parent
        if os.environ.get(KEEP_OTHER_CODE, "") not in ("", "0"):
            log.warning("%s: kept, though made by other code (%s; this code: %s)", suite, code, now)
            continue
        if not (suite / "config.toml").is_file():  # not a run folder: nothing is renamed
            return False
        moved = set_aside(suite, code)
        log.warning(
            "%s was made by other code (%s; this code: %s): set aside as %s and run again "
            "(%s=1 keeps such runs)",
            suite,
            code or "no fingerprint recorded",
            now,
            moved.name,
            KEEP_OTHER_CODE,
        )
        return False
    return all(path.is_file() for path in paths)


def reusable(summary_path: Path, reuse: bool) -> bool:
    """`--reuse` was given and the run behind `summary_path` finished under this code (`kept`)."""
    return reuse and kept([summary_path])
