"""A process serving many Flower nodes gives back what its messages freed, and results do not move."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

pytest.importorskip("flwr")

from fedistill.config import RunConfig, build_config
from fedistill.engine.flower import heap
from fedistill.engine.flower import node as flower_node
from fedistill.engine.flower.apps import make_client_app
from fedistill.engine.launch import run_suite
from flower_local_grid import LocalGrid, run_on_grid


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap, /proc")
def test_release_free_memory_returns_freed_heap_pages() -> None:
    """Freed blocks pinned below the heap's top stay resident until they are released."""
    if heap._malloc_trim() is None:
        pytest.skip("the C library has no malloc_trim (not glibc)")
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block, count = 64 * 1024, 400  # below glibc's mmap threshold: on the heap
    blocks = [libc.malloc(block) for _ in range(2 * count)]
    for address in blocks:
        ctypes.memset(address, 1, block)  # resident
    # a live block after each freed one: free() alone cannot shrink the heap
    freed, pins = blocks[::2], blocks[1::2]
    for address in freed:
        libc.free(address)
    before = _rss_mb()
    assert heap.release_free_memory() is True
    released = before - _rss_mb()
    for address in pins:
        libc.free(address)
    assert released > 0.5 * block * count / 2**20


def test_every_message_to_a_node_first_releases_free_memory(tmp_path, monkeypatch) -> None:
    """Each message a client answers starts by giving back the heap's free pages; the results are the
    in-process ones."""
    config = build_config(
        RunConfig(), {"algorithm": "fedavg", "clients": 3, "rounds": 2, "model": "lenet-fedmdcg"}
    )
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    calls: list[int] = []
    monkeypatch.setattr(flower_node, "release_free_memory", lambda: calls.append(1) or True)
    app = make_client_app(config, state_root=tmp_path / "nodes")
    answered: list[str] = []

    def watched(message, context):
        answered.append(message.metadata.message_type)
        return app(message, context)

    there = run_on_grid(config, tmp_path / "flower", LocalGrid(watched, config.clients))
    assert len(calls) == sum(1 for kind in answered if kind != "query.hello") > 0
    for a, b in zip(here, there, strict=True):
        assert b["final"]["test_accuracy"] == pytest.approx(a["final"]["test_accuracy"], abs=1e-6)


def test_clients_pushed_out_of_the_cache_are_freed(tmp_path, monkeypatch) -> None:
    """A FedIOD client is a reference cycle (its discriminator holder keeps a bound method of it): pushed
    out of a worker's client cache, it must still be freed, not wait for a full collection that a worker
    with many long-lived objects rarely runs."""
    import gc
    import weakref

    from flwr.app import Context, RecordDict

    monkeypatch.setattr(flower_node, "_NODES", type(flower_node._NODES)())
    monkeypatch.setattr(flower_node, "_COLLECTOR", {"evicted": 0, "frozen": False})
    monkeypatch.setattr(flower_node, "_DATA", {})
    monkeypatch.setattr(gc, "freeze", lambda: None)  # this test process's objects stay collectable
    config = build_config(RunConfig(), {"algorithm": "fediod", "clients": 40, "model": "lenet-fedmdcg"})
    limit, alive = 8, []
    gc.disable()  # no collection but the cache's own
    try:
        for pid in range(config.clients):
            node_config = {"partition-id": pid, "num-partitions": config.clients, "client-cache": limit}
            state = RecordDict()
            context = Context(run_id=1, node_id=pid, node_config=node_config, state=state, run_config={})
            node = flower_node.node_for(context, config, "fediod", tmp_path)
            alive.append(weakref.ref(node.client))
            del node
            # the cache's clients only: one pushed out is freed at once, without waiting for a collection
            assert sum(ref() is not None for ref in alive) <= limit
    finally:
        gc.enable()


class _Counter:
    """A client whose whole state is a tensor and a step count, kept in the two files a commit writes."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"weights": torch.full((2,), float(self.step)), "step": self.step}


def test_a_node_killed_while_it_commits_reloads_the_version_its_context_names(tmp_path, monkeypatch) -> None:
    """The tensors and the JSON of a client's state are two files: a process killed between their writes
    (or before its reply brought the new version into the node's context) left the next process a state of
    mixed or later versions, loaded as the context's. Each version now has files of its own."""
    from flwr.app import Context, RecordDict

    from fedistill import disk
    from fedistill.engine.checkpoint import load_state
    from fedistill.transports.flower.forward import VERSIONS

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    client, stem = _Counter(), tmp_path / "fediod-client-000" / "state"
    node = flower_node.Node((1, "fediod", 0), client, 0, stem)
    for step in (1, 2, 3):
        client.step = step
        node.commit(context)
    assert int(context.state[VERSIONS]["fediod"]) == 3
    assert sorted(p.name for p in stem.parent.iterdir()) == [
        f"state-{v:08d}.{suffix}" for v in (2, 3) for suffix in ("json", "safetensors")
    ]
    client.step = 4

    def killed(path, text):
        raise OSError("killed")

    monkeypatch.setattr(disk, "write_text", killed)  # the tensors are written, the JSON is not
    with pytest.raises(OSError):
        node.commit(context)
    version = int(context.state[VERSIONS]["fediod"])
    state = load_state(flower_node.versioned(stem, version))
    assert version == 3 and state["step"] == 3 and state["weights"].tolist() == [3.0, 3.0]
