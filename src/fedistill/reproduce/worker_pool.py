"""Worker processes for `reproduce --jobs N` that end with the process that started them, and share the
machine's cores between them.

A worker ends when its parent does, however the parent ends (SIGTERM, SIGKILL, a crash): on Linux the
kernel sends it SIGTERM at once (PR_SET_PDEATHSIG), elsewhere a thread notices within a second. A parent
that receives SIGTERM stops the pool itself: nothing more starts, the running workers are terminated.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from types import FrameType

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class Terminated(BaseException):
    """SIGTERM reached the parent while its workers ran (a BaseException: no `except Exception` stops it)."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Torch threads for each of `workers` processes, so that together they use the cores once: a run
    whose config leaves `threads = 0` (torch's choice: every core) would otherwise start that many
    threads in every worker: two workers on 2 cores ran a FedMD-CG table cell 6 times slower."""
    return max(1, (cores or usable_cores()) // max(1, workers))


def run_threads(workers: int) -> int:
    """The torch threads a run that leaves `threads = 0` runs on under `reproduce --jobs workers`: this
    process's own count for one at a time (the runs go in this process), else `threads_per_worker`."""
    import torch

    return torch.get_num_threads() if workers <= 1 else threads_per_worker(workers)


def start_worker(parent: int, threads: int) -> None:
    """A pool initializer: end with `parent` (`end_with_parent`) and run torch on `threads` threads. A run
    whose config names its threads still sets them itself."""
    end_with_parent(parent)
    import torch

    torch.set_num_threads(threads)


def end_with_parent(parent: int) -> None:
    """A pool initializer: SIGTERM this worker once `parent` (the pid that started it) has ended."""
    if not (sys.platform.startswith("linux") and _signal_on_parent_death(signal.SIGTERM)):
        threading.Thread(target=_watch_parent, args=(parent,), name="end-with-parent", daemon=True).start()
    if os.getppid() != parent:  # it ended before the line above took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _signal_on_parent_death(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when its parent ends; whether it agreed."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, every: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the body runs on the main thread, SIGTERM raises `Terminated` there instead of ending the
    process, so the pool can be stopped first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(pool: Executor, within: float = 5.0) -> None:
    """Cancel the jobs not started and end the running workers: SIGTERM, then SIGKILL for any still alive
    after `within` seconds. The workers are this process's multiprocessing children (it starts no other
    while the pool runs)."""
    pool.shutdown(wait=False, cancel_futures=True)
    workers = multiprocessing.active_children()
    for worker in workers:
        worker.terminate()
    deadline = time.monotonic() + within
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join(1.0)
