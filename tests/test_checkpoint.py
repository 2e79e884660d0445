"""Checkpoints: exact round trips of nested state, atomic replacement, no pickle."""

import json

import pytest
import torch

from fedistill.engine.checkpoint import (
    DamagedCheckpoint,
    checkpoints,
    latest_checkpoint,
    read_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)


def test_nested_state_round_trips_exactly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "round": 3,
        "name": "x",
        "none": None,
    }
    write_checkpoint(tmp_path, "round_00003", {"client_000": state, "runner": {"round": 3}})
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == "round_00003"
    loaded = read_checkpoint(path)
    assert loaded["runner"] == {"round": 3}
    restored = loaded["client_000"]
    for key, value in state["model"].items():
        assert torch.equal(restored["model"][key], value)
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(restored["optimizer"])
    assert torch.equal(
        fresh.state_dict()["state"][0]["momentum_buffer"],
        optimizer.state_dict()["state"][0]["momentum_buffer"],
    )
    assert restored["round"] == 3 and restored["name"] == "x" and restored["none"] is None


def test_the_two_newest_checkpoints_are_kept(tmp_path):
    """The one before the newest is the fallback when the newest turns out damaged on resume."""
    for round in (1, 2, 3):
        write_checkpoint(tmp_path, f"round_{round:05d}", {"runner": {"round": round}})
    assert latest_checkpoint(tmp_path).name == "round_00003"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["round_00002", "round_00003"]
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.pkl"))


def test_checkpoints_past_round_99999_stay_newest(tmp_path):
    """Names sorted as text put round_100000 before round_99999: the newest checkpoints were pruned as
    old ones and a resume went back to round 99999."""
    for round in (99998, 99999, 100000, 100001):
        write_checkpoint(tmp_path, f"round_{round:05d}", {"runner": {"round": round}})
    assert [p.name for p in checkpoints(tmp_path)] == ["round_100001", "round_100000"]


def test_clients_that_hold_nothing_cost_no_file_and_read_back_empty(tmp_path):
    """A thousand idle clients (never sampled, or stateless) must not cost two files each."""
    runner = {"round": 1, "ledger": 0, "metrics": 1, "elapsed": 0.5}
    parts = {"runner": runner, "server": {}, "client_000": {"model": {"w": torch.ones(2)}}}
    parts |= {f"client_{cid:03d}": {} for cid in range(1, 50)}
    path = write_checkpoint(tmp_path, "round_00001", parts)
    written = sorted(p.name for p in path.iterdir())
    assert written == [
        "client_000.json",
        "client_000.safetensors",
        "empty-parts.json",
        "manifest.json",
        "runner.json",
        "runner.safetensors",
    ]
    loaded = verify_checkpoint(path)
    assert list(loaded) == sorted(parts)
    assert all(loaded[name] == {} for name in parts if name not in ("runner", "client_000"))
    assert torch.equal(loaded["client_000"]["model"]["w"], torch.ones(2))
    (path / "empty-parts.json").write_text('["server"]')  # the list is in the manifest like every part
    with pytest.raises(DamagedCheckpoint):
        verify_checkpoint(path)


def test_a_checkpoint_that_lost_its_manifest_is_damaged_unless_it_predates_manifests(tmp_path):
    """Without its manifest a checkpoint was read unchecked as one from before manifests: a flipped byte in
    the server's weights then resumed silently into other numbers. Only a runner state without the
    settings record (older than manifests) is still read that way."""
    runner = {"round": 1, "ledger": 0, "metrics": 1, "elapsed": 0.5}
    server = {"model": {"w": torch.ones(4)}}
    for name, state in (("new", runner | {"settings": {"rounds": 2}}), ("old", runner)):
        path = write_checkpoint(tmp_path / name, "round_00001", {"runner": state, "server": server})
        (path / "manifest.json").unlink()
        data = bytearray((path / "server.safetensors").read_bytes())
        data[-1] ^= 0x40
        (path / "server.safetensors").write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpoint, match=r"^its manifest\.json is missing$"):
        verify_checkpoint(tmp_path / "new" / "round_00001")
    assert not torch.equal(
        verify_checkpoint(tmp_path / "old" / "round_00001")["server"]["model"]["w"], torch.ones(4)
    )


def test_fedavgm_velocity_read_back_from_a_checkpoint_goes_to_the_runs_device(monkeypatch):
    """A checkpoint reads back on the CPU; FedAvgM's velocity stayed there and its first update on a GPU
    mixed devices. `meta` stands in for the card."""
    from types import SimpleNamespace

    from fedistill import devices
    from fedistill.algorithms.classic.fedavg import FedAvgServer

    server = SimpleNamespace(
        model=torch.nn.Linear(2, 1), privacy=SimpleNamespace(load_state_dict=lambda state: None)
    )
    state = {"model": server.model.state_dict(), "momentum": {"weight": torch.ones(1, 2)}}
    monkeypatch.setattr(devices, "_current", torch.device("meta"))
    FedAvgServer.load_state_dict(server, state)
    assert server.momentum["weight"].device.type == "meta"


@pytest.mark.parametrize("edit", ["lr = 0.05", "rounds = 3", "seed = 3", "alpha = 0.2"])
def test_a_resume_refuses_a_config_edited_since_the_checkpoint_naming_the_key(tmp_path, edit):
    """An edited config.toml was accepted: the run went on with other settings (or more rounds) and its
    record kept the old ones."""
    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite
    from fedistill.errors import ConfigError

    config = build_config(
        RunConfig(), {"algorithm": "fedavg", "clients": 2, "rounds": 2, "model": "mlp", "lr": 0.1}, {}
    )
    run_until_crash(config, FedAvgServer, tmp_path, crash_round=2)
    path = tmp_path / "config.toml"
    key = edit.split(" = ")[0]
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{key} = "))
    path.write_text("\n".join([*lines[:at], edit, *lines[at + 1 :]]) + "\n")
    with pytest.raises(ConfigError, match=rf"written under \({key}\); a resume continues"):
        resume_suite(tmp_path, progress=False)
    path.write_text("\n".join(lines) + "\n")
    assert resume_suite(tmp_path, progress=False)[0]["rounds"] == 2


def test_a_resume_of_a_finished_run_refuses_a_config_edited_since(tmp_path):
    """A finished run whose config.toml was edited (more rounds, another lr) resumed without a word: it
    returned the old summary for 2 rounds while config.toml said 4."""
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite, run_suite
    from fedistill.errors import ConfigError

    config = build_config(
        RunConfig(), {"algorithm": "fedavg", "clients": 2, "rounds": 2, "model": "mlp", "lr": 0.1}, {}
    )
    first = run_suite(config, tmp_path, progress=False)[0]
    path = tmp_path / "config.toml"
    original = path.read_text()
    path.write_text(original.replace("rounds = 2\n", "rounds = 4\n"))
    with pytest.raises(ConfigError, match=r"written under \(rounds\); a resume continues"):
        resume_suite(tmp_path, progress=False)
    path.write_text(original)
    again = resume_suite(tmp_path, progress=False)[0]
    assert again["final"] == first["final"] and again["rounds_done"] == 2


def test_a_resume_refuses_a_config_that_no_longer_names_an_algorithm_the_run_holds(tmp_path):
    """An `algorithm` key edited to leave out an algorithm that ran was accepted: the resume went on with the
    others and left that algorithm's folder behind, which `fedistill summary` no longer showed."""
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite, run_suite
    from fedistill.errors import ConfigError

    common = {"algorithm": "fedavg,standalone", "clients": 2, "rounds": 1, "model": "mlp", "lr": 0.1}
    run_suite(build_config(RunConfig(), common, {}), tmp_path, progress=False)
    path = tmp_path / "config.toml"
    original = path.read_text()
    path.write_text(original.replace('algorithm = "fedavg,standalone"', 'algorithm = "fedavg"'))
    with pytest.raises(ConfigError, match=r"no longer names standalone, whose folder holds its run"):
        resume_suite(tmp_path, progress=False)
    path.write_text(original)
    assert [s["algorithm"] for s in resume_suite(tmp_path, progress=False)] == ["fedavg", "standalone"]


def test_a_resume_ignores_a_folder_left_by_an_earlier_run_that_never_did_any_work(tmp_path):
    """A run may take the name of a folder whose run never did any work; that run's algorithm folders (a
    config.toml and a partition, no round) stay, and the resume of the new run was refused as if its
    config.toml had dropped them."""
    import shutil

    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite, run_suite

    common = {"algorithm": "fedavg", "clients": 2, "rounds": 1, "model": "mlp", "lr": 0.1}
    run_suite(build_config(RunConfig(), common, {}), tmp_path, progress=False)
    earlier = tmp_path / "standalone"  # as a run killed in its set-up leaves it
    earlier.mkdir()
    for name in ("config.toml", "partition.npz", "partition.json"):
        shutil.copy(tmp_path / "fedavg" / name, earlier / name)
    assert [s["algorithm"] for s in resume_suite(tmp_path, progress=False)] == ["fedavg"]


@pytest.mark.parametrize("finished", [False, True])
def test_a_resume_refuses_an_algorithms_own_config_edited_since_the_checkpoint(tmp_path, finished):
    """An edit of an algorithm's own config.toml (the one its models are loaded with) was ignored: the run
    went on, or handed back its summary, under the run's settings, and the edited file stayed beside them."""
    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite, run_suite
    from fedistill.errors import ConfigError

    config = build_config(
        RunConfig(), {"algorithm": "fedavg", "clients": 2, "rounds": 2, "model": "mlp", "lr": 0.1}, {}
    )
    if finished:
        run_suite(config, tmp_path, progress=False)
    else:
        run_until_crash(config, FedAvgServer, tmp_path, crash_round=2)
    path = tmp_path / "fedavg" / "config.toml"
    original = path.read_text()
    path.write_text(original.replace("rounds = 2\n", "rounds = 4\n"))
    with pytest.raises(ConfigError, match=r"fedavg/config\.toml differs from the settings .* \(rounds\)"):
        resume_suite(tmp_path, progress=False)
    path.write_text(original)
    assert resume_suite(tmp_path, progress=False)[0]["rounds_done"] == 2


def test_an_edit_of_one_algorithms_table_blocks_resuming_that_algorithm_alone(tmp_path):
    """Every checkpoint recorded the suite's whole config, so an edited `[fedprox] mu` was refused as an
    edit of FedAvg's run too (its checkpoint was written under the old table)."""
    from fedistill.config import RunConfig, build_config, for_algorithm
    from fedistill.engine.launch import resume_suite, run_suite
    from fedistill.engine.resume import check_finished_settings
    from fedistill.errors import ConfigError

    common = {"algorithm": "fedavg,fedprox", "clients": 2, "rounds": 1, "model": "mlp", "lr": 0.1}
    config = build_config(RunConfig(), common, {"fedprox": {"mu": 0.01}})
    run_suite(config, tmp_path, progress=False)
    path = tmp_path / "config.toml"
    path.write_text(path.read_text().replace("mu = 0.01", "mu = 0.1"))
    edited = build_config(RunConfig(), common, {"fedprox": {"mu": 0.1}})
    check_finished_settings(tmp_path / "fedavg", for_algorithm(edited, "fedavg"))  # FedAvg's run is as it was
    with pytest.raises(ConfigError, match=r"fedprox: config\.toml differs .* \(fedprox\)"):
        resume_suite(tmp_path, progress=False)


def test_run_log_records_the_fallback_from_a_damaged_newest_checkpoint(tmp_path):
    """The warning that a resume went back past a damaged checkpoint reached the console only: run.log,
    the run's own record, did not say that rounds were computed twice."""
    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite

    config = build_config(RunConfig(), {"algorithm": "fedavg", "clients": 2, "rounds": 3, "model": "mlp"}, {})
    run_until_crash(config, FedAvgServer, tmp_path, crash_round=3)
    (tmp_path / "fedavg" / "checkpoints" / "round_00002" / "server.json").write_text("{")
    resume_suite(tmp_path, progress=False)
    log = (tmp_path / "fedavg" / "run.log").read_text()
    assert "resuming from round_00001" in log and "round_00002: " in log


def test_a_resume_without_a_checkpoint_says_it_starts_again_from_round_1(tmp_path, caplog):
    """With checkpoint_every above the rounds done, a killed run has no checkpoint: its resume redid every
    round without a word, as if nothing had run."""
    import logging

    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite

    keys = {"algorithm": "fedavg", "clients": 2, "rounds": 3, "model": "mlp", "checkpoint_every": 5}
    run_until_crash(build_config(RunConfig(), keys, {}), FedAvgServer, tmp_path, crash_round=3)
    with caplog.at_level(logging.WARNING):
        assert resume_suite(tmp_path, progress=False)[0]["rounds_done"] == 3
    assert "no checkpoint to resume from (checkpoint_every = 5): 2 rounds run again" in caplog.text


def test_a_checkpoint_from_before_manifests_that_lost_a_clients_part_is_named_in_one_line(tmp_path):
    """Without a manifest nothing notices a missing part: a client then restarted from nothing and the
    resume died in its load_state_dict with a bare KeyError."""
    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.classic.standalone import StandaloneServer
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.checkpoint import MANIFEST
    from fedistill.engine.launch import resume_suite
    from fedistill.errors import RunDirError

    config = build_config(
        RunConfig(), {"algorithm": "standalone", "clients": 2, "rounds": 2, "model": "mlp"}, {}
    )
    run_until_crash(config, StandaloneServer, tmp_path, crash_round=2)
    checkpoint = tmp_path / "standalone" / "checkpoints" / "round_00001"
    (checkpoint / MANIFEST).unlink()  # as a checkpoint written before manifests, which had no settings
    runner = checkpoint / "runner.json"
    runner.write_text(
        json.dumps({k: v for k, v in json.loads(runner.read_text()).items() if k != "settings"})
    )
    for part in checkpoint.glob("client_001.*"):
        part.unlink()
    with pytest.raises(RunDirError, match="its checkpoint lacks client_001; start again"):
        resume_suite(tmp_path, progress=False)


def test_a_resumed_run_keeps_the_setup_time_its_first_start_measured(tmp_path, monkeypatch):
    """The set-up before round 1 (FedIOD's stage 1) is timed once, by the start that ran it: a resumed run's
    summary said `setup_time_s: null`, though its wall time counted that set-up."""
    import time

    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import resume_suite

    setup = FedAvgServer.setup

    def slow_setup(self, fleet):
        time.sleep(0.3)
        setup(self, fleet)

    monkeypatch.setattr(FedAvgServer, "setup", slow_setup)
    config = build_config(RunConfig(), {"algorithm": "fedavg", "clients": 2, "rounds": 2, "model": "mlp"}, {})
    run_until_crash(config, FedAvgServer, tmp_path, crash_round=2)
    monkeypatch.setattr(FedAvgServer, "setup", lambda self, fleet: pytest.fail("set up again on resume"))
    summary = resume_suite(tmp_path, progress=False)[0]
    assert 0.3 <= summary["setup_time_s"] < summary["wall_time_s"]


def test_equal_tensors_and_metadata_give_equal_files(tmp_path):
    """safetensors writes its header's metadata keys in a hash map's random order, so two identical
    exports of one model had different bytes (and sha256); the header is now written with them sorted."""
    import hashlib

    from safetensors import safe_open

    from fedistill.disk import save_tensors

    tensors = {"weight": torch.arange(6.0).reshape(2, 3), "bias": torch.ones(2)}
    metadata = {f"key{i}": f"value {i} é" for i in range(12)}
    digests = set()
    for i in range(8):
        save_tensors(tensors, tmp_path / f"m{i}.safetensors", metadata)
        digests.add(hashlib.sha256((tmp_path / f"m{i}.safetensors").read_bytes()).hexdigest())
    assert len(digests) == 1
    with safe_open(str(tmp_path / "m0.safetensors"), "pt") as f:
        assert f.metadata() == metadata
        assert all(torch.equal(f.get_tensor(name), value) for name, value in tensors.items())
