"""Where a published result came from: the command(s) its JSON file records, the commit that produced
it (recorded in the JSON, else the file's last commit in git) and the machine, when recorded."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: How a commit taken from git rather than from the result file reads on a page. The regeneration test
#: leaves these out of its comparison: committing a page and its result together gives the result file
#: a new last commit, which the page written before the commit cannot know.
GIT_COMMIT_NOTE = "(the result file's last commit)"
GIT_COMMIT = re.compile(r"`[0-9a-f]{7,40}` \(the result file's last commit\)|not in git yet")


@dataclass(frozen=True)
class Provenance:
    """What produced one result file."""

    commands: tuple[str, ...]
    commit: str  # Markdown: the commit, and whether the file recorded it or git did
    machine: str  # "" when the file does not record it; several are joined by "; " (each holds commas)


def _collect(value: Any, key: str, found: list[str]) -> None:
    """Every string stored under `key` (or in a list of strings under it) anywhere in a JSON value, in
    order, each once."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name == key and isinstance(item, str):
                found.extend([item] if item not in found else [])
            elif name == key and isinstance(item, list) and item and all(isinstance(i, str) for i in item):
                found.extend(i for i in dict.fromkeys(item) if i not in found)
            else:
                _collect(item, key, found)
    elif isinstance(value, list):
        for item in value:
            _collect(item, key, found)


def git_commit(path: Path) -> str:
    """The short hash of the last commit that changed `path`; "" outside git or for a new file."""
    try:
        done = subprocess.run(
            ["git", "log", "-1", "--format=%h", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def provenance(json_path: Path) -> Provenance:
    """The provenance of one result file (its JSON twin for a Markdown table)."""
    data = json.loads(json_path.read_text(encoding="utf-8"))
    commands: list[str] = []
    _collect(data, "command", commands)
    _collect(data, "commands", commands)
    recorded: list[str] = []
    _collect(data, "commit", recorded)
    machines: list[str] = []
    _collect(data, "machine", machines)
    if recorded:
        commit = ", ".join(f"`{c}`" for c in recorded)
    else:
        found = git_commit(json_path)
        commit = f"`{found}` {GIT_COMMIT_NOTE}" if found else "not in git yet"
    return Provenance(tuple(commands), commit, "; ".join(machines))


def provenance_lines(json_path: Path, root: Path, written: Sequence[str] = ()) -> list[str]:
    """A short list saying what produced the file: commands (the JSON's, else those `written` in its
    Markdown twin), commit, machine, the files themselves."""
    found = provenance(json_path)
    commands = found.commands or tuple(written)
    lines = []
    if commands:
        label = "Command" if len(commands) == 1 else "Commands"
        lines.append(f"- {label}: " + "; ".join(f"`{c}`" for c in commands))
    else:
        lines.append("- Command: not recorded in the result file")
    lines.append(f"- Commit: {found.commit}")
    if found.machine:
        lines.append(f"- Machine: {found.machine}")
    relative = json_path.relative_to(root).with_suffix("")
    lines.append(f"- Files: `{relative}.json`, `{relative}.md`")
    return lines
