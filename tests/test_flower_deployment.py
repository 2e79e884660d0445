"""`flwr run .` against real Flower processes: the local simulation SuperLink, and a deployment
(SuperLink + SuperNodes on loopback, plain and TLS). Every run must agree with the same config run
in-process: final test accuracy, and bytes per client and kind in the ledger (the transport's
`query.hello` handshake left out).

Slow (tens of seconds to minutes each): `pytest -m slow tests/test_flower_deployment.py`.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")

from flower_processes import (
    REPO,
    deployment,
    flwr_bin,
    flwr_run,
    ledger_totals,
    local_superlink,
    round_times,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which(flwr_bin("flwr")) is None or shutil.which(flwr_bin("flower-superlink")) is None,
        reason="the flwr / flower-superlink commands are not installed",
    ),
]

#: The run of tests A-C: FedAvg, 2 clients on digits (the app's defaults), `rounds` set per test.
FEDAVG = {"algorithm": "fedavg", "dataset": "digits", "model": "lenet-fedmdcg", "clients": 2}
#: Test D: FedIOD cut down to a few messages. Flower's `-c` takes only keys pyproject.toml declares
#: ([tool.flwr.app.config]); algorithm options go through its `set` key.
FEDIOD = {
    "algorithm": "fediod",
    "dataset": "digits",
    "model": "lenet-fedmdcg",
    "clients": 2,
    "rounds": 1,
    "set": "fediod.teacher_epochs=1 fediod.iters_per_epoch=2 fediod.generator_width=16 "
    "fediod.discriminator_width=16",
}

_REFERENCES: dict[str, Path] = {}


def app_config() -> dict[str, Any]:
    """`[tool.flwr.app.config]` of pyproject.toml: what `flwr run .` starts from."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(project["tool"]["flwr"]["app"]["config"])


def reference_run(overrides: dict[str, Any], root: Path) -> Path:
    """The same run config in-process (default transport): its algorithm's run directory."""
    from fedistill.engine.flower.apps import config_from_run_config
    from fedistill.engine.launch import run_suite

    key = json.dumps(overrides, sort_keys=True)
    if key not in _REFERENCES:
        suite = root / f"reference-{len(_REFERENCES)}"
        config = config_from_run_config({**app_config(), **overrides, "out": str(root), "name": suite.name})
        assert config.transport == "inprocess"
        run_suite(config, suite, progress=False)
        _REFERENCES[key] = suite / config.algorithms[0]
    return _REFERENCES[key]


@pytest.fixture(scope="module")
def reference_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference")


def compare(run: Path, reference: Path, *, tol: float) -> dict[str, Any]:
    """Assert a Flower run directory agrees with the in-process one; what was compared."""
    got = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    want = json.loads((reference / "summary.json").read_text(encoding="utf-8"))
    assert got["transport"] == "flower" and want["transport"] == "inprocess"
    assert got["partition"]["hash"] == want["partition"]["hash"]
    assert got["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=tol), (
        f"final test accuracy: Flower {got['test_accuracy']}, in-process {want['test_accuracy']}"
    )
    curve = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ref_curve = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("test_accuracy") for r in curve] == pytest.approx(
        [r.get("test_accuracy") for r in ref_curve], abs=tol
    )

    records = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    hellos = [r for r in records if r["type"] == "query.hello"]
    assert {(h["direction"], h["client"]) for h in hellos} == {
        (d, c) for d in ("server->client", "client->server") for c in range(got["clients"])
    }, "one query.hello each way per client"
    totals, ref_totals = ledger_totals(run / "ledger.jsonl"), ledger_totals(reference / "ledger.jsonl")
    assert totals == ref_totals, {
        k: (totals.get(k), ref_totals.get(k))
        for k in sorted(set(totals) | set(ref_totals))
        if totals.get(k) != ref_totals.get(k)
    }
    assert not got["communication"]["failures"]
    return {
        "test_accuracy": got["test_accuracy"],
        "reference_accuracy": want["test_accuracy"],
        "round_time_s": round_times(run / "metrics.jsonl"),
        "reference_round_time_s": round_times(reference / "metrics.jsonl"),
    }


def report(request: pytest.FixtureRequest, started: float, **facts: Any) -> None:
    facts["wall_s"] = round(time.monotonic() - started, 1)
    print(f"\n[{request.node.name}] {json.dumps(facts)}")


def test_flwr_run_local_simulation_matches_inprocess(tmp_path, reference_root, request):
    started = time.monotonic()
    runs = tmp_path / "runs"
    overrides = {**FEDAVG, "rounds": 2, "out": str(runs), "name": "local"}
    with local_superlink(tmp_path) as procs:
        run_s = flwr_run(
            procs,
            "local",
            overrides,
            federation_config="num_supernodes=2",
            timeout=240,
            summary=runs / "local" / "fedavg" / "summary.json",
        )
    reference = reference_run({**FEDAVG, "rounds": 2}, reference_root)
    facts = compare(runs / "local" / "fedavg", reference, tol=1e-6)
    report(request, started, flwr_run_s=round(run_s, 1), **facts)


def _deployed_run(
    tmp_path: Path, tls: bool, overrides: dict[str, Any], timeout: float, *, worker: bool = False
) -> tuple[Path, float]:
    runs = tmp_path / "runs"
    name = f"deploy-{'tls' if tls else 'insecure'}-{overrides['algorithm']}"
    algorithm_dir = runs / name / overrides["algorithm"]
    node_config = (lambda i: {"worker": True}) if worker else None
    with deployment(tmp_path, 2, tls, node_config=node_config) as dep:
        if tls:
            _assert_tls(dep.address, dep.certificates["ca"])
        run_s = dep.flwr_run(
            {**overrides, "out": str(runs), "name": name},
            timeout=timeout,
            summary=algorithm_dir / "summary.json",
        )
        # the client state lived on the nodes' disks, one folder per (run, algorithm, partition)
        for i, state_dir in enumerate(dep.state_dirs):
            folders = {p.parent.name for p in state_dir.glob("run-*/*-client-*/state-*.safetensors")}
            assert folders == {f"{overrides['algorithm']}-client-{i:03d}"}, (
                f"node {i}: client states {folders}"
            )
    return algorithm_dir, run_s


def _assert_tls(address: str, ca: Path) -> None:
    """The SuperLink speaks TLS with a certificate the CA vouches for, for the IP and for localhost."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    for server_name in (host, "localhost"):
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=server_name) as tls,
        ):
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with pytest.raises(ssl.SSLError):  # and only with that CA
        untrusted = ssl.create_default_context()
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            untrusted.wrap_socket(raw, server_hostname=host),
        ):
            pass


@pytest.mark.timeout(480)
def test_deployment_insecure_matches_inprocess(tmp_path, reference_root, request):
    started = time.monotonic()
    run, run_s = _deployed_run(tmp_path, False, {**FEDAVG, "rounds": 2}, timeout=360)
    facts = compare(run, reference_run({**FEDAVG, "rounds": 2}, reference_root), tol=1e-6)
    report(request, started, flwr_run_s=round(run_s, 1), **facts)


@pytest.mark.timeout(480)
def test_deployment_tls_matches_inprocess(tmp_path, reference_root, request):
    started = time.monotonic()
    run, run_s = _deployed_run(tmp_path, True, {**FEDAVG, "rounds": 1}, timeout=360)
    facts = compare(run, reference_run({**FEDAVG, "rounds": 1}, reference_root), tol=1e-6)
    report(request, started, flwr_run_s=round(run_s, 1), **facts)


@pytest.mark.timeout(600)
def test_deployment_fediod_matches_inprocess(tmp_path, reference_root, request):
    started = time.monotonic()
    run, run_s = _deployed_run(tmp_path, False, FEDIOD, timeout=480)
    facts = compare(run, reference_run(FEDIOD, reference_root), tol=1e-5)
    report(request, started, flwr_run_s=round(run_s, 1), **facts)


@pytest.mark.timeout(600)
def test_deployment_with_node_workers_matches_inprocess(tmp_path, reference_root, request):
    """worker=true: every message goes through one long-lived worker per node; same results, and the
    deployment harness ends the workers with the nodes (no process left behind)."""
    started = time.monotonic()
    run, run_s = _deployed_run(tmp_path, False, FEDIOD, timeout=480, worker=True)
    facts = compare(run, reference_run(FEDIOD, reference_root), tol=1e-5)
    logs = sorted((tmp_path / "deployment").parent.rglob("worker.log"))
    assert len(logs) == 2 and all(log.read_text().count("listening on") == 1 for log in logs)
    report(request, started, flwr_run_s=round(run_s, 1), **facts)


def _digit_sites(root: Path) -> Path:
    """The digits as image folders a consortium would hold: the server's (`server/`: validation and test
    images) and two sites' own (`site-0/`: digits 0-6, `site-1/`: 3-9), none holding another's records."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = np.clip(digits.images * 16, 0, 255).astype(np.uint8), digits.target
    order = np.random.default_rng(0).permutation(len(labels))
    held = {"server/test": order[:200], "server/train": order[200:300]}
    for k, classes in enumerate(((0, 1, 2, 3, 4, 5, 6), (3, 4, 5, 6, 7, 8, 9))):
        mine = [i for i in order[300 + k :: 2] if labels[i] in classes]
        held[f"site-{k}/train"], held[f"site-{k}/test"] = mine[:150], mine[150:180]
    for part, indices in held.items():
        for i in indices:
            (root / part / str(labels[i])).mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(root / part / str(labels[i]) / f"{i:04d}.png")
    return root


@pytest.mark.timeout(600)
def test_deployment_with_each_site_reading_its_own_folder_matches_inprocess(
    tmp_path, reference_root, request
):
    """site_data_dir: each SuperNode reads only its own folder, named in its node config (a path no other
    process knows), and the run matches the same sites read in-process from site_data_dir's folders."""
    started = time.monotonic()
    data = _digit_sites(tmp_path / "data")
    folders = f"site_data_dir={data}/site-{{site}} data_dir={data / 'server'}"
    overrides = {
        "algorithm": "fedavg", "dataset": "image-folder", "model": "small-cnn", "clients": 2, "rounds": 2,
        "set": f"{folders} image-folder.channels=1 image-folder.image_size=8",
    }  # fmt: skip
    for i in range(2):  # each hospital's scans where only its own node looks
        shutil.copytree(data / f"site-{i}", tmp_path / f"hospital-{i}" / "scans")
    runs, name = tmp_path / "runs", "deploy-own-data"
    algorithm_dir = runs / name / "fedavg"
    own = {"node_config": lambda i: {"data-dir": str(tmp_path / f"hospital-{i}" / "scans")}}
    with deployment(tmp_path, 2, False, **own) as dep:
        run_s = dep.flwr_run(
            {**overrides, "out": str(runs), "name": name}, timeout=360, summary=algorithm_dir / "summary.json"
        )
    facts = compare(algorithm_dir, reference_run(overrides, reference_root), tol=1e-6)
    got = json.loads((algorithm_dir / "summary.json").read_text(encoding="utf-8"))
    assert got["partition"]["method"] == "own-data" and len(got["partition"]["sizes"]) == 2
    report(request, started, flwr_run_s=round(run_s, 1), **facts)


@pytest.mark.timeout(600)
def test_a_killed_supernode_is_dropped_and_the_run_goes_on(tmp_path, request):
    """Kill one SuperNode after round 1: the server notices (offline node or timeout), records the
    drop in the summary and the ledger, and finishes the rounds with the other clients."""
    import threading

    started = time.monotonic()
    runs, name = tmp_path / "runs", "deploy-kill"
    algorithm_dir = runs / name / "fedavg"
    overrides = {**FEDAVG, "clients": 3, "rounds": 3, "out": str(runs), "name": name,
                 "set": "timeout=60 min_clients=1"}  # fmt: skip
    with deployment(tmp_path, 3, False) as dep:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                dep.flwr_run(overrides, timeout=540, summary=algorithm_dir / "summary.json")
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        deadline = time.monotonic() + 300
        metrics = algorithm_dir / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.is_file() and metrics.read_text().strip()):
            time.sleep(0.5)
        assert metrics.is_file(), "round 1 never finished:\n" + dep.procs.diagnostics()
        killed_at = time.monotonic()
        dep.supernodes[2].popen.kill()
        runner.join(timeout=560)
        assert not runner.is_alive(), "flwr run did not finish:\n" + dep.procs.diagnostics()
        assert not errors, errors
    summary = json.loads((algorithm_dir / "summary.json").read_text())
    assert set(summary["dropped_clients"]) == {"2"}, summary["dropped_clients"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    records = [json.loads(line) for line in (algorithm_dir / "ledger.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["status"] != "ok"]
    assert failed and {r["client"] for r in failed} == {2} and min(r["round"] for r in failed) >= 2
    ok_up = [
        r for r in records if r["direction"] == "client->server" and r["round"] == 3 and r["status"] == "ok"
    ]
    assert {r["client"] for r in ok_up} == {0, 1}
    report(request, started, after_kill_s=round(time.monotonic() - killed_at, 1),
           dropped=summary["dropped_clients"]["2"], test_accuracy=summary["test_accuracy"])  # fmt: skip
