"""The processes a test started, found through /proc (Ray's and pool workers included)."""

from __future__ import annotations

from pathlib import Path


def descendants(root: int) -> dict[int, str]:
    """The processes below `root` now, with their command lines."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(text[text.rfind(")") + 2 :].split()[1])
    found: dict[int, str] = {}
    for pid in parents:
        up = pid
        while up in parents and up != root:
            up = parents[up]
        if up == root and pid != root:
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found
