"""FedIOD's privacy-utility trade-off (the paper's Table 5 style): the student's accuracy without DP
and with each client's budget capped at a target epsilon.

Each DP row calibrates every client's noise multiplier up front for the planned number of D-steps
(`fediod.dp_target_epsilon`), clips and noises every per-sample input-gradient a client returns and
accounts the D-steps' use of real data per client (see `fedistill.algorithms.fediod`). Same data,
partition, seed and budget for every row; each row is one `fedistill run` process.

    python benchmarks/fediod_privacy_utility.py [--dataset fashion-mnist] [--alpha 0.1] \
        [--epsilons 3.5,6.0,7.7,10.0] [--epochs 10] [--iters 60] [--set fediod.generator_width=32 ...]

Writes benchmarks/results/fediod_privacy_utility_<dataset>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, add_fediod_run_options, cell_name, fediod_budget_sets, fediod_parser, run_fediod
from fedistill import disk
from fedistill.reproduce.arguments import shown_arguments


def main() -> None:
    parser = fediod_parser(__doc__)
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--epsilons", default="3.5,6.0,7.7,10.0")
    parser.add_argument("--delta", type=float, default=1e-5)
    add_fediod_run_options(parser, reuse_help="keep finished runs of the same name")
    args = parser.parse_args()
    rows = [("no DP", None)] + [(f"epsilon {float(e):g}", float(e)) for e in args.epsilons.split(",")]
    results = []
    for label, epsilon in rows:
        run = f"privacy-{cell_name(args)}-" + ("nodp" if epsilon is None else f"eps{epsilon:g}")
        dp = [] if epsilon is None else ["fediod.dp_enabled=true", f"fediod.dp_target_epsilon={epsilon}",
                                         f"fediod.dp_delta={args.delta}"]  # fmt: skip
        summary = run_fediod(args, run, args.model, [*args.set, *fediod_budget_sets(args), *dp])
        final = summary["final"]
        results.append({
            "row": label,
            "target_epsilon": epsilon,
            "test_accuracy": final["test_accuracy"],
            "ensemble_accuracy": final.get("ensemble_accuracy"),
            "epsilon_max": final.get("epsilon_max"),
            "epsilons": {k: v for k, v in final.items() if k.startswith("epsilon_client_")},
            "stopped": summary.get("stopped"),
            "wall_time_s": summary["wall_time_s"],
            "run": run,
        })  # fmt: skip
        write(results, args)


def write(results: list[dict], args: argparse.Namespace) -> None:
    command = " ".join(["python benchmarks/fediod_privacy_utility.py", *shown_arguments(sys.argv[1:])])
    lines = [
        f"# FedIOD privacy-utility (Table 5 style): {args.dataset}, K = {args.clients}, alpha = {args.alpha:g}",
        "",
        f"Command: `{command}`",
        "",
        f"delta = {args.delta:g}; epsilon = the largest of the clients' epsilons (each client accounts its own",
        "D-steps, sample rate = real batch / its data size). Student selected on the clients' validation splits.",
        "",
        "| row | target epsilon | max client epsilon | student test % | ensemble % | stopped early | wall s |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {r['row']} | {'-' if r['target_epsilon'] is None else format(r['target_epsilon'], 'g')} "
            f"| {'-' if r['epsilon_max'] is None else format(r['epsilon_max'], '.2f')} "
            f"| {100 * r['test_accuracy']:.2f} | {100 * (r['ensemble_accuracy'] or 0):.2f} "
            f"| {r['stopped'] or 'no'} | {r['wall_time_s']:.0f} |"
            for r in results
        ],
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"fediod_privacy_utility_{args.dataset}"
    disk.write_text(stem.with_suffix(".md"), "\n".join(lines) + "\n")
    disk.write_text(
        stem.with_suffix(".json"), json.dumps({"command": command, "rows": results}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
