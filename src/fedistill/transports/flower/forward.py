"""A ClientApp that is ephemeral by default, or a thin forwarder to a long-lived worker on nodes
started with `--node-config "... worker=true"` (pyproject.toml's `clientapp` is one of these).

A deployed SuperNode starts a fresh ClientApp process for every message. By default that process
imports torch and the algorithms and answers the message itself (`apps.client_app`). With
`worker=true` it imports Flower and the standard library only and hands the message to the node's
worker (worker.py), which keeps the client logic in memory; the first message starts the worker and
it exits after `worker-idle-s` (default 900) without a message. The node's state directory (node
config `state-dir`) holds the worker's key and log; its socket is in the temp folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import secrets
import struct
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.common import serde
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

VERSIONS = "fedistill.versions"  # the node's state versions in `context.state` (node.py)
CLIENT_ERROR = 2  # Flower's error code for an exception inside a ClientApp
START_TIMEOUT_S = 120.0
_HEADER = struct.Struct("!I")


def pack(header: dict[str, Any], content: RecordDict | None) -> bytes:
    """A frame: 4-byte header length, JSON header, then the RecordDict in Flower's protobuf encoding."""
    head = json.dumps(header).encode()
    body = serde.recorddict_to_proto(content).SerializeToString() if content is not None else b""
    return _HEADER.pack(len(head)) + head + body


def unpack(frame: bytes) -> tuple[dict[str, Any], RecordDict]:
    """The header and content of a frame `pack` wrote; an empty RecordDict for a frame without content,
    since Flower's protobuf writes an empty RecordDict (a reply with no payload) as no bytes at all."""
    (size,) = _HEADER.unpack_from(frame)
    header = json.loads(frame[_HEADER.size : _HEADER.size + size])
    body = frame[_HEADER.size + size :]
    if not body:
        return header, RecordDict()
    proto = ProtoRecordDict()
    proto.ParseFromString(body)
    return header, serde.recorddict_from_proto(proto)


def node_state_dir(context: Context) -> Path:
    """The node's storage: its node config's `state-dir` (`~` is the home folder: the value is quoted on
    the SuperNode's command line, so no shell expands it), else a folder in the temp folder."""
    default = Path(tempfile.gettempdir()) / "fedistill-nodes"
    return Path(str(context.node_config.get("state-dir", default))).expanduser()


def worker_dir(context: Context) -> Path:
    """The folder of this node's worker: its socket, key and log, under the node's state-dir."""
    return node_state_dir(context) / f"worker-node-{context.node_id}"


def _key(folder: Path) -> bytes:
    path = folder / "worker.key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(32))
    return path.read_bytes()


def socket_path(folder: Path) -> Path:
    """The worker's socket: a short path in the temp folder, named after the node's folder, since Unix
    socket paths are limited to about 100 bytes and state folders can be deeper than that."""
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"fedistill-worker-{digest}.sock"


def _connect(folder: Path, key: bytes):
    return Client(str(socket_path(folder)), family="AF_UNIX", authkey=key)


def connect_or_start(folder: Path, idle_s: float, worker_module: str) -> Any:
    """A connection to the node's worker, starting it first if none answers (one starter at a time)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "worker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        key = _key(folder)
        try:
            return _connect(folder, key)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        with open(folder / "worker.log", "ab") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", worker_module, "--socket", str(socket_path(folder)),
                 "--key-file", str(folder / "worker.key"), "--idle-s", str(idle_s)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return _connect(folder, key)
            except (FileNotFoundError, ConnectionRefusedError):
                log_file = folder / "worker.log"
                if (code := worker.poll()) is not None:  # it failed to start: no use waiting for it
                    raise RuntimeError(
                        f"the node worker exited (code {code}) before it listened; see {log_file}"
                    ) from None
                if time.monotonic() > deadline:
                    message = f"the node worker did not start within {START_TIMEOUT_S:.0f} s; see {log_file}"
                    raise TimeoutError(message) from None
                time.sleep(0.1)


def stop_worker(folder: Path) -> bool:
    """Ask the worker serving `folder` to exit now; False if none was running."""
    try:
        with _connect(folder, (folder / "worker.key").read_bytes()) as connection:
            connection.send_bytes(pack({"stop": True}, None))
            return bool(unpack(connection.recv_bytes())[0].get("stopped"))
    except (FileNotFoundError, ConnectionRefusedError, EOFError):
        return False


def worker_idle_s(context: Context) -> float:
    """The node config's `worker-idle-s`: a number of seconds > 0 (0 started a worker that exited at once,
    and each message then waited for it to start), else a ValueError naming the key."""
    value = context.node_config.get("worker-idle-s", 900.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ValueError(f"node config worker-idle-s must be a number of seconds > 0, got {value!r}")
    return float(value)


def forward(message: FlowerMessage, context: Context, worker_module: str) -> FlowerMessage:
    """Answer a Flower message through the node's worker process (started when none runs); an unreachable
    worker or its error becomes an error reply."""
    versions = dict(context.state[VERSIONS]) if VERSIONS in context.state else {}
    header = {
        "message_type": message.metadata.message_type,
        "run_id": int(context.run_id),
        "node_id": int(context.node_id),
        "node_config": dict(context.node_config),
        "run_config": dict(context.run_config),
        "versions": versions,
    }
    try:
        idle_s = worker_idle_s(context)
    except ValueError as exc:  # the node's own setting, not an unreachable worker
        return FlowerMessage(Error(code=CLIENT_ERROR, reason=str(exc)), reply_to=message)
    try:
        with connect_or_start(worker_dir(context), idle_s, worker_module) as connection:
            connection.send_bytes(pack(header, message.content))
            reply, content = unpack(connection.recv_bytes())
    except Exception as exc:
        reply, content = {"error": f"node worker unreachable: {type(exc).__name__}: {exc}"}, None
    if "error" in reply:
        return FlowerMessage(Error(code=CLIENT_ERROR, reason=reply["error"]), reply_to=message)
    if reply["versions"]:
        context.state[VERSIONS] = ConfigRecord(reply["versions"])
    return FlowerMessage(content, reply_to=message)


def uses_worker(context: Context) -> bool:
    """Whether this node's config asks for a worker process (`worker = true`); a ValueError naming the key
    for a value that is no yes or no (a typo such as "treu" meant no worker, without a word)."""
    value = context.node_config.get("worker", "false")
    text = str(value).lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no", ""):
        return False
    raise ValueError(f"node config worker must be true or false, got {value!r}")


class NodeClientApp(ClientApp):
    """Every message type goes to the node's worker (`worker_module`, started on demand) or to the
    ephemeral ClientApp named by `ephemeral` ("module:attribute", imported on first use, since it
    brings torch and every algorithm); the client logic refuses types it does not know."""

    def __init__(self, ephemeral: str, worker_module: str) -> None:
        super().__init__()
        self.ephemeral, self.worker_module = ephemeral, worker_module

    def __call__(self, message: FlowerMessage, context: Context) -> FlowerMessage:
        try:
            worker = uses_worker(context)
        except ValueError as exc:  # the node's own setting: its every reply says so
            return FlowerMessage(Error(code=CLIENT_ERROR, reason=str(exc)), reply_to=message)
        if worker:
            return forward(message, context, self.worker_module)
        module, _, attribute = self.ephemeral.partition(":")
        app = getattr(importlib.import_module(module), attribute)
        return app(message, context)
