"""Experiment tracking (`track`): what a tracked run streams reads back from TensorBoard's event files and
MLflow's file store with the values of metrics.jsonl and ledger.jsonl; an untracked run is as before."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from algorithm_helpers import run_until_crash
from fedistill.algorithms.classic.fedavg import FedAvgServer
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import resume_suite, run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.errors import ConfigError
from fedistill.federation.ledger import read_ledger
from fedistill.reference import config_keys

TINY = {"algorithm": "fedavg", "clients": 3, "rounds": 2, "model": "mlp", "batch_size": 32}
CARD = "# fedavg model card\n"


@pytest.fixture
def file_store_env(monkeypatch):
    """No tracking server from the environment; what the run sets is undone afterwards."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # recorded as unset, so restored as unset
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def _run(out: Path, **keys) -> Path:
    """A tiny fedavg suite in `out/suite`, with a model card where an export puts one; its run folder."""
    config = build_config(RunConfig(), {**TINY, "out": str(out), **keys})
    card = out / "suite" / "fedavg" / "export" / "model-card.md"
    card.parent.mkdir(parents=True)
    card.write_text(CARD, encoding="utf-8")
    run_suite(config, out / "suite", progress=False)
    return out / "suite" / "fedavg"


def _expected_scalars(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per round: every number of metrics.jsonl's row, and the ledger's bytes per direction and kind."""
    expected: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        expected[row["round"]] |= {k: float(v) for k, v in row.items() if k != "round" and v is not None}
    for record in read_ledger(run_dir / "ledger.jsonl"):
        direction = record["direction"].replace("->", "_to_")
        expected[record["round"]][f"bytes/{direction}/total"] += record["bytes"]
        for kind, size in record["kinds"].items():
            expected[record["round"]][f"bytes/{direction}/{kind}"] += size
    return expected


def _events(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


def _text(events, tag: str) -> str:
    return events.Tensors(f"{tag}/text_summary")[-1].tensor_proto.string_val[0].decode()


def _check_tensorboard_scalars(events, run_dir: Path) -> None:
    """Every expected scalar at its round, once, equal to float32 precision."""
    for round, scalars in _expected_scalars(run_dir).items():
        for tag, value in scalars.items():
            steps = [e for e in events.Scalars(tag) if e.step == round]
            assert len(steps) == 1, (tag, round)
            assert steps[0].value == np.float32(value), (tag, round)


def test_tensorboard_run_reads_back_per_round(tmp_path):
    run_dir = _run(tmp_path, track="tensorboard")
    events = _events(run_dir)
    assert {"test_accuracy", "train_loss", "round_time_s", "bytes/client_to_server/parameters"} <= set(
        events.Tags()["scalars"]
    )
    _check_tensorboard_scalars(events, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    final = events.Scalars("final/test_accuracy")
    assert [(e.step, e.value) for e in final] == [(2, np.float32(summary["final"]["test_accuracy"]))]
    up = summary["communication"]["client->server"]["total_bytes"]
    assert events.Scalars("final/bytes/client_to_server/total")[0].value == np.float32(up)
    assert {"learning_curve", "partition"} <= set(events.Tags()["images"])
    assert "| fedavg |" in _text(events, "results")
    assert "| rounds | 2 |" in _text(events, "config")
    assert _text(events, "export/model-card.md") == CARD


def test_mlflow_run_reads_back_from_the_file_store(tmp_path, file_store_env):
    from mlflow.tracking import MlflowClient

    run_dir = _run(tmp_path, track="mlflow")
    record = json.loads((run_dir / "mlflow.json").read_text())
    assert record["tracking_uri"] == (tmp_path / "mlruns").resolve().as_uri()
    client = MlflowClient(record["tracking_uri"])
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "fedavg"
    assert client.get_experiment(run.info.experiment_id).name == "suite"
    for round, scalars in _expected_scalars(run_dir).items():
        for name, value in scalars.items():
            assert [m.value for m in client.get_metric_history(run.info.run_id, name) if m.step == round] == [
                value
            ], (name, round)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert run.data.metrics["final/test_accuracy"] == summary["final"]["test_accuracy"]
    assert run.data.params["rounds"] == "2" and run.data.params["model"] == "mlp"

    def listed(folder: str | None = None) -> set[str]:
        return {f.path for f in client.list_artifacts(run.info.run_id, folder)}

    assert {"results.md", "summary.json", "config.toml", "plots", "export"} <= listed()
    assert listed("plots") == {"plots/learning_curve.png", "plots/partition.png"}
    assert listed("export") == {"export/model-card.md"}


def test_resumed_run_logs_on_from_its_checkpoint(tmp_path, file_store_env):
    """Round 3 ran after the last checkpoint (2) before the crash: TensorBoard shows it once, from the
    resumed run; MLflow logs on into the same run, and holds round 3 once too."""
    config = build_config(
        RunConfig(),
        {**TINY, "rounds": 4, "checkpoint_every": 2, "out": str(tmp_path), "track": "tensorboard,mlflow"},
    )
    run_until_crash(config, FedAvgServer, tmp_path / "suite", crash_round=4)
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "suite" / "fedavg"
    first_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    client = MlflowClient((tmp_path / "mlruns").resolve().as_uri())
    assert client.get_run(first_id).info.status == "KILLED"
    resume_suite(tmp_path / "suite", progress=False)
    _check_tensorboard_scalars(_events(run_dir), run_dir)
    record = json.loads((run_dir / "mlflow.json").read_text())
    assert record["run_id"] == first_id and client.get_run(first_id).info.status == "FINISHED"
    for name in ("test_accuracy", "bytes/client_to_server/total"):  # round 3 once, not again on resume
        assert sorted(m.step for m in client.get_metric_history(first_id, name)) == [1, 2, 3, 4], name


def test_an_unknown_tracker_names_the_key_and_the_valid_values():
    with pytest.raises(ConfigError, match=r"track = 'tensorbord'.*tensorboard, mlflow"):
        build_config(RunConfig(), {"track": "tensorbord"})
    assert build_config(RunConfig(), {"track": " mlflow , tensorboard"}).track == " mlflow , tensorboard"
    # the doc and the message listed "both" as if it were a value; they spell the pair as it is written
    with pytest.raises(ConfigError, match=r"track = 'both'.*or tensorboard,mlflow$"):
        build_config(RunConfig(), {"track": "both"})
    with pytest.raises(ConfigError, match=r"track = ',': valid values are empty"):  # names no tracker
        build_config(RunConfig(), {"track": ","})
    doc = next(key.doc for key in config_keys.common_keys() if key.name == "track")
    assert "both" not in doc and "tensorboard,mlflow" in doc


#: Where a tracker would come from: an untracked run must never import them.
TRACKER_MODULES = (
    "fedistill.engine.tracking_tensorboard",
    "fedistill.engine.tracking_mlflow",
    "torch.utils.tensorboard",
    "tensorboard",
    "mlflow",
)


def test_an_untracked_run_writes_no_tracker_files_and_imports_no_tracker(tmp_path, monkeypatch):
    for module in TRACKER_MODULES:
        monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    config = build_config(RunConfig(), {**TINY, "out": str(tmp_path)})
    run_suite(config, tmp_path / "suite", progress=False)
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
    assert not [p for p in written if "tensorboard" in p or "mlflow" in p or "mlruns" in p]
    saved = (tmp_path / "suite" / "fedavg" / "config.toml").read_text()
    assert not re.search(r"^track\b", saved, re.MULTILINE)  # config.toml as untracked runs always wrote it


def test_tracking_changes_nothing_the_run_computes(tmp_path):
    plain = build_config(RunConfig(), {**TINY, "out": str(tmp_path / "plain")})
    run_suite(plain, tmp_path / "plain" / "suite", progress=False)
    tracked = _run(tmp_path / "tracked", track="tensorboard")
    assert _timeless(tmp_path / "plain" / "suite" / "fedavg") == _timeless(tracked)


def _timeless(run_dir: Path) -> list[dict]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return [{k: v for k, v in row.items() if not k.endswith("_s")} for row in rows]


def test_mlflow_goes_where_the_environment_says(tmp_path, monkeypatch):
    from fedistill.engine.tracking_mlflow import tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert tracking_uri(tmp_path / "suite" / "fedavg") == "http://tracking.example:5000"


def test_an_unreachable_mlflow_server_is_one_line_at_once_and_the_run_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    """MLflow's client retries a server that does not answer for minutes before it says so; the run probes
    the server first and stops at once, naming the address."""
    import socket
    import time

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    from fedistill.cli import main

    started = time.monotonic()
    argv = ["run", "--algorithm", "fedavg", "--clients", "2", "--rounds", "1", "--model", "mlp", "--quiet"]
    assert main([*argv, "--track", "mlflow", "--out", str(tmp_path), "--name", "suite"]) == 2
    assert time.monotonic() - started < 30
    assert f"track = mlflow: http://127.0.0.1:{port} does not answer" in capsys.readouterr().err
    assert not (tmp_path / "suite").exists()


def test_a_run_resumed_after_its_last_round_logs_its_final_metrics_at_that_round(tmp_path, file_store_env):
    """The run died after its last checkpoint (in the final evaluation), so the resumed run trains no round:
    both trackers still log the final metrics at step = the last round, as a run that never stopped does."""
    from mlflow.tracking import MlflowClient

    config = build_config(RunConfig(), {**TINY, "out": str(tmp_path), "track": "tensorboard,mlflow"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FedAvgServer, "final_evaluate", lambda *_: (_ for _ in ()).throw(RuntimeError("crash")))
        with pytest.raises(RuntimeError, match="crash"):
            run_suite(config, tmp_path / "suite", progress=False)
    resume_suite(tmp_path / "suite", progress=False)
    run_dir = tmp_path / "suite" / "fedavg"
    record = json.loads((run_dir / "mlflow.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    history = client.get_metric_history(record["run_id"], "final/test_accuracy")
    assert [m.step for m in history] == [2]
    assert [e.step for e in _events(run_dir).Scalars("final/test_accuracy")] == [2]


def test_a_tracker_that_fails_mid_run_is_dropped_with_a_warning_and_the_run_goes_on(
    tmp_path, file_store_env, caplog
):
    """The MLflow server goes away in round 2: the run still finishes with its summary, TensorBoard still
    gets every round and the final metrics, and a warning says MLflow stopped and why."""
    from mlflow.exceptions import MlflowException

    from fedistill.engine.tracking_mlflow import MlflowTracker

    log_round = MlflowTracker.log_round

    def server_gone(self, row, communication):
        if row["round"] == 2:
            raise MlflowException("API request to endpoint failed: connection refused")
        log_round(self, row, communication)

    config = build_config(RunConfig(), {**TINY, "out": str(tmp_path), "track": "mlflow,tensorboard"})
    with pytest.MonkeyPatch.context() as patch, caplog.at_level("WARNING", logger="fedistill"):
        patch.setattr(MlflowTracker, "log_round", server_gone)
        (summary,) = run_suite(config, tmp_path / "suite", progress=False)
    run_dir = tmp_path / "suite" / "fedavg"
    assert json.loads((run_dir / "summary.json").read_text())["final"] == summary["final"]
    events = _events(run_dir)
    _check_tensorboard_scalars(events, run_dir)
    assert [e.step for e in events.Scalars("final/test_accuracy")] == [2]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("mlflow" in m.lower() and "connection refused" in m for m in warned), warned
    from mlflow.tracking import MlflowClient

    record = json.loads((run_dir / "mlflow.json").read_text())
    assert MlflowClient(record["tracking_uri"]).get_run(record["run_id"]).info.status == "KILLED"  # closed


def _disk_full(*args, **kwargs):
    raise OSError("No space left on device")


@pytest.mark.parametrize(
    ("track", "where"),
    [
        ("mlflow,tensorboard", "fedistill.engine.tracking_tensorboard.TensorBoardTracker.start"),
        ("mlflow", "fedistill.engine.loop.write_summary"),
        ("mlflow", "fedistill.algorithms.base.ServerLogic.setup"),
    ],
    ids=["a-later-tracker-cannot-start", "writing-the-summary-fails", "the-server-set-up-fails"],
)
def test_a_run_that_fails_outside_its_rounds_closes_its_mlflow_run(tmp_path, file_store_env, track, where):
    """A tracker started before one that cannot start (TensorBoard on a full disk), or a failure after the
    last round (writing the models, plot or summary), or before the first (the server's set-up: FedIOD's
    stage 1, the long part a user interrupts): the MLflow run already opened is closed (KILLED), not
    left RUNNING in the store; `--resume` logs on from the checkpoint as after any failure."""
    from mlflow.tracking import MlflowClient

    config = build_config(RunConfig(), {**TINY, "out": str(tmp_path), "track": track})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(where, _disk_full)
        with pytest.raises(OSError, match="No space left"):
            run_suite(config, tmp_path / "suite", progress=False)
    record = json.loads((tmp_path / "suite" / "fedavg" / "mlflow.json").read_text())
    assert MlflowClient(record["tracking_uri"]).get_run(record["run_id"]).info.status == "KILLED"


@pytest.mark.parametrize(
    ("track", "missing", "message"),
    [
        ("tensorboard", ("torch.utils.tensorboard",), r"track = tensorboard needs TensorBoard: pip install"),
        ("mlflow", ("mlflow", "mlflow.tracking", "mlflow.exceptions"), r"track = mlflow needs MLflow: pip"),
    ],
)
def test_a_tracker_whose_package_is_missing_is_named_before_anything_is_written(
    tmp_path, monkeypatch, track, missing, message
):
    """A missing tracker package is a setup mistake like a missing dataset: one line, and no run folder."""
    from fedistill.engine.launch import start_suite

    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    config = build_config(RunConfig(), {**TINY, "out": str(tmp_path / "out"), "name": "a", "track": track})
    with pytest.raises(ConfigError, match=message):
        start_suite(config, progress=False)
    assert not (tmp_path / "out").exists()


def test_mlflow_logs_the_set_up_traffic_at_step_0_as_tensorboard_does(tmp_path, file_store_env):
    """Traffic before round 1 (FedIOD's stage 1: the logits its teachers send) goes to step 0; MLflow took
    step 0 for a round it already held and left it out, so its bytes curve started at round 1."""
    from mlflow.tracking import MlflowClient

    from fedistill.engine.tracking_mlflow import MlflowTracker

    run_dir = tmp_path / "suite" / "fediod"
    run_dir.mkdir(parents=True)
    tracker = MlflowTracker()
    tracker.start(build_config(RunConfig(), {"algorithm": "fediod"}), run_dir)
    tracker.log_round({"round": 0}, {"client->server": {"logits": 100}})
    tracker.log_round({"round": 1, "test_accuracy": 0.5}, {"client->server": {"logits": 40}})
    tracker.abort()
    client = MlflowClient(json.loads((run_dir / "mlflow.json").read_text())["tracking_uri"])
    history = client.get_metric_history(tracker.run_id, "bytes/client_to_server/total")
    assert sorted((m.step, m.value) for m in history) == [(0, 100.0), (1, 40.0)]


def test_a_new_run_in_the_folder_of_one_that_never_did_work_gets_an_mlflow_run_of_its_own(
    tmp_path, file_store_env
):
    """A run that diverged in round 1 leaves its name free; the next run under that name (with a sane lr)
    logged on into the failed run's MLflow run, under the failed run's params (lr = 1e9)."""
    from mlflow.tracking import MlflowClient

    from fedistill.engine.launch import start_suite
    from fedistill.errors import FederationError

    keys = {**TINY, "out": str(tmp_path), "name": "a", "track": "mlflow"}
    with pytest.raises(FederationError):
        start_suite(build_config(RunConfig(), {**keys, "lr": 1e9}), progress=False)
    failed = json.loads((tmp_path / "a" / "fedavg" / "mlflow.json").read_text())["run_id"]
    start_suite(build_config(RunConfig(), {**keys, "lr": 0.05}), progress=False)
    record = json.loads((tmp_path / "a" / "fedavg" / "mlflow.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    assert record["run_id"] != failed
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.05"
    assert client.get_run(failed).info.status == "KILLED"


def test_a_tracking_server_whose_certificate_the_probe_cannot_verify_counts_as_reachable(monkeypatch):
    """The probe verifies TLS with the system's certificates only, while MLflow's client also trusts
    MLFLOW_TRACKING_SERVER_CERT_PATH, REQUESTS_CA_BUNDLE or MLFLOW_TRACKING_INSECURE_TLS: a server behind a
    private certificate answered, and was refused as one that does not."""
    import ssl
    import urllib.error
    import urllib.request

    from fedistill.engine.tracking_mlflow import check_reachable

    def untrusted(*args, **kwargs):
        raise urllib.error.URLError(ssl.SSLCertVerificationError(1, "certificate verify failed"))

    monkeypatch.setattr(urllib.request, "urlopen", untrusted)
    check_reachable("https://tracking.example:5000")


@pytest.mark.parametrize("uri", ["http://host:notaport", "http://[bad"])
def test_a_malformed_mlflow_tracking_uri_is_named_not_a_traceback(uri):
    from fedistill.engine.tracking_mlflow import check_reachable

    with pytest.raises(ConfigError, match=r"track = mlflow: MLFLOW_TRACKING_URI = .* is no valid URL"):
        check_reachable(uri)


def test_a_suite_whose_mlflow_experiment_was_deleted_says_so_and_how_to_go_on(tmp_path, file_store_env):
    """Deleting an experiment in MLflow's UI keeps its name taken; the next suite of that name stopped with
    MLflow's 'non-active experiment with ID ...', naming neither the experiment nor a way out."""
    import shutil

    from mlflow.tracking import MlflowClient

    from fedistill.engine.launch import start_suite

    config = build_config(RunConfig(), {**TINY, "out": str(tmp_path), "name": "a", "track": "mlflow"})
    start_suite(config, progress=False)
    client = MlflowClient(json.loads((tmp_path / "a" / "fedavg" / "mlflow.json").read_text())["tracking_uri"])
    experiment = client.get_experiment_by_name("a")
    client.delete_experiment(experiment.experiment_id)
    shutil.rmtree(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"experiment 'a' .*deleted.*restore.*another --name"):
        start_suite(config, progress=False)


def test_tracking_added_on_resume_shows_the_rounds_before_the_checkpoint_too(tmp_path, file_store_env):
    """`track` may change on a resume; a run resumed from round 2 with tracking newly added showed rounds 3
    and 4 only, its first rounds and their bytes nowhere in TensorBoard or MLflow."""
    from mlflow.tracking import MlflowClient

    config = build_config(RunConfig(), {**TINY, "rounds": 4, "checkpoint_every": 2, "out": str(tmp_path)})
    run_until_crash(config, FedAvgServer, tmp_path / "suite", crash_round=4)
    path = tmp_path / "suite" / "config.toml"
    text = path.read_text(encoding="utf-8")
    path.write_text(f'track = "tensorboard,mlflow"\n{text}', encoding="utf-8")
    resume_suite(tmp_path / "suite", progress=False)
    run_dir = tmp_path / "suite" / "fedavg"
    _check_tensorboard_scalars(_events(run_dir), run_dir)
    client = MlflowClient((tmp_path / "mlruns").resolve().as_uri())
    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    for round, scalars in _expected_scalars(run_dir).items():
        for name, value in scalars.items():
            steps = [m.value for m in client.get_metric_history(run_id, name) if m.step == round]
            assert steps == [pytest.approx(value)], (name, round)
