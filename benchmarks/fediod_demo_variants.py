"""Variants of the digits demo's FedIOD settings, compared seed by seed on seeds of their own.

Each variant is a list of `--set` items on top of src/fedistill/experiment/demo.toml; `base` (no item) is
always run. Every (cell, seed) runs every variant, so the table compares them in pairs: the mean student
test %, the mean difference to `base` on the same seeds with how many seeds went up and down, the
student as a fraction of its ensemble and FedIOD's wall time. `--fedavg` also runs FedAvg on the base
runs (the same partition, as `fedistill run` does), for the distance to it. Choose settings on seeds the
published grids do not use (those use 0-2), so they stay a clean check.

    python benchmarks/fediod_demo_variants.py --cells 10:0.5:3-11,10:0.1:3-6 \\
        --variant noise085=fediod.student_noise=0.85 --variant poolg=fediod.pool_generator_batch=true \\
        [--fedavg] [--jobs 2] [--tag NAME] [--reuse --runs-tag OTHER]
    python benchmarks/fediod_demo_variants.py --report results/fediod_demo_variants_NAME.json

A variant is NAME=KEY=VALUE[;KEY=VALUE...]. Jobs go seed by seed, so a sweep cut short still holds
every variant of the seeds it reached. Every run is its own process at one torch thread. Writes
benchmarks/results/fediod_demo_variants[_<tag>].{md,json} after every finished run. `--report` rewrites
the table of a results file (for example one from another machine).
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from _common import RESULTS, add_seed_and_out, benchmark_parser, run_on_demo


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


def parse_variants(items: list[str]) -> dict[str, list[str]]:
    variants: dict[str, list[str]] = {"base": []}
    for item in items:
        name, _, sets = item.partition("=")
        if not sets:
            raise SystemExit(f"--variant {item!r}: expected NAME=KEY=VALUE[;KEY=VALUE...]")
        variants[name] = sets.split(";")
    return variants


def run_name(variant: str, k: int, alpha: str, seed: int, tag: str) -> str:
    return f"variant-{variant}-K{k}-alpha{alpha}-seed{seed}" + (f"-{tag}" if tag else "")


def run(args: Any, variant: str, sets: list[str], k: int, alpha: str, seed: int) -> dict[str, Any]:
    name = run_name(variant, k, alpha, seed, args.tag if args.runs_tag is None else args.runs_tag)
    algorithms = "fediod,fedavg" if args.fedavg and variant == "base" else "fediod"
    row: dict[str, Any] = {"variant": variant, "clients": k, "alpha": float(alpha), "seed": seed}
    folder = Path(args.out) / name
    if not (args.reuse and (folder / "fediod" / "summary.json").is_file()):
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
        row["fedavg_accuracy"] = json.loads(fedavg.read_text())["final"]["test_accuracy"]
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    done = [r for r in rows if "error" not in r]
    cells = sorted({(r["clients"], r["alpha"]) for r in done})
    lines = [
        "| K | alpha | variant | seeds | student % | vs base (same seeds) | up / down | of ensemble | FedIOD s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for k, alpha in cells:
        here = [r for r in done if (r["clients"], r["alpha"]) == (k, alpha)]
        base = {r["seed"]: r for r in here if r["variant"] == "base"}
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
                f"| {statistics.mean(r['wall_time_s'] for r in runs):.0f} |"
            )
        fedavg = [r for r in base.values() if "fedavg_accuracy" in r]
        if fedavg:
            notes.append(
                f"K = {k}, alpha {alpha:g}: FedAvg {100 * statistics.mean(r['fedavg_accuracy'] for r in fedavg):.2f}% "
                f"and the ensemble {100 * statistics.mean(r['ensemble_accuracy'] for r in fedavg):.2f}% "
                f"over the base runs' seeds {','.join(str(r['seed']) for r in sorted(fedavg, key=lambda r: r['seed']))}."
            )
    failed = [f"- {r['variant']} K={r['clients']} alpha={r['alpha']:g} seed {r['seed']}: {r['error']}"
              for r in rows if "error" in r]  # fmt: skip
    return (
        lines + (["", *notes] if notes else []) + (["", "Runs that failed:", "", *failed] if failed else [])
    )


def write(stem: str, header: list[str], payload: dict[str, Any]) -> list[str]:
    lines = [*header, *table(payload["runs"])]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (RESULTS / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    return lines


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--cells", default="10:0.5:3-11", help="K:alpha:seeds items, comma-separated")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[;KEY=VALUE]")
    parser.add_argument("--fedavg", action="store_true", help="run FedAvg next to each base run")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    parser.add_argument("--tag", default="", help="suffix of the run folders and the result files")
    parser.add_argument("--runs-tag", default=None,
                        help="suffix of the run folders only (default: --tag): with --reuse, another sweep's "
                        "finished runs (its base runs) serve this one and its result files stay as they are")  # fmt: skip
    parser.add_argument("--report", default="", help="only rewrite the table of this results .json")
    add_seed_and_out(parser)
    args = parser.parse_args()
    if args.report:
        path = Path(args.report)
        if not path.is_file():
            parser.error(f"--report {path}: no such results file")
        payload = json.loads(path.read_text())
        header = [f"# FedIOD demo variants on their own seeds ({payload.get('where', 'this machine')})", "",
                  f"Command: `{payload['command']}`", ""]  # fmt: skip
        print("\n".join(write(path.stem, header, payload)))
        return
    if args.runs_tag is not None and not args.reuse:
        parser.error(
            "--runs-tag names another sweep's finished runs: add --reuse, or they would be run again"
        )
    cells, variants = parse_cells(args.cells), parse_variants(args.variant)
    command = (f"python benchmarks/fediod_demo_variants.py --cells {args.cells}"
               + "".join(f" --variant {v}" for v in args.variant) + (" --fedavg" if args.fedavg else "")
               + f" --jobs {args.jobs}" + (f" --tag {args.tag}" if args.tag else "")
               + (f" --runs-tag {args.runs_tag}" if args.runs_tag is not None else ""))  # fmt: skip
    stem = "fediod_demo_variants" + (f"_{args.tag}" if args.tag else "")
    header = ["# FedIOD demo variants on their own seeds", "", f"Command: `{command}`", ""]
    jobs = [(v, variants[v], k, a, s) for k, a, seeds in cells for s in seeds for v in variants]
    rows: list[dict[str, Any]] = []
    start = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in as_completed([pool.submit(run, args, *job) for job in jobs]):
            row = future.result()
            rows.append(row)
            write(stem, header, {"command": command, "runs": rows})
            result = f"{100 * row['test_accuracy']:.2f}%" if "error" not in row else row["error"]
            print(f"{time.time() - start:6.0f} s  {row['variant']} K={row['clients']} alpha={row['alpha']:g} "
                  f"seed {row['seed']}: {result}", flush=True)  # fmt: skip
    print("\n".join(write(stem, header, {"command": command, "runs": rows})))


if __name__ == "__main__":
    main()
