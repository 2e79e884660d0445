"""No user mistake or fault costs a run: each case ends in its exit code and one clear line, never a
traceback, and leaves a run directory that a later correct run or `--resume` can use."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedistill.cli import main
from fedistill.engine.rundir import read_jsonl

FAST = ["--algorithm", "fedavg", "--clients", "2", "--rounds", "3", "--model", "mlp", "--quiet"]


def _run(out: Path, *extra: str) -> list[str]:
    return ["run", *FAST, "--out", str(out), *extra]


def _one_line(capsys, prefix: str = "fedistill: error: ", lines: int = 1) -> str:
    """The message's first line; a missing dataset's message goes on with which files go where."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    lines_ = [line for line in err.splitlines() if not line.startswith(("WARNING", "INFO"))]
    assert len(lines_) == lines, err
    lines = lines_
    assert lines[0].startswith(prefix), err
    return lines[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run: the metrics every repaired run must end with."""
    out = tmp_path_factory.mktemp("reference")
    assert main(_run(out, "--name", "ref")) == 0
    return read_jsonl(out / "ref" / "fedavg" / "metrics.jsonl")


def _same_as(reference: list[dict], run: Path) -> bool:
    strip = lambda rows: [{k: v for k, v in r.items() if k != "round_time_s"} for r in rows]  # noqa: E731
    return strip(read_jsonl(run / "fedavg" / "metrics.jsonl")) == strip(reference)


# --- 1. a failed setup writes nothing and blocks nothing ------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        ["--alpha", "0"],
        ["--dataset", "nosuch"],
        ["--model", "nosuch"],
        ["--dataset", "mnist", "--data-dir", "/nonexistent"],
        ["--set", "fedavg.weighting=nosuch"],
        ["--set", "fedavg.nosuch=1"],
    ],
)
def test_a_failed_setup_writes_nothing_and_the_name_stays_free(tmp_path, capsys, bad):
    assert main(_run(tmp_path, "--name", "a", *bad)) == 2
    _one_line(capsys, lines=7 if "--data-dir" in bad else 1)
    assert not (tmp_path / "a").exists()
    assert main(_run(tmp_path, "--name", "a")) == 0


@pytest.mark.parametrize(
    "key",
    [
        "fediod.teachers",
        "fediod.student",
        "dense.teachers",
        "coboosting.student",
        "feddf.groups",
        "fedavg-oneshot.teachers",
        "feddf-oneshot.student",
    ],
)
def test_a_misspelt_model_in_an_algorithms_options_is_refused_before_the_run_folder(tmp_path, capsys, key):
    algorithm = key.split(".")[0]
    argv = ["run", "--algorithm", algorithm, "--clients", "2", "--rounds", "1", "--quiet"]
    assert main([*argv, "--set", f"{key}=resnet-8", "--out", str(tmp_path), "--name", "a"]) == 2
    assert f"{key} names an unknown model 'resnet-8'" in _one_line(capsys)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "key",
    [
        "fediod.teachers",
        "dense.student",
        "coboosting.teachers",
        "feddf.groups",
        "fedavg-oneshot.teachers",
        "feddf-oneshot.student",
        "fedkd.teachers",
        "fedkd.student",
        "fedmd.models",
    ],
)
def test_a_model_of_another_task_in_an_algorithms_options_is_refused_before_the_run_folder(
    tmp_path, capsys, key
):
    algorithm = key.split(".")[0]
    argv = ["run", "--algorithm", algorithm, "--clients", "2", "--rounds", "1", "--quiet"]
    value = "unet" if key.endswith("student") else "mlp,unet"  # a list's second model
    assert main([*argv, "--set", f"{key}={value}", "--out", str(tmp_path), "--name", "a"]) == 2
    line = _one_line(capsys)
    assert f"{key} names model 'unet', which does not serve classification" in line
    assert "models that do: " in line and "mlp" in line
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("algorithm", "sets", "start"),
    [
        ("fedkd", ["norm=group", "fedkd.teachers=mlp"], "fedkd.teachers: model 'mlp' has no norm layers"),
        ("fediod", ["norm=group", "fediod.student=mlp"], "fediod.student: model 'mlp' has no norm layers"),
        ("feddf", ["norm=group", "feddf.groups=resnet8,mlp"], "feddf.groups: model 'mlp' has no norm layers"),
        (
            "dense",
            ["model=vgg9", "model_options.conv_bias=true", "dense.teachers=resnet8"],
            "dense.teachers: model 'resnet8' takes no options, got 'conv_bias'",
        ),
        (
            "fedmd",
            ["model=vgg9", "model_options.conv_bias=true", "fedmd.models=vgg9,mlp"],
            "fedmd.models: model 'mlp' takes no options",
        ),
        ("fedavg", ["model_options.width=8"], "model 'resnet8' takes no options, got 'width'"),
    ],
)
def test_a_norm_or_model_options_a_built_model_lacks_is_refused_before_the_run_folder(
    tmp_path, capsys, algorithm, sets, start
):
    argv = [
        "run",
        "--algorithm",
        algorithm,
        "--clients",
        "2",
        "--rounds",
        "1",
        "--model",
        "resnet8",
        "--quiet",
    ]
    extra = [arg for key in sets for arg in ("--set", key)]
    assert main([*argv, *extra, "--out", str(tmp_path), "--name", "a"]) == 2
    assert _one_line(capsys).startswith(f"fedistill: error: {start}")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("algorithm", "sets", "start"),
    [
        ("dense", ["val_fraction=0"], "dense.selection = 'clients' needs validation splits"),
        ("fediod", ["val_fraction=0"], "fediod.selection = 'validation' needs validation splits"),
        (
            "coboosting",
            ["val_fraction=0", "coboosting.selection=server"],
            "coboosting.selection = 'server' needs",
        ),
        ("feddf-oneshot", ["val_fraction=0"], "feddf-oneshot selects on the server's validation split"),
        ("fedkd", ["val_fraction=0"], "fedkd.public = 'holdout' is the federation's held-out split"),
        ("fedmd", ["val_fraction=0"], "fedmd.public = 'holdout' is the federation's held-out split"),
        ("fedavg-oneshot", ["rounds=2"], "a one-shot method runs one round, got rounds = 2"),
        (
            "fedprox",
            ["model=lenet-fedmdcg", "fedprox.dp_enabled=true", "fedprox.dp_noise_multiplier=1.0"],
            "fedprox.dp_enabled = true clips and noises client updates, but model 'lenet-fedmdcg' has",
        ),
        (
            "feddf",
            ["model=lenet-fedmdcg", "feddf.dp_enabled=true", "feddf.dp_noise_multiplier=1.0"],
            "feddf.dp_enabled = true clips and noises client updates, but model 'lenet-fedmdcg' has",
        ),
        (  # options that depend on the dataset's task, known once the data are read
            "fediod",
            ["fediod.distill_augment=true"],
            "fediod.distill_augment crops, turns and flips the student's images",
        ),
        ("fediod", ["fediod.truth_weight=0.5"], "fediod.truth_weight teaches the student the label"),
        ("feddf", ["feddf.fuse_precision=full"], "feddf.fuse_precision = 'full' fuses binary models"),
        (  # a BatchNorm model in one group of FedDF's architectures, not the run's `model`
            "feddf",
            ["model=mlp", "feddf.groups=mlp,resnet8", "feddf.dp_enabled=true", "feddf.dp_noise_multiplier=1"],
            "feddf.dp_enabled = true clips and noises client updates, but model 'resnet8' has",
        ),
    ],
)
def test_an_option_the_run_s_common_keys_rule_out_is_refused_before_the_run_folder(
    tmp_path, capsys, algorithm, sets, start
):
    argv = ["run", "--algorithm", algorithm, "--clients", "2", "--rounds", "1", "--quiet"]
    extra = [arg for key in sets for arg in ("--set", key)]
    assert main([*argv, *extra, "--out", str(tmp_path), "--name", "a"]) == 2
    assert _one_line(capsys).startswith(f"fedistill: error: {start}")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("algorithm", ["feddf", "feddf-oneshot"])
def test_an_unknown_dataset_as_distillation_source_is_refused_before_the_run_folder(
    tmp_path, capsys, algorithm
):
    argv = ["run", "--algorithm", algorithm, "--clients", "2", "--rounds", "1", "--quiet"]
    sets = ["--set", f"{algorithm}.source=dataset:fashion-mnst"]
    assert main([*argv, *sets, "--out", str(tmp_path), "--name", "a"]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"fedistill: error: {algorithm}.source = 'dataset:fashion-mnst': unknown dataset")
    assert "fashion-mnist" in line
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("key", "spec"),
    [
        ("feddf.source", "dataset:digits"),
        ("feddf-oneshot.source", "dataset:digits"),
        ("fedkd.public", "dataset:digits"),
        ("fedmd.public", "dataset:digits"),
    ],
)
def test_the_federations_own_dataset_as_public_data_is_refused_before_the_run_folder(
    tmp_path, capsys, key, spec
):
    argv = ["run", "--algorithm", key.split(".")[0], "--dataset", "digits", "--clients", "2", "--rounds", "1"]
    assert main([*argv, "--quiet", "--set", f"{key}={spec}", "--out", str(tmp_path), "--name", "a"]) == 2
    line = _one_line(capsys)
    assert line.startswith(
        f"fedistill: error: {key} = {spec!r} is (or shares images with) the federation's own"
    )
    assert "whose training images are the clients' private data" in line  # one reason, whichever key
    assert not (tmp_path / "a").exists()


def test_a_folder_whose_run_never_started_does_not_count_as_a_run(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.toml").write_text('algorithm = "fedavg"\n')  # left by an older version
    assert main(_run(tmp_path, "--name", "a")) == 0


# --- 2. an unwritable --out -------------------------------------------------------------------------
def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("")
    for out, name in [(a_file, "a"), (Path("/proc/fedistill"), "a"), (tmp_path, "n" * 300)]:
        assert main(_run(out, "--name", name)) == 2
        assert "cannot write the run directory" in _one_line(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_one_line_and_exit_2(tmp_path, capsys):
    tmp_path.chmod(0o500)
    try:
        assert main(_run(tmp_path, "--name", "a")) == 2
        assert "cannot write" in _one_line(capsys)
    finally:
        tmp_path.chmod(0o700)


def test_an_out_on_a_read_only_file_system_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """The same refusal where the mount is read-only, which chmod cannot show to root (the folder is
    made, the probe file in it is not): the run stops before writing anything else."""
    from conftest import read_only_below

    read_only_below(monkeypatch, tmp_path)
    assert main(_run(tmp_path, "--name", "a")) == 2
    line = _one_line(capsys)
    assert f"cannot write the run directory {tmp_path / 'a'}: {os.strerror(errno.EROFS)}" in line
    assert [p.name for p in (tmp_path / "a").iterdir()] == []


@pytest.mark.parametrize("name", ["../x", "/abs", ".", "..", "a/b"])
def test_a_name_is_a_plain_folder_name(tmp_path, capsys, name):
    assert main(_run(tmp_path, "--name", name)) == 2
    assert "one plain folder name" in _one_line(capsys)


# --- 3. damaged checkpoints -------------------------------------------------------------------------
def _finished_then_cut(tmp_path: Path, rounds_done: int = 3) -> Path:
    """A finished run made to look as if it was killed after `rounds_done` rounds."""
    assert main(_run(tmp_path, "--name", "r")) == 0
    run = tmp_path / "r" / "fedavg"
    (run / "summary.json").unlink()
    return run


def _checkpoint(run: Path, round: int) -> Path:
    return run / "checkpoints" / f"round_{round:05d}"


@pytest.mark.parametrize(
    "damage",
    ["truncate-safetensors", "truncate-json", "flip-byte", "missing-file", "empty-runner"],
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, reference, damage):
    run = _finished_then_cut(tmp_path)
    newest = _checkpoint(run, 3)
    server = newest / "server.safetensors"
    if damage == "truncate-safetensors":
        server.write_bytes(server.read_bytes()[: server.stat().st_size // 2])
    elif damage == "truncate-json":
        (newest / "server.json").write_text('{"model": {')
    elif damage == "flip-byte":
        data = bytearray(server.read_bytes())
        data[-1] ^= 0xFF
        server.write_bytes(bytes(data))
    elif damage == "missing-file":
        (newest / "runner.json").unlink()
    else:
        (newest / "runner.json").write_text("{}")
        (newest / "manifest.json").unlink()  # as a checkpoint written before manifests existed
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    assert "resuming from round_00002" in caplog.text
    assert _same_as(reference, tmp_path / "r")


def test_no_intact_checkpoint_refuses_with_what_to_do(tmp_path, capsys):
    run = _finished_then_cut(tmp_path)
    for round in (2, 3):
        (_checkpoint(run, round) / "server.json").write_text("{")
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 2
    line = _one_line(capsys)
    assert "cannot be resumed without losing rounds" in line and "another --name" in line


def test_a_latest_pointer_to_nothing_does_not_restart_silently(tmp_path, capsys):
    run = _finished_then_cut(tmp_path)
    for round in (2, 3):
        for f in _checkpoint(run, round).iterdir():
            f.unlink()
        _checkpoint(run, round).rmdir()
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 2
    assert "the checkpoint folders are gone" in _one_line(capsys)


def test_metrics_shorter_than_the_checkpoint_fall_back_to_a_covered_one(tmp_path, caplog, reference):
    run = _finished_then_cut(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # a torn last line
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    assert "metrics.jsonl holds 2 records" in caplog.text
    assert _same_as(reference, tmp_path / "r")


def test_a_torn_last_metrics_line_past_the_checkpoint_is_dropped(tmp_path, capsys, reference):
    run = _finished_then_cut(tmp_path)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"round": 4, "test_acc')
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    assert _same_as(reference, tmp_path / "r")


# --- 4. damaged summaries ---------------------------------------------------------------------------
DAMAGED = [b'{"algorithm": "fe', b"[1, 2, 3]", b'{"algorithm": "fedavg"}', b"\xff\xfe"]


@pytest.mark.parametrize("content", DAMAGED)
def test_a_damaged_summary_is_named_and_resume_rebuilds_it(tmp_path, capsys, content):
    assert main(_run(tmp_path, "--name", "r")) == 0
    good = json.loads((tmp_path / "r" / "fedavg" / "summary.json").read_text())
    (tmp_path / "r" / "fedavg" / "summary.json").write_bytes(content)
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "r")]) == 2
    line = _one_line(capsys)
    assert "summary.json is damaged" in line and "--resume" in line
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    rebuilt = json.loads((tmp_path / "r" / "fedavg" / "summary.json").read_text())
    assert rebuilt["final"] == good["final"]
    assert main(["summary", str(tmp_path / "r")]) == 0


# --- 5. one writer per run ----------------------------------------------------------------------------
def test_a_second_process_on_a_locked_run_gets_a_clear_message(tmp_path, capsys):
    assert main(_run(tmp_path, "--name", "r")) == 0
    holder = textwrap.dedent(
        f"""
        import sys, time
        from fedistill.engine.suite_dir import locked
        from pathlib import Path
        with locked(Path({str(tmp_path / "r")!r})):
            print("locked", flush=True)
            time.sleep(30)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 2
        line = _one_line(capsys)
        assert f"pid {process.pid}" in line and "another fedistill process" in line
    finally:
        process.kill()
        process.wait()
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0  # the lock died with it


def _unfinished_run(tmp_path: Path, capsys) -> Path:
    """A run planning fedavg and fediod with neither finished, as one still in its rounds leaves it."""
    assert main(_run(tmp_path, "--name", "r")) == 0
    run = tmp_path / "r"
    (run / "fedavg" / "summary.json").rename(run / "fedavg.summary")
    config = run / "config.toml"
    config.write_text(config.read_text().replace('algorithm = "fedavg"', 'algorithm = "fedavg,fediod"'))
    capsys.readouterr()
    return run


def _reading_messages(run: Path, capsys) -> list[str]:
    """What `fedistill summary`, `fedistill.summary` and `fedistill.load_model` say of the run: with no
    algorithm finished, then with fedavg finished and fediod still to come."""
    import fedistill
    from fedistill.errors import RunDirError

    assert main(["summary", str(run)]) == 2
    said = [_one_line(capsys)]
    for read in (
        fedistill.summary,
        *(lambda r, a=a: fedistill.load_model(r, a) for a in ("fedavg", "fediod")),
    ):
        with pytest.raises(RunDirError) as info:
            read(run)
        said.append(str(info.value))
    (run / "fedavg.summary").rename(run / "fedavg" / "summary.json")
    try:
        assert main(["summary", str(run)]) == 0
        said.append(capsys.readouterr().err.strip())
        with pytest.warns(UserWarning) as warned:
            result = fedistill.summary(run)
        said.append(str(warned[0].message))
        with pytest.raises(KeyError) as info:
            result["fediod"]
        said.append(str(info.value))
    finally:
        (run / "fedavg" / "summary.json").rename(run / "fedavg.summary")
    return said


def test_reading_a_run_another_process_is_writing_says_it_is_running_not_to_resume_it(tmp_path, capsys):
    """While a run's lock is held, the run is being trained: advising `--resume` would start a second
    writer on it, which the lock refuses. The messages say it is running, and by which process."""
    from fedistill.engine.suite_dir import locked

    run = _unfinished_run(tmp_path, capsys)
    with locked(run):
        for line in _reading_messages(run, capsys):
            assert f"still running (pid {os.getpid()})" in line and "--resume" not in line, line
    for line in _reading_messages(run, capsys):  # the lock released: a stopped run, to finish
        assert "--resume" in line and "still running" not in line, line


def test_reading_a_run_whose_writer_was_killed_keeps_the_advice_to_resume(tmp_path, capsys):
    """A stale lock (its process killed with -9 leaves .lock and .lock-owner) is no running run."""
    run = _unfinished_run(tmp_path, capsys)
    holder = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from fedistill.engine.suite_dir import locked
        with locked(Path({str(run)!r})):
            print("locked", flush=True)
            time.sleep(30)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "locked"
        for line in _reading_messages(run, capsys):
            assert f"still running (pid {process.pid})" in line and "--resume" not in line, line
    finally:
        process.kill()
        process.wait()
    assert (run / ".lock").is_file() and (run / ".lock-owner").read_text() == str(process.pid)
    for line in _reading_messages(run, capsys):
        assert "--resume" in line and "still running" not in line, line


# --- 6. --resume of an algorithm's folder -------------------------------------------------------------
def test_resume_of_an_algorithm_folder_names_the_run(tmp_path, capsys):
    assert main(_run(tmp_path, "--name", "r")) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "r" / "fedavg"), "--quiet"]) == 2
    line = _one_line(capsys)
    assert f"--resume {tmp_path / 'r'}" in line
    assert not (tmp_path / "r" / "fedavg" / "fedavg").exists()


# --- smaller ones -------------------------------------------------------------------------------------------
def test_summary_of_an_empty_folder_says_it_holds_no_run(tmp_path, capsys):
    assert main(["summary", str(tmp_path)]) == 2
    line = _one_line(capsys)
    assert "holds no run" in line and "--resume" not in line


# --- Ctrl-C and SIGTERM ----------------------------------------------------------------------------
def _signal_after_rows(
    argv: list[str], metrics: Path, rows: int, signum: int, *, job_wide: bool = False
) -> tuple[int, str]:
    """Start `fedistill argv` in a process of its own, wait until `metrics` holds `rows` rows, send it
    `signum` (`job_wide`: to its whole session at once, as a scheduler does); its exit code and stderr."""
    env = {**os.environ, "MPLBACKEND": "Agg"}
    process = subprocess.Popen(
        [sys.executable, "-m", "fedistill.cli", *argv],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        # a terminal's child gets Ctrl-C; an ignored SIGINT is inherited across exec (a Flower test in the
        # same process may leave it ignored), and Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=job_wide,
    )
    # its start (over 30 s at a load of eight on two cores) is not what this checks: wait for it
    deadline = time.monotonic() + 240
    while not metrics.is_file() or len(metrics.read_text().splitlines()) < rows:
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"the run did not get to round {rows}: {process.communicate()[1]}")
        time.sleep(0.01)
    if job_wide:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert "Traceback" not in err
    return process.returncode, err


def test_ctrl_c_names_the_run_folder_and_resume_ends_like_an_uninterrupted_run(tmp_path):
    argv = ["run", *FAST, "--rounds", "25", "--out", str(tmp_path)]
    assert main([*argv, "--name", "ref"]) == 0
    metrics = tmp_path / "cut" / "fedavg" / "metrics.jsonl"
    code, err = _signal_after_rows([*argv, "--name", "cut"], metrics, 2, signal.SIGINT)
    assert code == 130, err
    assert f"interrupted; continue with --resume {tmp_path / 'cut'}" in err
    assert main(["run", "--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    assert _same_as(read_jsonl(tmp_path / "ref" / "fedavg" / "metrics.jsonl"), tmp_path / "cut")


def test_sigterm_stops_a_run_and_its_resume_as_ctrl_c_does_with_exit_code_143(tmp_path):
    """A batch scheduler (SLURM, Kubernetes, systemd) stops a job with SIGTERM: the run and then its
    `--resume` stop as at Ctrl-C, with one line naming the run to resume, and 128 + 15; a last `--resume`
    ends with the metrics of an uninterrupted run."""
    argv = ["run", *FAST, "--rounds", "25", "--out", str(tmp_path)]
    assert main([*argv, "--name", "ref"]) == 0
    metrics = tmp_path / "cut" / "fedavg" / "metrics.jsonl"
    stopped = f"fedistill: stopped by SIGTERM; continue with --resume {tmp_path / 'cut'}"
    code, err = _signal_after_rows([*argv, "--name", "cut"], metrics, 2, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM and err.strip().splitlines()[-1] == stopped, err
    done = len(read_jsonl(metrics))
    resume = ["run", "--resume", str(tmp_path / "cut"), "--quiet"]
    code, err = _signal_after_rows(resume, metrics, done + 2, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM and err.strip().splitlines()[-1] == stopped, err
    assert main(resume) == 0
    assert _same_as(read_jsonl(tmp_path / "ref" / "fedavg" / "metrics.jsonl"), tmp_path / "cut")


def test_a_sigterm_to_the_whole_job_stops_a_run_as_one_to_its_main_process_does(tmp_path):
    """SLURM's scancel or time limit and systemd send SIGTERM to every process of a job at once: the run
    stops with the same line and 143, and its `--resume` ends with the metrics of an uninterrupted run."""
    argv = ["run", *FAST, "--rounds", "25", "--out", str(tmp_path)]
    assert main([*argv, "--name", "ref"]) == 0
    metrics = tmp_path / "cut" / "fedavg" / "metrics.jsonl"
    stopped = f"fedistill: stopped by SIGTERM; continue with --resume {tmp_path / 'cut'}"
    code, err = _signal_after_rows([*argv, "--name", "cut"], metrics, 2, signal.SIGTERM, job_wide=True)
    assert code == 128 + signal.SIGTERM and err.strip().splitlines()[-1] == stopped, err
    assert main(["run", "--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    assert _same_as(read_jsonl(tmp_path / "ref" / "fedavg" / "metrics.jsonl"), tmp_path / "cut")


def test_the_command_line_puts_back_the_sigterm_handler_it_found(tmp_path):
    """SIGTERM stops a run only while the command line runs it: a program that calls `main` (or the
    library) keeps its own handler afterwards."""
    # start from the default whatever an earlier test in this worker left (Ray, when a simulation ran here)
    earlier = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        assert main(_run(tmp_path, "--name", "r")) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, earlier)


# --- config and dataset options ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (["--lr", "inf"], "lr must be a finite number"),
        (["--set", "lr=nan"], "lr must be a finite number"),
        (["--set", "fediod.lr_student=inf"], "fediod.lr_student must be a finite number"),
        (["--set", "fediod.nosuch=1"], "unknown config key 'fediod.nosuch'"),  # fediod is not running
        (["--set", "fedavg.nosuch=1"], "unknown config key 'fedavg.nosuch' (valid"),  # no unrelated guess
        (["--set", "fedavg.weightin='uniform'"], "did you mean 'fedavg.weighting'"),
        (["--set", "min_clients=3"], "min_clients = 3 is more than clients = 2"),
        (["--set", "cifar100.labels='coarse'"], "sets options of dataset 'cifar100', but the run uses"),
        (["--set", "nosuch.key=1"], "unknown config table [nosuch]"),
        (["--set", "fedprox.model='lenett'"], "unknown model 'lenett'; did you mean"),  # not running
        (["--set", "fedprox.norm='groups'"], "unknown norm 'groups'"),
    ],
)
def test_config_mistakes_are_named_before_anything_is_written(tmp_path, capsys, bad, named):
    assert main(_run(tmp_path, "--name", "a", *bad)) == 2
    assert named in _one_line(capsys)
    assert not (tmp_path / "a").exists()


def test_config_given_a_folder_says_it_wants_a_file(tmp_path, capsys):
    assert main(_run(tmp_path, "--config", str(tmp_path))) == 2
    assert "is a folder; pass a TOML file" in _one_line(capsys)


def _image_folder(root: Path, classes: list[str]) -> None:
    from PIL import Image

    for split in ("train", "test"):
        for i, name in enumerate(classes):
            for j in range(4 if split == "train" else 2):
                (root / split / name).mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (8, 8), (40 * i, 10 * j, 255 - 40 * i)).save(
                    root / split / name / f"{j}.png"
                )


def test_dataset_options_come_from_the_command_line_and_survive_resume(tmp_path, capsys):
    data = tmp_path / "data"
    _image_folder(data, ["ant", "bee"])
    argv = _run(tmp_path, "--dataset", "image-folder", "--data-dir", str(data))
    grey = ["--set", "image-folder.channels=1", "--set", "image-folder.image_size=8"]
    assert main([*argv, "--name", "r", *grey]) == 0
    assert "[image-folder]" in (tmp_path / "r" / "config.toml").read_text()
    (tmp_path / "r" / "fedavg" / "summary.json").unlink()  # finish it again from its checkpoint
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    assert main([*argv, "--name", "s", "--set", "image-folder.nosuch=1"]) == 2
    assert "does not take option(s) nosuch" in _one_line(capsys)


def test_a_one_class_image_folder_is_refused(tmp_path, capsys):
    data = tmp_path / "data"
    _image_folder(data, ["ant"])
    assert main(_run(tmp_path, "--dataset", "image-folder", "--data-dir", str(data))) == 2
    assert "a classifier needs at least 2" in _one_line(capsys)


def test_a_full_disk_during_a_run_stops_it_resumably(tmp_path, capsys, monkeypatch, reference):
    import errno

    from fedistill.engine import loop as runner

    real = runner.write_checkpoint

    def full_at_round_3(directory, name, parts):
        if name == "round_00003":
            raise OSError(errno.ENOSPC, "No space left on device", str(directory / name))
        return real(directory, name, parts)

    monkeypatch.setattr(runner, "write_checkpoint", full_at_round_3)
    assert main(_run(tmp_path, "--name", "r")) == 1
    line = _one_line(capsys, prefix="fedistill: run stopped: ")
    assert "No space left on device" in line and f"--resume {tmp_path / 'r'}" in line
    monkeypatch.setattr(runner, "write_checkpoint", real)
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    assert _same_as(reference, tmp_path / "r")


def test_why_a_run_stopped_is_in_its_run_log_as_well(tmp_path, capsys):
    """A run that cannot go on says why in one line on stderr; run.log, which a batch job's reader opens
    later, held the clients' warnings but not that line."""
    assert main(_run(tmp_path, "--name", "a", "--lr", "1e9")) == 1
    stopped = _one_line(capsys, prefix="fedistill: run stopped: ").removeprefix("fedistill: run stopped: ")
    log = (tmp_path / "a" / "fedavg" / "run.log").read_text(encoding="utf-8")
    assert f"ERROR fedistill: run stopped: {stopped}" in log
