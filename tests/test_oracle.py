"""The global-accuracy oracle: the FedMD-CG paper's "global accuracy" (the average of the full local
models) is computed by the in-process runner from the clients' own states, outside the protocol. It
must add no message and change no byte of the ledger, agree with a protocol-built global model where
one exists, and be reported as not computed where the clients live elsewhere (Flower)."""

import dataclasses
import json

import pytest

from fedistill.algorithms.registry import ALGORITHMS, get_algorithm
from fedistill.algorithms.shared.oracle import ORACLE_LABEL, ORACLE_METRIC, average_local_models
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl

SMALL = {
    "clients": 3,
    "alpha": 0.5,
    "rounds": 2,
    "model": "lenet-fedmdcg",
    "batch_size": 32,
    "lr": 0.1,
    "local_steps": 5,
    "seed": 0,
    "fedmdcg": {"generator_hidden": "32", "server_steps": 3},
}


def _config(**changes) -> RunConfig:
    return build_config(RunConfig(), SMALL, changes)


def _without_oracle_and_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != ORACLE_METRIC and not k.endswith("_s")} for r in rows]


def test_wired_where_the_paper_reports_a_global_accuracy_without_a_global_model():
    wired = {"standalone", "fedper", "lgfedavg", "fedgen", "fedcg", "fedmdcg"}
    for name in wired:
        assert get_algorithm(name).oracle is average_local_models, name
    for name in ("fedavg", "centralized", "feddf", "fediod"):  # a global model exists, or no local ones
        assert get_algorithm(name).oracle is None, name


def test_the_oracle_adds_no_message_and_changes_no_ledger_byte(tmp_path, monkeypatch):
    """FedMD-CG with the oracle on and off: byte-identical ledgers and the same protocol metrics; with
    it on, every evaluated row, summary.json and summary.md carry it under its label."""
    config = _config(algorithm="fedmdcg", eval_every=1)
    on = run_suite(config, tmp_path / "on", progress=False)[0]
    monkeypatch.setitem(ALGORITHMS, "fedmdcg", dataclasses.replace(ALGORITHMS["fedmdcg"], oracle=None))
    off = run_suite(config, tmp_path / "off", progress=False)[0]

    ledger_on = (tmp_path / "on" / "fedmdcg" / "ledger.jsonl").read_bytes()
    assert ledger_on and ledger_on == (tmp_path / "off" / "fedmdcg" / "ledger.jsonl").read_bytes()
    assert on["communication"] == off["communication"]
    assert on["final"] == off["final"]
    rows_on = read_jsonl(tmp_path / "on" / "fedmdcg" / "metrics.jsonl")
    rows_off = read_jsonl(tmp_path / "off" / "fedmdcg" / "metrics.jsonl")
    assert _without_oracle_and_times(rows_on) == _without_oracle_and_times(rows_off)

    assert all(0.0 <= r[ORACLE_METRIC] <= 1.0 for r in rows_on) and len(rows_on) == 2
    assert not any(ORACLE_METRIC in r for r in rows_off)
    assert on[ORACLE_METRIC] == rows_on[-1][ORACLE_METRIC]  # nothing trains between the two
    assert on["oracle"] == ORACLE_LABEL and off[ORACLE_METRIC] is None and off["oracle"] is None
    assert ORACLE_METRIC not in on["final"]  # kept apart from the protocol's own metrics
    saved = json.loads((tmp_path / "on" / "fedmdcg" / "summary.json").read_text())
    assert saved[ORACLE_METRIC] == on[ORACLE_METRIC]
    text = (tmp_path / "on" / "fedmdcg" / "summary.md").read_text()
    assert f"{ORACLE_LABEL}: **{on[ORACLE_METRIC]:.4f}** (`{ORACLE_METRIC}`)" in text
    assert f"- {ORACLE_LABEL}" not in (tmp_path / "off" / "fedmdcg" / "summary.md").read_text()


def test_the_oracle_equals_the_global_model_where_the_protocol_builds_one(tmp_path):
    """FedGen sharing whole models averages exactly the full local models by sample count, so its
    global model's test accuracy and the oracle's must agree."""
    summary = run_suite(_config(algorithm="fedgen"), tmp_path, progress=False)[0]
    assert summary[ORACLE_METRIC] == pytest.approx(summary["final"]["test_accuracy"], abs=1e-12)


def test_on_the_flower_transport_the_oracle_is_skipped_and_said_so(tmp_path):
    pytest.importorskip("flwr")
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid, run_on_grid

    config = _config(algorithm="fedmdcg", rounds=1)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    summary = run_on_grid(config, tmp_path / "run", grid)[0]
    assert summary["transport"] == "flower" and summary[ORACLE_METRIC] is None
    assert (
        summary["oracle"].startswith(ORACLE_LABEL)
        and "not computed on the Flower transport" in summary["oracle"]
    )
    assert "not computed on the Flower transport" in (tmp_path / "run" / "fedmdcg" / "summary.md").read_text()
    rows = read_jsonl(tmp_path / "run" / "fedmdcg" / "metrics.jsonl")
    assert not any(ORACLE_METRIC in r for r in rows)
