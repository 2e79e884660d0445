"""Flower runs under a user's hand: Ctrl-C (or a scheduler's SIGTERM) stops a simulation within seconds
and `--resume` finishes it, a second Ctrl-C ends the process at once, and a bad `flwr run -c` value is one
logged line."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict

from fedistill.cli import main
from fedistill.engine.flower.apps import make_server_app
from fedistill.engine.rundir import read_jsonl
from fedistill.errors import UserError
from process_tree import descendants

ENV = {
    **os.environ,
    "MPLBACKEND": "Agg",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}
ARGV = ["--transport", "flower", "--algorithm", "fedavg", "--model", "mlp", "--clients", "2", "--quiet"]


def _start(out: Path, rounds: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "fedistill.cli", "run", *ARGV, "--rounds", str(rounds)]
    return subprocess.Popen(
        [*argv, "--out", str(out), "--name", "r"],
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C as in a terminal
    )


def _wait_for_rows(process: subprocess.Popen, metrics: Path, rows: int, limit: float = 600.0) -> None:
    """Wait for the run to get going (Ray starts in seconds on an idle machine, minutes on a loaded one);
    what is timed comes after. A run that ends first fails the test at once, with what it said."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= rows:
            return
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"{metrics} did not reach {rows} rows: {process.communicate()[1]}")


@pytest.mark.timeout(900)  # two Ray starts: seconds each on an idle machine, minutes on a loaded one
@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 128 + signal.SIGTERM, "stopped by SIGTERM"),  # a batch scheduler's stop
    ],
)
def test_ctrl_c_stops_a_simulation_within_seconds_and_resume_finishes_it(
    tmp_path, capsys, signum, code, said
):
    metrics = tmp_path / "r" / "fedavg" / "metrics.jsonl"
    started = time.monotonic()
    process = _start(tmp_path, rounds=200)
    try:
        _wait_for_rows(process, metrics, 2)
        # imports, Ray's start and two rounds: how fast this machine is at the moment
        start_s = time.monotonic() - started
        process.send_signal(signum)
        signalled = time.monotonic()
        _, err = process.communicate(timeout=max(60.0, 3 * start_s))
    finally:
        if process.poll() is None:  # it did not stop: end it rather than leave it running its 200 rounds
            process.kill()
            process.wait()
    # stopping does less than starting did (no imports, no Ray start), whatever the machine's load
    stop_s = time.monotonic() - signalled
    assert stop_s < max(20.0, start_s), f"{stop_s:.1f} s to stop, {start_s:.1f} s to start"
    done = len(read_jsonl(metrics))  # 2, or more where this process was kept waiting before it signalled
    assert done < 200, "the run went on to its last round"
    assert process.returncode == code, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"fedistill: {said}; continue with --resume {tmp_path / 'r'}", err
    # the same name is not free (the run did work), and --resume finishes it instead of refusing
    assert main(["run", *ARGV, "--rounds", "200", "--out", str(tmp_path), "--name", "r"]) == 2
    assert "use --resume" in capsys.readouterr().err
    config = (tmp_path / "r" / "config.toml").read_text().replace("rounds = 200", f"rounds = {done + 1}")
    (tmp_path / "r" / "config.toml").write_text(config)  # one round more: only the restart matters here
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    assert [row["round"] for row in read_jsonl(metrics)] == list(range(1, done + 2))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))


def _cpu_ticks(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _while_a_client_trains(pids: list[int], limit: float = 120.0) -> None:
    """Return once one of Flower's client actors among `pids` is using the CPU (or after `limit` s)."""
    actors = [pid for pid in pids if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ClientApp")]
    deadline = time.monotonic() + limit
    before = {pid: _cpu_ticks(pid) for pid in actors}
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = {pid: _cpu_ticks(pid) for pid in actors}
        if any(now[pid] - before[pid] >= 2 for pid in actors):
            return
        before = now


@pytest.mark.timeout(900)  # two Ray starts: seconds each on an idle machine, minutes on a loaded one
def test_a_sigterm_to_the_whole_job_stops_a_simulation_as_one_to_its_main_process_does(tmp_path):
    """SLURM's scancel or time limit and systemd send SIGTERM to every process of a job at once, Ray's
    workers included: the run stops with the main process's one line and 143, leaves no process behind,
    and `--resume` goes on from the last round it kept."""
    metrics = tmp_path / "r" / "fedavg" / "metrics.jsonl"
    argv = [sys.executable, "-m", "fedistill.cli", "run", *ARGV, "--rounds", "200"]
    process = subprocess.Popen(
        [*argv, "--out", str(tmp_path), "--name", "r"],
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_rows(process, metrics, 2)
        helpers = list(descendants(process.pid))
        _while_a_client_trains(helpers)  # so that Ray's workers die holding a message
        os.killpg(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err, err
    stopped = f"fedistill: stopped by SIGTERM; continue with --resume {tmp_path / 'r'}"
    assert err.strip().splitlines()[-1] == stopped, err
    deadline = time.monotonic() + 10
    while [pid for pid in helpers if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in helpers if _alive(pid)], "a process of the run outlived it"
    done = len(read_jsonl(metrics))
    config = (tmp_path / "r" / "config.toml").read_text().replace("rounds = 200", f"rounds = {done + 1}")
    (tmp_path / "r" / "config.toml").write_text(config)  # one round more: only the restart matters here
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    assert [row["round"] for row in read_jsonl(metrics)] == list(range(1, done + 2))


@pytest.mark.timeout(900)  # a Ray start: seconds on an idle machine, minutes on a loaded one
def test_a_second_ctrl_c_ends_the_process_at_once_without_a_traceback(tmp_path):
    process = _start(tmp_path, rounds=200)
    _wait_for_rows(process, tmp_path / "r" / "fedavg" / "metrics.jsonl", 1)
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "interrupted twice" in err


@pytest.mark.parametrize(
    ("run_config", "named"),
    [
        ({"algorithm": "nosuch"}, "unknown algorithm 'nosuch'"),
        ({"set": "rounds=abc"}, "rounds must be int"),
        ({"clients": 0}, "clients must be >= 1"),
        ({"set": "lr='0.1"}, 'set = "lr=\'0.1": No closing quotation'),
    ],
)
def test_a_bad_flwr_run_config_is_one_logged_line_and_fails_the_run(tmp_path, caplog, run_config, named):
    """What `flwr run . <federation> -c ...` hands the ServerApp: a user mistake is logged as one line
    (no traceback) and raised to Flower, which marks the run failed and ends the ServerApp's process
    with a non-zero code; nothing is written (no run folder for a refused run)."""
    app = make_server_app()
    context = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={"out": str(tmp_path), **run_config},
    )
    with caplog.at_level(logging.ERROR), pytest.raises(UserError, match=named):
        app(None, context)  # the grid is never reached
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert errors[0].getMessage().startswith("fedistill: error: ") and named in errors[0].getMessage()
    assert not any(tmp_path.iterdir())
