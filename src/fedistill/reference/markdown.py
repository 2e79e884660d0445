"""Small Markdown helpers shared by the generated pages: a table, a cell, a value in code style."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def prose(text: Any, *, in_table: bool = False) -> str:
    """`text` safe as Markdown prose: outside its code spans `<` and `*` show as themselves (and, in a
    table, `|` is no column break; inside code spans the table extension already keeps it)."""
    parts = str(text).replace("``", "`").split("`")
    for index in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[index] = parts[index].replace("<", "&lt;").replace("*", "\\*")
        if in_table:
            parts[index] = parts[index].replace("|", "\\|")
    return "`".join(parts)


def cell(text: Any) -> str:
    """`text` made safe inside a table cell: one line, `prose`'s escapes."""
    return prose(" ".join(str(text).split()), in_table=True)


def code(value: Any) -> str:
    """`value` as inline code, as a config file would write it (strings quoted, booleans lower case)."""
    if isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, str):
        shown = f'"{value}"'
    else:
        shown = repr(value)
    return f"`{shown}`"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; every cell goes through `cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def between_markers(text: str, start: str, end: str, inner: str) -> str:
    """`text` with what lies between its `start` and `end` marker lines replaced by `inner`; ValueError
    naming the markers when they are missing or out of order."""
    first, last = text.find(start), text.find(end)
    if first < 0 or last < first:
        raise ValueError(f"README.md lacks the markers {start} ... {end}")
    return text[: first + len(start)] + "\n" + inner + "\n" + text[last:]
