"""A target's table from its runs' summaries: per row and column our mean ± std over the seeds, the number
it is checked against, the difference and the verdict.

Below the paper's scale a number is checked both ways (|ours - recorded| <= tolerance: a regression check
of our own recorded result). At the paper's scale only falling short counts against it: ours more than the
tolerance below the paper's number (above it, for a lower-is-better column such as HD95) is `outside`,
anything better is `within`. A cell with no expected number is `unchecked`; one where any of its seeds
gave no number (a run that failed) is `no result`, which counts as a failure: the mean of the seeds that
did run is shown, but it is not the mean the expected number was recorded over.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedistill.reproduce.target_spec import Column, Expected, Row, Scale, Target

WITHIN, OUTSIDE, UNCHECKED, NO_RESULT = "within", "outside", "unchecked", "no result"
FAILING = (OUTSIDE, NO_RESULT)


@dataclass(frozen=True)
class Check:
    """One (row, column) of the table."""

    row: str
    column: str
    values: tuple[float, ...]
    mean: float | None
    std: float | None
    paper: float | None
    reference: float | None
    tolerance: float | None
    difference: float | None
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"values": list(self.values)}


def value_at(summary: Mapping[str, Any], path: str) -> Any:
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def read_value(summary: Mapping[str, Any], column: Column, section: str = "final") -> float | None:
    """The column's number in one summary: the first of its paths that holds a number, scaled; paths into
    "final" read `section` instead. NaN or infinity there (a metric left undefined) is no number: it cannot
    be averaged with the other seeds' (and stopped the table's std), nor replaced by a later path's."""
    for path in column.paths:
        if section != "final" and path.startswith("final."):
            path = f"{section}.{path.removeprefix('final.')}"
        value = value_at(summary, path)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value) * column.factor if math.isfinite(value) else None
    return None


def read_summary(folder: Path, algorithm: str) -> dict[str, Any] | None:
    path = folder / algorithm / "summary.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def judge(mean: float | None, expected: Expected | None, check: str, column: Column) -> tuple:
    """(reference, difference, verdict) of one cell."""
    reference = None if expected is None else (expected.paper if check == "paper" else expected.ours)
    if mean is None:
        return reference, None, NO_RESULT if reference is not None else UNCHECKED
    if reference is None or expected is None:
        return None, None, UNCHECKED
    difference = round(mean - reference, 9) + 0.0  # no -0.00 from float noise
    if check == "paper":  # only falling short of the paper counts against it
        shortfall = -difference if column.higher_is_better else difference
        ok = shortfall <= expected.tolerance + 1e-9
    else:
        ok = abs(difference) <= expected.tolerance + 1e-9
    return reference, difference, WITHIN if ok else OUTSIDE


def check_row(row: Row, column: Column, summaries: Sequence[Mapping[str, Any] | None], check: str) -> Check:
    values = tuple(
        v for s in summaries if s is not None and (v := read_value(s, column, row.section)) is not None
    )
    mean = statistics.fmean(values) if values else None
    std = statistics.stdev(values) if len(values) > 1 else None
    expected = row.expected.get(column.key)
    reference, difference, verdict = judge(mean, expected, check, column)
    if reference is not None and len(values) < len(summaries):  # a seed without a number fails the cell
        verdict = NO_RESULT
    return Check(
        row=row.label,
        column=column.key,
        values=values,
        mean=mean,
        std=std,
        paper=None if expected is None else expected.paper,
        reference=reference,
        tolerance=None if expected is None else expected.tolerance,
        difference=difference,
        verdict=verdict,
    )


def checks(target: Target, scale: str, folders: Mapping[str, Sequence[Path]]) -> list[Check]:
    """Every (row, column) of the target at `scale`, reading each row's algorithm in the folders of its
    run (`folders`: run name -> one folder per seed). A column a row has no expected number for and no
    value in is left out."""
    spec: Scale = target.scales[scale]
    out = []
    for row in spec.rows:
        summaries = [read_summary(folder, row.algorithm) for folder in folders.get(row.run, ())]
        for column in target.columns_at(scale):
            cell = check_row(row, column, summaries, spec.check)
            if cell.values or column.key in row.expected:
                out.append(cell)
    return out


def exit_code(cells: Sequence[Check], run_failed: bool = False) -> int:
    """1 when any cell is outside its tolerance or has no result, or a run failed (the rows it would give
    may expect no number, and a row with neither value nor expected number is left out), else 0."""
    return 1 if run_failed or any(c.verdict in FAILING for c in cells) else 0
