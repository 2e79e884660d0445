"""Writing a reproduction's result table: Markdown for people, JSON with every number for programs.

Every table is a pair `<name>.md` and `<name>.json` in one folder. The Markdown ends with a newline;
the JSON is indented (2 unless a table keeps the indent its published files have). Each file is replaced
whole (written beside it, then renamed over it): a command stopped while writing leaves the previous
file, never half of one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedistill import disk


def write_markdown(path: Path, lines: Sequence[str]) -> Path:
    """``lines`` as one Markdown file, UTF-8, ending with a newline."""
    disk.write_text(path, "\n".join(lines) + "\n")
    return path


def write_json(path: Path, payload: Any, *, indent: int = 2, newline: bool = True) -> Path:
    """``payload`` as indented JSON (ASCII, so any reader opens it)."""
    disk.write_text(path, json.dumps(payload, indent=indent) + ("\n" if newline else ""))
    return path


def write_table(
    folder: str | Path, name: str, lines: Sequence[str], payload: Any, *, indent: int = 2
) -> Path:
    """``<folder>/<name>.md`` and ``<name>.json``, the folder made if missing; the Markdown's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    markdown = write_markdown(folder / f"{name}.md", lines)
    write_json(folder / f"{name}.json", payload, indent=indent)
    return markdown
