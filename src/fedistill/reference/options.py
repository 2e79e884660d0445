"""Every option of every algorithm (its config table, `[fediod]`, `--set fediod.w_adv=0.5`): name, type,
default and doc, read from the options dataclass and its source (`field_docs`), grouped by the class that
declares them (FedIOD's groups in `algorithms/fediod/option_groups.py`, the `dp_*` keys in `DPOptions`).

`format_options(name)` gives the same reference in the terminal (`fedistill list --options NAME`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from fedistill.algorithms.registry import ALGORITHMS, get_algorithm
from fedistill.reference.field_docs import field_docs, one_line
from fedistill.reference.markdown import cell, code, prose, table


@dataclass(frozen=True)
class Option:
    """One key of an algorithm's table."""

    name: str
    type: str
    default: Any
    doc: str  # the whole doc its source gives it; "" when none
    group: type  # the class that documents (or declares) it


def _default(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None


def options_of(name: str) -> list[Option]:
    """Every option of algorithm `name`, grouped (most specific group first), in declaration order; not
    the keys it inherits but refuses (its options' `refused_keys`)."""
    cls = get_algorithm(name).options
    declared = {item.name: item for item in dataclasses.fields(cls)}
    refused = getattr(cls, "refused_keys", {})
    rows = [
        Option(doc.name, str(declared[doc.name].type), _default(declared[doc.name]), doc.text, doc.owner)
        for doc in field_docs(cls)
        if doc.name not in refused
    ]
    rank = {base: index for index, base in enumerate(cls.__mro__)}
    return sorted(rows, key=lambda option: rank.get(option.group, len(rank)))


def groups_of(name: str) -> list[tuple[type, list[Option]]]:
    """The options of `name` by group, in `options_of`'s order."""
    grouped: dict[type, list[Option]] = {}
    for option in options_of(name):
        grouped.setdefault(option.group, []).append(option)
    return list(grouped.items())


def group_title(group: type, name: str) -> str:
    """A group's heading in algorithm `name`'s reference: an options class registered for algorithms is
    named by them ("its own keys", "keys shared with [fedavg]"); any other group by its docstring."""
    owners = sorted(n for n, algorithm in ALGORITHMS.items() if algorithm.options is group)
    if name in owners:
        return "its own keys"
    if owners:
        return "keys shared with " + ", ".join(f"[{owner}]" for owner in owners)
    doc = group.__dict__.get("__doc__") or ""
    if doc.startswith(f"{group.__name__}("):  # the signature dataclasses write in place of a docstring
        doc = ""
    return f"{group.__name__}: {one_line(doc).replace('``', '`')}" if doc else group.__name__


def group_heading(group: type, name: str) -> tuple[str, str]:
    """A group's short heading for the web page ("Generator loss") and the sentence that says what it
    holds; groups registered for algorithms keep `group_title`'s wording."""
    title = group_title(group, name)
    if ": " not in title:
        return title[:1].upper() + title[1:], ""
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", group.__name__.removesuffix("Options")).lower()
    heading = "Differential privacy (`dp_*`)" if words == "dp" else words[:1].upper() + words[1:]
    return heading, title.split(": ", 1)[1]


def options_markdown(name: str) -> str:
    """The page `reference/options/<name>.md`."""
    algorithm = get_algorithm(name)
    parts = [
        f"# `[{name}]` options",
        "",
        cell(algorithm.summary) + ".",
        "",
        f"Runs on: {', '.join(f'`{task}`' for task in algorithm.tasks)}. Set a key in a config file's "
        f"`[{name}]` table or with `--set {name}.KEY=VALUE`; in the terminal, "
        f"`fedistill list --options {name}` prints this list.",
        "",
    ]
    if algorithm.unused_keys:
        parts += [prose(f"Common keys it never reads (its table refuses them): {unused(name)}."), ""]
    groups = groups_of(name)
    if not groups:
        parts += ["This algorithm takes no options of its own; the [common keys](../config.md) apply.", ""]
    for group, options in groups:
        if len(groups) > 1:
            heading, sentence = group_heading(group, name)
            parts += [f"## {heading}", ""] + ([prose(sentence), ""] if sentence else [])
        rows = [(f"`{o.name}`", f"`{o.type}`", code(o.default), o.doc) for o in options]
        parts += [table(("key", "type", "default", "meaning"), rows), ""]
    return "\n".join(parts)


def format_options(name: str) -> str:
    """Every key of algorithm `name` with its default and one line, for the terminal."""
    algorithm = get_algorithm(name)
    lines = [f"[{name}]  {algorithm.summary}", ""]
    groups = groups_of(name)
    if not groups:
        lines.append("  (no options of its own; the common keys apply: fedistill run --help)")
    width = max((len(o.name) + len(_plain(o.default)) for _, group in groups for o in group), default=0) + 5
    for group, options in groups:
        if len(groups) > 1:
            lines.append(group_title(group, name))
        for option in options:
            head = f"  {option.name} = {_plain(option.default)}"
            lines.append(f"{head:<{width}} {one_line(option.doc)}")
        lines.append("")
    lines.append(f"set with --set {name}.KEY=VALUE or a [{name}] table in a config file")
    if algorithm.unused_keys:
        lines.append(f"common keys it never reads (its table refuses them): {unused(name)}")
    return "\n".join(lines)


def unused(name: str) -> str:
    """The common keys algorithm `name` never reads, each with what decides it instead."""
    return "; ".join(
        f"{key} ({why.format(name=name)})" for key, why in get_algorithm(name).unused_keys.items()
    )


def _plain(value: Any) -> str:
    return code(value).strip("`")
