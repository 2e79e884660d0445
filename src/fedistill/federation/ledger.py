"""The ledger: one JSON line per message that crossed the boundary, and totals per client and kind.

It is what makes a privacy claim checkable: "no parameters left any client" is a sum over this file.
Bytes are those that crossed the wire: a kind sent in a wire encoding (encodings.py) counts its encoded
size, and its record names the encoding under `encodings` (absent when every array went as built, as in
every ledger written before encodings existed).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedistill.federation.messages import Message

DOWN = "server->client"
UP = "client->server"
#: The most records held for revision between flushes; past it the older half is written (a round of a
#: thousand sites' G-steps stays bounded in memory).
PENDING_LIMIT = 50_000


@dataclass
class Totals:
    """Bytes and message counts, keyed by (direction, client, kind), and the wire encodings seen per
    (direction, kind)."""

    bytes: dict[tuple[str, int, str], int] = field(default_factory=lambda: defaultdict(int))
    messages: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    failures: list[dict[str, Any]] = field(default_factory=list)
    encodings: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    _failure_seqs: list[int] = field(default_factory=list, repr=False)  # the failures' records, in order

    def add(self, record: dict[str, Any]) -> None:
        """Count one ledger record: its bytes per kind, its message, and its failure if it has one."""
        key = (record["direction"], record["client"])
        self.messages[key] += 1
        for kind, size in record["kinds"].items():
            self.bytes[(record["direction"], record["client"], kind)] += size
        for kind, encoding in record.get("encodings", {}).items():
            self.encodings[(record["direction"], kind)].update(encoding.split("+"))
        if record["status"] != "ok":
            self._failure_seqs.append(record["seq"])
            self.failures.append(_failure(record))

    def revise(self, record: dict[str, Any]) -> None:
        """Count a revised status of a record already added (its bytes and message stay as counted):
        its failure, now or no longer, in the place its `seq` gives it among the others."""
        at = bisect_left(self._failure_seqs, record["seq"])
        if at < len(self._failure_seqs) and self._failure_seqs[at] == record["seq"]:
            del self._failure_seqs[at], self.failures[at]
        if record["status"] != "ok":
            self._failure_seqs.insert(at, record["seq"])
            self.failures.insert(at, _failure(record))

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


def _failure(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in ("round", "step", "client", "type", "status", "error")}


class Ledger:
    """Appends one record per message to `ledger.jsonl` (when a path is given) and keeps running totals.

    Records reach the file at `flush` (every round, before a checkpoint) and `close`; until then one may
    still be revised (`revise`: a reply judged implausible once the round's replies are in, plausibility.py),
    so the file holds every message once, with its final status."""

    def __init__(self, path: Path | None = None, *, resume_at: int | None = None) -> None:
        self.path = path
        self.totals = Totals()
        self.count = 0
        self._file: IO[str] | None = None
        self._pending: list[str] = []  # the JSON lines of the records not yet written: the last of `count`
        if path is not None:
            if resume_at is not None and path.exists():
                self._replay(path, resume_at)
                self._file = path.open("a", encoding="utf-8")
            else:
                self._file = path.open("w", encoding="utf-8")

    def _replay(self, path: Path, keep: int) -> None:
        """Resume: keep the first `keep` records (those before the checkpoint), drop the rest.

        The file is cut in place, not rewritten: shrinking a file needs no free space, so a full disk
        cannot cost the records a resume needs (a rewrite emptied the file first and lost them)."""
        lines = path.read_bytes().splitlines(keepends=True)[:keep]
        with path.open("r+b") as file:
            file.truncate(sum(map(len, lines)))
            if lines and not lines[-1].endswith(b"\n"):  # the last record kept had no line end yet
                file.seek(0, 2)
                file.write(b"\n")
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
    ) -> int:
        """Append one message (or a failed reply, `message` None) to the ledger and the totals; its `seq`."""
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
        self._pending.append(json.dumps(record))
        if len(self._pending) > PENDING_LIMIT:
            self._write(len(self._pending) // 2)
        return record["seq"]

    def revise(self, seq: int, *, status: str, error: str | None) -> bool:
        """Give record `seq` another status and error (its bytes stay); False when it is already on disk."""
        first = self.count - len(self._pending)
        if not first <= seq < self.count:
            return False
        record = json.loads(self._pending[seq - first])
        record["status"] = status
        record.pop("error", None)
        if error is not None:
            record["error"] = error
        self._pending[seq - first] = json.dumps(record)
        self.totals.revise(record)
        return True

    def _write(self, n: int, *, flush: bool = False) -> None:
        """Write the first `n` pending records to the file (and push them to disk if `flush`); an OSError
        (a full disk) names the ledger file, as the run directory's other writers do."""
        if self._file is not None:
            try:
                self._file.write("".join(line + "\n" for line in self._pending[:n]))
                if flush:
                    self._file.flush()
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        del self._pending[:n]

    def flush(self) -> None:
        """Push every record so far to disk (a checkpoint's ledger must be complete)."""
        self._write(len(self._pending), flush=True)

    def close(self) -> None:
        """Write what is pending and close the ledger file; the totals stay readable."""
        self._write(len(self._pending), flush=True)
        if self._file is not None:
            self._file.close()
            self._file = None


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every record of a `ledger.jsonl`, in order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
