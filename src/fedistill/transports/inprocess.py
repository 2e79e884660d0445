"""The in-process transport: clients live in this process and messages are passed by reference.

Payload arrays are read-only snapshots, so passing them without serialising is safe and copy-free.
Every message is still checked on receipt and written to the ledger exactly as a networked
transport would, so a run here shows the same ledger as a run on Flower.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from fedistill.errors import FederationError
from fedistill.federation.client import ClientLogic
from fedistill.federation.fleet import Fleet, Reply
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import DEFAULT_MAX_BYTES, Message, check_on_receipt
from fedistill.federation.reply_spec import Expectation

log = logging.getLogger(__name__)


class InProcessFleet(Fleet):
    """Calls each client's handler in turn, in client-id order (deterministic).

    A handler that raises becomes an error reply, as on a real network. A handler that takes longer
    than the timeout has its reply discarded and is reported as timed out: a single process cannot
    pre-empt it, but the server sees exactly what it would see from a slow remote client.
    """

    def __init__(
        self,
        clients: Mapping[int, ClientLogic],
        ledger: Ledger,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float | None = None,
    ) -> None:
        super().__init__(ledger)
        self._clients = dict(sorted(clients.items()))
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
        for cid in sorted(requests):
            request = requests[cid]
            self.record_request(cid, request, step)
            reply = self._deliver(cid, request, timeout)
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
            log.warning("client %d failed on %s: %s", cid, request.type, exc, exc_info=log.isEnabledFor(10))
            return Reply(cid, None, f"{type(exc).__name__}: {exc}")
        try:
            check_on_receipt(answer, max_bytes=self.max_bytes)
        except FederationError as exc:  # NaN, oversize, a malformed message: invalid, like any other fault
            return Reply(cid, None, f"invalid reply: {exc}")
        elapsed = time.perf_counter() - start
        if timeout is not None and elapsed > timeout:
            return Reply(cid, None, f"timed out after {elapsed:.1f} s (limit {timeout:.1f} s)")
        return Reply(cid, answer)
