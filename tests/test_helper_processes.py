"""Helper processes end with the run: Ray's processes with a Flower simulation (however it ends), and
`reproduce --jobs N`'s workers with their parent (SIGTERM: one line on how to go on; SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedistill.transports.flower.ray_reaper import end_processes, session_processes
from process_tree import descendants

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from /proc")

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}

# A stand-in for Ray's dashboard agent: ignores SIGTERM and keeps a log file open under a folder.
HELPER = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log = open(sys.argv[1], "w")
    print("ready", flush=True)
    time.sleep(120)
    """
)


def alive(pid: int) -> bool:
    """Running, or stopped; not ended (an ended process whose parent has not collected it is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def ctrl_c_delivered() -> None:
    """A child's Ctrl-C as in a terminal, whatever the tests' own: a run started with SIGINT ignored (tests
    started in the background by a script) keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_helper(log: Path) -> subprocess.Popen:
    helper = subprocess.Popen([sys.executable, "-c", HELPER, str(log)], stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None and helper.stdout.readline() == "ready\n"
    return helper


def test_only_the_sessions_own_processes_are_killed_even_when_they_ignore_sigterm(tmp_path) -> None:
    ours, theirs = tmp_path / "ray", tmp_path / "ray-other"  # a name that merely begins the same
    ours.mkdir()
    theirs.mkdir()
    mine, other = start_helper(ours / "agent.log"), start_helper(theirs / "agent.log")
    try:
        assert session_processes(ours) == [mine.pid]
        assert end_processes(ours) == [mine.pid]
        assert mine.wait(timeout=5) == -signal.SIGKILL
        assert alive(other.pid) and session_processes(ours) == []
    finally:
        for helper in (mine, other):
            helper.kill()
            helper.wait()


# A run that started a Ray-like helper in its session folder, then goes on until a signal ends it; with
# "check" it stops at the first Ctrl-C as the run loop does, otherwise it is busy until the second.
RUN = textwrap.dedent(
    """
    import subprocess, sys, time
    from fedistill import interrupt
    from fedistill.transports.flower.ray_session import own_ray_session

    with interrupt.deferred_to_run_loop(), own_ray_session() as root:
        helper = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(root / "agent.log")],
                                  stdout=subprocess.PIPE, text=True)
        helper.stdout.readline()
        print(helper.pid, root, flush=True)
        while True:
            if sys.argv[2] == "check":
                interrupt.check()
            time.sleep(0.05)
    """
)


@pytest.mark.parametrize(
    ("signals", "loop", "returncode"),
    [
        ([signal.SIGINT], "check", -signal.SIGINT),  # the run loop stops: KeyboardInterrupt, `finally` runs
        ([signal.SIGINT, signal.SIGINT], "busy", 130),  # the second Ctrl-C exits at once: no `finally`
        ([signal.SIGTERM], "busy", -signal.SIGTERM),  # no `finally` either
        ([signal.SIGKILL], "busy", -signal.SIGKILL),
    ],
)
def test_the_ray_session_ends_with_the_run_however_it_ends(tmp_path, signals, loop, returncode) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, HELPER, loop],
        env={**ENV, "RAY_TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_delivered,
    )
    assert run.stdout is not None
    pid, root = run.stdout.readline().split()
    assert Path(root).parent == tmp_path
    for signum in signals:
        run.send_signal(signum)
        time.sleep(0.2)
    _, err = run.communicate(timeout=30)
    assert run.returncode == returncode, err
    assert gone_within([int(pid)], 5), "the helper outlived the run"
    assert gone_within(reapers_of(run.pid), 5), "the watcher outlived the run"
    assert not Path(root).exists()


def reapers_of(parent: int) -> list[int]:
    """The session watchers started by `parent`, from their command lines."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(arg.endswith("ray_reaper.py") for arg in args) and str(parent) in args:
            found.append(int(cmdline.parent.name))
    return found


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_flower_simulation_leaves_no_ray_process_after_a_second_ctrl_c(tmp_path) -> None:
    """As from a terminal: both Ctrl-C reach the whole process group, Ray's processes included."""
    pytest.importorskip("flwr")
    argv = [sys.executable, "-m", "fedistill.cli", "run", "--transport", "flower", "--algorithm", "fedavg"]
    argv += ["--model", "mlp", "--clients", "2", "--rounds", "200", "--quiet", "--out", str(tmp_path)]
    env = {**ENV, "MPLBACKEND": "Agg", "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    run = subprocess.Popen(
        [*argv, "--name", "r"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=ctrl_c_delivered,
    )
    metrics = tmp_path / "r" / "fedavg" / "metrics.jsonl"
    deadline = time.monotonic() + 600  # Ray starts in seconds on an idle machine, minutes on a busy one
    while not (metrics.is_file() and metrics.read_text().strip()):
        assert run.poll() is None and time.monotonic() < deadline, "the run did not get to its first round"
        time.sleep(0.1)
    ray = {pid: cmd for pid, cmd in descendants(run.pid).items() if cmd.startswith("ray::")}
    assert ray, "no Ray helper started"
    os.killpg(run.pid, signal.SIGINT)
    time.sleep(0.05)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130 and "interrupted twice" in err, err
    assert gone_within(list(ray), 5), {pid: ray[pid] for pid in ray if alive(pid)}


# `reproduce --jobs 2` with jobs that only sleep: each worker writes its pid to the folder first.
REPRODUCE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from fedistill.config import RunConfig
    from fedistill.reproduce import execute
    from fedistill.reproduce.plan import Job

    def sleeping_job(job):
        (job.folder.parent / f"worker-{os.getpid()}").write_text("")
        time.sleep(120)

    if __name__ == "__main__":
        execute.execute = sleeping_job
        out = Path(sys.argv[1])
        execute.execute_all([Job("run", seed, RunConfig(), out / f"job{seed}") for seed in range(3)], 2)
    """
)


def start_reproduce(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    script = tmp_path / "reproduce_sleeping_jobs.py"
    script.write_text(REPRODUCE, encoding="utf-8")
    parent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], env=ENV, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while len(workers := list(tmp_path.glob("worker-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) == 2, "the workers did not start"
    return parent, [int(path.name.removeprefix("worker-")) for path in workers]


def test_reproduce_on_sigterm_stops_its_workers_and_says_how_to_go_on(tmp_path) -> None:
    from fedistill.reproduce.execute import STOPPED

    parent, workers = start_reproduce(tmp_path)
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=30)
    assert parent.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == STOPPED and "Traceback" not in err
    assert "run the same command again" in STOPPED
    assert gone_within(workers, 5), "a worker outlived the pool"
    assert len(list(tmp_path.glob("worker-*"))) == 2  # the third job never started


def test_reproduce_workers_end_when_their_parent_is_killed(tmp_path) -> None:
    parent, workers = start_reproduce(tmp_path)
    parent.kill()
    parent.communicate(timeout=30)
    assert gone_within(workers, 5), "a worker outlived its parent"


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def test_reproduce_workers_share_the_cores_between_them() -> None:
    """Runs whose config leaves `threads = 0` used every core in every worker: 2 workers on 2 cores ran
    a FedAvg cell of the FedMD-CG table in 855 s, and in 138-148 s at one thread each."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from fedistill.reproduce.worker_pool import start_worker, threads_per_worker

    assert [threads_per_worker(w, cores=2) for w in (1, 2, 3)] == [2, 1, 1]
    assert threads_per_worker(2, cores=16) == 8 and threads_per_worker(3, cores=16) == 5
    with ProcessPoolExecutor(
        1, mp_context=get_context("spawn"), initializer=start_worker, initargs=(os.getpid(), 1)
    ) as pool:
        assert pool.submit(_torch_threads).result(timeout=120) == 1


# `fedistill reproduce` of a tiny target (FedAvg on digits, a round a checkpoint), started as from a shell.
TINY_REPRODUCE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fedistill.cli import main
    from fedistill.reproduce import targets
    from fedistill.reproduce.target_spec import Column, Row, Run, Scale, Target

    if __name__ == "__main__":
        config = Path(sys.argv[1]) / "tiny.toml"
        config.write_text('algorithm = "fedavg"\\n', encoding="utf-8")
        settings = ("dataset='digits'", "model='mlp'", "clients=2", "rounds=30", "threads=1")
        column = Column("test", "test %", ("final.test_accuracy",))
        scale = Scale((Run("suite", str(config), settings),), (Row("FedAvg", "suite", "fedavg"),))
        target = Target("tiny", "a tiny table", "test only", (column,), {"ci": scale})
        targets.all_targets = lambda: {"tiny": target}
        sys.exit(main(["reproduce", "tiny", "--out", sys.argv[1], *sys.argv[2:]]))
    """
)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("jobs", "job_wide"), [("1", False), ("2", False), ("1", True), ("2", True)])
def test_reproduce_stopped_by_sigterm_says_how_to_go_on_and_the_same_command_resumes(
    tmp_path, jobs, job_wide
) -> None:
    """A scheduler's SIGTERM stops `fedistill reproduce` (its runs in this process, or in --jobs workers)
    with one line and 143; the same command again resumes the run it stopped. `job_wide`: as SLURM and
    systemd send it, to every process of the job at once, the workers included."""
    from fedistill.reproduce.execute import STOPPED

    script = tmp_path / "reproduce_tiny.py"
    script.write_text(TINY_REPRODUCE, encoding="utf-8")
    argv = [sys.executable, str(script), str(tmp_path), "--jobs", jobs, "--seeds", "0,1"]
    env = {**ENV, "MPLBACKEND": "Agg"}
    parent = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, start_new_session=job_wide)
    deadline = time.monotonic() + 300  # imports take half a minute on a loaded machine
    while not any(
        len(m.read_text().splitlines()) >= 2 for m in tmp_path.glob("reproduce/*/runs/*/*/metrics.jsonl")
    ):
        if time.monotonic() > deadline or parent.poll() is not None:
            parent.kill()
            pytest.fail(f"no run got to its second round: {parent.communicate()[1]}")
        time.sleep(0.01)
    workers = list(descendants(parent.pid))
    if job_wide:
        os.killpg(parent.pid, signal.SIGTERM)
    else:
        parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == 128 + signal.SIGTERM, err
    assert "ended abruptly" not in err and "failed" not in err, err  # a worker's death is no failed job
    assert gone_within(workers, 10), "a worker outlived the command"
    # --jobs 2: the workers' ended runs may leave multiprocessing's resource tracker a warning after it
    assert STOPPED in err.splitlines() and "Traceback" not in err, err
    assert STOPPED.startswith("fedistill: stopped by SIGTERM; run the same command again")
    again = subprocess.run(argv, env=env, stderr=subprocess.PIPE, text=True, timeout=600)
    assert again.returncode == 0 and ": resumed" in again.stderr, again.stderr
