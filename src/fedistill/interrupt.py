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


def check() -> None:
    """Raise KeyboardInterrupt in the calling thread if the user asked the run to stop."""
    if _requested.is_set():
        raise KeyboardInterrupt


@contextmanager
def deferred_to_run_loop() -> Iterator[None]:
    """While the body runs, the first SIGINT asks the run loop to stop; the second exits with 130."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: object) -> None:
        if _requested.is_set():
            print("fedistill: interrupted twice; stopping now", file=sys.stderr, flush=True)
            os._exit(130)
        print("fedistill: stopping after this step (Ctrl-C again: at once)", file=sys.stderr, flush=True)
        _requested.set()

    _requested.clear()
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested.clear()
