"""A long-lived worker per SuperNode: the client logic stays in memory across messages.

In a Flower deployment the SuperNode starts a fresh ClientApp process for every message, which then
imports torch, loads the node's data, rebuilds the client and reloads its state: seconds per message.
With the forwarding ClientApp (forward.py) that process only imports Flower and hands the message to
this worker over a local Unix socket; the worker answers it with the same code as the ordinary
ClientApp (`apps.answer`). The first message on a node starts the worker; it exits after
`idle_s` without a message. State is still written to node storage after every state-changing
message, and the versions travel back into the node's `context.state`, so if the worker dies a new
one reloads the state exactly as an ephemeral ClientApp would.

The socket carries raw bytes: a length-prefixed JSON header and Flower's own protobuf encoding of
the RecordDict (no pickle). Connections are authenticated with a per-node key file (mode 0600).

    python -m fedistill.engine.flower.worker --socket PATH.sock --key-file DIR/worker.key [--idle-s 900]
"""

from __future__ import annotations

import argparse
import logging
import socket
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from pathlib import Path

from flwr.app import ConfigRecord, Context, RecordDict

from fedistill.engine.flower.apps import answer
from fedistill.transports.flower.forward import VERSIONS, pack, unpack

log = logging.getLogger(__name__)


def serve_one(connection: Connection) -> bool:
    """Answer one frame; False when it asked the worker to stop."""
    header, content = unpack(connection.recv_bytes())
    if header.get("stop"):
        connection.send_bytes(pack({"stopped": True}, None))
        return False
    versions = header["versions"]
    context = Context(
        run_id=int(header["run_id"]),
        node_id=int(header["node_id"]),
        node_config=header["node_config"],
        state=RecordDict({VERSIONS: ConfigRecord(versions)}) if versions else RecordDict(),
        run_config=header["run_config"],
    )
    try:
        reply = answer(header["message_type"], content, context)
    except Exception as exc:  # the forwarder turns it into the error reply the server expects
        log.warning("worker failed on %s: %s", header["message_type"], exc, exc_info=True)
        connection.send_bytes(pack({"error": f"{type(exc).__name__}: {exc}"}, None))
        return True
    versions = dict(context.state[VERSIONS]) if VERSIONS in context.state else {}
    connection.send_bytes(pack({"versions": versions}, reply))
    return True


def serve(socket_path: Path, key: bytes, idle_s: float) -> None:
    """Answer messages until `idle_s` pass without one."""
    socket_path.unlink(missing_ok=True)
    with Listener(str(socket_path), family="AF_UNIX", authkey=key) as listener:
        listener._listener._socket.settimeout(idle_s)  # accept() has no timeout argument
        log.info("fedistill node worker listening on %s", socket_path)
        while True:
            try:
                connection = listener.accept()
            except TimeoutError:
                log.info("no message for %.0f s: the worker exits", idle_s)
                break
            except socket.timeout:  # noqa: UP041 - older spellings of the same timeout
                break
            except (AuthenticationError, EOFError, ConnectionError) as exc:  # not a forwarder of this node
                log.warning("a connection failed the key handshake (%s): ignored", exc)
                continue
            with connection:
                try:
                    if not serve_one(connection):
                        log.info("asked to stop: the worker exits")
                        break
                except (EOFError, OSError) as exc:  # its forwarder ended mid-message: serve the next
                    log.warning("a forwarder went away mid-message (%s): waiting for the next", exc)
    socket_path.unlink(missing_ok=True)


def main() -> None:
    """The worker's command line: serve a forwarding socket with the given key file until asked to stop."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--key-file", required=True, type=Path)
    parser.add_argument("--idle-s", type=float, default=900.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(args.socket, args.key_file.read_bytes(), args.idle_s)


if __name__ == "__main__":
    main()
