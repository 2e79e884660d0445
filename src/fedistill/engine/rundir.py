"""The run directory: where a run writes everything it produces, streamed as it goes.

config.toml  partition.npz  partition.json  metrics.jsonl  ledger.jsonl
checkpoints/  models/  plots/  summary.json  summary.md  run.log
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

from fedistill import disk


class MetricsWriter:
    """Appends one JSON line per round to metrics.jsonl and flushes it, so a crash loses nothing."""

    def __init__(self, path: Path, *, resume_at: int | None = None) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        if resume_at is not None and path.exists():  # the first rows only: a torn last line is dropped
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[:resume_at]
            self.rows = [json.loads(line) for line in lines]
            disk.write_text(path, "".join(json.dumps(r) + "\n" for r in self.rows))
            self._file: IO[str] = path.open("a", encoding="utf-8")
        else:
            self._file = path.open("w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        """Append one row, flushed at once; non-finite floats (at any depth) become null so the file stays
        valid JSON."""
        row = _finite_or_null(row)
        self.rows.append(row)
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        except OSError as exc:  # a full disk: say which file, as fedistill.disk's writers do
            raise disk.disk_error(exc, self.path) from exc

    def close(self) -> None:
        """Close the metrics file."""
        self._file.close()


def _finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float inside it (dicts and lists too) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, blank lines skipped."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON atomically (fedistill.disk)."""
    disk.write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
