"""The in-process transport: clients live in this process and messages are passed by reference.

Payload arrays are read-only snapshots, so passing them without serialising is safe and copy-free.
Every message is still checked on receipt and written to the ledger exactly as a networked
transport would, so a run here shows the same ledger as a run on Flower.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace

from fedistill.errors import FederationError
from fedistill.federation.client import ClientLogic
from fedistill.federation.fleet import Fleet, Reply
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import (
    DEFAULT_MAX_BYTES,
    Message,
    check_contents,
    check_on_receipt,
    check_structure,
)
from fedistill.federation.reply_spec import Expectation

log = logging.getLogger(__name__)


class InProcessFleet(Fleet):
    """Calls each client's handler in turn, in client-id order (deterministic).

    Requests that clients of one class may answer together (equal `together_key`) go to one
    `handle_together` call at the first of them; the ledger still records each request and reply in
    client-id order, and each reply is checked on receipt as if it came alone.

    A handler that raises becomes an error reply, as on a real network. A handler that takes longer
    than the timeout has its reply discarded and is reported as timed out: a single process cannot
    pre-empt it, but the server sees exactly what it would see from a slow remote client.

    `answered(cid)`, when given, is called after each client has answered a message, before its reply
    crosses: where a site keeps what must outlive a crash (its DP spending, privacy/journal.py).
    """

    def __init__(
        self,
        clients: Mapping[int, ClientLogic],
        ledger: Ledger,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float | None = None,
        answered: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(ledger)
        self._clients = dict(sorted(clients.items()))
        self._answered = answered
        self.max_bytes = max_bytes
        self.timeout = timeout

    @property
    def clients(self) -> list[int]:
        """The ids of the clients built in this process, in order."""
        return list(self._clients)

    def send(
        self,
        requests: Mapping[int, Message],
        *,
        step: int | None = None,
        timeout: float | None = None,
        expect: Expectation = None,
    ) -> dict[int, Reply]:
        """Hand each request to its client in turn, checked on receipt; an error becomes a failed reply."""
        timeout = self.timeout if timeout is None else timeout
        started, in_clients = time.perf_counter(), self.seconds_in_clients
        replies: dict[int, Reply] = {}
        groups, answered = self._together(requests), {}
        for cid in sorted(requests):
            request = requests[cid]
            self.record_request(cid, request, step)
            if cid in groups:
                answered |= self._deliver_together(groups[cid], requests, timeout)
            reply = answered.pop(cid) if cid in answered else self._deliver(cid, request, timeout)
            replies[cid] = self.record_reply(reply, request.type, step, expect)
        self.seconds_in_transport += time.perf_counter() - started - (self.seconds_in_clients - in_clients)
        return replies

    def _deliver(self, cid: int, request: Message, timeout: float | None) -> Reply:
        if cid not in self._clients:
            return Reply(cid, None, f"unknown client {cid}")
        start = time.perf_counter()
        try:
            check_on_receipt(request, max_bytes=self.max_bytes)
            handler_start = time.perf_counter()
            answer = self._clients[cid].handle(request)
            self.seconds_in_clients += time.perf_counter() - handler_start
        except Exception as exc:  # a failing client must not take the server down
            return self._failed(cid, request.type, exc)
        if self._answered is not None:
            self._answered(cid)
        return self._checked(cid, answer, request.type, time.perf_counter() - start, timeout)

    def _together(self, requests: Mapping[int, Message]) -> dict[int, list[int]]:
        """The groups of at least two clients that may answer their requests together, by first member."""
        keyed: dict[tuple[type, Hashable], list[int]] = {}
        for cid in sorted(requests):
            client = self._clients.get(cid)
            try:
                key = None if client is None else client.together_key(requests[cid])
            except Exception:  # a request the client cannot read: it answers alone (and says why)
                key = None
            if key is not None:
                keyed.setdefault((type(client), key), []).append(cid)
        return {members[0]: members for members in keyed.values() if len(members) > 1}

    def _deliver_together(
        self, members: list[int], requests: Mapping[int, Message], timeout: float | None
    ) -> dict[int, Reply]:
        """One `handle_together` call for `members`; each member is charged an equal share of its time."""
        start, replies, ready = time.perf_counter(), {}, []
        for cid in members:
            try:
                check_on_receipt(requests[cid], max_bytes=self.max_bytes)
                ready.append(cid)
            except Exception as exc:
                replies[cid] = self._failed(cid, requests[cid].type, exc)
        if not ready:
            return replies
        clients = [self._clients[cid] for cid in ready]
        handler_start = time.perf_counter()
        try:
            answers = list(type(clients[0]).handle_together(clients, [requests[cid] for cid in ready]))
            if len(answers) != len(ready):
                raise FederationError(
                    f"{type(clients[0]).__name__}.handle_together gave {len(answers)} answers to "
                    f"{len(ready)} requests"
                )
        except Exception as exc:  # as for one client: every member's request failed
            return replies | {cid: self._failed(cid, requests[cid].type, exc) for cid in ready}
        self.seconds_in_clients += time.perf_counter() - handler_start
        for cid in ready if self._answered is not None else ():
            self._answered(cid)
        share = (time.perf_counter() - start) / len(members)
        for cid, answer in zip(ready, answers, strict=True):
            replies[cid] = self._checked(cid, answer, requests[cid].type, share, timeout)
        return replies

    @staticmethod
    def _failed(cid: int, message_type: str, exc: Exception) -> Reply:
        log.warning("client %d failed on %s: %s", cid, message_type, exc, exc_info=log.isEnabledFor(10))
        return Reply(cid, None, f"{type(exc).__name__}: {exc}")

    def _checked(
        self, cid: int, answer: Message, request_type: str, elapsed: float, timeout: float | None
    ) -> Reply:
        """A client's answer as the server receives it: of its request's type, as Flower delivers it (the
        type the client built it with never crosses), invalid if it fails the receipt checks, timed out if
        it took longer than `timeout`."""
        if not isinstance(answer, Message):  # a failure in the client, as over Flower (its codec fails)
            error = FederationError(f"the handler returned {type(answer).__name__}, not a Message")
            return self._failed(cid, request_type, error)
        if answer.type != request_type:
            answer = replace(answer, type=request_type)
        try:  # a malformed message: invalid, its bytes unknown (over Flower it does not decode)
            check_structure(answer)
        except FederationError as exc:
            return Reply(cid, None, f"invalid reply: {exc}")
        try:
            check_contents(answer, max_bytes=self.max_bytes)
        except FederationError as exc:  # NaN, oversize: invalid, like any other fault, its bytes counted
            return Reply(cid, None, f"invalid reply: {exc}", received=answer)
        if timeout is not None and elapsed > timeout:
            return Reply(cid, None, f"timed out after {elapsed:.1f} s (limit {timeout:.1f} s)")
        return Reply(cid, answer)
