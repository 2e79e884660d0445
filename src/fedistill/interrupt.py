"""Ctrl-C for runs whose loop is not on the main thread (Flower's simulation runs the ServerApp in a
thread while its engine holds the main one, so a KeyboardInterrupt never reaches the run loop).

The main thread's SIGINT handler only sets a flag; the run loop and the Flower fleet check it between
rounds and while they wait for replies, and raise KeyboardInterrupt there, so the run stops at a
checkpointable point and the engine shuts down normally. A second Ctrl-C ends the process at once.

The command line also takes SIGTERM, how batch schedulers (SLURM, Kubernetes, systemd) stop a job, as the
first Ctrl-C (`sigterm_as_interrupt`): the same stop, then exit code 143. A library call keeps its
program's SIGTERM handler. Where a stop after the step cannot be counted on (`sigterm_ends_at_once`: a
Flower simulation, whose Ray processes a scheduler's SIGTERM reaches too), SIGTERM ends the process at once
with the stop's last line and 143; the run's last checkpoint holds, as after any abrupt end.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_requested = threading.Event()
_lock = threading.Lock()
_depth = 0  # how many deferred_to_run_loop bodies are running: only the outermost owns the handler
_terminated = threading.Event()  # SIGTERM came while sigterm_as_interrupt was in place
_at_once = threading.Event()  # SIGTERM ends the process at once (sigterm_ends_at_once)
_last_line: list[Callable[[], str]] = []  # what the command says when SIGTERM stops it (sigterm_as_interrupt)

STOPPING = "fedistill: stopping after this step (Ctrl-C again: at once)"
STOPPING_ON_SIGTERM = "fedistill: stopping after this step (SIGTERM; again: at once)"


def check() -> None:
    """Raise KeyboardInterrupt in the calling thread if the user asked the run to stop."""
    if _requested.is_set():
        raise KeyboardInterrupt


def stop_requested() -> bool:
    """Whether the run was asked to stop (and has not stopped yet)."""
    return _requested.is_set()


def request_stop(signum: int = signal.SIGINT) -> bool:
    """Ask the run loop to stop, saying so on stderr the first time only; whether it was asked before."""
    with _lock:
        if _requested.is_set():
            return True
        _requested.set()
    print(STOPPING_ON_SIGTERM if signum == signal.SIGTERM else STOPPING, file=sys.stderr, flush=True)
    return False


def _on_sigint(signum: int, frame: object) -> None:
    if request_stop(signum):
        twice = "stopped by SIGTERM twice" if signum == signal.SIGTERM else "interrupted twice"
        print(f"fedistill: {twice}; stopping now", file=sys.stderr, flush=True)
        os._exit(128 + signum)


def _on_sigterm(signum: int, frame: object) -> None:
    """The first Ctrl-C's stop: the run loop's request where it waits for one, else KeyboardInterrupt;
    under `sigterm_ends_at_once`, the end of the process."""
    _terminated.set()
    if _at_once.is_set():
        said = _last_line[-1]() if _last_line else "fedistill: stopped by SIGTERM"
        print(said, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(128 + signum)
    if _depth:
        _on_sigint(signum, frame)
        return
    raise KeyboardInterrupt


def terminated() -> bool:
    """Whether SIGTERM stopped the command (its exit code is then 143, not Ctrl-C's 130)."""
    return _terminated.is_set()


def takes_sigterm() -> bool:
    """Whether SIGTERM is this module's to handle now (the command line's, not a library caller's)."""
    return signal.getsignal(signal.SIGTERM) is _on_sigterm


@contextmanager
def sigterm_as_interrupt(last_line: Callable[[], str] | None = None) -> Iterator[None]:
    """While the body runs, SIGTERM stops the run as the first Ctrl-C does and `terminated()` says so;
    `last_line()` is what the command then says, should SIGTERM end it at once (`sigterm_ends_at_once`).

    For the command line only: a program that calls the library keeps its own handlers. The handler that
    was there is put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _terminated.clear()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    if last_line is not None:
        _last_line.append(last_line)
    try:
        yield
    finally:
        if last_line is not None:
            _last_line.remove(last_line)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextmanager
def sigterm_ends_at_once() -> Iterator[None]:
    """While the body runs, the command line's SIGTERM ends the process at once, saying the stop's last line,
    with exit code 143. Why: a scheduler (SLURM, systemd) sends SIGTERM to every process of a job, and a
    Flower simulation's Ray processes are in it; Ray's driver, in this process, then exits it with code 1
    on its own (from C++, nothing to catch) once it finds its node gone, which under load came before the
    stop after the step had finished. The last checkpoint holds (they are written atomically), so
    `--resume` goes on from it, as after any abrupt end. Nothing changes where the command line does not
    take SIGTERM (a library caller's handler stays)."""
    if not takes_sigterm() or _at_once.is_set():
        yield
        return
    _at_once.set()
    try:
        yield
    finally:
        _at_once.clear()


@contextmanager
def deferred_to_run_loop() -> Iterator[None]:
    """While the body runs, the first SIGINT asks the run loop to stop; the second exits with 130.

    Nested bodies share the outermost one's handler and request, so one Ctrl-C is announced once. A
    process started with SIGINT ignored (a background job of a non-interactive shell) keeps ignoring it;
    SIGTERM, where the command line takes it, still asks the run loop to stop."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    _requested.clear()
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    previous = None if ignored else signal.signal(signal.SIGINT, _on_sigint)
    if previous is None:  # a handler installed outside Python cannot be put back: Python's own is
        previous = signal.default_int_handler
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        if not ignored:
            signal.signal(signal.SIGINT, previous)
        _requested.clear()
