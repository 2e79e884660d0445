"""`fedistill run --dry-run`: every check of a real run, then a plan on stdout, and nothing on disk."""

from fedistill.cli import main

FAST = ["--clients", "3", "--rounds", "1", "--model", "mlp", "--quiet"]


def test_dry_run_of_the_demo_prints_the_plan_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the demo's run folder would go under ./runs
    out = tmp_path / "plans"
    assert main(["run", "--dry-run", "--out", str(out)]) == 0
    plan = capsys.readouterr().out
    for line in (
        "[fediod]",
        "[standalone]",
        "[fedavg]",
        "[centralized]",
        'preset = "stable"',
        "lr_student = 0.003",  # set by the preset, not by the demo's table
        "dataset: digits",
        "partition: 10 clients, dirichlet, alpha 0.5",
        "model: small-cnn",
        "device: ",
        "threads: ",
        f"run folder: {out}",
    ):
        assert line in plan, line
    assert "train " in plan and "test " in plan
    assert "parameters" in plan
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_dry_run_gives_a_real_runs_error_and_exit_code(tmp_path, capsys):
    argv = ["run", *FAST, "--out", str(tmp_path / "out"), "--algorithm", "fedavgg"]
    assert main([*argv, "--dry-run"]) == 2
    dry = capsys.readouterr()
    assert main(argv) == 2
    real = capsys.readouterr()
    assert dry.err == real.err and len(dry.err.strip().splitlines()) == 1
    assert "did you mean 'fedavg'" in dry.err
    assert not (tmp_path / "out").exists()


def test_dry_run_refuses_a_name_that_holds_a_run(tmp_path, capsys):
    argv = ["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--dry-run"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_dry_run_of_a_resume_says_where_it_goes_on_and_writes_nothing(tmp_path, capsys):
    argv = ["run", *FAST, "--algorithm", "fedavg,standalone", "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    capsys.readouterr()
    (tmp_path / "x" / "fedavg" / "summary.json").unlink()  # as if stopped after its last checkpoint
    before = sorted(p for p in (tmp_path / "x").rglob("*"))
    stamps = {p: p.stat().st_mtime_ns for p in before}
    assert main(["run", "--resume", str(tmp_path / "x"), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "fedavg: continues after round 1" in plan
    assert "standalone: finished" in plan
    assert sorted(p for p in (tmp_path / "x").rglob("*")) == before
    assert {p: p.stat().st_mtime_ns for p in before} == stamps


def test_dry_run_of_a_resume_refuses_an_edited_config(tmp_path, capsys):
    argv = ["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    capsys.readouterr()
    (tmp_path / "x" / "fedavg" / "summary.json").unlink()
    config = tmp_path / "x" / "config.toml"
    config.write_text(config.read_text().replace("lr = 0.05", "lr = 0.1"))
    assert main(["run", "--resume", str(tmp_path / "x"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "lr" in err


def test_dry_run_downloads_nothing(tmp_path, capsys):
    """With `--download`, a dry run checks the files that are there and fetches none: missing ones are the
    real run's one-line error."""
    data = tmp_path / "data"
    argv = ["run", *FAST, "--dataset", "mnist", "--data-dir", str(data), "--download", "--dry-run"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "missing dataset files" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _read_only(monkeypatch, root):
    """Every folder under `root` reads as unwritable (a test runs as any user, root included)."""
    import os

    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if str(p).startswith(str(root)) else real(p, mode, **kw)
    )


def test_dry_run_names_an_out_folder_a_run_could_not_write(tmp_path, capsys, monkeypatch):
    _read_only(monkeypatch, tmp_path)
    assert main(["run", *FAST, "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "cannot write the run directory" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_dry_run_of_a_resume_names_a_folder_a_resume_could_not_write(tmp_path, capsys, monkeypatch):
    argv = ["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    capsys.readouterr()
    _read_only(monkeypatch, tmp_path)
    assert main(["run", "--resume", str(tmp_path / "x"), "--dry-run"]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_the_plan_sums_up_many_clients(tmp_path, capsys):
    argv = ["run", *FAST, "--clients", "30", "--out", str(tmp_path / "out"), "--dry-run"]
    assert main(argv) == 0
    assert (
        "partition: 30 clients, dirichlet, alpha 0.5; training samples per client: min "
        in capsys.readouterr().out
    )


def test_dry_run_of_a_resume_refuses_a_run_another_process_writes(tmp_path, capsys):
    from filelock import FileLock

    argv = ["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    capsys.readouterr()
    with FileLock(str(tmp_path / "x" / ".lock"), timeout=0):
        assert main(["run", "--resume", str(tmp_path / "x"), "--dry-run"]) == 2
    assert "is being written by another fedistill process" in capsys.readouterr().err


def test_dry_run_of_a_resume_says_a_damaged_summary_is_finished_again(tmp_path, capsys):
    argv = ["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    capsys.readouterr()
    (tmp_path / "x" / "fedavg" / "summary.json").write_text("{torn")
    assert main(["run", "--resume", str(tmp_path / "x"), "--dry-run"]) == 0
    assert "fedavg: summary damaged, finished again: continues after round 1" in capsys.readouterr().out


def test_the_plan_shows_an_own_algorithms_preset_as_it_runs(tmp_path, capsys, monkeypatch):
    import dataclasses
    from dataclasses import dataclass

    from fedistill.algorithms.base import ALGORITHMS
    from fedistill.algorithms.registry import get_algorithm

    @dataclass(frozen=True)
    class Tuned:
        preset: str = "plain"
        mix: float = 0.0

    def tuned(config, options, info):
        return dataclasses.replace(options, mix=0.25) if options.preset == "strong" else options

    own = dataclasses.replace(get_algorithm("fedavg"), name="own", options=Tuned, resolve_options=tuned)
    monkeypatch.setitem(ALGORITHMS, "own", own)
    argv = ["run", "--dry-run", *FAST, "--algorithm", "own", "--out", str(tmp_path / "out")]
    assert main([*argv, "--set", "own.preset=strong"]) == 0
    plan = capsys.readouterr().out
    assert "  mix = 0.25" in plan  # set by the preset, not by the config
    assert 'preset = "strong"' in plan


def test_the_plan_spells_an_option_as_a_config_file_reads_it_back(tmp_path, capsys, monkeypatch):
    import dataclasses
    import tomllib
    from dataclasses import dataclass

    from fedistill.algorithms.base import ALGORITHMS
    from fedistill.algorithms.registry import get_algorithm

    @dataclass(frozen=True)
    class Rooted:
        root: str = ""

    monkeypatch.setitem(
        ALGORITHMS, "own", dataclasses.replace(get_algorithm("fedavg"), name="own", options=Rooted)
    )
    argv = ["run", "--dry-run", *FAST, "--algorithm", "own", "--out", str(tmp_path / "out")]
    assert main([*argv, "--set", "own.root='C:\\data\\\"x\"'"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  root = "))
    assert tomllib.loads(line.strip()) == {"root": 'C:\\data\\"x"'}


def test_an_option_value_toml_cannot_hold_is_shown_as_python_writes_it():
    """An own algorithm's options may hold None (TOML has no null): the plan shows it instead of failing."""
    from fedistill.config import toml_literal

    assert toml_literal(None) == "None"
    assert toml_literal(("a", 1)) == '["a", 1]'
    assert toml_literal('a"b') == '"a\\"b"'


def test_dry_run_names_alpha_only_for_a_partition_that_draws_with_it(tmp_path, capsys):
    argv = ["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--dry-run"]
    assert main([*argv, "--partition", "iid"]) == 0
    plan = capsys.readouterr().out
    assert "partition: 3 clients, iid; training samples" in plan  # "iid, alpha 0.5" reads as a skewed split
    assert ", alpha" not in plan
