"""Ends what is left of one Ray session once the process that started it has ended, however it ended.

Ray's raylet starts helpers (the dashboard agent, the runtime-env agent) that outlive an abrupt end of
the process that started Ray (a second Ctrl-C exits at once; on SIGTERM Ray's own handler aborts it) and
then ignore SIGTERM. A run gives Ray a session folder of its own; every process of that session keeps a
log file there open, which is how they are found: only this user's processes, only those with an
argument or an open file under that folder.

Run as a script (`python -I ray_reaper.py PARENT_PID`; standard library only, so it starts in
milliseconds) it reads the session folder from its stdin (not an argument: it is no process of the
session itself), waits until its parent writes `done` (the parent ended the session itself) or ends
without it, and then kills the session's processes and removes the folder.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time
from pathlib import Path

PROC = Path("/proc")


def session_processes(root: Path) -> list[int]:
    """This user's live processes, other than this one, with an argument or an open file under `root`
    (Ray rewrites its helpers' command lines, but their log files stay open). Empty without /proc."""
    if not PROC.is_dir():
        return []
    mark = os.path.join(os.path.realpath(root), "")
    found: list[int] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid() or _ended(entry):
                continue
            if mark in (entry / "cmdline").read_bytes().decode(errors="replace") or _has_open_file_under(
                entry, mark
            ):
                found.append(int(entry.name))
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
    return found


def _ended(entry: Path) -> bool:
    """Exited, and waiting for its parent to collect it (a zombie): nothing left to end."""
    stat = (entry / "stat").read_text(errors="replace")
    return stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))


def _has_open_file_under(entry: Path, mark: str) -> bool:
    for fd in (entry / "fd").iterdir():
        try:
            if os.readlink(fd).startswith(mark):
                return True
        except OSError:
            continue
    return False


def end_processes(root: Path, within: float = 5.0) -> list[int]:
    """Kill (SIGKILL: the helpers ignore SIGTERM) every process of the session under `root`, again for any
    started meanwhile, until none is left or `within` seconds passed; the pids killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + within
    while (left := session_processes(root)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            killed.add(pid)
        time.sleep(0.05)
    return sorted(killed)


def end_session(root: Path) -> None:
    """The session's processes, then its folder."""
    end_processes(root)
    shutil.rmtree(root, ignore_errors=True)


def parent_said_done(parent: int, every: float = 0.2) -> bool:
    """Wait until the parent writes `done` on stdin (True) or ends without it (False)."""
    while os.getppid() == parent:
        readable, _, _ = select.select([sys.stdin], [], [], every)
        if readable:
            return sys.stdin.readline().strip() == "done"
    return False


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the parent's end ends this process
    parent, folder = int(argv[0]), sys.stdin.readline().strip()
    if folder and not parent_said_done(parent):
        end_session(Path(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
