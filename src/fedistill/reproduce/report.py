"""A target's result files: `table.md` for people, `table.json` with every number, `table.png` (ours next
to the paper's and the checked number, per row), in `<out>/reproduce/<name>-<scale>/`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedistill import machine
from fedistill.reproduce.execute import Outcome
from fedistill.reproduce.figure import plot_checks
from fedistill.reproduce.paths import relative_to_checkout
from fedistill.reproduce.tables import write_table
from fedistill.reproduce.target_spec import Target
from fedistill.reproduce.verdict import FAILING, UNCHECKED, Check, exit_code

MARKS = {"within": "✓ within", "outside": "✗ outside", "unchecked": "- unchecked", "no result": "✗ no result"}


def number(value: float | None, digits: int, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def ours_text(cell: Check, digits: int) -> str:
    if cell.mean is None:
        return "-"
    return number(cell.mean, digits) + (f" ± {cell.std:.{digits}f}" if cell.std is not None else "")


def runs_line(outcomes: Sequence[Outcome]) -> str:
    """What this invocation did with the runs and how long the work took (not the finished ones reused)."""
    counts = {
        status: sum(o.status == status for o in outcomes) for status in ("ran", "resumed", "reused", "failed")
    }
    line = "Runs: " + ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    worked = [o.seconds for o in outcomes if o.status in ("ran", "resumed")]
    if worked:
        line += (
            f"; the {len(worked)} that ran or resumed took {sum(worked):,.0f} s of run time"
            f" ({min(worked):,.0f}-{max(worked):,.0f} s a run)"
        )
    return line + "."


def machines(outcomes: Sequence[Outcome]) -> str:
    """Which machine(s) the runs' summaries say they ran on: a number may not repeat on another CPU."""
    summaries = []
    for outcome in outcomes:
        for path in sorted(outcome.job.folder.glob("*/summary.json")):
            try:
                summaries.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):  # a damaged summary is the run's problem, reported with it
                continue
    return machine.of_summaries(summaries)


def headline(cells: Sequence[Check], problems: Sequence[str]) -> str:
    """The table's verdict in one bold line. A cell with no expected number is reported, not judged: a
    table of only such cells checked nothing, and is not said to be within tolerance."""
    if problems:
        return f"**{'; '.join(problems)}**"
    unchecked = sum(c.verdict == UNCHECKED for c in cells)
    if unchecked == len(cells):
        return "**nothing checked: no number here has an expected one to compare with**"
    left = f" ({unchecked} of {len(cells)} numbers unchecked: no expected number)" if unchecked else ""
    return "**all within tolerance**" + left


def markdown(
    target: Target, scale: str, cells: Sequence[Check], outcomes: Sequence[Outcome], ran_on: str
) -> list[str]:
    spec = target.scales[scale]
    columns = {c.key: c for c in target.columns_at(scale)}
    checked = "our recorded number at this scale" if spec.check == "ours" else "the paper's number"
    failing = sum(c.verdict in FAILING for c in cells)
    failed = [o for o in outcomes if o.status == "failed"]
    problems = [f"{failing} outside tolerance or without result"] if failing else []
    problems += [f"{len(failed)} of {len(outcomes)} runs failed"] if failed else []
    lines = [
        f"# {target.title} ({scale} scale)",
        "",
        f"Reproduces: {target.source}. Target `{target.name}`, scale `{scale}`: {len(outcomes)} runs "
        f"({len(spec.runs)} settings, each over its seeds), "
        f"seeds {', '.join(map(str, sorted({o.job.seed for o in outcomes})))}.",
    ]
    if spec.note:
        lines.append(f"Scale: {spec.note}.")
    lines += [
        f"Checked against {checked}"
        + (" (both ways)" if spec.check == "ours" else " (falling short by more than the tolerance fails)")
        + "; the paper's number is shown "
        + ("for reference only." if spec.check == "ours" else "as checked."),
        "",
        headline(cells, problems),
        "",
        "| row | column | paper | checked against | ours | difference | tolerance | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        column = columns[cell.column]
        d = column.digits
        lines.append(
            f"| {cell.row} | {column.label} | {number(cell.paper, d)} | {number(cell.reference, d)} | "
            f"{ours_text(cell, d)} | {number(cell.difference, d, sign=True)} | {number(cell.tolerance, d)} | "
            f"{MARKS[cell.verdict]} |"
        )
    lines += ["", runs_line(outcomes), f"Machine: {ran_on}."]
    if failed:
        lines += ["", "Runs that failed:", *(f"- {o.job.run} seed {o.job.seed}: {o.error}" for o in failed)]
    return lines


def payload(
    target: Target, scale: str, cells: Sequence[Check], outcomes: Sequence[Outcome], ran_on: str
) -> dict[str, Any]:
    spec = target.scales[scale]
    return {
        "target": target.name,
        "title": target.title,
        "source": target.source,
        "scale": scale,
        "checked_against": spec.check,
        "exit_code": exit_code(cells, any(o.status == "failed" for o in outcomes)),
        "columns": [
            {"key": c.key, "label": c.label, "higher_is_better": c.higher_is_better}
            for c in target.columns_at(scale)
        ],
        "rows": [cell.as_dict() for cell in cells],
        "machine": ran_on,
        "runs": [
            {
                "run": o.job.run,
                "seed": o.job.seed,
                "folder": relative_to_checkout(o.job.folder),
                "status": o.status,
                "seconds": round(o.seconds, 1),
                "error": o.error,
            }
            for o in outcomes
        ],
    }


def write_report(
    folder: Path, target: Target, scale: str, cells: Sequence[Check], outcomes: Sequence[Outcome]
) -> Path:
    """table.md, table.json and table.png in `folder`; the Markdown's path."""
    ran_on = machines(outcomes)  # read from the runs' summaries once, for both files
    lines = markdown(target, scale, cells, outcomes, ran_on)
    path = write_table(folder, "table", lines, payload(target, scale, cells, outcomes, ran_on))
    plot_checks(cells, target.columns_at(scale), folder / "table.png", title=f"{target.name} ({scale})")
    return path
