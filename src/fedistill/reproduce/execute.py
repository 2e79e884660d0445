"""Running a target's jobs: a finished run is reused, an interrupted one resumes from its last checkpoint
(the engine's resume, as `fedistill run --resume` does), a missing one runs; with `jobs` > 1 that many at
once, each in its own process.

A job that fails (a diverging loss, a missing data file, a crash) does not stop the others: its error's
first line is returned, and the rows that read it have no number.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from fedistill.errors import FederationError, UserError
from fedistill.reproduce import worker_pool
from fedistill.reproduce.plan import Job
from fedistill.reproduce.reuse import kept

STOPPED = (
    "fedistill: stopped by SIGTERM; run the same command again to continue "
    "(finished runs are reused, interrupted ones resume)"
)


@dataclass(frozen=True)
class Outcome:
    """What became of a job: `reused`, `resumed`, `ran` or `failed` (with the error's one line)."""

    job: Job
    status: str
    seconds: float = 0.0
    error: str = ""


def finished(folder: Path, algorithms: Sequence[str]) -> bool:
    """Every algorithm's summary is there, made by this code (a run another code made is set aside)."""
    return kept(folder / name / "summary.json" for name in algorithms)


def state(job: Job) -> str:
    """`finished`, `started` (a checkpoint, metrics or a summary to go on from) or `missing`."""
    from fedistill.engine.suite_dir import run_started

    if finished(job.folder, job.algorithms):
        return "finished"
    return "started" if run_started(job.folder) else "missing"


def first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or ["?"])[0]


def execute(job: Job) -> Outcome:
    """Run, resume or reuse one job, holding its folder's lock while it writes."""
    from fedistill.engine import suite_dir
    from fedistill.engine.launch import resume_suite, run_suite
    from fedistill.engine.setup import validate_setup

    began = time.perf_counter()
    try:
        now = state(job)
        if now == "finished":
            return Outcome(job, "reused")
        if now == "started":
            with suite_dir.locked(job.folder):
                resume_suite(job.folder, progress=False)
            status = "resumed"
        else:
            data = validate_setup(job.config, simulation=True)  # nothing is written before it is valid
            suite_dir.create(job.folder)
            with suite_dir.locked(job.folder):
                run_suite(job.config, job.folder, progress=False, data=data)
            status = "ran"
    except (UserError, FederationError, OSError) as exc:
        return Outcome(job, "failed", time.perf_counter() - began, first_line(exc))
    except Exception as exc:  # a crash of one run leaves the others, and the table, standing
        return Outcome(job, "failed", time.perf_counter() - began, f"{type(exc).__name__}: {first_line(exc)}")
    return Outcome(job, status, time.perf_counter() - began)


def report(outcome: Outcome) -> None:
    """One line per job on stderr, as it ends."""
    job = outcome.job
    took = f" in {outcome.seconds:.0f} s" if outcome.status in ("ran", "resumed", "failed") else ""
    error = f": {outcome.error}" if outcome.error else ""
    print(f"  {job.run} seed {job.seed}: {outcome.status}{took}{error}", file=sys.stderr, flush=True)


def execute_in_workers(jobs: Sequence[Job], workers: int) -> list[Outcome]:
    """`jobs`, `workers` at once in spawned processes that end with this one, the cores shared between
    them (`worker_pool.threads_per_worker`). On SIGTERM the pool stops (nothing more starts, running jobs
    are ended) and the process exits with one line on how to go on; on Ctrl-C it stops likewise and the
    interrupt goes on (else leaving the pool would wait for every job still queued). A worker that dies
    (killed for memory, a crash of the interpreter) breaks the pool: each job it had not finished fails
    with one line, and the table is still written from the rest."""
    outcomes: list[Outcome] = []
    context = multiprocessing.get_context("spawn")
    workers = min(workers, len(jobs))
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=worker_pool.start_worker,
        initargs=(os.getpid(), worker_pool.threads_per_worker(workers)),
    ) as pool:
        try:
            with worker_pool.sigterm_raises():
                futures = {pool.submit(execute, job): job for job in jobs}
                for future in as_completed(futures):
                    try:
                        outcomes.append(future.result())
                    except BrokenProcessPool as exc:
                        error = (
                            f"a worker process ended abruptly ({first_line(exc)}); run the same command again"
                        )
                        outcomes.append(Outcome(futures[future], "failed", error=error))
                    report(outcomes[-1])
        except worker_pool.Terminated:
            worker_pool.stop(pool)
            print(STOPPED, file=sys.stderr, flush=True)
            raise SystemExit(128 + signal.SIGTERM) from None
        except KeyboardInterrupt:  # the workers got it too, and would go on with the queue
            worker_pool.stop(pool)
            raise
    return outcomes


def execute_all(jobs: Sequence[Job], workers: int = 1) -> list[Outcome]:
    """Every job, finished ones first (nothing to do); the rest in order, or `workers` at once in their
    own processes (spawned: each starts clean, whatever threads this process started; see
    `execute_in_workers`)."""
    done = [Outcome(job, "reused") for job in jobs if state(job) == "finished"]
    for outcome in done:
        report(outcome)
    todo = [job for job in jobs if state(job) != "finished"]
    outcomes = list(done)
    if workers <= 1 or len(todo) <= 1:
        for job in todo:
            outcomes.append(execute(job))
            report(outcomes[-1])
    else:
        outcomes += execute_in_workers(todo, workers)
    order = {(job.run, job.seed): i for i, job in enumerate(jobs)}
    return sorted(outcomes, key=lambda o: order[o.job.run, o.job.seed])
