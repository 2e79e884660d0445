"""A Flower `Grid` that lets only enrolled sites take part, each at the partition the operator fixed.

The SuperLink (with `--enable-supernode-auth`) binds each node id to the public key the node proved
it holds; this grid looks that key up in the enrolment and so knows each node's site and partition
without asking the node. It then
- offers the run only enrolled nodes (any other is left out, with a warning),
- tells every node its partition in each message's transport header (`partition-id`), so a site's
  node config needs no partition id and one that contradicts the enrolment is refused on the node,
- refuses the run when a node's `query.hello` reply claims another partition than its own: an
  enrolled site cannot take another site's place, whatever code it runs.
The server's `GridFleet` on top is unchanged and builds its partition map from those checked replies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.serverapp import Grid

from fedistill.engine.flower.enrolment import ASSIGNED_PARTITION, Enrolment, Site, load_enrolment
from fedistill.errors import ConfigError, FederationError
from fedistill.transports.flower.codec import HEADER, from_records, header_of
from fedistill.transports.flower.grid_fleet import HELLO

log = logging.getLogger(__name__)


class EnrolledGrid(Grid):
    """`grid` restricted to the enrolled nodes, each bound to its site's partition."""

    def __init__(self, grid: Grid, enrolment: Enrolment) -> None:
        self.grid = grid
        self.enrolment = enrolment
        self._site_of: dict[int, Site] = {}
        self._refused: set[int] = set()

    # --- which node is which site ----------------------------------------------------------------
    def sites(self) -> dict[int, Site]:
        """node id -> site, for every node the SuperLink lists now whose key is enrolled."""
        current: dict[int, Site] = {}
        for node in self.grid.get_nodes():
            node_id = int(node.node_id)
            site = self._site_of.get(node_id) or self.enrolment.site_for_key(bytes(node.public_key))
            if site is None:
                if node_id not in self._refused:
                    self._refused.add(node_id)
                    log.warning("Flower node %s is not enrolled (unknown key): it is left out", node_id)
                continue
            self._site_of[node_id] = current[node_id] = site
        return current

    def left_out(self) -> str:
        """Why connected nodes are not offered to the run (for the error when too few sites connect)."""
        listed = {int(node.node_id) for node in self.grid.get_nodes()}
        strangers = len(listed - set(self.sites()))
        if not strangers:
            return ""
        return (
            f"{strangers} more connected but are not enrolled: their keys are not in the enrolment (is the "
            "SuperLink started with --enable-supernode-auth, and each site's key registered?)"
        )

    def partition_of(self, node_id: int) -> int:
        site = self._site_of.get(node_id) or self.sites().get(node_id)
        if site is None:
            raise FederationError(f"Flower node {node_id} is not enrolled: no message goes to it")
        return site.partition

    # --- the Grid interface ----------------------------------------------------------------------
    def set_run(self, run_id: int) -> None:  # pragma: no cover - Flower's runtime sets the inner grid's run
        self.grid.set_run(run_id)

    @property
    def run(self) -> Any:  # pragma: no cover
        return self.grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> FlowerMessage:  # pragma: no cover - deprecated
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.sites())

    def get_nodes(self) -> Iterable[Any]:
        enrolled = self.sites()
        return [node for node in self.grid.get_nodes() if int(node.node_id) in enrolled]

    def push_messages(self, messages: Iterable[FlowerMessage]) -> Iterable[str]:
        stamped = []
        for message in messages:
            header = header_of(message.content)
            header[ASSIGNED_PARTITION] = self.partition_of(int(message.metadata.dst_node_id))
            message.content = RecordDict({**dict(message.content.items()), HEADER: ConfigRecord(header)})
            stamped.append(message)
        return self.grid.push_messages(stamped)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[FlowerMessage]:
        replies = list(self.grid.pull_messages(message_ids))
        for reply in replies:
            if reply.metadata.message_type == HELLO and not reply.has_error():
                self._check_claim(reply)
        return replies

    def send_and_receive(
        self, messages: Iterable[FlowerMessage], *, timeout: float | None = None
    ) -> Iterable[FlowerMessage]:  # pragma: no cover - GridFleet pushes and pulls itself
        raise NotImplementedError("EnrolledGrid is driven by push_messages/pull_messages")

    def _check_claim(self, reply: FlowerMessage) -> None:
        node_id = int(reply.metadata.src_node_id)
        site = self._site_of.get(node_id)
        try:
            claimed = int(from_records(reply.content, HELLO, reply=True).scalar("metrics", "partition_id"))
        except Exception as exc:  # a malformed hello is refused like a false one
            raise FederationError(f"Flower node {node_id} sent an unreadable {HELLO} reply: {exc}") from None
        if site is None or claimed != site.partition:
            known = "not enrolled" if site is None else f"site {site.name!r}, partition {site.partition}"
            raise FederationError(
                f"Flower node {node_id} ({known}) claims partition {claimed}: refused, "
                "a site cannot take another site's partition"
            )


def enrolled(grid: Grid, enrolment_file: Path | None, clients: int) -> Grid:
    """`grid` itself for an open deployment (no enrolment file), else restricted to the enrolled sites."""
    if enrolment_file is None:
        return grid
    enrolment = load_enrolment(enrolment_file)
    if len(enrolment.sites) != clients:
        raise ConfigError(
            f"the enrolment {enrolment_file} has {len(enrolment.sites)} sites, the run has clients={clients}"
        )
    log.info("enrolled sites by partition: %s", {s.partition: s.name for s in enrolment.sites})
    return EnrolledGrid(grid, enrolment)
