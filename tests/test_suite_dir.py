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
