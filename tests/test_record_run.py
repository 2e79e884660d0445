"""benchmarks/record_run.py: one `fedistill run` command's numbers in a record a page can cite, exactly as the
run measured them, with the command, commit and machine, and no folder of the machine that made it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import record_run

RUN = ["--algorithm", "centralized", "--rounds", "2", "--model", "small-cnn", "--set", "threads=1"]
DATA = ["--data-dir", "data"]  # a folder of this machine: the run reads it, the record leaves it out


def test_the_record_holds_what_the_run_measured(tmp_path):
    out, results = tmp_path / "runs", tmp_path / "results"
    argv = ["probe", "--note", "A check.", "--out", str(out), "--results", str(results), "--", *RUN, *DATA]
    path = record_run.main(argv)

    summary = json.loads((out / "probe" / "centralized" / "summary.json").read_text())
    record = json.loads((results / "probe.json").read_text())
    (centralized,) = record["algorithms"]
    assert centralized["final"] == summary["final"]
    assert len(centralized["by_round"]) == 2
    assert centralized["by_round"][-1] == summary["final"]["test_accuracy"]
    assert record["command"] == "fedistill run " + " ".join(RUN)  # nothing here needs quoting
    assert record["machine"] and record["commit"]
    text = path.read_text()
    assert f"| centralized | accuracy | {100 * summary['final']['test_accuracy']:.2f} |" in text
    assert "A check." in text and "--note 'A check.'" in record["recorded_with"]
    assert str(tmp_path) not in text and str(tmp_path) not in (results / "probe.json").read_text()


def test_reuse_keeps_a_finished_run_with_the_same_options_and_reruns_a_changed_one(tmp_path, monkeypatch):
    folder = tmp_path / "runs" / "probe"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text("[]")
    (folder / "record_options.json").write_text(json.dumps({"options": RUN, "commit": "abc1234"}))
    started = []
    monkeypatch.setattr(record_run, "head_commit", lambda: "def5678")
    monkeypatch.setattr(record_run.subprocess, "run", lambda *a, **k: started.append(a) or _failed())
    common = ["probe", "--out", str(tmp_path / "runs"), "--reuse", "--"]
    assert record_run.run(record_run.parse([*common, *RUN])) == (folder, "abc1234")  # the commit that ran it
    assert not started
    with pytest.raises(SystemExit, match="failed"):
        record_run.run(record_run.parse([*common, *RUN[:-1], "threads=2"]))
    assert started


def test_reuse_runs_again_what_other_code_made_even_with_the_same_options(tmp_path, monkeypatch):
    """The same options are not the same run when the library changed since: as every benchmark's
    `--reuse`, the finished run another code made is set aside (kept, renamed) and made again."""
    folder = tmp_path / "runs" / "probe"
    (folder / "centralized").mkdir(parents=True)
    (folder / "config.toml").write_text('algorithm = "centralized"\n')
    summary = {"algorithm": "centralized", "versions": {"code": "0123456789ab"}}
    (folder / "centralized" / "summary.json").write_text(json.dumps(summary))
    (folder / "results.json").write_text(json.dumps([summary]))
    (folder / "record_options.json").write_text(json.dumps({"options": RUN, "commit": "abc1234"}))
    started = []
    monkeypatch.setattr(record_run, "head_commit", lambda: "def5678")
    monkeypatch.setattr(record_run.subprocess, "run", lambda *a, **k: started.append(a) or _failed())
    with pytest.raises(SystemExit, match="failed"):
        record_run.run(record_run.parse(["probe", "--out", str(tmp_path / "runs"), "--reuse", "--", *RUN]))
    assert started
    aside = folder.with_name("probe.other-code-0123456789ab")
    assert json.loads((aside / "centralized" / "summary.json").read_text()) == summary


def _failed():
    class Done:
        returncode = 1

    return Done()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["probe"], "after `--`"),
        (["probe", "--", "--algorithm", "fedavg", "--out", "x"], "--out: the record chooses"),
        (["probe", "--", "--name=x"], "--name=x: the record chooses"),
        (["../probe", "--", "--rounds", "1"], "use letters"),
    ],
)
def test_bad_commands_stop_with_what_to_do(argv, message, capsys):
    with pytest.raises(SystemExit):
        record_run.parse(argv)
    assert message in capsys.readouterr().err


def test_the_record_gives_the_machines_matmul_rate_beside_its_wall_times(tmp_path, monkeypatch):
    import fediod_step_time

    monkeypatch.setattr(fediod_step_time, "matmul_peak_gflops", lambda: 61.5)
    out, results = tmp_path / "runs", tmp_path / "results"
    path = record_run.main(["probe", "--out", str(out), "--results", str(results), "--", *RUN, *DATA])
    record = json.loads((results / "probe.json").read_text())
    assert record["matmul_peak_gflops"] == 61.5
    assert "fp32 matmul 61.5 GFLOP/s at one thread" in path.read_text()
