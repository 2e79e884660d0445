"""The classic algorithms end to end on digits: accuracy, the ledger, resume identity."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedistill.config import RunConfig, build_config
from fedistill.data.partition import load_split
from fedistill.engine.launch import resume_suite, run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.federation.ledger import DOWN, UP, read_ledger
from fedistill.version import code_fingerprint

SMALL = {"clients": 5, "alpha": 0.5, "rounds": 4, "model": "mlp", "batch_size": 32, "lr": 0.05}


def _run(tmp_path: Path, algorithm: str, **changes) -> list[dict]:
    config = build_config(RunConfig(), SMALL, {"algorithm": algorithm, **changes})
    return run_suite(config, tmp_path / "suite", progress=False)


@pytest.fixture(scope="module")
def digits_suite(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    out = tmp_path_factory.mktemp("digits")
    summaries = _run(out, "fedavg,standalone,centralized", rounds=6)
    return out / "suite", {s["algorithm"]: s for s in summaries}


def test_fedavg_beats_the_standalone_mean_and_centralized_beats_both(digits_suite):
    _, runs = digits_suite
    fedavg, standalone, central = (runs[a]["test_accuracy"] for a in ("fedavg", "standalone", "centralized"))
    assert fedavg > standalone + 0.10, (fedavg, standalone)
    assert central >= fedavg - 0.02
    assert standalone > 0.2  # the locals learned something: better than chance (0.1)
    assert runs["standalone"]["final"]["test_accuracy_std"] > 0


def test_fedavg_ledger_shows_parameters_both_ways(digits_suite):
    suite, runs = digits_suite
    records = read_ledger(suite / "fedavg" / "ledger.jsonl")
    train = [r for r in records if r["type"] == "train"]
    assert len(train) == 2 * 5 * 6  # every client, every round, both directions
    sizes = {r["kinds"]["parameters"] for r in train}
    assert len(sizes) == 1  # the same model both ways
    comm = runs["fedavg"]["communication"]
    assert comm[UP]["per_kind"]["parameters"] == comm[DOWN]["per_kind"]["parameters"] == 30 * sizes.pop()
    assert set(comm[UP]["per_client"]) == {str(k) for k in range(5)}


def test_standalone_sends_no_parameters(digits_suite):
    _, runs = digits_suite
    comm = runs["standalone"]["communication"]
    assert "parameters" not in comm[UP]["per_kind"] and "parameters" not in comm[DOWN]["per_kind"]
    assert set(comm[UP]["per_kind"]) == {"metrics"}


def test_run_directory_contents(digits_suite):
    suite, _ = digits_suite
    run = suite / "fedavg"
    for name in (
        "config.toml",
        "partition.npz",
        "partition.json",
        "metrics.jsonl",
        "ledger.jsonl",
        "summary.json",
        "summary.md",
        "run.log",
        "plots/partition.png",
        "plots/learning_curve.png",
        "models/global.safetensors",
    ):
        assert (run / name).is_file(), name
    summary = json.loads((run / "summary.json").read_text())
    partition = json.loads((run / "partition.json").read_text())
    assert summary["partition"]["hash"] == partition["hash"]
    # the split itself, key for key as it always was (a run whose sites hold their own data writes another)
    assert (run / "partition.json").read_text() == json.dumps(load_split(run).to_json(), indent=1) + "\n"
    assert list(partition) == [
        "format", "version", "method", "alpha", "seed", "num_classes", "num_clients", "options",
        "val_fraction", "val_mode", "hash", "client_train_sizes", "client_val_sizes", "server_val_size",
        "client_test_sizes", "train_counts",
    ]  # fmt: skip
    assert partition["method"] == "dirichlet" and len(partition["train_counts"]) == 5
    for key in ("test_accuracy", "wall_time_s", "peak_memory_mb", "versions", "seed", "communication"):
        assert key in summary
    assert summary["device_name"] == "cpu"  # the device a run used, by name (on a GPU: the card)
    assert summary["versions"]["code"] == code_fingerprint()  # what `--reuse` checks (reproduce/reuse.py)
    assert (suite / "results.md").is_file() and (suite / "plots" / "test_accuracy.png").is_file()
    assert len(read_jsonl(run / "metrics.jsonl")) == 6


def test_fedprox_and_fedavgm_change_the_result(tmp_path):
    base = _run(tmp_path / "a", "fedavg", rounds=2)[0]["test_accuracy"]
    prox = _run(tmp_path / "b", "fedprox", rounds=2, fedprox={"mu": 1.0})[0]["test_accuracy"]
    avgm = _run(tmp_path / "c", "fedavgm", rounds=2)[0]["test_accuracy"]
    assert prox != base and avgm != base


def test_same_seed_same_result(tmp_path):
    a = _run(tmp_path / "a", "fedavg", rounds=2)[0]
    b = _run(tmp_path / "b", "fedavg", rounds=2)[0]
    assert a["test_accuracy"] == b["test_accuracy"] and a["partition"]["hash"] == b["partition"]["hash"]


def _strip_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.endswith("_s")} for row in rows]


def test_resume_after_kill_ends_like_an_uninterrupted_run(tmp_path):
    settings = ["--clients", "4", "--rounds", "6", "--model", "lenet5", "--seed", "3"]
    sets = ["--set", "local_epochs=3", "--set", "algorithm=fedavgm,standalone"]
    reference = tmp_path / "ref"
    config = build_config(
        RunConfig(),
        {
            "clients": 4,
            "rounds": 6,
            "model": "lenet5",
            "seed": 3,
            "local_epochs": 3,
            "algorithm": "fedavgm,standalone",
        },
    )
    run_suite(config, reference, progress=False)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "fedistill.cli",
        "run",
        *settings,
        *sets,
        "--out",
        str(tmp_path),
        "--name",
        "k",
        "--quiet",
    ]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at = tmp_path / "k" / "fedavgm" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if killed_at.is_file() and killed_at.read_text().strip() >= "round_00003":
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "k" / "fedavgm" / "summary.json").exists()

    resume_suite(tmp_path / "k", progress=False)
    for algorithm in ("fedavgm", "standalone"):
        got = _strip_times(read_jsonl(tmp_path / "k" / algorithm / "metrics.jsonl"))
        want = _strip_times(read_jsonl(reference / algorithm / "metrics.jsonl"))
        assert got == want, algorithm
        assert len(read_ledger(tmp_path / "k" / algorithm / "ledger.jsonl")) == len(
            read_ledger(reference / algorithm / "ledger.jsonl")
        )
