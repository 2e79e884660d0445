"""Experiment tracking: a run streamed, as it goes, to TensorBoard and/or MLflow (`track` in the config).

The run directory stays the record; a tracker is a live view of it. The run loop hands `Tracking` each
metrics row right after it flushed the ledger, and `Tracking` reads that round's traffic from
`ledger.jsonl` itself, so a tracker shows exactly the bytes the ledger wrote. This module imports
neither TensorBoard nor MLflow: `trackers_for` imports the ones a config names, and only then.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from fedistill.config import RunConfig, tracker_names
from fedistill.engine.tracking_values import Communication, traffic_by_round
from fedistill.errors import ConfigError

log = logging.getLogger("fedistill")


class Tracker(Protocol):
    """Where a run is streamed: one run of the tracker per algorithm of a suite."""

    def start(self, config: RunConfig, run_dir: Path, *, resume: bool = False) -> None:
        """Open (or, for a resumed run, reopen) the tracker's run; log the resolved config."""

    def log_round(self, row: dict[str, Any], communication: Communication) -> None:
        """One metrics row, at step = its round, with that round's traffic."""

    def finish(self, summary: dict[str, Any], run_dir: Path) -> None:
        """The final metrics, the results table, the plots and a model card if there is one; close."""

    def abort(self) -> None:
        """The run failed or was interrupted: close, leaving the run open to `--resume`."""


def trackers_for(config: RunConfig) -> list[Tracker]:
    """The trackers `config.track` names, not yet started; none (and no import) when it is empty."""
    trackers: list[Tracker] = []
    for name in tracker_names(config.track):
        if name == "tensorboard":
            from fedistill.engine.tracking_tensorboard import TensorBoardTracker

            trackers.append(TensorBoardTracker())
        elif name == "mlflow":
            from fedistill.engine.tracking_mlflow import MlflowTracker

            trackers.append(MlflowTracker())
        else:  # config.validate refuses these; a hand-built RunConfig may not have been validated
            raise ConfigError(f"track = {config.track!r}: unknown tracker {name!r}")
    return trackers


def start_tracking(config: RunConfig, run_dir: Path, *, resume: bool = False) -> Tracking | None:
    """The run's tracking, started after the ledger was opened (it reads on from there); None untracked.
    `resume`: the run goes on from where an earlier start of it stopped (a checkpoint, or round 1 again)."""
    if not config.track:
        return None
    trackers = trackers_for(config)
    tracking = Tracking(trackers, run_dir / "ledger.jsonl")
    for count, tracker in enumerate(trackers):
        try:
            tracker.start(config, run_dir, resume=resume)
        except BaseException:
            # those started before it are closed (an MLflow run is not left RUNNING), then the error goes on
            Tracking(trackers[:count], tracking.ledger.path).abort()
            raise
    return tracking


class Tracking:
    """The trackers of one algorithm's run, fed from the run loop."""

    def __init__(self, trackers: list[Tracker], ledger_path: Path) -> None:
        self.trackers = trackers
        self.ledger = LedgerTail(ledger_path)
        self.closed = False

    def log_round(self, row: dict[str, Any]) -> None:
        """Call after `ledger.flush()`: traffic recorded before round 1 (set-up) goes to step 0."""
        traffic = self.ledger.read_by_round()
        for tracker in list(self.trackers):
            try:
                for round in sorted(r for r in traffic if r != row["round"]):
                    tracker.log_round({"round": round}, traffic[round])
                tracker.log_round(row, traffic.get(row["round"], {}))
            except Exception as exc:
                self._drop(tracker, exc)

    def finish(self, summary: dict[str, Any], run_dir: Path) -> None:
        """Traffic after the last round's flush (a final evaluation) is not logged per round: it is in
        the summary's totals, which each tracker logs under `final/bytes/`."""
        for tracker in list(self.trackers):
            try:
                tracker.finish(summary, run_dir)
            except Exception as exc:
                self._drop(tracker, exc)
        self.closed = True

    def _drop(self, tracker: Tracker, exc: Exception) -> None:
        """A tracker that failed (its server went away, its disk filled) is closed and left out, with a
        warning: it is a live view, the run directory is the record, so the run goes on without it."""
        self.trackers.remove(tracker)
        log.warning("%s stopped tracking this run: %s; the run goes on, its record is the run directory",
                    _name(tracker), exc)  # fmt: skip
        try:
            tracker.abort()
        except Exception as again:
            log.warning("could not close %s: %s", _name(tracker), again)

    def abort(self) -> None:
        """Close every tracker; a tracker failing here must not hide why the run stopped."""
        if not self.closed:
            self.closed = True
            for tracker in self.trackers:
                try:
                    tracker.abort()
                except Exception as exc:
                    log.warning("could not close %s: %s", _name(tracker), exc)


def _name(tracker: Tracker) -> str:
    """The tracker as `track` names it (`MlflowTracker`: mlflow)."""
    return type(tracker).__name__.removesuffix("Tracker").lower()


class LedgerTail:
    """Reads the records appended to `ledger.jsonl` since the last read (or since it was opened)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read_by_round(self) -> dict[int, Communication]:
        """The bytes sent per round, direction and kind in the ledger records appended since the last read; a
        line still being written waits for the next read."""
        if not self.path.exists():
            return {}
        with self.path.open("rb") as file:
            file.seek(self.offset)
            text = file.read()
        complete = text[: text.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self.offset += len(complete)
        return traffic_by_round(complete.decode("utf-8").splitlines())
