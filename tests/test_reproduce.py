"""`fedistill reproduce`: the registry and `--list`, usage mistakes (exit 2), the verdicts on hand-made
summaries (exit 0 / 1), a tiny target run end to end (table.md / .json / .png, finished runs reused,
an interrupted one resumed), and each real ci-scale target (slow)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

import fedistill.errors
from fedistill.config import read_config
from fedistill.machine import describe, machine
from fedistill.reproduce import command, execute, targets
from fedistill.reproduce.plan import plan
from fedistill.reproduce.target_spec import SCALES, Column, Expected, Row, Run, Scale, Target
from fedistill.reproduce.verdict import NO_RESULT, OUTSIDE, UNCHECKED, WITHIN, checks, exit_code
from fedistill.version import code_fingerprint

CI_TARGETS = ("fedmdcg-table", "one-shot", "segmentation-table2", "reconstruction-table9")
ACCURACY = Column("test", "test %", ("final.test_accuracy",))
LOWER = Column("hd95", "HD95 px", ("final.test_hd95",), factor=1.0, higher_is_better=False)


def reproduce(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="fedistill reproduce")
    command.add_arguments(parser)
    code = command.run_command(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return code, out, err


# --- the registry and --list ---------------------------------------------------------------------------
def test_list_names_every_target_with_its_scales_and_runs(capsys):
    code, out, _ = reproduce(capsys, "--list")
    assert code == 0
    for target in targets.all_targets().values():
        line = next(line for line in out.splitlines() if line.startswith(target.name + " "))
        for scale in target.scales:
            assert f"{scale} " in line and " runs" in line
        assert target.title in out
    assert "fedmdcg-table            ci 7 runs | cpu" in out


def test_the_help_gives_the_defaults_of_the_run_folder_and_the_jobs():
    parser = argparse.ArgumentParser(prog="fedistill reproduce")
    command.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "writes <out>/reproduce/<NAME>-<scale>/ (default: runs" in text
    assert "each in its own process (default: 1" in text


def test_every_target_is_declared_consistently():
    for target in targets.all_targets().values():
        assert set(target.scales) <= set(SCALES), target.name
        for name, scale in target.scales.items():
            runs = {run.name for run in scale.runs}
            assert len(runs) == len(scale.runs), (target.name, name)
            columns = {c.key for c in target.columns_at(name)}
            for row in scale.rows:
                assert row.run in runs and row.algorithm, (target.name, name, row.label)
                assert set(row.expected) <= columns, (target.name, name, row.label)
            for run in scale.runs:
                assert run.config_path().is_file(), (target.name, run.config)
    for name in CI_TARGETS:  # the ci targets check our own recorded numbers, every row of them
        ci = targets.get_target(name).scales["ci"]
        assert ci.check == "ours" and all(e.ours is not None for r in ci.rows for e in r.expected.values())


def test_every_run_of_every_scale_resolves_to_a_config_and_a_folder_of_its_own(tmp_path):
    for target in targets.all_targets().values():
        for scale in target.scales:
            jobs = plan(target, scale, tmp_path, "data")
            assert len({job.folder for job in jobs}) == len(jobs), (target.name, scale)
            assert all(job.config.out == str(tmp_path) and job.folder.parent == tmp_path for job in jobs)


def test_the_cpu_scale_reads_our_recorded_numbers_and_the_paper_scale_the_papers():
    table = targets.get_target("fedmdcg-table")
    row = next(r for r in table.scales["cpu"].rows if r.label == "FedAvg, FMNIST, omega 10")
    assert row.expected["local"] == Expected(paper=84.28, ours=85.45, tolerance=2.0)
    assert table.scales["cpu"].run(row.run).seeds == (0, 1, 2)  # the seeds the means were recorded on
    assert table.scales["paper"].check == "paper" and table.scales["paper"].seeds == (0, 1, 2)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["nope"], "unknown target 'nope'"),
        (["fedmdcg-table", "--scale", "gpu"], "unknown scale 'gpu' (valid: ci, cpu, paper)"),
        (["fediod-table1", "--scale", "ci"], "has no scale 'ci'; valid: paper"),
        (["fedmdcg-table", "--seeds", "0,x"], "--seeds takes a comma list"),
        (["fedmdcg-table", "--jobs", "0"], "--jobs must be >= 1"),
        (["one-shot", "--rows", "nowhere"], "no row of one-shot (ci) matches 'nowhere'"),
        ([], "--list"),
    ],
)
def test_usage_mistakes_exit_2_with_one_line(capsys, tmp_path, argv, expected):
    code, _, err = reproduce(capsys, *argv, "--out", str(tmp_path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("fedistill: error: ")
    assert expected in err
    if argv == ["nope"]:
        assert all(name in err for name in CI_TARGETS)


# --- verdicts on hand-made summaries -------------------------------------------------------------------
def fake_summary(folder: Path, algorithm: str, **final: float) -> None:
    (folder / algorithm).mkdir(parents=True, exist_ok=True)
    (folder / algorithm / "summary.json").write_text(json.dumps({"final": final}), encoding="utf-8")


def fake_target(check: str = "ours") -> Target:
    rows = (
        Row("near", "a", "fedavg", {"test": Expected(paper=90.0, ours=80.0, tolerance=2.0)}),
        Row("far", "b", "fedavg", {"test": Expected(paper=90.0, ours=70.0, tolerance=2.0)}),
        Row("free", "a", "fedavg"),
        Row("lost", "c", "fedavg", {"test": Expected(paper=90.0, ours=60.0)}),
        Row("hd", "a", "fedavg", {"hd95": Expected(paper=10.0, ours=11.0, tolerance=1.0)}),
    )
    runs = tuple(Run(n, "unused.toml") for n in "abc")
    scale = Scale(runs, rows, check=check)
    return Target("fake", "a fake table", "no paper", (ACCURACY, LOWER), {"ci": scale, "paper": scale})


def test_rows_narrow_a_target_to_their_rows_and_only_the_runs_they_read():
    narrowed = fake_target().narrowed("ci", ("A", "r"))  # "near" and "far" hold both, any case
    spec = narrowed.scales["ci"]
    assert [r.label for r in spec.rows] == ["near", "far"]
    assert [r.name for r in spec.runs] == ["a", "b"]
    assert "only the rows matching" in spec.note
    assert narrowed.scales["paper"] == fake_target().scales["paper"]
    either = fake_target().narrowed("ci", ("^(near|lost)$",))  # a regular expression: one of two rows
    assert [r.label for r in either.scales["ci"].rows] == ["near", "lost"]
    assert [r.name for r in either.scales["ci"].runs] == ["a", "c"]
    with pytest.raises(fedistill.errors.UserError, match="--rows takes regular expressions"):
        fake_target().narrowed("ci", ("(",))


def test_each_cell_is_judged_against_its_recorded_number_with_mean_and_std_over_seeds(tmp_path):
    seeds = [tmp_path / "a0", tmp_path / "a1"]
    fake_summary(seeds[0], "fedavg", test_accuracy=0.79, test_hd95=12.0)
    fake_summary(seeds[1], "fedavg", test_accuracy=0.83, test_hd95=12.5)
    fake_summary(tmp_path / "b0", "fedavg", test_accuracy=0.80)
    cells = checks(fake_target(), "ci", {"a": seeds, "b": [tmp_path / "b0"], "c": [tmp_path / "c0"]})
    by_row = {(c.row, c.column): c for c in cells}
    near = by_row["near", "test"]
    assert near.values == pytest.approx((79.0, 83.0)) and near.mean == pytest.approx(81.0)
    assert near.std == pytest.approx(2.8284, abs=1e-4) and near.difference == pytest.approx(1.0)
    assert (near.verdict, near.reference, near.paper) == (WITHIN, 80.0, 90.0)
    assert by_row["far", "test"].verdict == OUTSIDE  # 80 against 70: 10 points over, both ways count
    assert by_row["free", "test"].verdict == UNCHECKED  # no expected number: reported, not judged
    assert by_row["lost", "test"].verdict == NO_RESULT  # its run left no summary
    assert by_row["hd", "hd95"].verdict == OUTSIDE  # 12.25 against 11 +- 1
    assert ("far", "hd95") not in by_row  # neither a value nor an expected number: no cell
    assert exit_code(cells) == 1
    assert exit_code([by_row["near", "test"], by_row["free", "test"]]) == 0


def test_a_cell_whose_seed_gave_no_number_is_no_result_not_the_mean_of_the_others(tmp_path):
    """Seed 1 of run "a" failed (no summary): the seed that ran gives exactly the recorded 80.00, yet the
    cell is no reproduction of a two-seed mean and fails, at either scale."""
    fake_summary(tmp_path / "a0", "fedavg", test_accuracy=0.80, test_hd95=11.0)
    folders = {"a": [tmp_path / "a0", tmp_path / "a1"]}
    for scale in ("ci", "paper"):
        by_row = {(c.row, c.column): c for c in checks(fake_target(scale), scale, folders)}
        near = by_row["near", "test"]
        assert near.values == pytest.approx((80.0,)) and near.verdict == NO_RESULT
        assert by_row["hd", "hd95"].verdict == NO_RESULT
        assert by_row["free", "test"].verdict == UNCHECKED  # nothing expected: still only reported
        assert exit_code([near]) == 1


def test_a_seed_whose_summary_holds_nan_gives_no_number_instead_of_stopping_the_table(tmp_path):
    """A metric left undefined (NaN in summary.json: an HD95 with no image to measure, a diverged loss) is
    no number: the cell is `no result`, its std is over the numbers there are, and the table is written."""
    fake_summary(tmp_path / "a0", "fedavg", test_accuracy=0.80, test_hd95=11.0)
    fake_summary(tmp_path / "a1", "fedavg", test_accuracy=float("nan"), test_hd95=float("inf"))
    fake_summary(tmp_path / "a2", "fedavg", test_accuracy=0.82, test_hd95=11.5)
    cells = checks(fake_target(), "ci", {"a": [tmp_path / "a0", tmp_path / "a1", tmp_path / "a2"]})
    by_row = {(c.row, c.column): c for c in cells}
    near = by_row["near", "test"]
    assert near.values == pytest.approx((80.0, 82.0)) and near.std == pytest.approx(1.4142, abs=1e-4)
    assert near.verdict == NO_RESULT and by_row["hd", "hd95"].verdict == NO_RESULT
    json.dumps([c.as_dict() for c in cells], allow_nan=False)  # table.json stays strict JSON


def test_a_floor_row_reads_the_runs_trivial_predictor_not_its_model(tmp_path):
    summary = {"final": {"test_accuracy": 0.9}, "floor": {"label": "input", "test_accuracy": 0.4}}
    (tmp_path / "a0" / "fedavg").mkdir(parents=True)
    (tmp_path / "a0" / "fedavg" / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    rows = (
        Row("model", "a", "fedavg", {"test": Expected(ours=90.0)}),
        Row("floor", "a", "fedavg", {"test": Expected(ours=40.0)}, section="floor"),
    )
    target = Target("t", "t", "s", (ACCURACY,), {"ci": Scale((Run("a", "x.toml"),), rows)})
    cells = {c.row: c for c in checks(target, "ci", {"a": [tmp_path / "a0"]})}
    assert cells["model"].mean == pytest.approx(90.0) and cells["floor"].mean == pytest.approx(40.0)
    assert {c.verdict for c in cells.values()} == {WITHIN}


def test_at_the_papers_scale_only_falling_short_fails(tmp_path):
    fake_summary(tmp_path / "a0", "fedavg", test_accuracy=0.95, test_hd95=8.0)  # both better than the paper
    fake_summary(tmp_path / "b0", "fedavg", test_accuracy=0.87)  # 3 points short of 90
    cells = checks(fake_target("paper"), "paper", {"a": [tmp_path / "a0"], "b": [tmp_path / "b0"]})
    by_row = {(c.row, c.column): c.verdict for c in cells}
    assert by_row["near", "test"] == WITHIN and by_row["hd", "hd95"] == WITHIN
    assert by_row["far", "test"] == OUTSIDE


def test_the_table_lists_its_seeds_in_numeric_order():
    from types import SimpleNamespace

    from fedistill.reproduce.report import markdown

    outcomes = [execute.Outcome(SimpleNamespace(run="a", seed=seed), "reused") for seed in (10, 2)]
    lines = markdown(fake_target(), "ci", [], outcomes, "here")
    assert "seeds 2, 10." in lines[2]


# --- a tiny target end to end ---------------------------------------------------------------------------
TINY = (
    "dataset='digits'",
    "model='mlp'",
    "clients=3",
    "rounds=2",
    "threads=1",
    "val_fraction=0.0",
    "checkpoint_every=1",
)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A registry holding one tiny target: FedAvg and Standalone on digits in one run; `expect(ours,
    tolerance)` re-declares FedAvg's expected test accuracy."""
    config = tmp_path / "tiny.toml"
    config.write_text('algorithm = "fedavg,standalone"\n', encoding="utf-8")

    def expect(ours: float, tolerance: float) -> None:
        rows = (
            Row("FedAvg", "suite", "fedavg", {"test": Expected(paper=97.0, ours=ours, tolerance=tolerance)}),
            Row("Standalone", "suite", "standalone"),
        )
        scale = Scale((Run("suite", str(config), TINY),), rows)
        target = Target("tiny", "a tiny table", "no paper, test only", (ACCURACY,), {"ci": scale})
        monkeypatch.setattr(targets, "all_targets", lambda: {"tiny": target})

    expect(50.0, 100.0)
    return expect


def test_a_target_runs_writes_its_table_and_reuses_finished_runs(tiny, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    code, stdout, err = reproduce(capsys, "tiny", "--out", str(out))
    assert code == 0 and "suite seed 0: ran" in err and "note: --seeds" not in err
    folder = out / "reproduce" / "tiny-ci"
    table = json.loads((folder / "table.json").read_text(encoding="utf-8"))
    assert (table["target"], table["scale"], table["exit_code"]) == ("tiny", "ci", 0)
    fedavg, standalone = table["rows"]
    assert (fedavg["row"], fedavg["verdict"], standalone["verdict"]) == ("FedAvg", WITHIN, UNCHECKED)
    assert 0 < fedavg["mean"] <= 100 and fedavg["reference"] == 50.0 and fedavg["paper"] == 97.0
    markdown = (folder / "table.md").read_text(encoding="utf-8")
    assert markdown == stdout.rstrip("\n") + "\n"
    assert "| FedAvg | test % | 97.00 | 50.00 |" in markdown and "**all within tolerance**" in markdown
    assert re.search(r"^Runs: 1 ran; the 1 that ran or resumed took [\d,]+ s of run time", markdown, re.M)
    here = describe(machine())
    assert f"Machine: {here}." in markdown and table["machine"] == here  # the results pages' provenance
    assert (folder / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def never(job):
        raise AssertionError(f"{job.run} ran again")

    monkeypatch.setattr(execute, "execute", never)
    tiny(-5.0, 0.5)  # the same runs, now expected elsewhere: reused, and judged outside
    code, _, err = reproduce(capsys, "tiny", "--out", str(out))
    assert code == 1 and "suite seed 0: reused" in err
    table = json.loads((folder / "table.json").read_text(encoding="utf-8"))
    assert table["rows"][0]["verdict"] == OUTSIDE and table["rows"][0]["mean"] == fedavg["mean"]
    assert "1 outside tolerance" in (markdown := (folder / "table.md").read_text(encoding="utf-8"))
    assert "\nRuns: 1 reused.\n" in markdown


def test_a_run_left_to_torch_s_threads_is_not_reused_at_another_thread_count(tmp_path, capsys, monkeypatch):
    """A config that leaves `threads = 0` runs at the process's thread count (`--jobs 1`) or cores / N
    (`--jobs N`), and the count changes the numbers (a convolution's gradient sums in another order): a
    run made at one count was reused at another, its digest blind to it. The count is now written into
    the run's config, so its folder (and digest) says it."""
    import torch

    config = tmp_path / "tiny.toml"
    config.write_text('algorithm = "fedavg"\n', encoding="utf-8")
    sets = tuple(s for s in TINY if not s.startswith("threads="))
    scale = Scale((Run("suite", str(config), sets),), (Row("FedAvg", "suite", "fedavg"),))
    target = Target("tiny", "a tiny table", "no paper, test only", (ACCURACY,), {"ci": scale})
    monkeypatch.setattr(targets, "all_targets", lambda: {"tiny": target})
    out = tmp_path / "out"
    assert reproduce(capsys, "tiny", "--out", str(out))[0] == 0
    (one,) = (out / "reproduce" / "tiny-ci" / "runs").iterdir()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        code, _, err = reproduce(capsys, "tiny", "--out", str(out))
        assert code == 0 and "suite seed 0: ran" in err, err
        assert reproduce(capsys, "tiny", "--out", str(out))[2].count("reused") == 1  # and reused at 2
    finally:
        torch.set_num_threads(before)
    (two,) = {p for p in (out / "reproduce" / "tiny-ci" / "runs").iterdir() if p != one}
    assert (
        read_config(one / "config.toml").threads == before and read_config(two / "config.toml").threads == 2
    )
    workers = plan(target, "ci", tmp_path, "data", threads=3)
    assert [job.config.threads for job in workers] == [3]  # cores / N of `--jobs N`, in the config


def test_a_finished_run_that_other_code_made_is_set_aside_and_run_again(tiny, tmp_path, capsys, caplog):
    out = tmp_path / "out"
    assert reproduce(capsys, "tiny", "--out", str(out))[0] == 0
    (run,) = (out / "reproduce" / "tiny-ci" / "runs").iterdir()
    summary_path = run / "fedavg" / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    summary["versions"]["code"] = "0123456789ab"  # as if a library change had come since
    summary_path.write_text(json.dumps(summary), encoding="utf-8")
    code, _, err = reproduce(capsys, "tiny", "--out", str(out))
    assert code == 0 and "suite seed 0: ran" in err and "made by other code (0123456789ab" in caplog.text
    aside = run.with_name(f"{run.name}.other-code-0123456789ab")
    assert json.loads((aside / "fedavg" / "summary.json").read_text("utf-8")) == summary  # kept, not deleted
    again = json.loads(summary_path.read_text(encoding="utf-8"))
    assert again["versions"]["code"] == code_fingerprint()
    assert again["final"]["test_accuracy"] == summary["final"]["test_accuracy"]  # same settings, same run


def test_an_interrupted_run_resumes_and_new_seeds_run_beside_it(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert reproduce(capsys, "tiny", "--out", str(out))[0] == 0
    (run,) = (out / "reproduce" / "tiny-ci" / "runs").iterdir()
    before = json.loads((run / "standalone" / "summary.json").read_text(encoding="utf-8"))["final"]
    (run / "standalone" / "summary.json").unlink()  # as if killed after its last checkpoint
    code, _, err = reproduce(capsys, "tiny", "--out", str(out), "--seeds", "0,1", "--jobs", "2")
    assert code == 0 and "suite seed 0: resumed" in err and "suite seed 1: ran" in err
    assert "note: --seeds 0,1 replaces the seeds the recorded numbers were taken over (0)" in err
    after = json.loads((run / "standalone" / "summary.json").read_text(encoding="utf-8"))["final"]
    assert after["test_accuracy"] == before["test_accuracy"]
    table = json.loads((out / "reproduce" / "tiny-ci" / "table.json").read_text(encoding="utf-8"))
    assert len(table["rows"][0]["values"]) == 2 and table["rows"][0]["std"] is not None


def test_a_failing_run_leaves_its_rows_without_result(tiny, tmp_path, capsys):
    (tmp_path / "tiny.toml").write_text('algorithm = "fedavg,standalone"\npartition = "nope"\n', "utf-8")
    code, _, err = reproduce(capsys, "tiny", "--out", str(tmp_path / "out"))
    assert code == 1 and "suite seed 0: failed" in err and "nope" in err
    table = json.loads((tmp_path / "out" / "reproduce" / "tiny-ci" / "table.json").read_text("utf-8"))
    assert table["rows"][0]["verdict"] == NO_RESULT and table["runs"][0]["status"] == "failed"


def test_a_failed_run_whose_rows_expect_no_number_still_fails_the_command(tmp_path, capsys, monkeypatch):
    """Run "broken" (an unknown partition) is read only by a row without expected numbers: the checked row
    is within, yet a run failed, so the command, table.json and the table's headline say so."""
    config = tmp_path / "tiny.toml"
    config.write_text('algorithm = "fedavg"\n', encoding="utf-8")
    rows = (
        Row("FedAvg", "suite", "fedavg", {"test": Expected(ours=50.0, tolerance=100.0)}),
        Row("Broken", "broken", "fedavg"),
    )
    runs = (Run("suite", str(config), TINY), Run("broken", str(config), (*TINY, "partition='nope'")))
    target = Target("tiny", "a tiny table", "no paper", (ACCURACY,), {"ci": Scale(runs, rows)})
    monkeypatch.setattr(targets, "all_targets", lambda: {"tiny": target})
    code, stdout, err = reproduce(capsys, "tiny", "--out", str(tmp_path / "out"))
    assert "broken seed 0: failed" in err and code == 1
    table = json.loads((tmp_path / "out" / "reproduce" / "tiny-ci" / "table.json").read_text("utf-8"))
    assert [r["verdict"] for r in table["rows"]] == [WITHIN] and table["exit_code"] == 1
    assert "**1 of 2 runs failed**" in stdout and "all within tolerance" not in stdout


# --- the real ci targets -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    # fedmdcg-table: about 55 s at --jobs 2 on 2 shared cores; the others take 1.5 to 2.5 minutes
    [CI_TARGETS[0], *(pytest.param(name, marks=pytest.mark.slow) for name in CI_TARGETS[1:])],
)
def test_a_ci_target_reproduces_its_recorded_numbers(name, tmp_path, capsys):
    """The target at ci scale end to end: every row within the tolerance of our recorded number."""
    code, stdout, _ = reproduce(capsys, name, "--scale", "ci", "--jobs", "2", "--out", str(tmp_path))
    assert code == 0, stdout
    assert "**all within tolerance**" in stdout


def test_a_benchmark_asked_for_a_device_this_machine_lacks_stops_in_one_line(capsys):
    import argparse

    import torch

    from fedistill.reproduce.arguments import add_device_and_shape, check_shape

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    parser = argparse.ArgumentParser(prog="bench")
    add_device_and_shape(parser)
    args = parser.parse_args(["--device", "cuda"])
    with pytest.raises(SystemExit) as exit_info:
        check_shape(parser, args, ["mnist"])
    assert exit_info.value.code == 2
    assert "bench: error: --device: device 'cuda': this machine has no CUDA device" in capsys.readouterr().err
    # with --reuse a GPU's finished runs are only read back into a table: the device is not needed
    args.reuse = True
    check_shape(parser, args, ["mnist"])


def test_the_expected_files_header_says_which_way_each_scale_applies_its_tolerance():
    from fedistill.reproduce.expected import EXPECTED_HEADER
    from fedistill.reproduce.paths import EXPECTED

    assert EXPECTED.read_text(encoding="utf-8").startswith(EXPECTED_HEADER)
    # at the paper's scale only falling short fails (verdict.judge); below it ours is checked both ways
    # against our recorded number, never against the paper's
    assert "|ours - paper|" not in EXPECTED_HEADER
    assert "falling short" in EXPECTED_HEADER and "both ways" in EXPECTED_HEADER


def _fake_pool(settle):
    """A stand-in for the process pool: each submitted job's future is settled at once by `settle(future,
    job)`, in this process."""
    from concurrent.futures import Future

    class FakePool:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, job):
            future = Future()
            settle(future, job)
            return future

    return FakePool


def test_a_worker_process_that_dies_fails_its_jobs_and_the_table_is_still_written(tmp_path, monkeypatch):
    """A worker killed from outside (out of memory, a segfault) breaks the pool: every job not finished
    by then fails with one line, instead of the command ending in a traceback without a table."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool
    from types import SimpleNamespace

    def settle(future: Future, job: SimpleNamespace) -> None:
        if job.seed == 0:
            future.set_result(execute.Outcome(job, "ran", 1.0))
        else:
            future.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))

    monkeypatch.setattr(execute, "ProcessPoolExecutor", _fake_pool(settle))
    jobs = [SimpleNamespace(run="suite", seed=seed, folder=tmp_path / str(seed)) for seed in (0, 1, 2)]
    outcomes = sorted(execute.execute_in_workers(jobs, 2), key=lambda o: o.job.seed)
    assert [(o.job.seed, o.status) for o in outcomes] == [(0, "ran"), (1, "failed"), (2, "failed")]
    assert "terminated abruptly" in outcomes[1].error and "run the same command again" in outcomes[1].error


def test_the_tables_run_count_counts_every_seed_as_the_log_and_list_do():
    from types import SimpleNamespace

    from fedistill.reproduce.report import markdown

    outcomes = [execute.Outcome(SimpleNamespace(run=r, seed=s), "reused") for r in "abc" for s in (0, 1)]
    lines = markdown(fake_target(), "ci", [], outcomes, "here")
    assert ": 6 runs (3 settings, each over its seeds), seeds 0, 1." in lines[2]


def test_finished_runs_make_their_table_without_the_data_they_read(tiny, tmp_path, capsys, monkeypatch):
    from fedistill.reproduce import needed_data

    out = tmp_path / "out"
    assert reproduce(capsys, "tiny", "--out", str(out))[0] == 0
    monkeypatch.setattr(needed_data, "dataset_folder", lambda name, root: root / "not-here")
    code, _, err = reproduce(capsys, "tiny", "--out", str(out))  # nothing to run: no data needed
    assert code == 0 and "suite seed 0: reused" in err
    code, _, err = reproduce(capsys, "tiny", "--out", str(out), "--seeds", "0,1")  # seed 1 must run
    assert code == 2 and "not-here, which does not exist" in err


def test_ctrl_c_while_workers_run_ends_them_instead_of_waiting_for_every_queued_run(tmp_path, monkeypatch):
    """Ctrl-C reaches the workers as well, which fail their current run and go on with the queue: leaving
    the pool would wait for every run still queued. The pool is stopped first, then the interrupt goes on."""
    from types import SimpleNamespace

    stopped = []
    monkeypatch.setattr(
        execute,
        "ProcessPoolExecutor",
        _fake_pool(lambda future, job: future.set_exception(KeyboardInterrupt())),
    )
    monkeypatch.setattr(execute.worker_pool, "stop", stopped.append)
    jobs = [SimpleNamespace(run="suite", seed=seed, folder=tmp_path / str(seed)) for seed in (0, 1, 2)]
    with pytest.raises(KeyboardInterrupt):
        execute.execute_in_workers(jobs, 2)
    assert len(stopped) == 1


def test_an_interrupted_reproduce_says_to_run_the_same_command_again(capsys, monkeypatch):
    """Ctrl-C stops the command with one line and exit code 130; the way on is the same command (its
    finished runs reused, the interrupted one resumed), not `fedistill run --resume` of one run."""

    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "reproduce", interrupted)
    code, _, err = reproduce(capsys, "one-shot")
    assert code == 130 and len(err.strip().splitlines()) == 1
    assert "run the same command again" in err and "--resume" not in err


def test_an_out_folder_that_cannot_be_written_stops_in_one_line_before_any_run(tiny, tmp_path, capsys):
    """A file where --out's folder should be (or a folder without write permission): one line naming
    --out and exit code 2 before anything runs, not every run failing on its own and then a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    code, _, err = reproduce(capsys, "tiny", "--out", str(blocker))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("fedistill: error: --out ") and str(blocker) in err and "ran" not in err


def test_seeds_that_replace_some_runs_recorded_seeds_are_noted(capsys):
    """Runs recorded on different seeds (three for one, one for the other): --seeds 0,1,2 is the
    recorded set for the first, but replaces the second's seed 0, and the note says so."""
    runs = (Run("a", "x.toml", seeds=(0, 1, 2)), Run("b", "x.toml"))
    target = Target("t", "t", "s", (ACCURACY,), {"cpu": Scale(runs, (), seeds=(0,))})
    command._say_if_seeds_replace_recorded(target, "cpu", (0, 1, 2))
    err = capsys.readouterr().err
    assert "note: --seeds 0,1,2 replaces the seeds the recorded numbers were taken over" in err
    command._say_if_seeds_replace_recorded(target, "cpu", None)
    assert capsys.readouterr().err == ""


def test_missing_data_names_every_missing_dataset_folder_at_once(tmp_path):
    """Two datasets missing: both folders in the one line, not one now and the other on the next try."""
    from types import SimpleNamespace

    from fedistill.reproduce.needed_data import require_data

    def job(run: str, dataset: str) -> SimpleNamespace:
        return SimpleNamespace(run=run, config=SimpleNamespace(to_dict=lambda: {"dataset": dataset}))

    jobs = [job("a", "fashion-mnist"), job("b", "fashion-mnist"), job("c", "mnist"), job("d", "digits")]
    with pytest.raises(fedistill.errors.UserError) as error:
        require_data(jobs, str(tmp_path))
    message = str(error.value)
    assert len(message.splitlines()) == 1 and "--data-dir" in message
    assert str(tmp_path / "fashion-mnist") in message and str(tmp_path / "mnist") in message
    assert "'b'" not in message and "digits" not in message  # each folder once; digits needs none


def test_a_table_that_checks_nothing_does_not_call_itself_within_tolerance():
    """Rows without an expected number are reported, not judged: a table of only such rows (a figure's,
    whose paper gives no number) says it checked nothing, and one with some says how many it left."""
    from types import SimpleNamespace

    from fedistill.reproduce.report import markdown
    from fedistill.reproduce.verdict import Check

    def cell(row: str, verdict: str) -> Check:
        reference = None if verdict == UNCHECKED else 80.0
        return Check(row, "test", (80.0,), 80.0, None, None, reference, 2.0, 0.0, verdict)

    outcomes = [execute.Outcome(SimpleNamespace(run="a", seed=0), "reused")]
    lines = markdown(fake_target(), "ci", [cell("free", UNCHECKED)], outcomes, "here")
    assert "**all within tolerance**" not in lines and "**nothing checked" in "\n".join(lines)
    lines = markdown(fake_target(), "ci", [cell("near", WITHIN), cell("free", UNCHECKED)], outcomes, "here")
    assert "**all within tolerance** (1 of 2 numbers unchecked: no expected number)" in lines
    lines = markdown(fake_target(), "ci", [cell("near", WITHIN)], outcomes, "here")
    assert "**all within tolerance**" in lines
