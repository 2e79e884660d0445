"""The three demos as a new user runs them, each `fedistill run` in its own process at the default threads:
the digits main job (`make demo`), the segmentation demo and the reconstruction demo. Records what each
printed (its results table, as the terminal shows it), its process's wall time and peak memory, every
method's bytes in both directions, the machine and its matmul rate, in `benchmarks/results/demos.{md,json}`;
the README's demo block and the demos page are generated from that file
(`python -m fedistill.reference.results`).

    python benchmarks/demos.py [--demos digits,segmentation,reconstruction] [--out OUT] [--reuse]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from _common import RESULTS, head_commit
from fediod_step_time import matmul_peak_gflops
from fedistill import disk
from fedistill.engine.summary import results_markdown, results_table
from fedistill.federation.ledger import DOWN, UP
from fedistill.machine import joined, of_summaries
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.paths import RUNS
from fedistill.reproduce.tables import write_table

#: Each demo's `fedistill run` options (none: the main job, `make demo`).
DEMOS: dict[str, tuple[str, ...]] = {
    "digits": (),
    "segmentation": ("--config", "configs/demo-segmentation.toml"),
    "reconstruction": ("--config", "configs/demo-reconstruction.toml"),
}
#: Section markers of the record's tables, which the demos page includes (pymdownx.snippets sections).
TABLES_START, TABLES_END = "<!-- --8<-- [start:tables] -->", "<!-- --8<-- [end:tables] -->"


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--demos", default=",".join(DEMOS), help=f"comma list of {', '.join(DEMOS)}")
    parser.add_argument("--out", default=str(RUNS / "demos"), help="the demos' run folders: OUT/<demo>")
    parser.add_argument("--results", default=str(RESULTS), help="where demos.{md,json} go")
    parser.add_argument("--reuse", action="store_true", help="keep a demo whose runs finished (and timed)")
    args = parser.parse_args(argv)
    args.demos = [d.strip() for d in args.demos.split(",") if d.strip()]
    if not args.demos or any(d not in DEMOS for d in args.demos):
        parser.error(f"--demos takes {', '.join(DEMOS)}; got {args.demos}")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def run_demo(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One demo in a process of its own (unless `--reuse` finds it done); its record."""
    folder = Path(args.out) / name
    timing = folder / "process.json"
    if not (args.reuse and timing.is_file()):
        shutil.rmtree(folder, ignore_errors=True)  # `fedistill run` refuses to write over a run
        # and no stage-1 model from an earlier demo: a new user's first run trains its teachers
        shutil.rmtree(Path(args.out) / ".cache", ignore_errors=True)
        command = [sys.executable, "-m", "fedistill.cli", "run", *DEMOS[name], "--out", str(args.out),
                   "--name", name, "--quiet"]  # fmt: skip
        started = time.perf_counter()
        if subprocess.run(command, check=False).returncode:  # the run printed why
            raise SystemExit(f"demos.py: the {name} demo failed; its run is in {folder}")
        disk.write_text(timing, json.dumps({"process_s": time.perf_counter() - started}))
    summaries = json.loads((folder / "results.json").read_text(encoding="utf-8"))  # in the run's order
    return {
        "command": " ".join(["fedistill run", *DEMOS[name]]),
        "process_s": json.loads(timing.read_text(encoding="utf-8"))["process_s"],
        # MiB (2^20 bytes): the summaries' peak_memory_mb is ru_maxrss, in KiB, over 1024
        "peak_memory_mb": max(s["peak_memory_mb"] for s in summaries),
        "machine": of_summaries(summaries),
        "terminal": terminal(summaries),
        "table": results_markdown(summaries),
        "methods": {s["algorithm"]: method_facts(s) for s in summaries},
    }


def terminal(summaries: list[dict[str, Any]]) -> str:
    """The results table as the run printed it, wide enough that no column is cut."""
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(results_table(summaries))
    return console.export_text().rstrip() + "\n"


def method_facts(summary: dict[str, Any]) -> dict[str, Any]:
    """What the generated prose reads of one run: its headline, ceiling, bytes and time."""
    traffic = summary["communication"]
    return {
        "headline": summary.get("headline", "test_accuracy"),
        "final": summary["final"],
        "floor": summary.get("floor"),
        "up_bytes": traffic[UP]["total_bytes"],
        "all_bytes": traffic[UP]["total_bytes"] + traffic[DOWN]["total_bytes"],
        "wall_time_s": summary["wall_time_s"],
    }


def markdown(payload: dict[str, Any]) -> list[str]:
    lines = [
        "# The demos, as a new user runs them",
        "",
        f"Command: `{payload['command']}` (commit `{payload['commit']}`).",
        "",
        f"Machine: {payload['machine']}; fp32 matmul {payload['matmul_peak_gflops']:.1f} GFLOP/s at one thread "
        "(float kernels differ between CPUs: another moves the numbers a little, and its speed the times).",
        "",
        TABLES_START,
    ]
    for name, demo in payload["demos"].items():
        moved = ", ".join(f"{alg} {m['all_bytes'] / 1e6:.1f}" for alg, m in demo["methods"].items())
        lines += [
            f"**{name}** (`{demo['command']}`): {demo['process_s']:.1f} s from process start to exit, peak "
            f"{demo['peak_memory_mb']:.0f} MiB resident; MB both directions: {moved}.",
            "",
            demo["table"].rstrip(),
            "",
        ]
    lines += [TABLES_END]
    return lines


def main(argv: Sequence[str] | None = None) -> Path:
    args = parse(argv)
    torch.set_num_threads(1)
    gflops = matmul_peak_gflops()
    demos = {name: run_demo(name, args) for name in args.demos}
    payload = {
        "command": " ".join(["python benchmarks/demos.py", *shown_arguments(args.argv)]),
        "commit": head_commit(),
        "machine": joined(d["machine"] for d in demos.values()),
        "matmul_peak_gflops": gflops,
        "demos": demos,
    }
    path = write_table(args.results, "demos", markdown(payload), payload, indent=1)
    print(path)
    return path


if __name__ == "__main__":
    main()
