"""The run folder `--resume` takes: which paths name a run, and what it says of the others."""

import pytest

from fedistill.config import RunConfig, build_config, for_algorithm, write_config
from fedistill.engine.suite_dir import resume_target
from fedistill.errors import RunDirError


def test_resume_of_an_algorithm_folder_killed_before_its_first_round_names_the_run(tmp_path):
    """An algorithm's folder holds a config.toml of its own; killed before its first round (stage 1, a
    client's set-up) it had no metrics.jsonl yet, and `--resume RUN/fedavg` took it for a run: the
    resume started a new run nested inside it, RUN/fedavg/fedavg."""
    config = build_config(RunConfig(), {"algorithm": "fedavg,fedprox", "clients": 2, "model": "mlp"}, {})
    write_config(config, tmp_path / "config.toml")
    (tmp_path / "fedavg").mkdir()
    write_config(for_algorithm(config, "fedavg"), tmp_path / "fedavg" / "config.toml")
    with pytest.raises(RunDirError, match=r"is the fedavg folder of the run .*; resume the run: --resume"):
        resume_target(tmp_path / "fedavg")
    assert resume_target(tmp_path) == tmp_path


def test_the_write_probe_is_one_file_per_process(tmp_path, monkeypatch):
    """Every process probed with `.write-test`: two resumes starting together could unlink each other's
    probe and report the folder unwritable instead of the lock's message."""
    import os

    from fedistill import disk
    from fedistill.engine import suite_dir

    written = []
    real = disk.write_bytes
    monkeypatch.setattr(disk, "write_bytes", lambda path, data: (written.append(path), real(path, data)))
    assert suite_dir._unwritable(tmp_path) is None
    assert [p.name for p in written] == [f".write-test-{os.getpid()}"] and list(tmp_path.iterdir()) == []


def test_runs_started_in_the_same_second_without_a_name_get_folders_of_their_own(tmp_path, monkeypatch):
    """The default name is the dataset and the second a run started: a loop of short runs
    (`for lr in ...: fedistill.run(lr=lr)`) stopped at its second run with "already holds a run". A taken
    default name gets -2, -3, ...; a name the user gave is still refused."""
    from fedistill.engine import launch

    monkeypatch.setattr(launch, "default_name", lambda config: "digits-20240601-120000")
    keys = {"algorithm": "fedavg", "clients": 2, "rounds": 1, "model": "mlp", "out": str(tmp_path)}
    made = [
        launch.start_suite(build_config(RunConfig(), keys, {"lr": lr}), progress=False)[0]
        for lr in (0.1, 0.2)
    ]
    assert [p.name for p in made] == ["digits-20240601-120000", "digits-20240601-120000-2"]
    assert all((p / "fedavg" / "summary.json").is_file() for p in made)
    named = build_config(RunConfig(), keys, {"name": "digits-20240601-120000"})
    with pytest.raises(RunDirError, match="already holds a run"):
        launch.start_suite(named, progress=False)
