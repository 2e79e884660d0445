"""The server's `Fleet` over a Flower `Grid` (simulation engine or SuperLink).

Clients are addressed by partition id, as in-process; a `query.hello` at start-up asks every node
for its partition id (and the hash of the split its copy of the data gives; where sites hold their own
data, it carries the server's dataset facts and test set instead, and each node answers with its
training-record count, their fingerprint and the hash of its split of them). Every request and reply is
recorded in the ledger and every reply checked on receipt exactly as in-process. Every wait has a
deadline: a node that does not answer in time becomes an error reply ("timed out"), and the algorithm
decides whether it can go on without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from flwr.app import Message as FlowerMessage
from flwr.serverapp import Grid

from fedistill import interrupt
from fedistill.errors import FederationError
from fedistill.federation.fleet import Fleet, Reply
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import DEFAULT_MAX_BYTES, HELLO, Message, check_on_receipt
from fedistill.federation.reply_spec import Expectation
from fedistill.transports.flower.codec import from_records, to_records

log = logging.getLogger(__name__)

#: the scalar (content kind "config") in a node's HELLO reply: the hash of the split its data gives
SPLIT_HASH = "split_hash"
#: where sites hold their own data: the scalar (content kind "config") in a node's HELLO reply holding the
#: fingerprint of its training records (two nodes reading one folder are found out)
DATA_HASH = "data_hash"
#: How long a send waits for its replies when the run config sets no `timeout`.
DEFAULT_TIMEOUT_S = 600.0
#: A node's answer: (the valid message, None, None) or (None, the error, what arrived if it decoded).
Decoded = tuple[Message | None, str | None, Message | None]


class GridFleet(Fleet):
    """The Fleet of a Flower ServerApp: requests go through Flower's Grid to the nodes, each found by the
    partition it holds."""

    def __init__(
        self,
        grid: Grid,
        ledger: Ledger,
        *,
        algorithm: str,
        expected_clients: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float | None = None,
        connect_timeout: float = 300.0,  # Ray workers start slowly on a loaded machine
        poll_s: float = 0.02,
        split_hash: str | None = None,
        greeting: Message | None = None,
        server_hash: str | None = None,
    ) -> None:
        super().__init__(ledger)
        self.grid = grid
        self.algorithm = algorithm
        self.max_bytes = max_bytes
        self.timeout = timeout or DEFAULT_TIMEOUT_S
        self.poll_s = poll_s
        self.split_hash = split_hash
        #: the HELLO of a run whose sites hold their own data (the server's facts and test set for them)
        self.greeting = greeting
        #: the fingerprint of the server's own training records, which no site may hold
        self.server_hash = server_hash
        #: each site's training-sample count, as its node reported it, where sites hold their own data
        self.site_sizes: list[int] | None = None
        #: each site's (training-record hash, split hash), as its node reported them, in partition order
        self.site_hashes: list[tuple[str, str | None]] | None = None
        self.node_of = self._discover(expected_clients, connect_timeout)

    @property
    def clients(self) -> list[int]:
        return sorted(self.node_of)

    # --- start-up: which node holds which partition ------------------------------------------------
    def _discover(self, expected: int, connect_timeout: float) -> dict[int, int]:
        deadline = time.monotonic() + connect_timeout
        nodes = list(self.grid.get_node_ids())
        while len(nodes) < expected and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = list(self.grid.get_node_ids())
        if len(nodes) < expected:
            left_out = getattr(self.grid, "left_out", None)  # a grid that offers only some nodes says why
            why = left_out() if callable(left_out) else ""
            raise FederationError(
                f"only {len(nodes)} of {expected} Flower nodes connected within {connect_timeout:.0f} s"
                + (f"; {why}" if why else "")
            )
        hello = self.greeting or Message.build(HELLO)
        replies = self._exchange({node: hello for node in nodes}, step=None, timeout=connect_timeout)
        node_of: dict[int, int] = {}
        for node, (reply, error, _) in replies.items():
            if reply is None:
                raise FederationError(f"Flower node {node} did not answer {HELLO}: {error}")
            pid = reply.scalars.get("metrics", {}).get("partition_id")
            if isinstance(pid, bool) or not isinstance(pid, int):
                raise FederationError(f"Flower node {node} named partition {pid!r}, not a whole number")
            if pid in node_of:
                raise FederationError(f"Flower nodes {node_of[pid]} and {node} both hold partition {pid}")
            self._check_split(node, pid, reply.scalars.get("config", {}).get(SPLIT_HASH))
            node_of[pid] = node
        if sorted(node_of) != list(range(expected)):
            raise FederationError(f"expected partitions 0..{expected - 1}, the nodes hold {sorted(node_of)}")
        if self.greeting is not None:
            in_order = [replies[node][0] for _, node in sorted(node_of.items())]
            self.site_sizes = self._checked_site_sizes(in_order)
        for pid, node in sorted(node_of.items()):
            self.record_request(pid, hello, None)
            self.record_reply(Reply(pid, replies[node][0]), HELLO, None)
        log.info("Flower nodes by partition: %s", node_of)
        return node_of

    def _check_split(self, node: int, pid: int, theirs: object) -> None:
        """Each node rebuilds the split from its own copy of the data: another copy (a different version, a
        missing file, other options) gives other shards, which would train silently on the wrong samples."""
        if self.split_hash is None or theirs == self.split_hash:
            return
        if theirs is None:
            raise FederationError(
                f"Flower node {node} (partition {pid}) did not say which split its data gives; it runs an "
                "older fedistill than the server: install the same version on every node"
            )
        raise FederationError(
            f"Flower node {node} (partition {pid}) splits its data into other shards than the server "
            f"(split {str(theirs)[:12]} against {self.split_hash[:12]}): its copy of the dataset, or the "
            "options it read, differ from the server's; give every node the same data under its data-dir"
        )

    def _checked_site_sizes(self, replies: list[Message | None]) -> list[int]:
        """Each site's training-sample count from its HELLO reply (partition order); two sites whose records
        are the same (one folder read twice), or a site holding the server's, stop the run; each site's hashes
        of its records and its split are kept (`site_hashes`), for a resume to compare."""
        sizes, seen, hashes = [], {}, []
        for pid, reply in enumerate(replies):
            assert reply is not None  # _discover stopped on any missing reply
            fingerprint = reply.scalars.get("config", {}).get(DATA_HASH)
            if fingerprint is None:
                raise FederationError(
                    f"Flower node of partition {pid} did not say what data it holds; it runs an older "
                    "fedistill than the server: install the same version on every node"
                )
            if fingerprint == self.server_hash:
                raise FederationError(
                    f"the Flower node of partition {pid} holds the server's training records: the server's "
                    "data_dir would make them its validation and test data too; give it a folder of its own"
                )
            if fingerprint in seen:
                raise FederationError(
                    f"the Flower nodes of partitions {seen[fingerprint]} and {pid} hold the same training "
                    "records: each site's data-dir (or site_data_dir's {site}) must name its own folder"
                )
            seen[fingerprint] = pid
            hashes.append((str(fingerprint), reply.scalars.get("config", {}).get(SPLIT_HASH)))
            sizes.append(int(reply.scalars.get("metrics", {}).get("num_samples", 0)))
        self.site_hashes = hashes
        return sizes

    # --- the Fleet interface ---------------------------------------------------------------------
    def send(
        self,
        requests: Mapping[int, Message],
        *,
        step: int | None = None,
        timeout: float | None = None,
        expect: Expectation = None,
    ) -> dict[int, Reply]:
        started = time.perf_counter()
        unknown = [cid for cid in requests if cid not in self.node_of]
        # a node the SuperLink no longer lists (its heartbeats stopped) fails at once, not at the deadline
        online = set(self.grid.get_node_ids())
        offline = [cid for cid in requests if cid in self.node_of and self.node_of[cid] not in online]
        for cid in sorted(requests):
            self.record_request(cid, requests[cid], step)
        by_node = {
            self.node_of[cid]: requests[cid]
            for cid in sorted(requests)
            if cid in self.node_of and cid not in offline
        }
        answers = self._exchange(by_node, step=step, timeout=timeout or self.timeout) if by_node else {}
        replies: dict[int, Reply] = {}
        for cid in sorted(requests):
            if cid in unknown:
                reply = Reply(cid, None, f"unknown client {cid}")
            elif cid in offline:
                reply = Reply(cid, None, f"node {self.node_of[cid]} is offline (the SuperLink lost it)")
            else:
                message, error, received = answers[self.node_of[cid]]
                reply = Reply(cid, message, error, received)
            replies[cid] = self.record_reply(reply, requests[cid].type, step, expect)
        self.seconds_in_transport += time.perf_counter() - started
        return replies

    def _exchange(
        self, requests: Mapping[int, Message], *, step: int | None, timeout: float
    ) -> dict[int, Decoded]:
        """Push one message per node, pull until every reply is in or the deadline passes.

        Each message is pushed on its own: the SuperLink answers a message it did not store with an empty
        id (a deployment) or no id at all (the in-memory grid, a payload it refused), and only one at a
        time tells whose it was; that node's reply is "not delivered" at once, not a timeout later."""
        header = {"algorithm": self.algorithm, "round": self.round, "step": -1 if step is None else step}
        results: dict[int, Decoded] = {}
        node_of_id: dict[str, int] = {}
        for node, message in requests.items():
            outgoing = FlowerMessage(to_records(message, header), dst_node_id=node, message_type=message.type)
            stored = [mid for mid in self.grid.push_messages([outgoing]) if mid]
            if len(stored) == 1:
                node_of_id[stored[0]] = node
            else:
                results[node] = (None, "not delivered: the SuperLink did not store the request", None)
        pending = set(node_of_id)
        deadline = time.monotonic() + timeout
        while pending:
            interrupt.check()
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                results[node_of_id[mid]] = self._decode(reply, requests[node_of_id[mid]].type)
            if pending:
                if time.monotonic() > deadline:
                    break
                time.sleep(self.poll_s)
        for mid in pending:
            results[node_of_id[mid]] = (
                None,
                f"timed out after {timeout:.1f} s (no reply from the node)",
                None,
            )
        return results

    def _decode(self, reply: FlowerMessage, message_type: str) -> Decoded:
        """(message, None, None) for a valid reply; else (None, the error, what arrived if it decoded:
        its bytes go to the ledger)."""
        if reply.has_error():
            return None, f"client error {reply.error.code}: {reply.error.reason}", None
        received = None
        try:
            received = from_records(reply.content, message_type, reply=True)
            check_on_receipt(received, max_bytes=self.max_bytes)
        except Exception as exc:  # a malformed reply is that client's failure, not the server's
            return None, f"invalid reply: {exc}", received
        return received, None, None
