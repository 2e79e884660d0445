"""The fleet: how server logic reaches clients. Transports (in-process, Flower) implement it.

Server logic only ever sees client ids and replies; it never holds a client object. A reply is
either a message or an error (the client failed or did not answer in time), as in Flower's Grid.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fedistill.errors import FederationError
from fedistill.federation.ledger import DOWN, UP, Ledger
from fedistill.federation.messages import Message
from fedistill.federation.reply_spec import Expectation, spec_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """One client's answer to one request: its message, or the error that took its place."""

    client: int
    message: Message | None
    error: str | None = None  # set when the client failed or timed out
    # what arrived when it failed the receipt checks (NaN, oversize): for the ledger's bytes only
    received: Message | None = None

    @property
    def ok(self) -> bool:
        """Whether the client answered with a valid message."""
        return self.message is not None


class Fleet(ABC):
    """Send requests to clients and gather their replies, recording every message in the ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.round = 0  # set by the run loop; stamped on every ledger record
        self.dropped: dict[int, str] = {}  # client -> why it was dropped (first failure)
        # where a send's time goes: inside client handlers, and the rest of the send (transport:
        # checks on receipt, ledger, and for networked transports serialisation and the network)
        self.seconds_in_clients = 0.0
        self.seconds_in_transport = 0.0
        self._reply_seq: dict[int, int] = {}  # client -> the ledger seq of its latest reply's record

    @property
    @abstractmethod
    def clients(self) -> list[int]:
        """The ids of the clients this fleet can reach, in a fixed order."""

    @abstractmethod
    def send(
        self,
        requests: Mapping[int, Message],
        *,
        step: int | None = None,
        timeout: float | None = None,
        expect: Expectation = None,
    ) -> dict[int, Reply]:
        """Deliver one request per client and return one reply per client (message or error).

        `expect` (reply_spec.py) declares what a valid reply holds; a reply that does not match becomes
        an error reply naming what was wrong, exactly as a client that failed."""

    def broadcast(
        self,
        message: Message,
        clients: Iterable[int] | None = None,
        *,
        step: int | None = None,
        timeout: float | None = None,
        expect: Expectation = None,
    ) -> dict[int, Reply]:
        """Send the same message to `clients` (default: every client); one reply per client."""
        targets = self.clients if clients is None else list(clients)
        return self.send(dict.fromkeys(targets, message), step=step, timeout=timeout, expect=expect)

    def reject(
        self, replies: Mapping[int, Reply], faults: Mapping[int, str], step: int | None = None
    ) -> dict[int, Reply]:
        """`replies` with those of `faults`' clients turned into failed replies, as an invalid reply is.

        For checks that judge a round's replies together (plausibility.py), after the transport recorded
        each as received: that record becomes the verdict, status `invalid` with the reply's bytes (they
        crossed the boundary), and the client is marked as dropped."""
        kept = dict(replies)
        for client, why in faults.items():
            received = replies[client].message
            if received is None:
                continue
            reply = Reply(client, None, f"invalid reply: {received.type}: implausible {why}")
            seq = self._reply_seq.get(client)
            if seq is None or not self.ledger.revise(seq, status="invalid", error=reply.error):
                # its record already reached the disk (a very long round): the verdict is a record of its own
                self.ledger.record(
                    round=self.round,
                    step=step,
                    direction=UP,
                    client=client,
                    message=None,
                    type=received.type,
                    status="invalid",
                    error=reply.error,
                )
            self.note_failure(reply)
            kept[client] = reply
        return kept

    def note_failure(self, reply: Reply) -> None:
        """Mark the client of a failed reply as dropped, with the round and the error; the run's log says
        so the first time, on every transport (the ledger and summary keep every failure)."""
        if reply.client not in self.dropped:
            log.warning("client %d dropped in round %d: %s", reply.client, self.round, reply.error)
        self.dropped.setdefault(reply.client, f"round {self.round}: {reply.error}")

    # --- what every transport writes to the ledger ------------------------------------------------
    def record_request(self, client: int, request: Message, step: int | None) -> None:
        """Record a request in the ledger before it is delivered."""
        self.ledger.record(
            round=self.round, step=step, direction=DOWN, client=client, message=request, type=request.type
        )

    def record_reply(
        self, reply: Reply, request_type: str, step: int | None, expect: Expectation = None
    ) -> Reply:
        """Record the reply's bytes per kind, or its failure (which also marks the client as dropped).

        A reply that does not match `expect` is recorded with its bytes as `invalid` and comes back as
        a failed reply; the caller keeps what this returns."""
        received, spec = reply.message, spec_for(expect, reply.client)
        if received is not None and spec is not None:
            try:
                spec.check(received)
            except FederationError as exc:
                reply = Reply(reply.client, None, f"invalid reply: {exc}")
        error = reply.error or ""
        status = "ok" if reply.ok else "timeout" if error.startswith("timed out") else "failed"
        if error.startswith("invalid"):
            status = "invalid"
        self._reply_seq[reply.client] = self.ledger.record(
            round=self.round,
            step=step,
            direction=UP,
            client=reply.client,
            message=received or reply.received,  # an invalid reply's bytes crossed the boundary too
            type=request_type,
            status=status,
            error=reply.error,
        )
        if not reply.ok:
            self.note_failure(reply)
        return reply


def successful(
    replies: Mapping[int, Reply], *, minimum: int = 1, what: str = "replies"
) -> dict[int, Message]:
    """The messages of the clients that answered; a clear error when fewer than `minimum` did."""
    good = {cid: r.message for cid, r in replies.items() if r.message is not None}
    if len(good) < minimum:
        errors = "; ".join(f"client {cid}: {r.error}" for cid, r in replies.items() if not r.ok)
        raise FederationError(
            f"only {len(good)} of {len(replies)} clients returned {what} (need {minimum}). {errors}"
        )
    return good
