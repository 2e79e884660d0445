"""Record what one `fedistill run` command measured, so that a number a page quotes has a file behind it.

    python benchmarks/record_run.py NAME [--note TEXT] [--reuse] -- <fedistill run options>

Runs `fedistill run <options> --quiet` in a process of its own, its runs in OUT/NAME (`--out`,
`benchmarks/runs/recorded` by default), then writes benchmarks/results/recorded/NAME.{md,json}: the command, the
commit, the machine and its one-thread fp32 matmul rate, and for every algorithm of the run its headline metric
round by round, its final metrics, bytes in both directions and wall time. A page that quotes the numbers cites
the record.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import RESULTS, head_commit
from fediod_step_time import one_thread_gflops
from fedistill import disk
from fedistill.federation.ledger import DOWN, UP
from fedistill.machine import of_summaries
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.paths import RUNS
from fedistill.reproduce.reuse import kept
from fedistill.reproduce.tables import write_table

#: Options this script sets on the run itself: the record names where its runs went, not the user.
OWN_OPTIONS = ("--out", "--name", "--resume")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="the record's name (letters, digits, '-', '_', '.')")
    parser.add_argument("--note", default="", help="one line on what the run shows, written above the table")
    parser.add_argument("--out", default=str(RUNS / "recorded"), help="the run folder goes to OUT/NAME")
    parser.add_argument("--results", default=str(RESULTS / "recorded"), help="where NAME.{md,json} go")
    parser.add_argument(
        "--reuse", action="store_true", help="keep the run if it finished with the same options"
    )
    args = parser.parse_args(argv[:split])
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.name):
        parser.error(f"name {args.name!r}: use letters, digits, '-', '_' and '.'")
    args.run = argv[split + 1 :]
    if not args.run:
        parser.error("give the `fedistill run` options after `--`, e.g. -- --algorithm fedavg --rounds 3")
    clash = [o for o in args.run if o.split("=")[0] in OWN_OPTIONS]
    if clash:
        parser.error(f"{', '.join(clash)}: the record chooses where its run goes (use --out before `--`)")
    args.argv = argv
    return args


def run(args: argparse.Namespace) -> tuple[Path, str]:
    """The run's folder and the commit that ran it, after running it (or finding it done with the same
    options under `--reuse`, made by this code: one another code made is set aside, as `kept` does)."""
    folder = Path(args.out) / args.name
    given = folder / "record_options.json"
    done = json.loads(given.read_text()) if (folder / "results.json").is_file() and given.is_file() else {}
    if args.reuse and done.get("options") == args.run and kept(summary_paths(folder)):
        return folder, done["commit"]
    shutil.rmtree(folder, ignore_errors=True)  # `fedistill run` refuses to write over a run
    commit = head_commit()
    command = [sys.executable, "-m", "fedistill.cli", "run", *args.run, "--out", args.out, "--name", args.name,
               "--quiet"]  # fmt: skip
    if subprocess.run(command, check=False).returncode:  # the run printed why
        raise SystemExit(
            f"record_run.py: `fedistill run {' '.join(args.run)}` failed; its run is in {folder}"
        )
    disk.write_text(given, json.dumps({"options": args.run, "commit": commit}))
    return folder, commit


def summary_paths(folder: Path) -> list[Path]:
    """The summary.json of every algorithm the finished run in `folder` lists in its results.json."""
    return [
        folder / s["algorithm"] / "summary.json" for s in json.loads((folder / "results.json").read_text())
    ]


def rounds(run_dir: Path, headline: str) -> list[float]:
    """The headline metric at every round the run evaluated, in order."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [float(row[headline]) for row in rows if headline in row]


def algorithm_record(folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """One algorithm's numbers: headline by round, final metrics, bytes and time."""
    headline = summary.get("headline", "test_accuracy")
    traffic = summary["communication"]
    return {
        "algorithm": summary["algorithm"],
        "headline": headline,
        "by_round": rounds(folder / summary["algorithm"], headline),
        "final": summary["final"],
        "up_bytes": traffic[UP]["total_bytes"],
        "down_bytes": traffic[DOWN]["total_bytes"],
        "wall_time_s": summary["wall_time_s"],
    }


def shown(value: float, headline: str) -> str:
    """A headline value as the tables show it: accuracies and Dice in percent, the rest to four places."""
    percent = headline.endswith(("accuracy", "dice"))
    return f"{100 * value:.2f}" if percent else f"{value:.4f}"


def markdown(payload: dict[str, Any]) -> list[str]:
    lines = [f"# {payload['name']}", ""]
    if payload["note"]:
        lines += [payload["note"], ""]
    lines += [
        f"Command: `{payload['command']}` (commit `{payload['commit']}`), recorded with "
        f"`{payload['recorded_with']}`.",
        "",
        f"Machine: {payload['machine']}"
        + (
            f"; fp32 matmul {payload['matmul_peak_gflops']:.1f} GFLOP/s at one thread, measured when recorded."
            if "matmul_peak_gflops" in payload
            else "."
        ),
        "",
        "| algorithm | headline | final | local | by round | MB up / down | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for rec in payload["algorithms"]:
        headline, final = rec["headline"], rec["final"]
        spread = f" ± {shown(final[headline + '_std'], headline)}" if f"{headline}_std" in final else ""
        metric = headline.removeprefix("test_")
        local = final.get(f"local_{metric}")
        by_round = " ".join(shown(v, headline) for v in rec["by_round"]) or "-"
        lines.append(
            f"| {rec['algorithm']} | {metric} | {shown(final[headline], headline)}{spread} "
            f"| {'-' if local is None else shown(local, headline)} | {by_round} "
            f"| {rec['up_bytes'] / 1e6:.2f} / {rec['down_bytes'] / 1e6:.2f} | {rec['wall_time_s']:.1f} |"
        )
    lines += [
        "",
        "Accuracy and Dice in percent. `final`: the test metric (Standalone: the mean ± std of the sites' own "
        "models); `local`: each site's model on its own test share (where the method has one); `by round`: "
        "the test metric after each round. Every final metric is in the JSON beside this file.",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> Path:
    args = parse(sys.argv[1:] if argv is None else argv)
    folder, commit = run(args)
    summaries = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    payload = {
        "name": args.name,
        "note": args.note,
        "command": shlex.join(["fedistill", "run", *shown_arguments(args.run)]),  # no folder of this machine
        "recorded_with": shlex.join(["python", "benchmarks/record_run.py", *shown_arguments(args.argv)]),
        "commit": commit,
        "machine": of_summaries(summaries),
        "matmul_peak_gflops": one_thread_gflops(),  # the wall times' yardstick
        "algorithms": [algorithm_record(folder, s) for s in summaries],
    }
    path = write_table(args.results, args.name, markdown(payload), payload)
    print(path)
    return path


if __name__ == "__main__":
    main()
