"""A run under `flwr run` that the server stops must fail visibly: Flower marks a run failed (and ends the
ServerApp's process with a non-zero code) only when the ServerApp's main raises, and `flwr run` itself
exits 0 whatever happens, so the run's folder records the failure too. Exercised with the ServerApp as
`flwr run` builds it (no in-process error list) over a grid that runs the ClientApp in this process."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict

from fedistill.analysis.poisons import huge_bias
from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.engine.flower import apps
from fedistill.engine.flower.outcome import (
    FAILURE,
    failure_exit_code,
    failure_line,
    failure_record,
    recorded_failure,
)
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import UP, read_ledger
from fedistill.transports.flower.codec import from_records, to_records
from flower_local_grid import LocalGrid

BAD = 1


def _config() -> RunConfig:
    """Two sites, both needed: a site dropped as implausible stops the run."""
    keys = {
        "algorithm": "fedavg",
        "clients": 2,
        "min_clients": 2,
        "rounds": 1,
        "model": "mlp",
        "alpha": 100.0,
    }
    return build_config(RunConfig(), keys)


def _context() -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})


def _poison_site(monkeypatch) -> None:
    """Site BAD answers `train` with a model whose last bias is 1e30 (finite: only plausibility sees it)."""
    honest = apps.answer

    def answer(message_type, content, context, config=None, state_root=None):
        reply = honest(message_type, content, context, config, state_root)
        if message_type == "train" and int(context.node_config["partition-id"]) == BAD:
            return to_records(huge_bias(from_records(reply, message_type)))
        return reply

    monkeypatch.setattr(apps, "answer", answer)


def test_a_run_the_server_stops_fails_the_serverapp_and_records_why(tmp_path, monkeypatch, capsys):
    _poison_site(monkeypatch)
    config, run_dir = _config(), tmp_path / "run"
    grid = LocalGrid(apps.make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    with pytest.raises(FederationError, match="only 1 of 2 clients"):
        apps.make_server_app(config, run_dir)(grid, _context())
    record = recorded_failure(run_dir)
    assert record is not None and record["status"] == "stopped"
    assert "implausible parameters: norm" in record["error"] and "\n" not in record["error"]
    assert failure_line(record).startswith("fedistill: run stopped: only 1 of 2 clients")
    assert failure_exit_code(record) == 1
    # where a user looks next: `fedistill summary` of that folder says why, with the same exit code
    assert main(["summary", str(run_dir)]) == 1
    assert capsys.readouterr().err.strip().startswith("fedistill: run stopped: only 1 of 2 clients")
    # the rejected reply is in the ledger once, as invalid, with the bytes it sent
    replies = [
        r
        for r in read_ledger(run_dir / "fedavg" / "ledger.jsonl")
        if r["direction"] == UP and r["client"] == BAD and r["type"] == "train"
    ]
    assert [r["status"] for r in replies] == ["invalid"] and replies[0]["bytes"] > 0


def test_a_run_that_finishes_clears_an_earlier_failure(tmp_path):
    config, run_dir = _config(), tmp_path / "run"
    run_dir.mkdir()
    (run_dir / FAILURE).write_text(json.dumps({"status": "stopped", "error": "an earlier attempt"}))
    grid = LocalGrid(apps.make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    results: list = []
    apps.make_server_app(config, run_dir, results)(grid, _context())  # in-process: summaries handed back
    assert results and recorded_failure(run_dir) is None
    assert not Path(run_dir / FAILURE).exists()


def test_a_refusal_is_recorded_as_a_mistake():
    record = failure_record(ConfigError("fedavg.aggregate_trim must be in [0, 0.5), got 0.5"))
    assert record == {"status": "refused", "error": "fedavg.aggregate_trim must be in [0, 0.5), got 0.5"}
    assert failure_line(record) == "fedistill: error: fedavg.aggregate_trim must be in [0, 0.5), got 0.5"
    assert failure_exit_code(record) == 2
    assert failure_record(ValueError("bad\nsecond line")) == {"status": "stopped", "error": "ValueError: bad"}


def test_a_run_the_server_stops_logs_why_in_one_line(tmp_path, monkeypatch, caplog):
    """`flwr run --stream` shows the ServerApp's log: the reason a run stopped (a site misconfigured, too
    few sites) comes first as one line, as a mistake's does, not only at the end of a traceback."""
    _poison_site(monkeypatch)
    config = _config()
    grid = LocalGrid(apps.make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    with caplog.at_level(logging.ERROR), pytest.raises(FederationError):
        apps.make_server_app(config, tmp_path / "run")(grid, _context())
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and errors[0].startswith("fedistill: run stopped: only 1 of 2 clients")
    assert "\n" not in errors[0]


def test_a_deployment_run_again_without_an_algorithm_it_ran_is_refused(tmp_path):
    """A deployment's ServerApp run again into its run's folder (as after a failure) went on without an
    algorithm its config no longer named, leaving that algorithm's folder beside a config.toml that does not
    name it; it is refused as `fedistill run --resume` refuses it, before anything is written."""
    both = build_config(_config(), {"algorithm": "fedavg,standalone"})
    run_dir = tmp_path / "run"
    grid = LocalGrid(apps.make_client_app(both, state_root=tmp_path / "nodes"), both.clients)
    apps.make_server_app(both, run_dir, [])(grid, _context())
    before = (run_dir / "config.toml").read_text()
    fewer = _config()
    grid = LocalGrid(apps.make_client_app(fewer, state_root=tmp_path / "nodes"), fewer.clients)
    with pytest.raises(ConfigError, match=r"config.toml no longer names standalone"):
        apps.make_server_app(fewer, run_dir)(grid, _context())
    assert (run_dir / "config.toml").read_text() == before
    assert recorded_failure(run_dir)["status"] == "refused"
