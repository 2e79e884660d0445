"""One site on a Flower SuperNode: its private data, its client logic, and that logic's state.

The node reads its partition id (and optionally its data folder) from its node config, loads the
data itself and builds the algorithm's client logic; nothing private is ever sent. The client's
state (trained model, discriminator, optimiser state, ...) must outlive the process: Flower's
simulation engine routes a node's messages to whichever worker is free, and a deployed SuperNode
starts a fresh process per message. So after every message the state is written to node-local
storage (safetensors + JSON, under a name holding its version) and the version number is kept in the
node's `context.state`; a process whose in-memory copy has that version reuses it, any other reloads that
version's files. A process killed while it writes, or before its reply (which carries the context back)
leaves, cannot mix two versions' files or load a state ahead of its context: the version the context
names is still on disk (the one before it is kept too, older ones are removed). A process keeps at
most `client-cache` clients in memory (node config; default 64), so a worker that serves a thousand
simulated sites does not hold them all, and before each message it returns the C heap's free pages to
the system (heap.py), so what earlier messages freed is not kept either.

A client pushed out of that cache is often a reference cycle (a module holding a bound method of its
client), which only a full garbage collection frees; in a worker holding some 300,000 long-lived objects
(torch, Flower, Ray) CPython runs one rarely, and the pushed-out clients piled up (about 75 MiB of tensors
beyond the cache's own 35 MiB per worker in a 300-site FedIOD simulation, before any G-step). So a client
pushed out drops its attributes at once, which frees what the cycle held by reference counting alone; for
any cycle left, the process's long-lived objects are frozen out of the collector once its data are loaded
(`gc.freeze`), and a collection, now over the clients alone, runs after every `client-cache` pushed out.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context

from fedistill import devices
from fedistill.algorithms.shared.stage1 import cache_folder
from fedistill.algorithms.shared.training import task_of
from fedistill.config import MAX_THREADS, RunConfig
from fedistill.data.base import LoadedDataset
from fedistill.engine.checkpoint import load_state, save_state
from fedistill.engine.flower.heap import release_free_memory
from fedistill.engine.setup import Prepared, check_sets, client_context, prepare_data, resolve, site_context
from fedistill.engine.site_data import (
    DATASET_INFO,
    EVALUATION_SET,
    harness_from,
    load_site,
    own_data,
    site_folder,
)
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.client import ClientLogic
from fedistill.federation.messages import Message
from fedistill.transports.flower.forward import VERSIONS, node_state_dir
from fedistill.transports.flower.grid_fleet import DATA_HASH, HELLO, SPLIT_HASH


@dataclass
class Node:
    """One client of one algorithm on a Flower node, with the version of its state on disk."""

    key: tuple[int, str, int]  # (run id, algorithm, partition id)
    client: ClientLogic
    version: int
    state_stem: Path

    def commit(self, context: Context) -> None:
        """Persist the client's state as its next version, then publish that version in the node's
        context; versions before the previous one are removed."""
        version = self.version + 1
        self.state_stem.parent.mkdir(parents=True, exist_ok=True)
        save_state(self.client.state_dict(), versioned(self.state_stem, version))
        self.version = version
        versions = dict(context.state[VERSIONS]) if VERSIONS in context.state else {}
        versions[self.key[1]] = version
        context.state[VERSIONS] = ConfigRecord(versions)
        for old in self.state_stem.parent.glob(f"{self.state_stem.name}-*.*"):
            if _version_of(old, self.state_stem) < version - 1:
                old.unlink(missing_ok=True)


def versioned(stem: Path, version: int) -> Path:
    """Where version `version` of a client's state lives (`<stem>-<version>.safetensors` and `.json`)."""
    return stem.with_name(f"{stem.name}-{version:08d}")


def _version_of(path: Path, stem: Path) -> int:
    """The version in a state file's name (`versioned`); one it cannot read counts as current."""
    number = path.name[len(stem.name) + 1 :].split(".", 1)[0]
    return int(number) if number.isdigit() else 1 << 62


#: The clients a process keeps in memory, least recently used first. A simulation worker serves many nodes,
#: and every client's state is on node storage after each message, so a client pushed out is rebuilt and
#: reloaded when its node is asked again: memory stays bounded at a thousand sites.
_NODES: OrderedDict[tuple[int, str, int], Node] = OrderedDict()
#: How many clients a process keeps (node config `client-cache`; 0: every one it served).
CLIENT_CACHE = 64
_DATA: dict[str, Any] = {}


#: Clients pushed out since the last garbage collection, and whether this process froze its long-lived
#: objects (see the module docstring).
_COLLECTOR = {"evicted": 0, "frozen": False}


def _remember(key: tuple[int, str, int], node: Node, limit: int) -> None:
    """Keep `node` as the most recently used client, forgetting the least recently used past `limit`: a
    forgotten client drops its attributes (see the module docstring), and after every `limit` forgotten a
    collection frees any cycle that is left."""
    _NODES[key] = node
    _NODES.move_to_end(key)
    while limit > 0 and len(_NODES) > limit:
        _, forgotten = _NODES.popitem(last=False)
        vars(forgotten.client).clear()  # nothing else holds it: this process serves one message at a time
        _COLLECTOR["evicted"] += 1
    if limit > 0 and _COLLECTOR["evicted"] >= limit:
        _COLLECTOR["evicted"] = 0
        gc.collect()


def _freeze_long_lived() -> None:
    """Once per process, with the libraries imported and the data loaded: leave those objects out of every
    later collection, so that one costs milliseconds, not a few hundred (measured: 260-500 ms unfrozen)."""
    if not _COLLECTOR["frozen"]:
        _COLLECTOR["frozen"] = True
        gc.collect()
        gc.freeze()


def client_cache(context: Context) -> int:
    """The node config's `client-cache`: a whole number >= 0 (0: keep every client), else one clear line."""
    return _whole_number(context.node_config, "client-cache", CLIENT_CACHE, minimum=0, note=" (0: all)")


def _whole_number(
    node_config: Any, key: str, default: Any, *, minimum: int, note: str = "", maximum: int | None = None
) -> int:
    """A node config value that must be a whole number >= `minimum` (and <= `maximum`, if given); one clear
    line naming the key otherwise (int() cut 1.5 to 1 and named no key for 'abc')."""
    value = node_config.get(key, default)
    wrong = isinstance(value, bool) or not isinstance(value, int) or value < minimum
    if wrong or (maximum is not None and value > maximum):
        most = f" and <= {maximum}" if maximum is not None else ""
        raise ConfigError(f"node config {key} must be a whole number >= {minimum}{most}{note}, got {value!r}")
    return value


def node_threads(context: Context, config: RunConfig) -> int:
    """The torch threads this node trains on: the node config's `threads`, else the run's; 0 means one,
    as for the run's `threads` on Flower (one clear line for anything but a whole number in 0..MAX_THREADS,
    the run's own bound)."""
    node_config = context.node_config
    return (
        _whole_number(
            node_config, "threads", config.threads, minimum=0, maximum=MAX_THREADS, note=" (0: one)"
        )
        or 1
    )


def partition_of(context: Context, config: RunConfig, assigned: int | None = None) -> int:
    """This node's partition id (its client index), checked against the run's clients: the one the server
    `assigned` from the operator's enrolment (enrolment.py) when it sent one, else the node config's."""
    node_config = context.node_config
    if assigned is not None:
        claimed = node_config.get("partition-id")
        if claimed is not None and _whole_number(node_config, "partition-id", None, minimum=0) != assigned:
            raise ConfigError(
                f"this SuperNode's node config says partition-id={claimed}, but its enrolment fixes "
                f"partition {assigned}: remove partition-id from --node-config"
            )
    elif "partition-id" not in node_config:
        raise ConfigError("this SuperNode has no partition-id in its node config (--node-config)")
    pid = assigned if assigned is not None else _whole_number(node_config, "partition-id", None, minimum=0)
    total = _whole_number(node_config, "num-partitions", config.clients, minimum=1)
    if total != config.clients:
        raise ConfigError(f"node config says num-partitions={total}, the run has clients={config.clients}")
    if not 0 <= pid < total:
        raise ConfigError(f"partition-id {pid} is outside 0..{total - 1}")
    return pid


def node_for(
    context: Context,
    config: RunConfig,
    algorithm_name: str,
    state_root: Path | None,
    assigned: int | None = None,
) -> Node:
    """The node's client of `algorithm_name` in this run: kept in memory while its version is current, else
    rebuilt and its state reloaded. `assigned`: the partition the server fixed for this node, if any."""
    release_free_memory()  # what the messages before this one freed
    pid = partition_of(context, config, assigned)
    key = (int(context.run_id), algorithm_name, pid)
    versions = dict(context.state[VERSIONS]) if VERSIONS in context.state else {}
    version = int(versions.get(algorithm_name, 0))
    limit = client_cache(context)
    node = _NODES.get(key)
    if node is not None and node.version == version:
        _remember(key, node, limit)
        return node
    root = state_root or node_state_dir(context)
    stem = Path(root) / f"run-{key[0]}" / f"{algorithm_name}-client-{pid:03d}" / "state"
    client = _build_client(
        context, config, algorithm_name, pid, cache_folder(config, beside=Path(root)), state_root
    )
    if version > 0:
        client.load_state_dict(load_state(versioned(stem, version)))
    node = Node(key, client, version, stem)
    _remember(key, node, limit)
    return node


def node_data(context: Context, config: RunConfig) -> tuple[RunConfig, Any]:
    """The run config with this node's `data-dir`, and the data prepared from it (loaded once per config):
    the node's copy of the dataset, split as the config says."""
    config = config.replace(data_dir=str(context.node_config.get("data-dir", config.data_dir)))
    data_key = repr(sorted(config.to_dict().items()))
    if data_key not in _DATA:
        _DATA.clear()  # one config's data at a time
        _DATA[data_key] = prepare_data(config)
        _freeze_long_lived()
    return config, _DATA[data_key]


def harness_stem(context: Context, state_root: Path | None) -> Path:
    """Where a node keeps what the run's HELLO brought it when it holds its own data (the server's dataset
    facts and test set, site_data.py): node storage, so that every later process of the node, a worker's
    included, has them."""
    return Path(state_root or node_state_dir(context)) / f"run-{int(context.run_id)}" / "evaluation-set"


def site_hello(
    context: Context, config: RunConfig, pid: int, request: Message, state_root: Path | None
) -> Message:
    """The HELLO reply of a site holding its own data: what the server sent is kept (a site whose data
    disagree with its facts fails here, naming the difference), and the reply says how many training
    records the site holds, their fingerprint (two sites reading one folder are found out) and the hash of
    its split of them (a resume finds a site whose records changed)."""
    arrays, scalars = request.arrays.get(EVALUATION_SET), request.scalars.get("config", {})
    if arrays is None or DATASET_INFO not in scalars:
        raise FederationError(
            f"{HELLO} carried no dataset facts and test set from the server, which a site with its own data "
            "needs (the server runs an older fedistill, or no site_data_dir): install the same version"
        )
    harness_from(arrays, scalars)  # what it cannot read is refused before it is kept
    stem = harness_stem(context, state_root)
    stem.parent.mkdir(parents=True, exist_ok=True)
    kept = {"arrays": {name: torch.as_tensor(np.array(value)) for name, value in arrays.items()}}
    save_state({**kept, "config": {key: str(value) for key, value in scalars.items()}}, stem)
    site, _ = node_site(context, config, pid, state_root)
    reply = {
        "metrics": {"partition_id": pid, "num_samples": len(site.split.client_train[0])},
        "config": {DATA_HASH: site.records_hash, SPLIT_HASH: site.split.hash()},
    }
    return Message.build(HELLO, scalars=reply)


def node_site(
    context: Context, config: RunConfig, pid: int, state_root: Path | None
) -> tuple[Prepared, LoadedDataset]:
    """This site's own data (site_data.py), from its node config's `data-dir`, else `site_data_dir`, and
    the server's facts and test set its HELLO kept (both loaded once per process)."""
    stem = harness_stem(context, state_root)
    if not stem.with_suffix(".json").exists():
        raise FederationError(f"this node has no dataset facts from the server: it missed the run's {HELLO}")
    folder = site_folder(config, pid, context.node_config.get("data-dir"))
    stamp = stem.with_suffix(".safetensors").stat().st_mtime_ns
    data_key = repr(("site", pid, str(folder), str(stem), stamp, sorted(config.to_dict().items())))
    if data_key not in _DATA:
        _DATA.clear()  # one site's data at a time
        kept = load_state(stem)
        harness = harness_from(kept["arrays"], kept["config"])
        site = load_site(config, pid, harness.info, folder)
        check_sets(task_of(config, site.dataset.info), site.dataset.info, site.dataset, f"site {pid}'s")
        _DATA[data_key] = (site, harness)
        _freeze_long_lived()
    return _DATA[data_key]


def _build_client(
    context: Context,
    config: RunConfig,
    algorithm_name: str,
    pid: int,
    cache_dir: Path | None,
    state_root: Path | None,
) -> ClientLogic:
    # simulation workers share the machine's cores: one thread each unless the node says otherwise
    torch.set_num_threads(node_threads(context, config))
    # a node may run on its own accelerator: node config `device`, else the run's
    devices.use(str(context.node_config.get("device", config.device)))
    own = own_data(config)
    if own:  # the site's own records (site_data.py)
        site, harness = node_site(context, config, pid, state_root)
    else:
        config, data = node_data(context, config)
    resolved = resolve(config, algorithm_name)
    if resolved.algorithm.pooled:
        raise ConfigError(f"{algorithm_name} pools every client's data; it cannot run on Flower nodes")
    if own:
        return resolved.algorithm.client(
            site_context(resolved.config, resolved.options, site, pid, cache_dir, harness)
        )
    # only this node's site: building all K contexts would copy every site's shard on each node
    return resolved.algorithm.client(client_context(resolved.config, resolved.options, data, pid, cache_dir))
