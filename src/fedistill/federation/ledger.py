"""The ledger: one JSON line per message that crossed the boundary, and totals per client and kind.

It is what makes a privacy claim checkable: "no parameters left any client" is a sum over this file.
Bytes are those that crossed the wire: a kind sent in a wire encoding (encodings.py) counts its encoded
size, and its record names the encoding under `encodings` (absent when every array went as built, as in
every ledger written before encodings existed).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedistill.federation.messages import Message

DOWN = "server->client"
UP = "client->server"


@dataclass
class Totals:
    """Bytes and message counts, keyed by (direction, client, kind), and the wire encodings seen per
    (direction, kind)."""

    bytes: dict[tuple[str, int, str], int] = field(default_factory=lambda: defaultdict(int))
    messages: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    failures: list[dict[str, Any]] = field(default_factory=list)
    encodings: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))

    def add(self, record: dict[str, Any]) -> None:
        """Count one ledger record: its bytes per kind, its message, and its failure if it has one."""
        key = (record["direction"], record["client"])
        self.messages[key] += 1
        for kind, size in record["kinds"].items():
            self.bytes[(record["direction"], record["client"], kind)] += size
        for kind, encoding in record.get("encodings", {}).items():
            self.encodings[(record["direction"], kind)].update(encoding.split("+"))
        if record["status"] != "ok":
            self.failures.append(
                {k: record[k] for k in ("round", "step", "client", "type", "status", "error")}
            )

    def sent_by_clients(self, kind: str | None = None) -> int:
        """Bytes the clients sent, of one content kind or of every kind."""
        return sum(v for (d, _, k), v in self.bytes.items() if d == UP and (kind is None or k == kind))

    def summary(self) -> dict[str, Any]:
        """Per direction, per client and per kind bytes; what summary.json shows."""
        out: dict[str, Any] = {}
        for direction in (UP, DOWN):
            per_client: dict[str, dict[str, int]] = {}
            per_kind: dict[str, int] = defaultdict(int)
            for (d, client, kind), size in sorted(self.bytes.items()):
                if d != direction:
                    continue
                per_client.setdefault(str(client), {})[kind] = size
                per_kind[kind] += size
            out[direction] = {
                "total_bytes": sum(per_kind.values()),
                "per_kind": dict(per_kind),
                "per_client": per_client,
                "messages": sum(n for (d, _), n in self.messages.items() if d == direction),
            }
            encodings = {
                k: "+".join(sorted(e)) for (d, k), e in sorted(self.encodings.items()) if d == direction
            }
            if encodings:  # only runs that encoded something: other summaries stay as they were
                out[direction]["encodings"] = encodings
        out["failures"] = self.failures
        return out


class Ledger:
    """Appends one record per message to `ledger.jsonl` (when a path is given) and keeps running totals."""

    def __init__(self, path: Path | None = None, *, resume_at: int | None = None) -> None:
        self.path = path
        self.totals = Totals()
        self.count = 0
        self._file: IO[str] | None = None
        if path is not None:
            if resume_at is not None and path.exists():
                self._replay(path, resume_at)
                self._file = path.open("a", encoding="utf-8")
            else:
                self._file = path.open("w", encoding="utf-8")

    def _replay(self, path: Path, keep: int) -> None:
        """Resume: keep the first `keep` records (those before the checkpoint), drop the rest."""
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[:keep]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        for line in lines:
            self.totals.add(json.loads(line))
        self.count = len(lines)

    def record(
        self,
        *,
        round: int,
        step: int | None,
        direction: str,
        client: int,
        message: Message | None,
        type: str,
        status: str = "ok",
        error: str | None = None,
    ) -> None:
        """Append one message (or a failed reply, `message` None) to the ledger and the totals."""
        kinds = message.bytes_by_kind() if message is not None else {}
        encodings = message.encodings_by_kind() if message is not None else {}
        record: dict[str, Any] = {
            "seq": self.count,
            "round": round,
            "step": step,
            "direction": direction,
            "client": client,
            "type": type,
            "kinds": kinds,
            "bytes": sum(kinds.values()),
            "status": status,
        }
        if encodings:
            record["encodings"] = encodings
        if error is not None:
            record["error"] = error
        self.totals.add(record)
        self.count += 1
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        """Push the records written so far to disk (a checkpoint's ledger must be complete)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Close the ledger file; the totals stay readable."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every record of a `ledger.jsonl`, in order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
