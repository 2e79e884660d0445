"""Variants of the digits demo's FedIOD settings, compared seed by seed on seeds of their own.

Each variant is a list of `--set` items on top of the demo's config (`fedistill.engine`'s demo.toml);
`base` (no item) is always run. Every (cell, seed) runs every variant, so the table compares them in
pairs: the mean student test %, the mean difference to `base` on the same seeds with how many seeds went
up and down, the student as a fraction of its ensemble and FedIOD's wall time. FedAvg may run next to
the base runs (the same partition, as `fedistill run` does), for the distance to it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedistill.reproduce.launch import run_on_demo
from fedistill.reproduce.reuse import reusable
from fedistill.reproduce.tables import write_table


def parse_cells(text: str) -> list[tuple[int, str, list[int]]]:
    """`K:alpha:seeds` items, seeds as `3-11` or `0,1,2` joined by `+` (`10:0.5:3-11`)."""
    cells = []
    for item in text.split(","):
        try:
            k, alpha, seeds = item.split(":")
            float(alpha)
            chosen: list[int] = []
            for part in seeds.split("+"):
                low, _, high = part.partition("-")
                chosen += list(range(int(low), int(high or low) + 1))
        except ValueError:
            raise SystemExit(
                f"--cells {item!r}: expected K:alpha:seeds, e.g. 10:0.5:3-11 or 10:0.1:0+3-5"
            ) from None
        cells.append((int(k), alpha, chosen))
    return cells


def parse_variants(items: Sequence[str]) -> dict[str, list[str]]:
    """`NAME=KEY=VALUE[;KEY=VALUE...]` items, after `base` (no item)."""
    variants: dict[str, list[str]] = {"base": []}
    for item in items:
        name, _, sets = item.partition("=")
        if not sets:
            raise SystemExit(f"--variant {item!r}: expected NAME=KEY=VALUE[;KEY=VALUE...]")
        variants[name] = sets.split(";")
    return variants


def run_name(variant: str, k: int, alpha: str, seed: int, tag: str) -> str:
    """A run's folder name: variant, cell, seed and the sweep's tag."""
    return f"variant-{variant}-K{k}-alpha{alpha}-seed{seed}" + (f"-{tag}" if tag else "")


def run_variant(args: Any, variant: str, sets: list[str], k: int, alpha: str, seed: int) -> dict[str, Any]:
    """One (variant, cell, seed) run, or its finished run with `args.reuse`: its row, or its error. `args`
    gives `out`, `tag`, `runs_tag` (the run folders' suffix when not `tag`), `fedavg` and `reuse`."""
    name = run_name(variant, k, alpha, seed, args.tag if args.runs_tag is None else args.runs_tag)
    algorithms = "fediod,fedavg" if args.fedavg and variant == "base" else "fediod"
    row: dict[str, Any] = {"variant": variant, "clients": k, "alpha": float(alpha), "seed": seed}
    folder = Path(args.out) / name
    if not reusable(folder / "fediod" / "summary.json", args.reuse):
        error = run_on_demo(
            algorithms=algorithms, name=name, out=args.out, clients=k, alpha=alpha, seed=seed, sets=sets
        )
        if error is not None:
            return row | {"error": error}
    summary = json.loads((folder / "fediod" / "summary.json").read_text())
    final = summary["final"]
    row |= {
        "test_accuracy": final["test_accuracy"],
        "ensemble_accuracy": final["ensemble_accuracy"],
        "selected_epoch": final.get("selected_epoch"),
        "wall_time_s": summary["wall_time_s"],
    }
    fedavg = folder / "fedavg" / "summary.json"
    if fedavg.is_file():
        fedavg_summary = json.loads(fedavg.read_text())
        row["fedavg_accuracy"] = fedavg_summary["final"]["test_accuracy"]
        row["fedavg_wall_time_s"] = fedavg_summary["wall_time_s"]
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Every variant against `base` on the seeds both ran, then FedAvg's distance, then the failed runs."""
    done = [r for r in rows if "error" not in r]
    cells = sorted({(r["clients"], r["alpha"]) for r in done})
    lines = [
        "| K | alpha | variant | seeds | student % | vs base (same seeds) | up / down | of ensemble "
        "| FedIOD s | x FedAvg's time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for k, alpha in cells:
        here = [r for r in done if (r["clients"], r["alpha"]) == (k, alpha)]
        base = {r["seed"]: r for r in here if r["variant"] == "base"}
        # FedAvg's mean wall time over the base runs that ran it (older records have none)
        fedavg_times = [r["fedavg_wall_time_s"] for r in base.values() if "fedavg_wall_time_s" in r]
        fedavg_time = statistics.mean(fedavg_times) if fedavg_times else None
        for variant in dict.fromkeys(r["variant"] for r in here):
            runs = sorted((r for r in here if r["variant"] == variant), key=lambda r: r["seed"])
            paired = [(r, base[r["seed"]]) for r in runs if r["seed"] in base]
            diffs = [100 * (r["test_accuracy"] - b["test_accuracy"]) for r, b in paired]
            versus = f"{statistics.mean(diffs):+.2f} ({len(diffs)})" if diffs else "-"
            lines.append(
                f"| {k} | {alpha:g} | {variant} | {','.join(str(r['seed']) for r in runs)} "
                f"| {100 * statistics.mean(r['test_accuracy'] for r in runs):.2f} | {versus} "
                f"| {sum(d > 0 for d in diffs)} / {sum(d < 0 for d in diffs)} "
                f"| {statistics.mean(r['test_accuracy'] / r['ensemble_accuracy'] for r in runs):.4f} "
                f"| {statistics.mean(r['wall_time_s'] for r in runs):.0f} "
                f"| {_times(statistics.mean(r['wall_time_s'] for r in runs), fedavg_time)} |"
            )
        fedavg = [r for r in base.values() if "fedavg_accuracy" in r]
        if fedavg:
            fedavg_mean = 100 * statistics.mean(r["fedavg_accuracy"] for r in fedavg)
            seeds = ",".join(str(r["seed"]) for r in sorted(fedavg, key=lambda r: r["seed"]))
            took = "" if fedavg_time is None else f", FedAvg {fedavg_time:.0f} s a run"
            notes.append(
                f"K = {k}, alpha {alpha:g}: FedAvg {fedavg_mean:.2f}% "
                f"and the ensemble {100 * statistics.mean(r['ensemble_accuracy'] for r in fedavg):.2f}% "
                f"over the base runs' seeds {seeds}{took}."
            )
    failed = [f"- {r['variant']} K={r['clients']} alpha={r['alpha']:g} seed {r['seed']}: {r['error']}"
              for r in rows if "error" in r]  # fmt: skip
    return (
        lines + (["", *notes] if notes else []) + (["", "Runs that failed:", "", *failed] if failed else [])
    )


def _times(seconds: float, fedavg_seconds: float | None) -> str:
    """FedIOD's mean time as a multiple of FedAvg's in the same sweep, or "-" without FedAvg runs."""
    return "-" if not fedavg_seconds else f"{seconds / fedavg_seconds:.1f}x"


def write(folder: str | Path, stem: str, header: list[str], payload: dict[str, Any]) -> list[str]:
    """`<folder>/<stem>.{md,json}`: the header and the table of `payload["runs"]`; the Markdown's lines."""
    lines = [*header, *table(payload["runs"])]
    write_table(folder, stem, lines, payload)
    return lines
