"""Variants of the digits demo's FedIOD settings, compared seed by seed on seeds of their own.

Each variant is a list of `--set` items on top of src/fedistill/engine/demo.toml; `base` (no item) is
always run. Every (cell, seed) runs every variant, so the table compares them in pairs: the mean student
test %, the mean difference to `base` on the same seeds with how many seeds went up and down, the
student as a fraction of its ensemble and FedIOD's wall time. `--fedavg` also runs FedAvg on the base
runs (the same partition, as `fedistill run` does), for the distance to it. Choose settings on seeds the
published grids do not use (those use 0-2), so they stay a clean check.

    python benchmarks/fediod_demo_variants.py --cells 10:0.5:3-11,10:0.1:3-6 \\
        --variant noise085=fediod.student_noise=0.85 --variant poolg=fediod.pool_generator_batch=true \\
        [--fedavg] [--jobs 2] [--tag NAME] [--reuse --runs-tag OTHER]
    python benchmarks/fediod_demo_variants.py --report results/sweeps/fediod_demo_variants_NAME.json

A variant is NAME=KEY=VALUE[;KEY=VALUE...]. Jobs go seed by seed, so a sweep cut short still holds
every variant of the seeds it reached. Every run is its own process at one torch thread. Writes
benchmarks/results/sweeps/fediod_demo_variants[_<tag>].{md,json} after every finished run. `--report` rewrites
the table of a results file (for example one from another machine).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from _common import RESULTS as ALL_RESULTS
from _common import add_seed_and_out, benchmark_parser
from fedistill.reproduce.demo_variants import parse_cells, parse_variants, run_variant, write

RESULTS = ALL_RESULTS / "sweeps"  # tuning sweeps, kept out of the results the docs are made from


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
        print("\n".join(write(RESULTS, path.stem, header, payload)))
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
        for future in as_completed([pool.submit(run_variant, args, *job) for job in jobs]):
            row = future.result()
            rows.append(row)
            write(RESULTS, stem, header, {"command": command, "runs": rows})
            result = f"{100 * row['test_accuracy']:.2f}%" if "error" not in row else row["error"]
            print(f"{time.time() - start:6.0f} s  {row['variant']} K={row['clients']} alpha={row['alpha']:g} "
                  f"seed {row['seed']}: {result}", flush=True)  # fmt: skip
    print("\n".join(write(RESULTS, stem, header, {"command": command, "runs": rows})))


if __name__ == "__main__":
    main()
