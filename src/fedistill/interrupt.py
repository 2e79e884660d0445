"""Ctrl-C for runs whose loop is not on the main thread (Flower's simulation runs the ServerApp in a
thread while its engine holds the main one, so a KeyboardInterrupt never reaches the run loop).

The main thread's SIGINT handler only sets a flag; the run loop and the Flower fleet check it between
rounds and while they wait for replies, and raise KeyboardInterrupt there, so the run stops at a
checkpointable point and the engine shuts down normally. A second Ctrl-C ends the process at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_requested = threading.Event()
_lock = threading.Lock()
_depth = 0  # how many deferred_to_run_loop bodies are running: only the outermost owns the handler

STOPPING = "fedistill: stopping after this step (Ctrl-C again: at once)"


def check() -> None:
    """Raise KeyboardInterrupt in the calling thread if the user asked the run to stop."""
    if _requested.is_set():
        raise KeyboardInterrupt


def request_stop() -> bool:
    """Ask the run loop to stop, saying so on stderr the first time only; whether it was asked before."""
    with _lock:
        if _requested.is_set():
            return True
        _requested.set()
    print(STOPPING, file=sys.stderr, flush=True)
    return False


def _on_sigint(signum: int, frame: object) -> None:
    if request_stop():
        print("fedistill: interrupted twice; stopping now", file=sys.stderr, flush=True)
        os._exit(130)


@contextmanager
def deferred_to_run_loop() -> Iterator[None]:
    """While the body runs, the first SIGINT asks the run loop to stop; the second exits with 130.

    Nested bodies share the outermost one's handler and request, so one Ctrl-C is announced once. A
    process started with SIGINT ignored (a background job of a non-interactive shell) keeps ignoring it."""
    global _depth
    if threading.current_thread() is not threading.main_thread() or (
        not _depth and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
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
    previous = signal.signal(signal.SIGINT, _on_sigint)
    if previous is None:  # a handler installed outside Python cannot be put back: Python's own is
        previous = signal.default_int_handler
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        signal.signal(signal.SIGINT, previous)
        _requested.clear()
