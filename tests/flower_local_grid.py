"""A Flower `Grid` that runs the ClientApp synchronously in this process (no Ray, no network).

It exercises the real ServerApp-side fleet and ClientApp code paths in milliseconds, and can make
chosen nodes silent (never reply) or fail, to test timeouts and drop handling.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import uuid4

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class LocalGrid(Grid):
    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        *,
        run_config: dict | None = None,
        silent: Iterable[int] = (),
        run_id: int = 1,
        node_config: dict | None = None,
    ) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 0
        self.client_app = client_app
        # node ids deliberately unrelated to partition ids: the fleet must map them via query.hello
        self.contexts = {
            1000 + 7 * i: Context(
                run_id=run_id,
                node_id=1000 + 7 * i,
                node_config={
                    "partition-id": num_nodes - 1 - i,
                    "num-partitions": num_nodes,
                    **(node_config or {}),
                },
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i in range(num_nodes)
        }
        self.silent_partitions = set(silent)
        self.replies: dict[str, Message] = {}
        self.delivered: list[tuple[int, str]] = []

    def set_run(self, run_id: int) -> None:  # pragma: no cover - not used by fedistill
        pass

    @property
    def run(self):  # pragma: no cover
        return None

    def create_message(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            mid = str(uuid4())
            message.metadata.__dict__["_message_id"] = mid
            context = self.contexts[message.metadata.dst_node_id]
            ids.append(mid)
            self.delivered.append((int(context.node_config["partition-id"]), message.metadata.message_type))
            silent = int(context.node_config["partition-id"]) in self.silent_partitions
            if silent and message.metadata.message_type != "query.hello":
                continue
            self.replies[mid] = self.client_app(message, context)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(mid) for mid in list(message_ids) if mid in self.replies]

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover
        return self.pull_messages(self.push_messages(messages))


def run_on_grid(config, suite_dir, grid, **kwargs):
    """The suite as a Flower ServerApp runs it: validated, then every algorithm over `grid`."""
    from fedistill.engine.setup import validate_setup
    from fedistill.engine.suite import run_algorithms

    config = config.replace(transport="flower")
    kwargs.setdefault("progress", False)
    return run_algorithms(config, suite_dir, validate_setup(config), grid=grid, **kwargs)


def traffic(run_dir):
    """Bytes per (direction, client, kind, type) from a run's ledger, without the transport's hello (only a
    Flower run has one), so that a Flower run's traffic compares with an in-process run's."""
    from collections import Counter

    from fedistill.federation.ledger import read_ledger

    totals: Counter = Counter()
    for record in read_ledger(run_dir / "ledger.jsonl"):
        if record["type"] != "query.hello":
            for kind, size in record["kinds"].items():
                totals[(record["direction"], record["client"], kind, record["type"])] += size
    return totals
