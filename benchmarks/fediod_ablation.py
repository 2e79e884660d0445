"""FedIOD's Table 6 ablation: the full method, then each component switched off in turn.

Same data, partition, seed and budget for every row; each row is one `fedistill run` process.

    python benchmarks/fediod_ablation.py [--dataset fashion-mnist] [--alpha 0.1] [--epochs 10] [--iters 60]
        [--set fediod.generator_width=32 ...]

Writes benchmarks/results/fediod_ablation_<dataset>.{md,json}. The full-method row has the run name
fediod_classification.py gives the same cell, so with `--reuse` (keep finished runs of the same name)
and the same settings that run is not repeated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, add_fediod_run_options, cell_name, fediod_budget_sets, fediod_parser, run_fediod
from fedistill import disk

#: (row name, the switches that turn one component off) — Table 6's columns.
ROWS = [
    ("full method", []),
    ("L_gan plain average (not pi-weighted)", ["fediod.gan_weighting=average"]),
    ("tau = 1 KL instead of logit L2", ["fediod.mimic=kl", "fediod.tau=1.0"]),
    ("plain ensemble weighting (not Eq. 8)", ["fediod.ensemble_weighting=uniform"]),
    ("no L_conf", ["fediod.use_conf=false"]),
    ("no L_unique", ["fediod.use_unique=false"]),
]


def main() -> None:
    parser = fediod_parser(__doc__)
    parser.add_argument("--model", default="lenet5")
    add_fediod_run_options(parser, reuse_help="keep finished runs of the same name")
    args = parser.parse_args()
    results = []
    for index, (name, switches) in enumerate(ROWS):
        cell = cell_name(args)
        run = f"fediod-{cell}" if not switches else f"ablation-{cell}-{index}"
        summary = run_fediod(args, run, args.model, [*args.set, *fediod_budget_sets(args), *switches])
        final = summary["final"]
        results.append({"row": name, "switches": switches, "run": run, "test_accuracy": final["test_accuracy"],
                        "ensemble_accuracy": final["ensemble_accuracy"],
                        "fraction_of_ensemble": final.get("fraction_of_ensemble"),
                        "teacher_mean_accuracy": final["teacher_mean_accuracy"],
                        "wall_time_s": summary["wall_time_s"]})  # fmt: skip
        write(results, args)


def write(results: list[dict], args: argparse.Namespace) -> None:
    lines = [
        f"# FedIOD ablation (Table 6 style): {args.dataset}, K = {args.clients}, alpha = {args.alpha:g}",
        "",
        f"Command: `python benchmarks/fediod_ablation.py --dataset {args.dataset} --alpha {args.alpha:g} "
        f"--epochs {args.epochs} --iters {args.iters} --teacher-epochs {args.teacher_epochs} --seed {args.seed}"
        f"{''.join(' --set ' + s for s in args.set)}`",
        "",
        "Every row: same partition, seed and budget; stage 1 is seeded per client, but a different torch",
        "thread count changes float rounding, so compare the teacher-mean and ensemble columns too. The",
        "student is selected on the clients' validation splits; 'of ensemble' = student / its ensemble.",
        "",
        "| variant | switches | student test % | of ensemble | ensemble % | teacher mean % | wall s |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {r['row']} | {' '.join(r['switches']) or '-'} | {100 * r['test_accuracy']:.2f} "
            f"| {100 * (r['fraction_of_ensemble'] or 0):.0f}% | {100 * r['ensemble_accuracy']:.2f} "
            f"| {100 * r['teacher_mean_accuracy']:.2f} | {r['wall_time_s']:.0f} |"
            for r in results
        ],
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    disk.write_text(RESULTS / f"fediod_ablation_{args.dataset}.md", "\n".join(lines) + "\n")
    disk.write_text(RESULTS / f"fediod_ablation_{args.dataset}.json", json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
