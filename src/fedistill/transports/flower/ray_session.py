"""A Ray session of the run's own, ended with it however the run ends.

A normal end or an exception: Ray's shutdown, then any process of the session it left behind is killed
here. An end that runs no `finally` (a second Ctrl-C exits at once; on SIGTERM Ray's own handler aborts;
SIGKILL): a small watcher process started with the session notices its parent is gone and does the same
(see `ray_reaper`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedistill.transports.flower import ray_reaper


def _start_reaper(root: Path) -> subprocess.Popen[str]:
    """The watcher, told the session folder; in a session of its own, so that a terminal's Ctrl-C
    reaches the run, not it."""
    reaper = subprocess.Popen(
        [sys.executable, "-I", ray_reaper.__file__, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    _tell(reaper, f"{root}\n")
    return reaper


def _tell(reaper: subprocess.Popen[str], line: str) -> None:
    if reaper.stdin is not None:
        reaper.stdin.write(line)
        reaper.stdin.flush()


def _stop_reaper(reaper: subprocess.Popen[str]) -> None:
    """Tell the watcher the session is ended already, and wait for it to go."""
    try:
        _tell(reaper, "done\n")
        if reaper.stdin is not None:
            reaper.stdin.close()
        reaper.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()
        reaper.wait()


def _shutdown_ray() -> None:
    """Ray's own shutdown, if Ray is loaded and still up (Flower's engine normally did it already)."""
    ray: Any = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@contextmanager
def own_ray_session() -> Iterator[Path]:
    """A fresh folder for Ray's session (pass it as ray.init's `_temp_dir`); when the body ends, Ray is
    shut down, what is left of its processes killed and the folder removed."""
    root = Path(tempfile.mkdtemp(prefix="fedistill-ray-", dir=os.environ.get("RAY_TMPDIR")))
    reaper = _start_reaper(root)
    try:
        yield root
    finally:
        try:
            _shutdown_ray()
        finally:
            ray_reaper.end_session(root)
            _stop_reaper(reaper)
