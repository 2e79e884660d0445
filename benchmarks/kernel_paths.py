"""How far one seed of a segmentation table or a demo moves between CPUs: the same command run through
three of this host's kernel paths (its own, AVX2 and SSE4.1, chosen with `ATEN_CPU_CAPABILITY` and
`ONEDNN_MAX_CPU_ISA`, as `make test-kernels` does), each method's numbers side by side with their spread.

    python benchmarks/kernel_paths.py --name table2 -- --tables 2 --methods centralized,fedavg,fediod-default \\
        --threads 1 --seed 0
    python benchmarks/kernel_paths.py --name demos --script demos -- --demos digits

Everything after `--` goes to `--script` (`benchmarks/segmentation_tables.py`, or `benchmarks/demos.py`),
not `--out` or `--results`: each path gets its own folders under `--out`. `--reuse` is passed on, so a
path whose runs finished is only scored again, under its own kernels. Writes `kernel_paths_<name>.{md,json}`
under `--results`.
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
    parser.add_argument("--script", default="segmentation_tables", choices=sorted(SCRIPTS),
                        help="the benchmark run through each path (its arguments after --)")  # fmt: skip
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
    if not passed and args.script != "demos":
        parser.error(f"give {args.script}.py's arguments after --")
    args.own = own
    return args, passed


def path_environment(path: str) -> dict[str, str]:
    """This process's environment with the path's kernel choice, and none inherited: `native` is what torch
    picks, even when the command itself ran under a lowered path."""
    inherited = {
        k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    return {**inherited, **PATHS[path]}


def run_path(path: str, passed: Sequence[str], args: argparse.Namespace) -> Path:
    """The script under one path's kernels; the folder of the records it wrote."""
    folder = Path(args.out) / path
    results = folder / "results"
    command = [sys.executable, str(HERE / f"{args.script}.py"), *passed, "--out", str(folder),
               "--results", str(results), *(["--reuse"] if args.reuse and "--reuse" not in passed else [])]  # fmt: skip
    print(f"kernel path {path}: {' '.join(command)}", flush=True)
    if subprocess.run(command, env=path_environment(path), check=False).returncode:  # it printed why
        raise SystemExit(f"kernel_paths.py: {args.script}.py failed under the {path} path; see above")
    return results


def spread_row(method: str, metric: str, label: str, values: dict[str, float]) -> dict[str, Any]:
    return {"method": method, "metric": metric, "label": label, "values": values,
            "spread": max(values.values()) - min(values.values())}  # fmt: skip


def segmentation_sections(folders: dict[str, Path]) -> list[tuple[str, list[dict[str, Any]], dict[str, str]]]:
    """Per table: one row per method and metric, each path's value the mean over the sites' models."""
    sections = []
    first = next(iter(folders.values()))
    for stem in sorted(p.stem for p in first.glob("segmentation_table*.json")):
        records = {
            p: json.loads((f / f"{stem}.json").read_text(encoding="utf-8")) for p, f in folders.items()
        }
        rows = []
        for method in records[next(iter(records))]["rows"]:
            for key, label in METRICS.items():
                values = {}
                for path, record in records.items():
                    sites = record["rows"].get(method, {}).get("sites", [])
                    if sites and key in sites[0]:
                        scale = 1.0 if key.startswith("hd95") else 100.0
                        values[path] = float(np.mean([s[key] for s in sites])) * scale
                if len(values) == len(records):
                    rows.append(spread_row(LABELS.get(method, method), key, label, values))
        title = f"Table {stem.removeprefix('segmentation_table')}"
        sections.append((title, rows, {p: machines(r["rows"]) for p, r in records.items()}))
    return sections


def demos_sections(folders: dict[str, Path]) -> list[tuple[str, list[dict[str, Any]], dict[str, str]]]:
    """Per demo: each method's headline and run time, and FedIOD's time over FedAvg's."""
    records = {p: json.loads((f / "demos.json").read_text(encoding="utf-8")) for p, f in folders.items()}
    sections = []
    for name in records[next(iter(records))]["demos"]:
        demos = {p: r["demos"][name] for p, r in records.items()}
        rows = []
        for method in next(iter(demos.values()))["methods"]:
            found = {p: d["methods"][method] for p, d in demos.items()}
            headline = next(iter(found.values()))["headline"]
            scale = 1.0 if headline.endswith(("ssim", "psnr")) else 100.0
            rows.append(spread_row(method, headline, headline.removeprefix("test_"),
                                   {p: m["final"][headline] * scale for p, m in found.items()}))  # fmt: skip
            rows.append(
                spread_row(method, "wall_time_s", "run s", {p: m["wall_time_s"] for p, m in found.items()})
            )
        if all({"fediod", "fedavg"} <= set(d["methods"]) for d in demos.values()):
            ratio = {p: d["methods"]["fediod"]["wall_time_s"] / d["methods"]["fedavg"]["wall_time_s"]
                     for p, d in demos.items()}  # fmt: skip
            rows.append(spread_row("fediod / fedavg", "time_ratio", "run time ratio", ratio))
        sections.append((f"The {name} demo", rows, {p: d["machine"] for p, d in demos.items()}))
    return sections


#: What each script's records are read as: sections of rows compared across the paths.
SCRIPTS = {"segmentation_tables": segmentation_sections, "demos": demos_sections}


def markdown(title: str, rows: list[dict[str, Any]], ran_on: dict[str, str], command: str) -> list[str]:
    paths = list(ran_on)
    lines = [
        f"# {title} through {len(paths)} kernel path(s) of one host: how far one seed moves between CPUs",
        "",
        f"Command: `{command}`",
        "",
        "Each path's runs and scoring ran under its own kernels (`native`: what torch picks on this host; "
        "`avx2`: `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`; `sse41`: `ATEN_CPU_CAPABILITY=default "
        "ONEDNN_MAX_CPU_ISA=SSE41`). Machines, as the runs' records name them:",
        "",
        *(f"- {p}: {line}" for p, line in ran_on.items()),
        "",
        f"| method | metric | {' | '.join(paths)} | spread |",
        "|---|---|" + "---|" * (len(paths) + 1),
    ]
    for r in rows:
        cells = " | ".join(f"{r['values'][p]:.{digits(r)}f}" for p in paths)
        lines.append(f"| {r['method']} | {r['label']} | {cells} | {r['spread']:.{digits(r)}f} |")
    lines += [
        "",
        "Spread: the largest minus the smallest of the paths. The code, data, seed and settings are the same in "
        "every column; only the float kernels' rounding differs, and training turns it into another run "
        "(times also differ with each path's speed: SSE4.1 runs without the wide vector units).",
    ]
    return lines


def digits(row: dict[str, Any]) -> int:
    return 4 if row["metric"].endswith("ssim") else 2


def main(argv: Sequence[str] | None = None) -> None:
    args, passed = parse(argv)
    folders = {path: run_path(path, passed, args) for path in args.paths}
    command = " ".join(["python benchmarks/kernel_paths.py", *shown_arguments(args.own), "--", *passed])
    payload: dict[str, Any] = {"command": command, "paths": {p: PATHS[p] for p in args.paths}, "sections": {}}
    lines: list[str] = []
    for title, rows, ran_on in SCRIPTS[args.script](folders):
        lines += [*([""] if lines else []), *markdown(title, rows, ran_on, command)]
        payload["sections"][title] = {"rows": rows, "machines": ran_on}
    path = write_table(Path(args.results), f"kernel_paths_{args.name}", lines, payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
