"""Scales built from ready configs and their configs/expected.toml entries: one run and one row per
config, the config's own algorithm, and per column the entry's `paper_<column>` (and `ours_<column>`),
with `tolerance_<column>` (or `tolerance_<metric>` for `<metric>_<source>` columns, else `tolerance`)."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from typing import Any

from fedistill.reproduce.expected import read_expected
from fedistill.reproduce.paths import CONFIGS
from fedistill.reproduce.target_spec import Column, Expected, Row, Run, Scale


def config_algorithm(key: str) -> str:
    """The `algorithm` a config under configs/ runs ("" when the file is not at hand)."""
    path = CONFIGS / key
    if not path.is_file():
        return ""
    return str(tomllib.loads(path.read_text(encoding="utf-8")).get("algorithm", ""))


def tolerance_of(entry: dict[str, Any], column: str) -> float:
    for key in (f"tolerance_{column}", f"tolerance_{column.split('_')[0]}", "tolerance"):
        if key in entry:
            return float(entry[key])
    return 2.0


def expected_of(entry: dict[str, Any], columns: Sequence[Column], *, ours: bool) -> dict[str, Expected]:
    """The columns the entry has a number for (the paper's, or ours where `ours`)."""
    out = {}
    for column in columns:
        paper = entry.get(f"paper_{column.key}")
        recorded = entry.get(f"ours_{column.key}") if ours else None
        if paper is not None or recorded is not None:
            out[column.key] = Expected(paper, recorded, tolerance_of(entry, column.key))
    return out


def row_label(entry: dict[str, Any], key: str) -> str:
    """The entry's `source` without the paper's name ("FedDF paper, Table 3: ..." -> "Table 3: ..."), else
    the config's file name."""
    source = str(entry.get("source", ""))
    return source.split(", ", 1)[1] if ", " in source else (source or key.rsplit("/", 1)[-1])


def config_scale(
    keys: Sequence[str],
    columns: Sequence[Column],
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    sets: tuple[str, ...] = (),
    note: str = "",
) -> Scale:
    """The paper's scale of `keys` (config paths under configs/), checked against the paper's numbers."""
    expected = read_expected()
    runs, rows = [], []
    for key in keys:
        name = key.removesuffix(".toml").replace("/", "-")
        entry = expected.get(key, {})
        runs.append(Run(name, key, sets))
        rows.append(
            Row(row_label(entry, key), name, config_algorithm(key), expected_of(entry, columns, ours=False))
        )
    return Scale(tuple(runs), tuple(rows), seeds=seeds, check="paper", note=note, columns=tuple(columns))


def config_keys(folder: str, prefix: str = "") -> list[str]:
    """The configs under configs/<folder>/ whose file name starts with `prefix`, sorted."""
    return sorted(f"{folder}/{p.name}" for p in (CONFIGS / folder).glob(f"{prefix}*.toml"))
