"""FedIOD with heterogeneous clients: half the teachers one architecture, half another.

One-shot distillation into a student of a chosen architecture, against the Standalone mean (the
teachers' own test accuracy) from the same run. Stage 1 trains every teacher with its own model.

    python benchmarks/fediod_heterogeneous.py [--dataset fashion-mnist] [--alpha 0.1] \
        [--teachers resnet8,lenet5] [--student resnet8] [--epochs 10] [--iters 60] [--reuse]

Writes benchmarks/results/fediod_heterogeneous.{md,json}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, add_fediod_run_options, cell_name, fediod_budget_sets, fediod_parser, run_fediod
from fedistill import disk


def main() -> None:
    parser = fediod_parser(__doc__)
    parser.add_argument("--teachers", default="resnet8,lenet5", help="comma list, cycled over the clients")
    parser.add_argument("--student", default="resnet8")
    add_fediod_run_options(parser, reuse_help="keep a finished run of the same name")
    parser.add_argument("--tag", default="", help="suffix of the run name, to keep variants apart")
    args = parser.parse_args()
    run = f"heterogeneous-{cell_name(args)}{'-' + args.tag if args.tag else ''}"
    sets = [*args.set, f"fediod.teachers={args.teachers}", f"fediod.student={args.student}",
            *fediod_budget_sets(args)]  # fmt: skip
    summary = run_fediod(args, run, args.student, sets)
    final = summary["final"]
    row = {
        "dataset": args.dataset,
        "alpha": args.alpha,
        "teachers": args.teachers,
        "student": args.student,
        "settings": " ".join(args.set),
        "student_accuracy": final["test_accuracy"],
        "standalone_mean": final["teacher_mean_accuracy"],
        "standalone_std": final["teacher_std_accuracy"],
        "ensemble_accuracy": final["ensemble_accuracy"],
        "fraction_of_ensemble": final.get("fraction_of_ensemble"),
        "wall_time_s": summary["wall_time_s"],
        "command": f"python benchmarks/fediod_heterogeneous.py --dataset {args.dataset} --alpha {args.alpha:g} "
        f"--teachers {args.teachers} --student {args.student} --epochs {args.epochs} --iters {args.iters} "
        f"--teacher-epochs {args.teacher_epochs} --seed {args.seed}{''.join(' --set ' + s for s in args.set)}"
        f"{' --tag ' + args.tag if args.tag else ''}",
    }
    path = RESULTS / "fediod_heterogeneous.json"
    old = json.loads(path.read_text()) if path.is_file() else []
    old = old if isinstance(old, list) else [old]
    key = lambda r: (r["dataset"], r["alpha"], r["teachers"], r["student"], r.get("settings", ""))  # noqa: E731
    rows = [r for r in old if key(r) != key(row)] + [row]
    lines = [
        "# FedIOD with heterogeneous clients",
        "",
        "Teachers cycled over the K = 10 clients from the `teachers` list; each row's command is in the JSON.",
        "",
        "| dataset | alpha | teachers | student | settings | FedIOD student % | Standalone mean ± std % | ensemble % | of ensemble | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[f"| {r['dataset']} | {r['alpha']:g} | {r['teachers']} | {r['student']} | {r.get('settings', '')} | {100 * r['student_accuracy']:.2f} "
          f"| {100 * r['standalone_mean']:.2f} ± {100 * r['standalone_std']:.2f} | {100 * r['ensemble_accuracy']:.2f} "
          f"| {100 * (r['fraction_of_ensemble'] or 0):.0f}% | {r['wall_time_s']:.0f} |" for r in rows],
    ]  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    disk.write_text(RESULTS / "fediod_heterogeneous.md", "\n".join(lines) + "\n")
    disk.write_text(path, json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
