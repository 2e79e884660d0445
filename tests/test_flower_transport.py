"""The Flower transport: lossless codec, the same results and ledger as in-process, faults."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from algorithm_helpers import SMALL_FEDIOD
from fedistill.config import RunConfig, build_config
from fedistill.engine.flower import node as flower_node
from fedistill.engine.flower.apps import make_client_app
from fedistill.engine.launch import run_suite
from fedistill.errors import FederationError
from fedistill.federation.ledger import read_ledger
from fedistill.federation.messages import Message
from fedistill.transports.flower.codec import from_records, header_of, to_records
from flower_local_grid import LocalGrid, run_on_grid, traffic


def _config(**keys) -> RunConfig:
    base = {
        "algorithm": "fedavg",
        "clients": 3,
        "rounds": 2,
        "model": "lenet-fedmdcg",
        "fediod": SMALL_FEDIOD,
    }
    return build_config(RunConfig(), {**base, **keys})


def test_codec_round_trip_is_lossless() -> None:
    message = Message.build(
        "query.generate",
        arrays={
            "logits": {"z": torch.randn(4, 3)},
            "parameters": {
                "steps": np.array(7, dtype=np.int64),  # 0-d, like BatchNorm's counter
                "mask": np.array([True, False]),
                "half": np.arange(6, dtype=np.float16).reshape(2, 3)[:, ::2],  # not contiguous
            },
        },
        scalars={"metrics": {"n": 3, "loss": 0.25, "name": "x", "flag": True}},
    )
    records = to_records(message, {"algorithm": "fediod"})
    back = from_records(records, message.type)
    assert header_of(records) == {"algorithm": "fediod"}
    assert back.scalars == message.scalars
    for kind, named in message.arrays.items():
        for name, array in named.items():
            got = back.arrays[kind][name]
            assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)
    assert back.bytes_by_kind() == message.bytes_by_kind()


def test_big_endian_and_fortran_ordered_arrays_from_the_wire_arrive_in_native_order() -> None:
    """A big-endian float32 is still named float32, so it passed every receipt check and then broke
    torch.from_numpy in the server's own code; it now arrives as the same values in native order."""
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    arrays = {"out": Array(values.astype(">f4")), "half": Array(np.asfortranarray(values.astype(">f2")))}
    back = from_records(RecordDict({"logits": ArrayRecord(arrays)}), "query.logits")
    for name in ("out", "half"):
        got = back.array("logits", name)
        assert got.dtype.isnative and got.flags.c_contiguous and np.array_equal(got, values)
        assert torch.equal(back.tensor("logits", name).float(), torch.from_numpy(values))


def test_codec_refuses_records_it_does_not_know() -> None:
    content = RecordDict({"metrics": MetricRecord({"a": 1.0})})
    with pytest.raises(FederationError, match="unexpected record 'metrics'"):
        from_records(content, "train")
    content = RecordDict({"secrets": ArrayRecord({"x": Array(np.zeros(2))})})
    with pytest.raises(FederationError, match="unknown content kind 'secrets'"):
        from_records(content, "train")


def test_fedavg_and_fediod_over_a_flower_grid_match_in_process(tmp_path) -> None:
    config = _config(algorithm="fedavg,fediod")
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)
    for a, b in zip(here, there, strict=True):
        assert a["algorithm"] == b["algorithm"] and b["transport"] == "flower"
        assert b["final"]["test_accuracy"] == pytest.approx(a["final"]["test_accuracy"], abs=1e-6)
        name = a["algorithm"]
        assert traffic(tmp_path / "flower" / name) == traffic(tmp_path / "inprocess" / name)
    # the hello is in the ledger: every client told the server which partition it holds
    hello = [
        r for r in read_ledger(tmp_path / "flower" / "fedavg" / "ledger.jsonl") if r["type"] == "query.hello"
    ]
    assert sorted(r["client"] for r in hello if r["direction"] == "client->server") == [0, 1, 2]


def test_feddf_and_the_partial_sharing_baselines_over_a_flower_grid_match_in_process(tmp_path) -> None:
    """FedDF (server-side distillation, parameters both ways) and FedPer / LG-FedAvg (private parts kept
    in the node's client state between rounds) give the in-process results and traffic on Flower."""
    config = _config(algorithm="feddf,fedper,lgfedavg", rounds=2, feddf={"steps": 20, "eval_every_steps": 10})
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)
    for a, b in zip(here, there, strict=True):
        for key in ("test_accuracy", "local_accuracy"):
            if key in a["final"]:
                assert b["final"][key] == pytest.approx(a["final"][key], abs=1e-6), (a["algorithm"], key)
        name = a["algorithm"]
        assert traffic(tmp_path / "flower" / name) == traffic(tmp_path / "inprocess" / name)


def test_client_state_survives_a_fresh_process_per_message(tmp_path) -> None:
    """Deployment starts one ClientApp process per message: emulate it by forgetting every client
    object between messages; the state on node storage must carry FedIOD through unchanged."""
    config = _config(algorithm="fediod", rounds=1)
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    app = make_client_app(config, state_root=tmp_path / "nodes")

    def ephemeral(message, context):
        flower_node._NODES.clear()
        return app(message, context)

    there = run_on_grid(config, tmp_path / "flower", LocalGrid(ephemeral, config.clients))
    assert there[0]["final"]["test_accuracy"] == pytest.approx(here[0]["final"]["test_accuracy"], abs=1e-6)
    assert there[0]["communication"]["client->server"]["per_kind"].get("parameters", 0) == 0


def test_a_silent_node_times_out_and_the_run_goes_on_without_it(tmp_path) -> None:
    config = _config(timeout=0.5, rounds=2)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients, silent={1})
    summary = run_on_grid(config, tmp_path / "run", grid)[0]
    assert set(summary["dropped_clients"]) == {"1"}
    assert "round 1: timed out" in summary["dropped_clients"]["1"]
    timeouts = [
        r for r in read_ledger(tmp_path / "run" / "fedavg" / "ledger.jsonl") if r["status"] == "timeout"
    ]
    assert timeouts and {r["client"] for r in timeouts} == {1}
    assert summary["final"]["test_accuracy"] > 0.1


def test_nodes_that_disagree_with_the_config_stop_the_run_with_a_clear_error(tmp_path) -> None:
    config = _config(clients=2)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), 3)
    with pytest.raises(FederationError, match="num-partitions=3, the run has clients=2"):
        run_on_grid(config, tmp_path / "run", grid)


@pytest.mark.timeout(900)  # Ray starts in seconds on an idle machine, minutes on a loaded one (43 s alone)
def test_flower_simulation_engine_gives_the_in_process_results(tmp_path) -> None:
    """`fedistill run --transport flower`: Ray-backed simulation, same metrics and traffic."""
    config = _config(algorithm="fedavg,fediod", rounds=1, clients=2)
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    there = run_suite(config.replace(transport="flower"), tmp_path / "flower", progress=False)
    for a, b in zip(here, there, strict=True):
        assert b["final"]["test_accuracy"] == pytest.approx(a["final"]["test_accuracy"], abs=1e-6)
        assert traffic(tmp_path / "flower" / a["algorithm"]) == traffic(
            tmp_path / "inprocess" / a["algorithm"]
        )


def _same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_read_only_handlers_leave_client_state_unchanged_and_skip_the_node_write(tmp_path, monkeypatch):
    """Nodes skip persisting state after read-only messages; that is only sound if those handlers
    really leave state_dict() as it was, which this checks on every such message of a real run."""
    import copy

    from fedistill.federation.client import ClientLogic

    checked: Counter = Counter()
    handle = ClientLogic.handle

    def checking(self, message):
        if self.changes_state(message.type):
            return handle(self, message)
        before = copy.deepcopy(self.state_dict())
        answer = handle(self, message)
        after = self.state_dict()
        changed = [key for key in before if not _same_state(before[key], after[key])]
        assert not changed, f"{message.type} changed the client state: {changed}"
        checked[message.type] += 1
        return answer

    monkeypatch.setattr(ClientLogic, "handle", checking)
    config = _config(algorithm="fediod,standalone", rounds=1)
    writes: Counter = Counter()
    commit = flower_node.Node.commit
    monkeypatch.setattr(flower_node.Node, "commit", lambda self, ctx: (writes.update([1]), commit(self, ctx)))
    run_on_grid(
        config,
        tmp_path / "flower",
        LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients),
    )
    assert {"query.student", "evaluate.student", "evaluate.teachers", "evaluate"} <= set(checked)
    records = [r for r in read_ledger(tmp_path / "flower" / "fediod" / "ledger.jsonl")]
    records += read_ledger(tmp_path / "flower" / "standalone" / "ledger.jsonl")
    state_changing = sum(
        1
        for r in records
        if r["direction"] == "server->client" and r["type"] not in ("query.hello", *checked)
    )
    assert sum(writes.values()) == state_changing


@pytest.mark.slow
def test_forwarding_client_app_and_node_workers_give_the_in_process_results(tmp_path) -> None:
    """The forwarding ClientApp hands every message to one long-lived worker process per node; the
    results and traffic are the in-process ones, and the workers stop when asked."""
    from fedistill.engine.flower.apps import config_from_run_config
    from fedistill.engine.flower.forward import client_app as forwarding_app
    from fedistill.transports.flower.forward import stop_worker

    small = " ".join(f"fediod.{k}={v}" for k, v in SMALL_FEDIOD.items())
    run_config = {
        "algorithm": "fedavg,fediod",
        "clients": 3,
        "rounds": 2,
        "model": "lenet-fedmdcg",
        "set": small,
    }
    config = config_from_run_config(run_config)
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    nodes = tmp_path / "nodes"
    grid = LocalGrid(
        forwarding_app, config.clients, run_config=run_config,
        node_config={"state-dir": str(nodes), "worker": True, "worker-idle-s": 300.0},
    )  # fmt: skip
    try:
        there = run_on_grid(config, tmp_path / "flower", grid)
    finally:
        stopped = [stop_worker(folder) for folder in sorted(nodes.glob("worker-node-*"))]
    assert stopped == [True, True, True]
    for a, b in zip(here, there, strict=True):
        assert b["final"]["test_accuracy"] == pytest.approx(a["final"]["test_accuracy"], abs=1e-6)
        assert traffic(tmp_path / "flower" / a["algorithm"]) == traffic(
            tmp_path / "inprocess" / a["algorithm"]
        )
    for folder in sorted(nodes.glob("worker-node-*")):  # one worker per node served every message
        log = (folder / "worker.log").read_text()
        assert log.count("listening on") == 1 and "asked to stop" in log


def test_a_node_worker_exits_when_idle(tmp_path) -> None:
    import subprocess
    import sys

    (tmp_path / "worker.key").write_bytes(b"k" * 32)
    command = [sys.executable, "-m", "fedistill.engine.flower.worker",
               "--socket", str(tmp_path / "worker.sock"),
               "--key-file", str(tmp_path / "worker.key"), "--idle-s", "1"]  # fmt: skip
    assert subprocess.run(command, timeout=120, capture_output=True).returncode == 0
    assert not (tmp_path / "worker.sock").exists()


def test_a_process_keeps_at_most_client_cache_clients_and_gives_the_same_results(tmp_path) -> None:
    """A simulation worker serving many nodes forgets the least recently used clients past `client-cache`
    (each is rebuilt from its node storage when asked again): the results do not change."""
    config = _config(algorithm="fedavg,fediod", rounds=1)
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    app = make_client_app(config, state_root=tmp_path / "nodes")
    flower_node._NODES.clear()  # this process's clients of earlier runs
    sizes: list[int] = []

    def watched(message, context):
        reply = app(message, context)
        sizes.append(len(flower_node._NODES))
        return reply

    grid = LocalGrid(watched, config.clients, node_config={"client-cache": 1})
    there = run_on_grid(config, tmp_path / "flower", grid)
    assert max(sizes) == 1 and config.clients > 1
    for a, b in zip(here, there, strict=True):
        assert b["final"]["test_accuracy"] == pytest.approx(a["final"]["test_accuracy"], abs=1e-6)


@pytest.mark.parametrize("value", ["many", -1, 2.5, True])
def test_a_wrong_client_cache_is_named_in_one_line(value) -> None:
    from types import SimpleNamespace

    from fedistill.engine.flower.node import client_cache
    from fedistill.errors import ConfigError

    with pytest.raises(ConfigError, match="client-cache must be a whole number"):
        client_cache(SimpleNamespace(node_config={"client-cache": value}))
    assert client_cache(SimpleNamespace(node_config={})) == 64
    assert client_cache(SimpleNamespace(node_config={"client-cache": 0})) == 0


@pytest.mark.parametrize(
    ("node_config", "named"),
    [
        ({"partition-id": 1.5}, "partition-id must be a whole number >= 0, got 1.5"),
        ({"partition-id": "abc"}, "partition-id must be a whole number >= 0, got 'abc'"),
        (
            {"partition-id": 0, "num-partitions": "ten"},
            "num-partitions must be a whole number >= 1, got 'ten'",
        ),
    ],
)
def test_a_wrong_partition_in_a_node_config_is_named_in_one_line(node_config, named) -> None:
    """int() took partition-id 1.5 as partition 1 (the node then served another site's data), and for a
    word raised a ValueError that named no key."""
    from types import SimpleNamespace

    from fedistill.config import RunConfig
    from fedistill.engine.flower.node import partition_of
    from fedistill.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^node config {re.escape(named)}$"):
        partition_of(SimpleNamespace(node_config=node_config), RunConfig(clients=2))
    assert partition_of(SimpleNamespace(node_config={"partition-id": 1}), RunConfig(clients=2)) == 1


class _StoringGrid:
    """A Grid that answers every stored message with `answer(node, request)` and stores none of the
    messages to the nodes in `refused` (`mode`: an empty id for each, as a deployment's SuperLink answers,
    or no id, as the in-memory grid skips one)."""

    def __init__(self, nodes, answer, refused=(), mode="empty-id"):
        self.nodes, self.answer, self.refused, self.mode = list(nodes), answer, set(), mode
        self.later_refused, self.stored, self.count = set(refused), {}, 0

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            if node in self.refused:
                ids += [""] if self.mode == "empty-id" else []
                continue
            self.count += 1
            mid = f"m{self.count}"
            message.metadata.__dict__["_message_id"] = mid
            self.stored[mid] = message
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        from flwr.app import Message as FlowerMessage

        out = []
        for mid in ids:
            request = self.stored.pop(mid, None)
            if request is not None:
                out.append(
                    FlowerMessage(self.answer(request.metadata.dst_node_id, request), reply_to=request)
                )
        return out


@pytest.fixture
def task_identity(monkeypatch):
    """The process's Flower task identity a Message needs, set for the test and restored after it."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1 if name == "_run_id" else 0)


def _hello_then(reply):
    def answer(node, request):
        if request.metadata.message_type == "query.hello":
            return to_records(Message.build("query.hello", scalars={"metrics": {"partition_id": node - 101}}))
        return to_records(reply)

    return answer


@pytest.mark.parametrize("mode", ["empty-id", "no-id"])
def test_a_request_the_superlink_did_not_store_is_that_nodes_failure_at_once(mode, task_identity) -> None:
    """An empty id for two nodes made the server crash on a KeyError; a missing id on a zip()."""
    from fedistill.federation.ledger import Ledger
    from fedistill.transports.flower.grid_fleet import GridFleet

    grid = _StoringGrid([101, 102, 103], _hello_then(Message.build("train", scalars={"metrics": {"n": 1}})))
    fleet = GridFleet(grid, Ledger(None), algorithm="fedavg", expected_clients=3, timeout=60.0)
    grid.refused, grid.mode = {102, 103}, mode
    replies = fleet.send({c: Message.build("train") for c in range(3)})
    assert replies[0].ok
    for client in (1, 2):
        assert replies[client].error == "not delivered: the SuperLink did not store the request"


def test_an_invalid_reply_over_flower_is_ledgered_with_its_bytes(tmp_path, task_identity) -> None:
    from fedistill.federation.ledger import Ledger
    from fedistill.transports.flower.grid_fleet import GridFleet

    nan = Message.build("query.logits", arrays={"logits": {"z": np.full((4, 10), np.nan, np.float32)}})
    grid = _StoringGrid([101, 102], _hello_then(nan))
    fleet = GridFleet(grid, Ledger(tmp_path / "ledger.jsonl"), algorithm="fediod", expected_clients=2)
    replies = fleet.send({c: Message.build("query.logits") for c in range(2)})
    assert not replies[0].ok and "NaN" in replies[0].error
    fleet.ledger.close()
    invalid = [r for r in read_ledger(tmp_path / "ledger.jsonl") if r["status"] == "invalid"]
    assert len(invalid) == 2 and all(r["bytes"] == 4 * 10 * 4 for r in invalid)


@pytest.mark.parametrize("partition", ["zero", 1.5, True])
def test_a_node_that_names_no_whole_partition_is_named_in_one_line(partition, task_identity) -> None:
    from fedistill.federation.ledger import Ledger
    from fedistill.transports.flower.grid_fleet import GridFleet

    def answer(node, request):
        return to_records(Message.build("query.hello", scalars={"metrics": {"partition_id": partition}}))

    with pytest.raises(FederationError, match=f"Flower node 101 named partition {partition!r}, not a whole"):
        GridFleet(_StoringGrid([101], answer), Ledger(None), algorithm="fedavg", expected_clients=1)


def _image_folder(root: Path, drop: int = 0) -> Path:
    """A two-class image folder (`train/`, `test/`), the last `drop` training images of class 'b' left out."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 4)):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            kept = n - drop if (split, label) == ("train", "b") else n
            for i in range(kept):
                pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8) // (1 if label == "a" else 4)
                Image.fromarray(pixels).save(root / split / label / f"{i:02d}.png")
    return root


def test_a_node_whose_copy_of_the_data_splits_otherwise_stops_the_run(tmp_path) -> None:
    """Each node rebuilds the split from the data under its own data-dir: a node with another copy (two
    images fewer) would train silently on other shards than the server's split assigns it."""
    folder = _image_folder(tmp_path / "data")
    config = _config(dataset="image-folder", data_dir=str(folder), model="mlp", clients=2, rounds=1)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    run_on_grid(config, tmp_path / "same", grid)  # the same copy on every node runs
    other = _image_folder(tmp_path / "other", drop=2)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes2"), config.clients)
    node = next(iter(grid.contexts.values()))
    node.node_config["data-dir"] = str(other)
    pid = node.node_config["partition-id"]
    named = rf"node {node.node_id} \(partition {pid}\) splits its data into other shards than the server"
    with pytest.raises(FederationError, match=named):
        run_on_grid(config, tmp_path / "other-run", grid)


def test_a_hello_without_the_nodes_split_is_refused_when_the_server_knows_its_own(task_identity) -> None:
    from fedistill.federation.ledger import Ledger
    from fedistill.transports.flower.grid_fleet import GridFleet

    grid = _StoringGrid([101, 102], _hello_then(Message.build("train")))
    GridFleet(grid, Ledger(None), algorithm="fedavg", expected_clients=2)  # no split to compare: runs
    with pytest.raises(FederationError, match="older fedistill than the server"):
        GridFleet(grid, Ledger(None), algorithm="fedavg", expected_clients=2, split_hash="ab" * 32)


@pytest.mark.parametrize(("threads", "per_node"), [(1, 1), (2, 2), (8, 3)])
def test_the_simulation_gives_ray_the_usable_cores_and_each_node_its_threads(monkeypatch, threads, per_node):
    """Ray was told os.cpu_count() cores (every core of the machine, not those the run may use: a job
    given 3 of 64 cores started 64 workers) and one core per node whatever `threads` said (4 threads per
    node started a worker per core, each running 4 threads)."""
    from fedistill.transports.flower import simulation

    monkeypatch.setattr(simulation.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(simulation.os, "sched_getaffinity", lambda pid: {0, 5, 9}, raising=False)
    backend = simulation.backend_config(Path("ray-root"), threads=threads)
    assert backend["init_args"]["num_cpus"] == 3
    assert backend["client_resources"]["num_cpus"] == per_node


def test_the_simulation_gives_a_stopping_run_minutes_before_ray_declares_its_node_dead() -> None:
    """A whole job's SIGTERM (SLURM, systemd) stops Ray's node with the run; with Ray's 5 missed health
    checks 3 s apart its driver ended the process with exit 1 (not the stop's 143, without its line)
    while the run was still shutting Ray down under load."""
    from fedistill.transports.flower import simulation

    system_config = simulation.backend_config(Path("ray-root"))["init_args"]["_system_config"]
    assert system_config["health_check_failure_threshold"] * 3 >= 120  # seconds, at Ray's 3 s period


def test_a_simulation_stops_well_within_a_schedulers_grace_period() -> None:
    """With Ray's control process gone (the whole job signalled), Ray's shutdown kept trying to send it
    task events: the run's stop took 11 s, 4 s with a 0.2 s limit; a scheduler kills a job after its grace
    period."""
    from fedistill.transports.flower import simulation

    system_config = simulation.backend_config(Path("ray-root"))["init_args"]["_system_config"]
    assert system_config["task_events_shutdown_flush_timeout_ms"] <= 1000


@pytest.mark.parametrize("value", ["two", 2.5, -1, True])
def test_a_wrong_thread_count_in_a_node_config_is_named_in_one_line(value) -> None:
    """int() cut 2.5 to 2 and named no key for 'two'; 0 reached torch.set_num_threads, which refused it
    on every message with 'set_num_threads expects a positive integer'."""
    from types import SimpleNamespace

    from fedistill.engine.flower.node import node_threads
    from fedistill.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^node config threads must be a whole number >= 0"):
        node_threads(SimpleNamespace(node_config={"threads": value}), RunConfig())
    assert node_threads(SimpleNamespace(node_config={"threads": 0}), RunConfig()) == 1  # as threads = 0
    assert node_threads(SimpleNamespace(node_config={"threads": 3}), RunConfig()) == 3
    assert node_threads(SimpleNamespace(node_config={}), RunConfig(threads=2)) == 2
    assert node_threads(SimpleNamespace(node_config={}), RunConfig()) == 1


def test_a_node_config_thread_count_has_the_run_s_bound() -> None:
    """A node's own `threads` is held to the bound the run's key has (MAX_THREADS), not only the run's."""
    from types import SimpleNamespace

    from fedistill.config import MAX_THREADS
    from fedistill.engine.flower.node import node_threads
    from fedistill.errors import ConfigError

    assert node_threads(SimpleNamespace(node_config={"threads": MAX_THREADS}), RunConfig()) == MAX_THREADS
    with pytest.raises(ConfigError, match=rf"^node config threads must be .* <= {MAX_THREADS}"):
        node_threads(SimpleNamespace(node_config={"threads": 100000}), RunConfig())


def test_a_missing_ray_is_one_line_before_flower_is_started(monkeypatch, tmp_path) -> None:
    """Without Ray (flwr installed without its simulation extra) Flower's run_simulation logged its own
    message and exited the process (sys.exit, then os._exit after a grace period) instead of fedistill's
    one line."""
    import importlib.util

    import flwr.simulation

    from fedistill.errors import ConfigError
    from fedistill.transports.flower import simulation

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    started = []
    monkeypatch.setattr(flwr.simulation, "run_simulation", lambda **kwargs: started.append(kwargs))
    with pytest.raises(ConfigError, match=r"needs Ray.*pip install"):
        simulation.simulate(None, None, 2, tmp_path / "home")
    assert not started


def test_a_state_dir_under_the_home_folder_is_there_not_in_a_folder_named_tilde(
    monkeypatch, tmp_path
) -> None:
    """--node-config "state-dir='~/state'" (quoted, so no shell expands it) put the node's state and its
    worker's key into a folder literally named '~' under wherever the SuperNode was started."""
    from types import SimpleNamespace

    from fedistill.transports.flower.forward import node_state_dir, worker_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    context = SimpleNamespace(node_config={"state-dir": "~/state"}, node_id=7)
    assert node_state_dir(context) == tmp_path / "state"
    assert worker_dir(context) == tmp_path / "state" / "worker-node-7"
    assert node_state_dir(SimpleNamespace(node_config={})).name == "fedistill-nodes"


@pytest.mark.parametrize("value", [0, -5, "soon", True])
def test_a_wrong_worker_idle_time_is_named_in_the_error_reply(monkeypatch, tmp_path, task_identity, value):
    """worker-idle-s = 0 started a worker that exited at once, and every message then waited for it to
    start (120 s) before failing with 'did not start'; a word failed with float()'s message, naming no key."""
    from flwr.app import Context
    from flwr.app import Message as FlowerMessage

    from fedistill.transports.flower import forward

    monkeypatch.setattr(forward, "START_TIMEOUT_S", 2.0)
    node_config = {"state-dir": str(tmp_path), "worker": True, "worker-idle-s": value}
    context = Context(run_id=1, node_id=3, node_config=node_config, state=RecordDict(), run_config={})
    request = FlowerMessage(RecordDict(), dst_node_id=3, message_type="query.hello")
    request.metadata.__dict__["_message_id"] = "m1"
    reply = forward.forward(request, context, "fedistill.engine.flower.worker")
    assert reply.has_error()
    assert reply.error.reason == f"node config worker-idle-s must be a number of seconds > 0, got {value!r}"


def test_a_worker_setting_that_is_no_yes_or_no_is_named_in_the_error_reply(task_identity):
    """worker = "treu" (a typo) meant no worker without a word; now each reply names the setting."""
    from flwr.app import Context
    from flwr.app import Message as FlowerMessage

    from fedistill.transports.flower import forward

    app = forward.NodeClientApp("fedistill.engine.flower.apps:client_app", "fedistill.engine.flower.worker")
    context = Context(run_id=1, node_id=3, node_config={"worker": "treu"}, state=RecordDict(), run_config={})
    request = FlowerMessage(RecordDict(), dst_node_id=3, message_type="query.hello")
    request.metadata.__dict__["_message_id"] = "m1"
    reply = app(request, context)
    assert reply.has_error() and reply.error.reason == "node config worker must be true or false, got 'treu'"
    for value, expected in ((True, True), ("yes", True), ("false", False), (0, False)):
        node = Context(run_id=1, node_id=3, node_config={"worker": value}, state=RecordDict(), run_config={})
        assert forward.uses_worker(node) is expected


def test_a_node_worker_that_exits_before_it_listens_fails_the_message_at_once(monkeypatch, tmp_path):
    """A worker that could not start (a module missing on the node) left each message waiting the whole
    start timeout (120 s) before 'did not start'; its exit is now noticed and named with its log."""
    import time

    from fedistill.transports.flower import forward

    monkeypatch.setattr(forward, "START_TIMEOUT_S", 20.0)
    started = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"the node worker exited \(code 1\) before it listened; see .*worker\.log"
    ):
        forward.connect_or_start(tmp_path / "w", 5.0, "fedistill_no_such_worker_module")
    assert time.monotonic() - started < 10
    assert "No module named fedistill_no_such_worker_module" in (tmp_path / "w" / "worker.log").read_text()


def test_a_node_worker_outlives_a_forwarder_that_dies_mid_message(tmp_path):
    """A forwarding ClientApp killed before it sent its message (Flower stops a run's ClientApps) ended
    the worker with an EOFError, and with it every client it kept in memory; so did a connection that
    failed the key handshake."""
    import threading
    import time
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from fedistill.engine.flower.worker import serve
    from fedistill.transports.flower.forward import pack, unpack

    sock, key = tmp_path / "w.sock", b"k" * 32
    thread = threading.Thread(target=serve, args=(sock, key, 60.0), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    Client(str(sock), family="AF_UNIX", authkey=key).close()  # connected, then gone without a frame
    with pytest.raises(AuthenticationError):  # a process without the node's key is turned away
        Client(str(sock), family="AF_UNIX", authkey=b"wrong" * 8)
    with Client(str(sock), family="AF_UNIX", authkey=key) as connection:
        connection.send_bytes(pack({"stop": True}, None))
        assert unpack(connection.recv_bytes())[0] == {"stopped": True}
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_both_transports_record_the_same_rows_in_the_order_the_ledger_page_states(tmp_path, task_identity):
    """Over one exchange with an encoded reply, a NaN reply (invalid, its bytes counted) and a failing
    client, Flower's ledger holds in-process's rows (bytes, kinds, encodings, directions, statuses) after
    its round-0 hello, with each exchange's requests before its replies."""
    from fedistill.federation.client import ClientLogic, handles
    from fedistill.federation.ledger import Ledger
    from fedistill.transports.flower.grid_fleet import GridFleet
    from fedistill.transports.inprocess import InProcessFleet

    class Site(ClientLogic):
        def __init__(self, cid: int) -> None:
            self.cid = cid

        @handles("query.logits")
        def logits(self, message: Message) -> Message:
            if self.cid == 2:
                raise RuntimeError("disk full")
            z = message.array("synthetic-inputs", "x")[:, :3] * (np.nan if self.cid == 1 else 2.0)
            return Message.build(
                "query.logits",
                arrays={"logits": {"z": z}},
                scalars={"metrics": {"n": 4}},
                encodings={"logits": "float16-scaled"},
            )

    sites = {cid: Site(cid) for cid in range(3)}

    def answer(node, request):
        if request.metadata.message_type == "query.hello":
            return to_records(Message.build("query.hello", scalars={"metrics": {"partition_id": node - 101}}))
        return to_records(sites[node - 101].handle(from_records(request.content, "query.logits")))

    def flower_answer(node, request):
        try:
            return answer(node, request)
        except RuntimeError as exc:
            from flwr.app import Error

            return Error(code=2, reason=str(exc))

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    request = Message.build(
        "query.logits", arrays={"synthetic-inputs": {"x": x}}, encodings={"synthetic-inputs": "uint8-affine"}
    )
    ledgers = {}
    for name in ("inprocess", "flower"):
        ledger = Ledger(tmp_path / f"{name}.jsonl")
        if name == "inprocess":
            fleet = InProcessFleet(sites, ledger)
        else:
            fleet = GridFleet(
                _StoringGrid([101, 102, 103], flower_answer), ledger, algorithm="x", expected_clients=3
            )
        fleet.round = 1
        fleet.broadcast(request, step=5)
        ledger.close()
        ledgers[name] = read_ledger(tmp_path / f"{name}.jsonl")

    def row(record):
        return {k: v for k, v in record.items() if k not in ("seq", "error")}

    hello, flower = ledgers["flower"][:6], ledgers["flower"][6:]
    assert {r["type"] for r in hello} == {"query.hello"} and {r["round"] for r in hello} == {0}
    assert [r["bytes"] for r in hello if r["direction"] == "server->client"] == [0, 0, 0]
    inprocess = ledgers["inprocess"]
    assert [r["direction"] for r in inprocess] == ["server->client", "client->server"] * 3
    assert [r["direction"] for r in flower] == ["server->client"] * 3 + ["client->server"] * 3
    key = lambda r: (r["direction"], r["client"])  # noqa: E731
    assert sorted(map(row, flower), key=key) == sorted(map(row, inprocess), key=key)
    ups = {r["client"]: r for r in inprocess if r["direction"] == "client->server"}
    assert [ups[c]["status"] for c in range(3)] == ["ok", "invalid", "failed"]
    assert ups[0]["encodings"] == {"logits": "float16-scaled"} and ups[1]["bytes"] == ups[0]["bytes"] > 0


def test_an_empty_reply_crosses_a_node_worker_as_it_crosses_the_plain_client_app(task_identity) -> None:
    """A reply with no arrays and no scalars (an acknowledgement) is an empty RecordDict, which Flower's
    protobuf encodes as no bytes: the worker's frame read that back as no content, and the forwarder then
    failed to build its reply, so the site failed only on nodes with `worker=true`."""
    from flwr.app import ConfigRecord
    from flwr.app import Message as FlowerMessage

    from fedistill.transports.flower.forward import pack, unpack

    request = FlowerMessage(
        RecordDict({"fedistill.header": ConfigRecord({"algorithm": "mine"})}),
        dst_node_id=5,
        message_type="query.ack",
    )
    request.metadata.__dict__["_message_id"] = "m1"
    header, content = unpack(pack({"versions": {}}, to_records(Message.build("query.ack"))))
    reply = FlowerMessage(content, reply_to=request)
    assert header == {"versions": {}} and not reply.has_error()
    assert from_records(reply.content, "query.ack") == Message.build("query.ack")


@pytest.mark.parametrize("smuggled", ["config", "arrays"])
def test_a_reply_carrying_a_transport_header_is_invalid_not_bytes_the_ledger_misses(
    tmp_path, task_identity, smuggled
) -> None:
    """Only requests carry the transport header; the server's codec skipped any record under its name, so
    a site could send arrays there that crossed the boundary without a line of the ledger counting them."""
    from flwr.app import ConfigRecord

    from fedistill.federation.ledger import Ledger
    from fedistill.transports.flower.codec import HEADER
    from fedistill.transports.flower.grid_fleet import GridFleet

    def answer(node, request):
        if request.metadata.message_type == "query.hello":
            return to_records(Message.build("query.hello", scalars={"metrics": {"partition_id": node - 101}}))
        content = to_records(Message.build("train", scalars={"metrics": {"n": 1}}))
        if node == 102:
            hidden = {"w": Array(np.ones(1000, np.float32))} if smuggled == "arrays" else None
            content[HEADER] = ArrayRecord(hidden) if hidden else ConfigRecord({"note": "x" * 1000})
        return content

    fleet = GridFleet(_StoringGrid([101, 102], answer), Ledger(None), algorithm="fedavg", expected_clients=2)
    replies = fleet.send({c: Message.build("train") for c in range(2)})
    assert replies[0].ok
    assert not replies[1].ok and "transport header" in replies[1].error
    assert fleet.ledger.totals.failures[0]["status"] == "invalid"
