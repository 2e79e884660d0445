"""Run summaries: summary.json (machine-readable), summary.md (for people) and the results table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fedistill import disk, machine
from fedistill.data.partition import DIRICHLET
from fedistill.engine.rundir import write_json
from fedistill.errors import RunDirError
from fedistill.federation.ledger import DOWN, UP
from fedistill.plots import plot_learning_curves

#: What every summary.json holds; a file without them is damaged.
SUMMARY_KEYS = ("algorithm", "description", "federated", "rounds", "final", "communication", "wall_time_s")


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run's summary.json; RunDirError naming the file when it is damaged (`--resume` rebuilds it)."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RunDirError(f"{path} is damaged ({type(exc).__name__}); --resume rebuilds it") from None
    if not isinstance(summary, dict) or any(key not in summary for key in SUMMARY_KEYS):
        missing = [k for k in SUMMARY_KEYS if not isinstance(summary, dict) or k not in summary]
        raise RunDirError(f"{path} is damaged (missing {', '.join(missing)}); --resume rebuilds it")
    return summary


def human_bytes(n: float) -> str:
    """A byte count in the largest unit that keeps it readable (B, KB, MB or GB), in powers of 1000 as
    every other MB the project prints (the reports' and the READMEs' byte counts are bytes / 1e6)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


#: The results table's metric columns of a classification run (summaries written before tasks existed).
CLASSIFICATION_COLUMNS = (("accuracy", "test %", "percent"),)


def _formatted(value: float | None, style: str) -> str:
    if value is None:
        return "-"
    if style == "percent":
        return f"{100 * value:.2f}"
    return f"{value:.4f}" if style == "float4" else f"{value:.2f}"


def metric_cell(final: dict[str, Any], metric: str, style: str = "percent") -> str:
    """`test_<metric>` of a run's final metrics, with the spread over the sites where there is one."""
    cell = _formatted(final.get(f"test_{metric}"), style)
    spread = final.get(f"test_{metric}_std")
    if spread is not None:
        cell += " ± " + _formatted(spread, style)
    return cell


def accuracy_cell(final: dict[str, Any]) -> str:
    """The accuracy cell of a results table: the final accuracy, with its spread where there is one."""
    return metric_cell(final, "accuracy")


def metric_text(value: Any) -> str:
    """A final metric as summary.md and a model card show it: four decimals, or three significant digits
    for a value under 0.0005 that is not zero (a DP run's `dp_delta` of 1e-05, a small NMSE or loss), which
    four decimals would show as 0.0000."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.3g}" if 0 < abs(value) < 5e-4 else f"{value:.4f}"


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write a run's human-readable summary.md, then its summary.json: the json marks a finished run (a
    resume keeps it), so it comes last, and a write cut short leaves a run `--resume` finishes."""
    disk.write_text(run_dir / "summary.md", summary_markdown(summary))
    write_json(run_dir / "summary.json", summary)


def oracle_line(s: dict[str, Any]) -> list[str]:
    """The evaluation-only oracle (algorithms/shared/oracle.py) under its label; none without one."""
    if not s.get("oracle"):
        return []
    value = s.get("global_accuracy_oracle")
    return [f"- {s['oracle']}" + ("" if value is None else f": **{value:.4f}** (`global_accuracy_oracle`)")]


def floor_line(s: dict[str, Any]) -> list[str]:
    """The trivial predictor's headline beside the run's (summary "floor"), where the task names one."""
    floor = s.get("floor")
    if not floor:
        return []
    columns = [tuple(c) for c in s.get("columns") or CLASSIFICATION_COLUMNS]
    cells = [f"{title} {metric_cell(floor, metric, style)}" for metric, title, style in columns]
    return [f"- floor ({floor['label']}, no training): {', '.join(cells)}"]


#: Up to this many clients summary.md lists each client's bytes per kind; past it, each kind's spread over
#: the clients (a 1,000-site run would print thousands of rows; summary.json keeps every client)
PER_CLIENT_ROWS = 20


def per_client_traffic(comm: dict[str, Any], clients: int) -> list[str]:
    """summary.md's per-client traffic table: a row per client and kind, or per kind its spread."""
    if clients <= PER_CLIENT_ROWS:
        rows = ["| direction | client | kind | bytes |", "|---|---|---|---|"]
        for direction in (UP, DOWN):
            for client, kinds in comm[direction]["per_client"].items():
                rows += [f"| {direction} | {client} | {kind} | {size:,} |" for kind, size in kinds.items()]
        return rows
    rows = ["| direction | kind | clients | min | median | max (client) |", "|---|---|---|---|---|---|"]
    for direction in (UP, DOWN):
        by_kind: dict[str, dict[str, int]] = {}
        for client, kinds in comm[direction]["per_client"].items():
            for kind, size in kinds.items():
                by_kind.setdefault(kind, {})[client] = size
        for kind, sizes in by_kind.items():
            top = max(sizes, key=lambda client: sizes[client])  # the first client of the largest share
            values = sorted(sizes.values())
            median = statistics.median(values)
            rows.append(
                f"| {direction} | {kind} | {len(values):,} | {values[0]:,} | {median:,.0f} | "
                f"{sizes[top]:,} ({top}) |"
            )
    return rows


def summary_markdown(s: dict[str, Any]) -> str:
    """The summary.md of one run: its setting, wall time, final metrics and communication."""
    comm, part = s["communication"], s["partition"]
    lines = [
        f"# {s['algorithm']} on {s['dataset']}",
        "",
        s["description"] + ("" if s["federated"] else "  **(not federated: data pooled)**"),
        "",
        f"- model: {s['model']}; clients: {s['clients']}; rounds: {rounds_cell(s)}; seed: {s['seed']}",
        f"- partition: {partition_text(part, brackets=True)}, hash `{part['hash'][:16]}`",
        f"- wall time: {s['wall_time_s']:.1f} s; peak memory: {s['peak_memory_mb']:.0f} MiB",
        *([f"- **stopped early**: {s['stopped']}"] if s.get("stopped") else []),
        *oracle_line(s),
        *floor_line(s),
        "",
        "## Final metrics",
        "",
        "| metric | value |",
        "|---|---|",
        *[f"| {k} | {metric_text(v)} |" for k, v in s["final"].items()],
        "",
        "## What crossed the boundary",
        "",
        *per_client_traffic(comm, s["clients"]),
    ]
    lines += ["", "| direction | kind | total bytes |", "|---|---|---|"]
    for direction in (UP, DOWN):
        for kind, size in comm[direction]["per_kind"].items():
            lines.append(f"| {direction} | {kind} | {size:,} ({human_bytes(size)}) |")
    if s["dropped_clients"]:
        lines += ["", "## Dropped clients", ""]
        lines += [f"- client {c}: {why}" for c, why in s["dropped_clients"].items()]
    lines += ["", f"Versions: {', '.join(f'{k} {v}' for k, v in s['versions'].items())}"]
    lines += [f"Machine: {machine.of_summary(s)}", ""]
    return "\n".join(lines)


def partition_text(part: dict[str, Any], *, brackets: bool) -> str:
    """The partitioner's name, with its alpha only where it draws with alpha: an iid or natural split
    ignores it, and "iid (alpha 0.5)" reads as a skewed one."""
    method, alpha = str(part["method"]), part["alpha"]
    if method not in DIRICHLET:
        return method
    return f"{method} (alpha {alpha})" if brackets else f"{method} alpha {alpha}"


def results_rows(summaries: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One row per run: its task's metric columns (`summary["columns"]`), the one-shot student as a fraction
    of its teachers' ensemble (when a run measured it), the local headline, traffic."""
    rows = []
    ceiling = any("fraction_of_ensemble" in s["final"] for s in summaries)
    floor = next((s for s in summaries if s.get("floor")), None)
    for s in summaries:
        comm = s["communication"]
        columns = [tuple(c) for c in s.get("columns") or CLASSIFICATION_COLUMNS]
        headline, _, style = columns[0]
        row = {"algorithm": s["algorithm"] + ("" if s["federated"] else " (pooled)")}
        row |= {title: metric_cell(s["final"], metric, style) for metric, title, style in columns}
        if ceiling:
            fraction = s["final"].get("fraction_of_ensemble")
            row["of ensemble"] = "-" if fraction is None else f"{fraction:.2f}"
        local_title = "local %" if style == "percent" else f"local {headline}"
        row[local_title] = _formatted(s["final"].get(f"local_{headline}"), style)
        row |= {
            "rounds": rounds_cell(s),
            "up": human_bytes(comm[UP]["total_bytes"]),
            "params up": human_bytes(comm[UP]["per_kind"].get("parameters", 0)),
            "time s": f"{s['wall_time_s']:.1f}",
        }
        rows.append(row)
    if floor is not None:  # the trivial predictor every row must beat, scored on the same test set
        rows.append(floor_row(floor, rows[0]))
    return rows


def rounds_cell(s: dict[str, Any]) -> str:
    """The planned rounds, or "done of planned" for a run that stopped early (summaries written before
    `rounds_done` was recorded show the planned rounds)."""
    done = s.get("rounds_done", s["rounds"])
    return str(s["rounds"]) if done == s["rounds"] else f"{done} of {s['rounds']}"


def floor_row(s: dict[str, Any], like: dict[str, str]) -> dict[str, str]:
    """The results table's row of a run's floor (its task's trivial predictor): the metric columns filled,
    the rest "-"."""
    columns = [tuple(c) for c in s.get("columns") or CLASSIFICATION_COLUMNS]
    cells = {title: metric_cell(s["floor"], metric, style) for metric, title, style in columns}
    return {key: s["floor"]["label"] if key == "algorithm" else cells.get(key, "-") for key in like}


def results_table(summaries: list[dict[str, Any]], title: str = "") -> Table:
    """The suite's results table for the terminal, one row per algorithm."""
    rows = results_rows(summaries)
    ran_on = machine.of_summaries(summaries) if summaries else None
    table = Table(title=title or None, caption=f"ran on: {ran_on}" if ran_on else None)
    for column in rows[0] if rows else []:
        table.add_column(column, justify="left" if column == "algorithm" else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row.values())
    return table


def results_markdown(summaries: list[dict[str, Any]]) -> str:
    """The suite's results table as Markdown, one row per algorithm; empty without summaries."""
    rows = results_rows(summaries)
    if not rows:
        return ""
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row.values()) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_suite_results(
    suite_dir: Path, summaries: list[dict[str, Any]], curves: dict[str, list[dict[str, Any]]]
) -> None:
    """Write a suite's results.md, results.json and the learning-curve plot of its headline metric."""
    first = summaries[0]
    # a pooled run (Centralized) trains one client: the suite's federation is a federated run's
    clients = next((s["clients"] for s in summaries if s["federated"]), first["clients"])
    text = (
        f"# Results: {first['dataset']}, {clients} client{'' if clients == 1 else 's'}, "
        f"{partition_text(first['partition'], brackets=False)}, seed {first['seed']}\n\n"
        + results_markdown(summaries)
        + f"\nRan on: {machine.of_summaries(summaries)}\n"
    )
    disk.write_text(suite_dir / "results.md", text)
    write_json(suite_dir / "results.json", summaries)
    (suite_dir / "plots").mkdir(exist_ok=True)
    headline = first.get("headline", "test_accuracy")
    kept = {s["algorithm"]: s.get("final", {}).get("selected_epoch") for s in summaries}
    plot_learning_curves(
        curves,
        suite_dir / "plots" / f"{headline}.png",
        title=first["dataset"],
        metrics=(headline,),
        selected=kept,
    )


def print_results(summaries: list[dict[str, Any]], title: str = "", console: Console | None = None) -> None:
    """Print the suite's results table; a console that is not a terminal is widened so no column is cut."""
    table = results_table(summaries, title)
    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and pipes: wide enough that no column is cut
            needed = Console(width=10_000).measure(table).maximum
            console = Console(width=max(120, needed))
    console.print(table)
