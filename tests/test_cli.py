"""The command line: user mistakes end in one line and exit code 2; list and summary work."""

import json
import subprocess
import sys

import pytest

from fedistill.cli import main

FAST = ["--clients", "3", "--rounds", "1", "--model", "mlp", "--quiet"]


def _error_line(capsys, lines: int = 1) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert err.startswith("fedistill: error: ")
    assert len(err.splitlines()) == lines, err
    return err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--dataset", "mnistt"], "did you mean 'mnist'"),
        (["--algorithm", "fedavgg"], "did you mean 'fedavg'"),
        (["--model", "resnet9"], "resnet9"),
        (["--partition", "dirichlet", "--alpha", "0"], "alpha must be > 0"),
        (["--partition", "nope"], "nope"),
        (["--clients", "5000"], "5000"),
        (["--set", "roundz=3"], "did you mean 'rounds'"),
        (["--set", "[weird]"], "key=value"),
        (["--config", "missing.toml"], "does not exist"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(tmp_path, capsys, argv, expected):
    code = main(["run", *FAST, "--out", str(tmp_path), *argv])
    assert code == 2
    assert expected in _error_line(capsys)


def test_missing_dataset_file_names_file_and_checksum(tmp_path, capsys):
    code = main(
        ["run", *FAST, "--dataset", "mnist", "--data-dir", str(tmp_path / "nothing"), "--out", str(tmp_path)]
    )
    assert code == 2
    text = _error_line(capsys, lines=7)  # the error, then exactly which files go where, then --download
    assert "missing dataset files" in text.splitlines()[0]
    assert "train-images-idx3-ubyte.gz  md5 f68b3c2dcbeaaa9fbdd348bbdeb94873" in text


def test_run_list_summary_and_refusal_to_overwrite(tmp_path, capsys):
    argv = ["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "test %" in out
    assert main(["summary", str(tmp_path / "x")]) == 0
    assert "fedavg" in capsys.readouterr().out
    assert main(argv) == 2
    assert "--resume" in _error_line(capsys)
    assert main(["summary", str(tmp_path)]) == 2
    _error_line(capsys)
    assert main(["summary", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in _error_line(capsys)
    assert main(["run", "--resume", str(tmp_path / "x"), "--rounds", "3"]) == 2
    assert "saved config" in _error_line(capsys)
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    for name in (
        "fedavg",
        "fedprox",
        "fedavgm",
        "standalone",
        "centralized",
        "digits",
        "cifar10",
        "resnet8",
        "dirichlet-equal",
    ):
        assert name in listing


def test_run_without_options_runs_the_demo_config(capsys):
    from fedistill.cli import DEMO_CONFIG, build_parser, config_from_args

    config = config_from_args(build_parser().parse_args(["run"]))
    assert "running the demo" in capsys.readouterr().err
    assert config.algorithms == ["fediod", "standalone", "fedavg", "centralized"]
    assert config.dataset == "digits" and DEMO_CONFIG.is_file()
    # any option that changes the experiment means: the plain defaults, not the demo
    plain = config_from_args(build_parser().parse_args(["run", "--rounds", "2"]))
    assert plain.algorithm != config.algorithm and "fediod" not in plain.options


def test_where_a_run_goes_does_not_cancel_the_demo(tmp_path, capsys):
    """`--out`, `--name`, `--device` and `--transport` say where and how the demo runs, not what."""
    from fedistill.cli import build_parser, config_from_args

    argv = ["run", "--out", str(tmp_path), "--name", "mine", "--device", "cpu", "--transport", "inprocess"]
    config = config_from_args(build_parser().parse_args(argv))
    assert "running the demo" in capsys.readouterr().err
    assert config.algorithms == ["fediod", "standalone", "fedavg", "centralized"]
    assert config.out == str(tmp_path) and config.name == "mine" and config.device == "cpu"
    assert config.options["fediod"]["student_noise"] == 0.5


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`fedistill list | head -1`: the closed pipe ends the command with 141 and no traceback."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "fedistill.cli", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr


def test_help_answers_without_importing_torch():
    """`fedistill --help` and `fedistill run --help` build the parser without the module commands' imports
    (torch, SciPy, the medical readers: seconds); `fedistill export --help` still lists export's flags."""
    code = (
        "import sys\n"
        "from fedistill.cli import main\n"
        "for argv in (['--help'], ['run', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "predict" in out and "export" in out and out.strip().endswith("False")
    shown = subprocess.run(
        [sys.executable, "-m", "fedistill.cli", "export", "--help"], capture_output=True, text=True
    )
    assert shown.returncode == 0 and "--format" in shown.stdout


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--rounds", "abc"], "fedistill run: error: argument --rounds: invalid int value: 'abc'"),
        (["bogus"], "fedistill: error: argument command: invalid choice: 'bogus'"),
    ],
)
def test_flag_mistakes_are_one_line_too(capsys, argv, expected):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(expected) and "--help" in err, err


def test_a_tilde_in_out_config_and_resume_means_the_home_folder(tmp_path, capsys, monkeypatch):
    """A shell expands `~` only at the start of a word: `--out=~/runs`, `out = "~/runs"` in a file and
    the Python API's paths reach fedistill as written, and must not make a folder called `~`."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (home / "exp.toml").write_text('algorithm = "fedavg"\nout = "~/runs"\n', encoding="utf-8")
    assert main(["run", *FAST, "--config", "~/exp.toml", "--name", "x"]) == 0
    assert (home / "runs" / "x" / "fedavg" / "summary.json").is_file()
    assert main(["run", "--quiet", "--resume", "~/runs/x"]) == 0
    assert list(work.iterdir()) == []
    from fedistill.algorithms.shared.stage1 import cache_folder
    from fedistill.config import RunConfig

    assert cache_folder(RunConfig(cache_dir="~/cache"), beside=work) == home / "cache"


def test_summary_of_an_unfinished_algorithm_folder_names_the_folder_resume_takes(tmp_path, capsys):
    """`--resume` takes the run's folder, not one algorithm's: the summary's advice must be one it accepts."""
    assert main(["run", *FAST, "--algorithm", "fedavg", "--out", str(tmp_path), "--name", "x"]) == 0
    (tmp_path / "x" / "fedavg" / "summary.json").unlink()  # as a run still going, or killed, leaves it
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "x" / "fedavg")]) == 2
    line = _error_line(capsys)
    assert "no finished run yet" in line and line.endswith(f"`fedistill run --resume {tmp_path / 'x'}`")
    assert main(["run", "--resume", str(tmp_path / "x"), "--quiet"]) == 0


def test_summary_of_a_run_partly_done_lists_its_algorithms_in_run_order_and_names_the_rest(tmp_path, capsys):
    """A suite killed (or still running) after its first algorithm: the table is the one `fedistill run`
    printed, in the run's order, and the algorithm still to come is named, not silently left out."""
    algorithms = ["--algorithm", "standalone,fedavg,centralized"]
    argv = ["run", *FAST, *algorithms, "--out", str(tmp_path), "--name", "x"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert main(["summary", str(tmp_path / "x")]) == 0
    summary = capsys.readouterr()
    assert summary.out.split("\n", 1)[1] == printed.split("\n", 1)[1]  # the same table under its title
    (tmp_path / "x" / "centralized" / "summary.json").unlink()
    assert main(["summary", str(tmp_path / "x")]) == 0
    summary = capsys.readouterr()
    rows = [line.split()[1] for line in summary.out.splitlines() if line.startswith("│")]
    assert rows == ["standalone", "fedavg"]
    assert summary.err.strip() == (
        "fedistill: not finished (no summary.json): centralized; "
        f"finish with `fedistill run --resume {tmp_path / 'x'}`"
    )  # the whole command: a bare `--resume` under `fedistill summary` reads as an option of summary


def test_a_file_error_outside_a_run_names_the_command_not_a_run(monkeypatch, capsys):
    """`export` or `predict` failing to read a file said `run stopped: cannot write ...`."""
    import fedistill.inference.export as export_module

    def unreadable(args):
        raise PermissionError(13, "Permission denied", "scans/a.png")

    monkeypatch.setattr(export_module, "run_command", unreadable)
    assert main(["export", "some-run"]) == 1
    assert capsys.readouterr().err.strip() == "fedistill: export stopped: scans/a.png: Permission denied"


def test_summary_of_the_folder_holding_runs_names_the_runs_in_it(tmp_path, capsys):
    """`fedistill summary runs` (the --out folder, not one run in it) said the folder holds no run."""
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text('algorithm = "fedavg"\n')
    assert main(["summary", str(tmp_path)]) == 2
    line = _error_line(capsys)
    assert "holds run directories" in line and line.endswith(f"{tmp_path / 'a'}, {tmp_path / 'b'}"), line


def test_run_help_says_when_it_runs_the_demo_and_which_source_wins(capsys):
    """`fedistill run --help` had no description: nothing said that options other than where and how a run
    goes leave the demo for the plain defaults, nor that --set wins over the flags and --config."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "runs the demo" in text and "plain defaults" in text
    assert "--out, --name, --transport, --device, --track or --quiet" in text
    assert "the defaults, --config, the flags, then --set" in text


def test_summary_names_an_algorithm_that_stopped_early(tmp_path, capsys):
    """A run stopped by its privacy budget printed, under `fedistill summary`, a row like any other (its
    planned rounds, its last accuracy) and not a word of the stop; summary.md said it, the table did not."""
    budget = ["--set", "fedavg.dp_enabled=true", "--set", "fedavg.dp_target_epsilon=1",
              "--set", "fedavg.dp_noise_multiplier=0.3"]  # fmt: skip
    assert main(["run", *FAST, "--algorithm", "fedavg,standalone", *budget, "--out", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    capsys.readouterr()
    assert main(["summary", str(run)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedistill: fedavg stopped early: stopped at round 1: "), err


def test_the_results_table_shows_the_rounds_a_stopped_run_completed(tmp_path, capsys):
    """A run its privacy budget stopped in round 1 of 2 showed 2 in the rounds column, like a finished one."""
    budget = ["--set", "fedavg.dp_enabled=true", "--set", "fedavg.dp_target_epsilon=1",
              "--set", "fedavg.dp_noise_multiplier=0.3"]  # fmt: skip
    two_rounds = [*FAST, "--rounds", "2", "--algorithm", "fedavg,standalone", *budget]
    assert main(["run", *two_rounds, "--out", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    assert json.loads((run / "fedavg" / "summary.json").read_text())["rounds_done"] == 0
    assert json.loads((run / "standalone" / "summary.json").read_text())["rounds_done"] == 2
    assert "rounds: 0 of 2;" in (run / "fedavg" / "summary.md").read_text()
    capsys.readouterr()
    assert main(["summary", str(run)]) == 0
    cells = {}
    for line in capsys.readouterr().out.splitlines():
        if "│" in line:
            row = [cell.strip() for cell in line.split("│")[1:-1]]
            cells[row[0]] = row
    assert "0 of 2" in cells["fedavg"] and "2" in cells["standalone"]
    assert not any(" of " in cell for cell in cells["standalone"])


def test_python_dash_m_fedistill_is_the_command_line():
    """`python -m fedistill` works where the `fedistill` script is not on PATH (a venv not activated)."""
    done = subprocess.run(
        [sys.executable, "-m", "fedistill", "list"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "digits" in done.stdout


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--algoritm", "fedavg"],
         "fedistill run: error: unrecognized arguments: --algoritm fedavg; did you mean --algorithm?"),
        (["run", "--local_epochs=2"],
         "fedistill run: error: unrecognized arguments: --local_epochs=2; did you mean --local-epochs?"),
        (["list", "--algorithms"], "fedistill list: error: unrecognized arguments: --algorithms (see"),
        (["summary", "a", "b"], "fedistill summary: error: unrecognized arguments: b (see"),
    ],
)  # fmt: skip
def test_a_misspelt_option_names_its_command_and_the_closest_option(capsys, argv, expected):
    """`fedistill run --algoritm fedavg` said `fedistill: error: unrecognized arguments` and pointed at
    `fedistill --help`, which lists no option of `run`; the error belongs to the command that was given."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(expected), err
    assert err.endswith(f"(see fedistill {argv[0]} --help)"), err


def test_a_misspelt_command_is_answered_with_the_closest_command(capsys):
    """`fedistill rnu` listed the seven commands; a one-letter slip deserves the one it was close to."""
    with pytest.raises(SystemExit) as stop:
        main(["rnu", "--rounds", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedistill: error: unknown command 'rnu'"), err
    assert "did you mean 'run'?" in err and err.endswith("(see fedistill --help)"), err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--set", "=0.1"], "--set expects key=value, got '=0.1'"),
        (["--set", "fedprox.mu", "=", "0.1"], "--set takes KEY=VALUE as one word"),
        (["--set", "fedprox.mu=", "0.1"], "--set takes KEY=VALUE as one word"),
    ],
)
def test_a_set_with_no_key_or_with_spaces_says_how_set_is_written(capsys, argv, expected):
    """`--set =0.1` said "unknown config key ''", and `--set fedprox.mu = 0.1` (spaces, as in a TOML file)
    "unrecognized arguments: = 0.1": neither said that --set takes one word, KEY=VALUE."""
    try:
        code = main(["run", *argv])
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_version_prints_the_package_version(capsys):
    """`fedistill --version`, the first thing a bug report asks for, said "the following arguments are
    required: command"."""
    from fedistill import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedistill {__version__}"


def test_run_help_says_what_goes_with_resume_and_how_set_is_written(capsys):
    """`--resume` refuses every option but --device and --quiet, and `--set` may be given many times with
    TOML values; the help said neither, so a user learnt both from errors."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "only --device, --dry-run and --quiet go with it" in text
    assert "repeatable" in text and "TOML" in text


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "mnist",
            "'mnist' is a dataset, not an algorithm; its options (image_size, channels, crop_padding, ",
        ),
        ("lenet5", "'lenet5' is a model, not an algorithm; it takes no options of its own"),
        ("unet", "'unet' is a model, not an algorithm; its options (width, depth) go in [model_options]"),
        ("dirichlet-equal", "'dirichlet-equal' is a partitioner, not an algorithm; its options go in"),
    ],
)
def test_list_options_of_a_dataset_model_or_partitioner_says_where_their_options_go(capsys, name, expected):
    """`fedistill list --options mnist` said "unknown algorithm 'mnist'" and how to register an algorithm
    of one's own: true, and no help to a user who wanted the dataset's options."""
    assert main(["list", "--options", name]) == 2
    line = _error_line(capsys)
    assert expected in line and "fedistill list --options takes an algorithm" in line, line


def test_summary_of_a_file_says_it_is_a_file(tmp_path, capsys):
    model = tmp_path / "global.safetensors"
    model.write_bytes(b"")
    assert main(["summary", str(model)]) == 2
    assert "is a file, not a run directory" in _error_line(capsys)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", *FAST], "fedistill: interrupted before the run directory was made; nothing to resume\n"),
        (["run", "--resume", "runs/a", "--quiet"], "fedistill: interrupted; continue with --resume runs/a\n"),
        (["summary", "runs/a"], "fedistill: interrupted\n"),
    ],
)
def test_ctrl_c_before_a_run_folder_exists_does_not_advise_resuming_one(argv, expected, capsys, monkeypatch):
    """Ctrl-C while a new run still loaded its data said `continue with --resume RUN_DIR`, though no run
    directory existed yet; `summary` and the other commands, which resume nothing, said it too."""
    from fedistill import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "command_run", interrupted)
    monkeypatch.setattr(cli, "command_summary", interrupted)
    assert main(argv) == 130
    assert capsys.readouterr().err == expected
