"""How far one seed of a segmentation table moves between CPUs: the same command run through three of this
host's kernel paths (its own, AVX2 and SSE4.1, chosen with `ATEN_CPU_CAPABILITY` and `ONEDNN_MAX_CPU_ISA`,
as `make test-kernels` does), each method's numbers side by side with their spread.

    python benchmarks/kernel_paths.py --name table2 -- --tables 2 --methods centralized,fedavg,fediod-default \\
        --threads 1 --seed 0

Everything after `--` goes to `benchmarks/segmentation_tables.py` (not `--out` or `--results`: each path
gets its own under `--out`). `--reuse` is passed on, so a path whose runs finished is only scored again,
under its own kernels. Writes `kernel_paths_<name>.{md,json}` under `--results`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.paths import RESULTS, RUNS
from fedistill.reproduce.segmentation_plan import LABELS
from fedistill.reproduce.segmentation_report import machines
from fedistill.reproduce.tables import write_table

HERE = Path(__file__).resolve().parent
#: Each path's environment; `native` is what torch picks on this host (its record names it).
PATHS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "sse41": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
#: The per-site metrics compared (those a table's rows hold), in percent except HD95 (pixels).
METRICS = {
    "dice": "Dice %",
    "sensitivity": "Sens. %",
    "hd95": "HD95 px",
    "real_dice_patient1": "real patient 1 Dice %",
    "real_dice_patient2": "real patient 2 Dice %",
    "object_dice": "object Dice %",
    "aji": "AJI %",
}


def parse(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    words = list(sys.argv[1:] if argv is None else argv)
    passed = words[words.index("--") + 1 :] if "--" in words else []
    own = words[: words.index("--")] if "--" in words else words
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True, help="the record's name: kernel_paths_<name>.{md,json}")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {', '.join(PATHS)}")
    parser.add_argument("--out", default=str(RUNS / "kernel-paths"), help="each path's runs: OUT/<path>")
    parser.add_argument("--results", default=str(RESULTS / "sweeps"), help="where the record goes")
    parser.add_argument("--reuse", action="store_true", help="keep each path's finished runs (scored again)")
    args = parser.parse_args(own)
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown or not args.paths:
        parser.error(f"--paths takes {', '.join(PATHS)}; got {args.paths}")
    if any(w.split("=")[0] in ("--out", "--results") for w in passed):
        parser.error("--out and --results are this script's: each path gets its own folders under --out")
    if not passed:
        parser.error("give segmentation_tables.py's arguments after --")
    args.own = own
    return args, passed


def run_path(path: str, passed: Sequence[str], args: argparse.Namespace) -> Path:
    """segmentation_tables.py under one path's kernels; the folder of the records it wrote."""
    folder = Path(args.out) / path
    results = folder / "results"
    command = [sys.executable, str(HERE / "segmentation_tables.py"), *passed, "--out", str(folder),
               "--results", str(results), *(["--reuse"] if args.reuse and "--reuse" not in passed else [])]  # fmt: skip
    print(f"kernel path {path}: {' '.join(command)}", flush=True)
    subprocess.run(command, env={**os.environ, **PATHS[path]}, check=True)
    return results


def compare(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method and metric: each path's value (mean over the sites' models) and the spread."""
    rows = []
    first = next(iter(records.values()))
    for method in first["rows"]:
        for key, label in METRICS.items():
            values = {}
            for path, record in records.items():
                sites = record["rows"].get(method, {}).get("sites", [])
                if sites and key in sites[0]:
                    scale = 1.0 if key.startswith("hd95") else 100.0
                    values[path] = float(np.mean([s[key] for s in sites])) * scale
            if len(values) == len(records):
                spread = max(values.values()) - min(values.values())
                rows.append(
                    {"method": method, "metric": key, "label": label, "values": values, "spread": spread}
                )
    return rows


def markdown(
    table: int, rows: list[dict[str, Any]], records: dict[str, dict[str, Any]], command: str
) -> list[str]:
    paths = list(records)
    lines = [
        f"# Table {table} through {len(paths)} kernel path(s) of one host: how far one seed moves between CPUs",
        "",
        f"Command: `{command}`",
        "",
        "Each path's runs and scoring ran under its own kernels (`native`: what torch picks on this host; "
        "`avx2`: `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`; `sse41`: `ATEN_CPU_CAPABILITY=default "
        "ONEDNN_MAX_CPU_ISA=SSE41`). Machines, as the runs' records name them:",
        "",
        *(f"- {p}: {machines(records[p]['rows'])}" for p in paths),
        "",
        f"| method | metric | {' | '.join(paths)} | spread |",
        "|---|---|" + "---|" * (len(paths) + 1),
    ]
    for r in rows:
        cells = " | ".join(f"{r['values'][p]:.2f}" for p in paths)
        lines.append(
            f"| {LABELS.get(r['method'], r['method'])} | {r['label']} | {cells} | {r['spread']:.2f} |"
        )
    lines += [
        "",
        "Spread: the largest minus the smallest of the paths. The code, data, seed and settings are the same in "
        "every column; only the float kernels' rounding differs, and training turns it into another run.",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    args, passed = parse(argv)
    folders = {path: run_path(path, passed, args) for path in args.paths}
    tables = sorted(
        int(p.stem.removeprefix("segmentation_table")) for p in folders[args.paths[0]].glob("*.json")
    )
    command = " ".join(["python benchmarks/kernel_paths.py", *shown_arguments(args.own), "--", *passed])
    payload: dict[str, Any] = {"command": command, "paths": {p: PATHS[p] for p in args.paths}, "tables": {}}
    lines: list[str] = []
    for table in tables:
        stem = f"segmentation_table{table}.json"
        records = {p: json.loads((folders[p] / stem).read_text(encoding="utf-8")) for p in args.paths}
        rows = compare(records)
        lines += [*([""] if lines else []), *markdown(table, rows, records, command)]
        payload["tables"][str(table)] = {
            "rows": rows,
            "machines": {p: machines(r["rows"]) for p, r in records.items()},
        }
    path = write_table(Path(args.results), f"kernel_paths_{args.name}", lines, payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
