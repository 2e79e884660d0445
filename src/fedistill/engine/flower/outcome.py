"""What a run under `flwr run` leaves when it fails, where its user looks for it.

`flwr run` exits 0 whatever becomes of the run it submitted: its ServerApp runs in another process
(`flwr-serverapp`, or `flwr-simulation` for a local federation) and an exception there only marks the
run `finished:failed` in `flwr ls`, with the exception's message, and makes that process exit 1. So the
ServerApp (apps.py) lets every failure reach Flower, and, where the run already has its folder,
first writes `failure.json` there: `{"status": "refused" | "stopped", "error": one line}`. `refused`
is a user mistake (a bad value, a missing file), `stopped` anything that ended the run once started (a
site refused as implausible that left too few sites, a node that failed). A later run into the same
folder that finishes removes it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from fedistill import disk
from fedistill.errors import FederationError, UserError

FAILURE = "failure.json"
REFUSED = "refused"
STOPPED = "stopped"


def failure_record(exc: BaseException) -> dict[str, str]:
    """The record of the failure `exc`: its status and its message in one line (an unexpected error
    named by its type, as a traceback would)."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if isinstance(exc, UserError):
        return {"status": REFUSED, "error": message}
    if isinstance(exc, FederationError | OSError | KeyboardInterrupt):
        return {"status": STOPPED, "error": message or type(exc).__name__}
    return {"status": STOPPED, "error": f"{type(exc).__name__}: {message}".rstrip(": ")}


def record_failure(run_dir: Path | None, exc: BaseException) -> None:
    """Write `failure.json` into `run_dir` when the run made that folder; nothing otherwise (a mistake
    found before anything was written leaves no folder behind). Never raises: the failure is what counts."""
    if run_dir is None or not run_dir.is_dir():
        return
    with contextlib.suppress(OSError):
        disk.write_text(run_dir / FAILURE, json.dumps(failure_record(exc), indent=2) + "\n")


def clear_failure(run_dir: Path) -> None:
    """Remove an earlier failure's record once the run in `run_dir` finished."""
    (run_dir / FAILURE).unlink(missing_ok=True)


def recorded_failure(run_dir: Path) -> dict[str, Any] | None:
    """The failure a Flower run recorded in `run_dir`; None when there is none (or it cannot be read)."""
    try:
        record = json.loads((run_dir / FAILURE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "status" in record else None


def failure_exit_code(record: dict[str, Any]) -> int:
    """The exit code `fedistill` gives the same failure in its own process: 2 a mistake, 1 a stop."""
    return 2 if record.get("status") == REFUSED else 1


def failure_line(record: dict[str, Any]) -> str:
    """How the command line reports a recorded failure, as it reports one of its own runs."""
    if record.get("status") == REFUSED:
        return f"fedistill: error: {record.get('error', '')}"
    return f"fedistill: run stopped: {record.get('error', '')}"
