"""Flower's `ServerApp` and `ClientApp` for every fedistill algorithm.

`flwr run .` loads `server_app` and `client_app` (pyproject.toml, `[tool.flwr.app.components]`);
they read the fedistill config from the run config (`[tool.flwr.app.config]`, `-c key=value`).
`fedistill run --transport flower` builds its own pair around an explicit config instead.
The ServerApp runs the same run loop as in-process, over a `GridFleet`; the ClientApp hands each
message to the client logic of the algorithm named in the message's transport header.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

from flwr.app import Context, Error, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedistill.algorithms.registry import ALGORITHMS, algorithm_names
from fedistill.config import RunConfig, build_config, parse_assignment
from fedistill.engine.flower.enrolled_grid import enrolled
from fedistill.engine.flower.enrolment import ASSIGNED_PARTITION, enrolment_from_environment
from fedistill.engine.flower.node import node_data, node_for, partition_of, site_hello
from fedistill.engine.flower.outcome import clear_failure, record_failure
from fedistill.engine.key_homes import key_homes
from fedistill.engine.setup import canonical_dataset, validate_setup
from fedistill.engine.site_data import own_data
from fedistill.engine.suite import default_name, run_algorithms
from fedistill.engine.suite_dir import check_algorithms_kept
from fedistill.errors import ConfigError, FederationError, UserError
from fedistill.federation.messages import Message, check_on_receipt
from fedistill.transports.flower.codec import from_records, header_of, to_records
from fedistill.transports.flower.forward import CLIENT_ERROR
from fedistill.transports.flower.grid_fleet import HELLO, SPLIT_HASH

log = logging.getLogger(__name__)


def config_from_run_config(run_config: dict[str, Any]) -> RunConfig:
    """`[tool.flwr.app.config]` keys are fedistill config keys; dotted keys reach algorithm tables.

    Flower rejects `-c` keys that pyproject.toml does not declare, so any other key (e.g.
    `fediod.teacher_epochs`) goes through the declared `set` key: `-c "set='fediod.teacher_epochs=1 lr=0.1'"`
    (space-separated `key=value`, as `fedistill run --set`)."""
    keys = {key.replace("-", "_"): value for key, value in run_config.items()}
    assignments = dict(parse_assignment(item) for item in _set_items(str(keys.pop("set", "") or "")))
    return build_config(RunConfig(), keys, assignments, homes=key_homes)


def _set_items(value: str) -> list[str]:
    """The `key=value` items of the `set` key, split as a shell would; a ConfigError (a user mistake,
    one logged line) when its quotes do not close, not a bare ValueError."""
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise ConfigError(f"set = {value!r}: {exc} (space-separated key=value items)") from None


def message_types() -> list[str]:
    """Every message type some algorithm's client logic handles, plus the transport's hello."""
    algorithm_names()  # imports (registers) every algorithm
    types = {HELLO}
    for algorithm in ALGORITHMS.values():
        types.update(getattr(algorithm.client, "_handlers", {}))
    return sorted(types)


def answer(
    message_type: str,
    content: RecordDict,
    context: Context,
    config: RunConfig | None = None,
    state_root: Path | None = None,
) -> RecordDict:
    """The reply content to one message on this node (raises on failure). Shared by the ClientApp
    and the node's long-lived worker (worker.py)."""
    run_config = config or config_from_run_config(dict(context.run_config))
    header = header_of(content)
    # an enrolled deployment's server names the node's partition in every message (enrolled_grid.py)
    assigned = int(header[ASSIGNED_PARTITION]) if ASSIGNED_PARTITION in header else None
    if message_type == HELLO:
        pid = partition_of(context, run_config, assigned)
        if own_data(run_config):  # a site's own records: nothing to split, the server's facts to keep
            request = from_records(content, message_type)
            return to_records(site_hello(context, run_config, pid, request, state_root))
        # the split this node's copy of the data gives: the server stops the run if it is not its own
        split_hash = node_data(context, run_config)[1].split.hash()
        scalars = {"metrics": {"partition_id": pid}, "config": {SPLIT_HASH: split_hash}}
        return to_records(Message.build(HELLO, scalars=scalars))
    algorithm = str(header.get("algorithm", ""))
    if not algorithm:
        raise FederationError(f"{message_type}: no algorithm in the transport header")
    node = node_for(context, run_config, algorithm, state_root, assigned)
    request = from_records(content, message_type)
    check_on_receipt(request, max_bytes=int(run_config.max_message_mb * 2**20))
    reply = node.client.handle(request)
    if node.client.changes_state(message_type):
        node.commit(context)
    return to_records(reply)


def error_reply(message: FlowerMessage, exc: BaseException) -> FlowerMessage:
    """What the server sees when a client fails: an error reply, as for any failed Flower client."""
    log.warning("client failed on %s: %s", message.metadata.message_type, exc, exc_info=True)
    return FlowerMessage(Error(code=CLIENT_ERROR, reason=f"{type(exc).__name__}: {exc}"), reply_to=message)


def make_client_app(config: RunConfig | None = None, state_root: Path | None = None) -> ClientApp:
    """The Flower ClientApp of a run: each message is answered by the client logic of its node, and an error
    becomes an error reply."""
    app = ClientApp()

    def handle(message: FlowerMessage, context: Context) -> FlowerMessage:
        try:
            content = answer(message.metadata.message_type, message.content, context, config, state_root)
            return FlowerMessage(content, reply_to=message)
        except Exception as exc:
            return error_reply(message, exc)

    for message_type in message_types():
        category, _, action = message_type.partition(".")
        register = getattr(app, category)  # app.train / app.evaluate / app.query
        decorator = register(action) if action else register()
        decorator(handle)
    return app


def make_server_app(
    config: RunConfig | None = None,
    suite_dir: Path | None = None,
    results: list | None = None,
    errors: list | None = None,
    *,
    progress: bool = False,
    resume: bool = False,
    enrolment: Path | None = None,
    read_environment: bool = False,
) -> ServerApp:
    """`results`/`errors` collect the summaries or the exception when the caller is in-process.
    `enrolment` (or, with `read_environment`, the file `FEDISTILL_ENROLMENT` names in the SuperLink's
    environment) lets only enrolled sites take part, each at its fixed partition (enrolled_grid.py).

    Under `flwr run` (no `errors`) every failure reaches Flower, which marks the run `finished:failed`
    and ends the ServerApp's process with a non-zero code; `flwr run` itself exits 0 whatever the run's
    outcome, so the run's folder records the failure first (outcome.py). A user mistake (a bad `-c`
    value, a missing file) or a stop (a site misconfigured, too few sites) is also logged as one line."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        target: Path | None = None
        try:
            run_config = canonical_dataset(config or config_from_run_config(dict(context.run_config)))
            target = suite_dir or Path(run_config.out).expanduser() / (
                run_config.name or default_name(run_config)
            )
            run_config = run_config.replace(transport="flower")
            if target.is_dir():  # run again into its folder (a retry after a failure): as --resume checks
                check_algorithms_kept(target, run_config.algorithms)
            data = validate_setup(run_config, resume=resume)
            enrolment_file = enrolment or (enrolment_from_environment() if read_environment else None)
            grid = enrolled(grid, enrolment_file, run_config.clients)
            summaries = run_algorithms(run_config, target, data, grid=grid, progress=progress, resume=resume)
        except BaseException as exc:
            if errors is not None:
                errors.append(exc)
                return
            record_failure(target, exc)
            if isinstance(exc, UserError | FederationError):
                stop = "error" if isinstance(exc, UserError) else "run stopped"
                log.error("fedistill: %s: %s", stop, exc)
                raise exc.with_traceback(None) from None  # the reason, not where it was found
            raise
        clear_failure(target)
        if results is not None:
            results.extend(summaries)

    return app


server_app = make_server_app(read_environment=True)
client_app = make_client_app()
