"""Faults and bad inputs as a new user meets them: each case calls `fedistill` as a subprocess in its own
scratch folder and sets what it observed (exit code, stderr lines, a traceback, and for resume cases
whether the run ends with exactly the metrics of an uninterrupted one) against what the documentation
promises (docs/concepts/resume.md: a mistake exits 2 with one line, a stop exits 1 with one line, Ctrl-C
exits 130, a damaged or killed run resumes exactly). Tiny digits runs, one thread:

    nice -n 5 .venv/bin/python benchmarks/fault_battery.py [--only NAME,...] [--list] [--out DIR] [--keep]

Which stderr lines count is in fault_harness.py. The whole battery writes
benchmarks/results/fault_battery.{md,json} (scratch paths written as <tmp>); `--only` prints its rows
only. Exits 1 when a case differs from its promise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from _common import RESULTS
from fault_cases import CASES
from fault_harness import Case, Observed, Scratch
from fedistill import disk

AS_PROMISED = "as promised"


def differences(case: Case, seen: Observed) -> list[str]:
    """How `seen` falls short of the case's promise (empty: as promised)."""
    promise, found = case.promise, []
    if seen.exit_code != promise.exit_code:
        found.append(f"exit {seen.exit_code}, promised {promise.exit_code}")
    if promise.lines is not None and len(seen.kept) != promise.lines:
        found.append(f"{len(seen.kept)} stderr lines, promised {promise.lines}")
    if seen.traceback:
        found.append("a traceback")
    if promise.words and promise.words not in seen.stderr:
        found.append(f"stderr lacks '{promise.words}'")
    if promise.resume_equal and not seen.resume_equal:
        found.append("resumed metrics differ from the uninterrupted run")
    found += [f"{check}: no" for check, held in seen.checks.items() if not held]
    return found


def headline(lines: list[str]) -> str:
    """The line that says what went wrong (`fedistill...: error` / `run stopped` / `interrupted`), else the
    first one: argparse, for one, prints its usage before its error."""
    said = [line for line in lines if line.startswith("fedistill") and ":" in line]
    return (said or lines or [""])[0][:300]


def run_case(case: Case, root: Path) -> dict:
    """One case's row: promised and observed outcome, its message line and the verdict."""
    start = time.perf_counter()
    try:
        seen = case.run(Scratch(root, case.name))
    except Exception as error:  # the battery's own failure (a reference run that failed): say so, go on
        seen = Observed(None, "".join(traceback.format_exception_only(error)))
        seen.checks["the case could be set up"] = False
    if seen.not_run:
        verdict = f"not run here: {seen.not_run}"
    else:
        found = differences(case, seen)
        verdict = AS_PROMISED if not found else "differs: " + "; ".join(found)
    return {
        "case": case.name,
        "family": case.family,
        "does": case.does,
        "promised": case.promise.text(),
        "exit_code": seen.exit_code,
        "stderr_lines": len(seen.kept) if not seen.not_run else None,
        "traceback": seen.traceback,
        "resume_equal": seen.resume_equal,
        "checks": seen.checks,
        "message": headline(seen.kept),
        "message_lines": [line[:300] for line in seen.kept[:12]],
        "verdict": verdict,
        "seconds": round(time.perf_counter() - start, 1),
    }


def scrubbed(text: str, root: Path) -> str:
    for path in (str(root.resolve()), str(root)):
        text = text.replace(path, "<tmp>")
    return text


def observed_cell(row: dict) -> str:
    if row["verdict"].startswith("not run"):
        return "-"
    resume = {None: "-", True: "equal", False: "differs"}[row["resume_equal"]]
    return (
        f"exit {row['exit_code']} / {row['stderr_lines']} / {'yes' if row['traceback'] else 'no'} / {resume}"
    )


def write_results(rows: list[dict], argv: str, seconds: float) -> None:
    ran = [r for r in rows if not r["verdict"].startswith("not run")]
    good = sum(r["verdict"] == AS_PROMISED for r in ran)
    head = (
        f"`{argv}`: {good} as promised of {len(ran)} run ({len(rows) - len(ran)} not run here), "
        f"{seconds / 60:.1f} min"
    )
    payload = {"command": argv, "as_promised": good, "run": len(ran), "cases": len(rows), "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    disk.write_text(RESULTS / "fault_battery.json", json.dumps(payload, indent=1) + "\n")
    lines = [
        "# Fault battery",
        "",
        head + ".",
        "",
        "Each case runs `fedistill` as a subprocess on tiny digits runs in its own folder. Observed: exit"
        " code / stderr lines left after dropping log records (`INFO `, `WARNING `), Python warnings and"
        " progress bars / a traceback / a resumed run's metrics against an uninterrupted run's. The message"
        " column is the line that says what went wrong (all kept lines are in the JSON)."
        " Written by benchmarks/fault_battery.py.",
        "",
        "| case | family | does | promised | observed | verdict | message |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        message = r["message"].replace("|", "\\|")[:160] or "-"
        lines.append(
            f"| {r['case']} | {r['family']} | {r['does'].replace('|', '/')} | {r['promised']} | "
            f"{observed_cell(r)} | {r['verdict']} | {message} |"
        )
    disk.write_text(RESULTS / "fault_battery.md", "\n".join(lines) + "\n")


def chosen(only: str | None) -> list[Case]:
    if not only:
        return CASES
    names = only.split(",")
    unknown = sorted(set(names) - {c.name for c in CASES})
    if unknown:
        sys.exit(f"fault_battery: unknown case(s) {', '.join(unknown)}; see --list")
    return [c for c in CASES if c.name in names]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only these cases (comma-separated)")
    parser.add_argument("--list", action="store_true", help="print the cases and stop")
    parser.add_argument("--out", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders")
    args = parser.parse_args()
    if args.list:
        for c in CASES:
            print(f"{c.name:34} {c.family:15} {c.does}  ->  {c.promise.text()}")
        return 0
    root = (args.out or Path(tempfile.mkdtemp(prefix="fault-battery-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cases, start, rows = chosen(args.only), time.perf_counter(), []
    try:
        for case in cases:
            row = run_case(case, root)
            row = json.loads(scrubbed(json.dumps(row), root))  # no machine paths in the results
            rows.append(row)
            print(
                f"{row['case']:34} {observed_cell(row):34} {row['seconds']:6.1f} s  {row['verdict']}",
                flush=True,
            )
    finally:
        if not args.keep:  # what the battery made: a given --out keeps whatever else it held
            made = [root] if args.out is None else [root / c.name for c in cases] + [root / "_references"]
            for folder in made:
                shutil.rmtree(folder, ignore_errors=True)
    if not args.only:  # a few cases print their rows; only the whole battery replaces the results
        argv = " ".join(
            ["python benchmarks/fault_battery.py", *("<dir>" if "/" in a else a for a in sys.argv[1:])]
        )
        write_results(rows, argv, time.perf_counter() - start)
    return 1 if any(r["verdict"].startswith("differs") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
