"""FedIOD with heterogeneous clients: half the teachers one architecture, half another.

One-shot distillation into a student of a chosen architecture, against the Standalone mean (the
teachers' own test accuracy) from the same run. Stage 1 trains every teacher with its own model.

    python benchmarks/fediod_heterogeneous.py [--dataset fashion-mnist] [--alpha 0.1] \
        [--teachers resnet8,lenet5] [--student resnet8] [--epochs 10] [--iters 60] [--reuse]

Writes benchmarks/results/fediod_heterogeneous.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=str(HERE.parents[1] / "shared" / "data"))
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--teachers", default="resnet8,lenet5", help="comma list, cycled over the clients")
    parser.add_argument("--student", default="resnet8")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--teacher-epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "runs"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--reuse", action="store_true", help="keep a finished run of the same name")
    parser.add_argument("--tag", default="", help="suffix of the run name, to keep variants apart")
    args = parser.parse_args()
    out = Path(args.out)
    run = f"heterogeneous-{args.dataset}-alpha{args.alpha:g}-seed{args.seed}{'-' + args.tag if args.tag else ''}"
    sets = [*args.set, f"fediod.teachers={args.teachers}", f"fediod.student={args.student}",
            f"fediod.teacher_epochs={args.teacher_epochs}", f"fediod.iters_per_epoch={args.iters}"]  # fmt: skip
    summary_path = out / run / "fediod" / "summary.json"
    if not (args.reuse and summary_path.is_file()):
        subprocess.run([sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--algorithm", "fediod",
                        "--dataset", args.dataset, "--data-dir", args.data_dir, "--clients", str(args.clients),
                        "--alpha", str(args.alpha), "--model", args.student, "--rounds", str(args.epochs),
                        "--seed", str(args.seed), "--out", str(out), "--name", run,
                        *[x for s in sets for x in ("--set", s)]], check=True)  # fmt: skip
    summary = json.loads(summary_path.read_text())
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
    (RESULTS / "fediod_heterogeneous.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
