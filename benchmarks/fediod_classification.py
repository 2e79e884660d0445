"""FedIOD against its baselines on MNIST / Fashion-MNIST (K = 10, Dirichlet alpha in {1, 0.1}).

For each dataset and alpha, on the same partition and seed:
  - FedIOD's student (selected on the clients' validation splits), with the teachers' mean
    (= Standalone) and the ensemble's accuracy (the one-shot ceiling) from the same run;
  - one-shot FedAvg: one round, each client trains `--teacher-epochs` epochs, one average;
  - FedAvg for `--fedavg-rounds` rounds in the foundation benchmark's protocol (20 local steps of
    batch 64 per round, SGD lr 0.05), and Centralized with the federation's 200 steps per round.

`--reuse` keeps any run of the same name that already finished (its summary.json exists).

    python benchmarks/fediod_classification.py --datasets fashion-mnist,mnist --alphas 1,0.1 \
        [--epochs 30] [--iters 50] [--teacher-epochs 30] [--fedavg-rounds 100] [--seed 0]

Writes benchmarks/results/fediod_classification.{md,json}. Every run is its own process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _common import PAPER_PRESET
from fedistill import disk
from fedistill.reproduce.paths import DATA
from fedistill.reproduce.reuse import kept

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def fedistill(args: list[str], run_dir: Path, reuse: bool) -> None:
    summaries = list(run_dir.glob("*/summary.json"))
    if reuse and summaries and kept(summaries):
        print(f"reusing {run_dir}", flush=True)
        return
    try:
        subprocess.run([sys.executable, "-m", "fedistill.cli", "run", "--quiet", *args], check=True)
    except subprocess.CalledProcessError as error:  # its own message is printed above: no traceback here
        raise SystemExit(
            f"fedistill run {run_dir.name!r} failed with exit code {error.returncode} "
            "(a finished run of that name is kept with --reuse)"
        ) from None


def summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--datasets", default="fashion-mnist,mnist")
    parser.add_argument("--alphas", default="1,0.1")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--epochs", type=int, default=30, help="FedIOD distillation epochs")
    parser.add_argument("--iters", type=int, default=50, help="generator steps per epoch")
    parser.add_argument("--teacher-epochs", type=int, default=30)
    parser.add_argument("--fedavg-rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "runs"))
    parser.add_argument("--reuse", action="store_true", help="keep finished runs of the same name")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra FedIOD config keys"
    )
    args = parser.parse_args()
    extra = [item for pair in args.set for item in ("--set", pair)]
    out = Path(args.out)
    rows = []
    for dataset in args.datasets.split(","):
        for alpha in (float(a) for a in args.alphas.split(",")):
            name = f"fediod-{dataset}-alpha{alpha:g}-seed{args.seed}"
            common = ["--dataset", dataset, "--data-dir", args.data_dir, "--clients", "10", "--partition", "dirichlet",
                      "--alpha", str(alpha), "--model", args.model, "--seed", str(args.seed), "--out", str(out)]  # fmt: skip
            fedistill([*common, "--algorithm", "fediod", "--rounds", str(args.epochs), "--name", name,
                       "--set", PAPER_PRESET, "--set", f"fediod.teacher_epochs={args.teacher_epochs}",
                       "--set", f"fediod.iters_per_epoch={args.iters}", *extra], out / name, args.reuse)  # fmt: skip
            fedistill([*common, "--algorithm", "fedavg", "--rounds", "1", "--local-epochs", str(args.teacher_epochs),
                       "--name", name + "-oneshot"], out / (name + "-oneshot"), args.reuse)  # fmt: skip
            steps = ["--batch-size", "64", "--lr", "0.05"]
            fedistill([*common, *steps, "--algorithm", "fedavg", "--rounds", str(args.fedavg_rounds),
                       "--local-steps", "20", "--name", name + "-fedavg-steps"],
                      out / (name + "-fedavg-steps"), args.reuse)  # fmt: skip
            fedistill([*common, *steps, "--algorithm", "centralized", "--rounds", str(args.fedavg_rounds),
                       "--local-steps", "200", "--name", name + "-central-steps"],
                      out / (name + "-central-steps"), args.reuse)  # fmt: skip
            fediod = summary(out / name / "fediod")
            final = fediod["final"]
            rows.append(
                {
                    "dataset": dataset,
                    "alpha": alpha,
                    "fediod": final["test_accuracy"],
                    "fediod_fraction_of_ensemble": final.get("fraction_of_ensemble"),
                    "standalone_mean": final["teacher_mean_accuracy"],
                    "standalone_std": final["teacher_std_accuracy"],
                    "ensemble": final["ensemble_accuracy"],
                    "oneshot_fedavg": summary(out / (name + "-oneshot") / "fedavg")["test_accuracy"],
                    "fedavg": summary(out / (name + "-fedavg-steps") / "fedavg")["test_accuracy"],
                    "fedavg_rounds": args.fedavg_rounds,
                    "centralized": summary(out / (name + "-central-steps") / "centralized")["test_accuracy"],
                    "fediod_wall_s": fediod["wall_time_s"],
                }
            )
            write(rows, args)


def merged(rows: list[dict], path: Path) -> list[dict]:
    """Earlier rows of other (dataset, alpha, seed) cells stay; this run's rows replace their own."""
    key = lambda r: (r["dataset"], r["alpha"], r.get("seed", 0))  # noqa: E731
    old = json.loads(path.read_text()) if path.is_file() else []
    mine = {key(r) for r in rows}
    return [r for r in old if key(r) not in mine] + rows


def write(rows: list[dict], args: argparse.Namespace) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = (
        f"python benchmarks/fediod_classification.py --datasets {args.datasets} --alphas {args.alphas} "
        f"--model {args.model} --epochs {args.epochs} --iters {args.iters} --teacher-epochs {args.teacher_epochs} "
        f"--fedavg-rounds {args.fedavg_rounds} --seed {args.seed}{''.join(' --set ' + s for s in args.set)}"
        f"{' --reuse' if args.reuse else ''}"
    )
    rows = merged(
        [{**r, "seed": args.seed, "command": command} for r in rows], RESULTS / "fediod_classification.json"
    )
    lines = [
        "# FedIOD on MNIST-family data",
        "",
        "Each row's command is in fediod_classification.json. K = 10 clients, Dirichlet alpha, 10% of each",
        "client's data held out for validation (FedIOD selects its student there, never on the test set).",
        "FedAvg: `fedavg_rounds` rounds x 20 local steps of batch 64 (the foundation benchmark's protocol);",
        "Centralized: the same number of rounds x 200 steps on the pooled data. 'of ensemble' = FedIOD's",
        "student as a fraction of its teachers' weighted ensemble (the one-shot ceiling).",
        "",
        "| dataset | alpha | FedIOD | of ensemble | Standalone mean ± std | ensemble (ceiling) | one-shot FedAvg | FedAvg (rounds) | Centralized | FedIOD wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['alpha']:g} | {100 * r['fediod']:.2f} | {100 * (r['fediod_fraction_of_ensemble'] or 0):.0f}% "
            f"| {100 * r['standalone_mean']:.2f} ± {100 * r['standalone_std']:.2f} | {100 * r['ensemble']:.2f} "
            f"| {100 * r['oneshot_fedavg']:.2f} | {100 * r['fedavg']:.2f} ({r.get('fedavg_rounds', '?')}) | {100 * r['centralized']:.2f} | {r['fediod_wall_s']:.0f} |"
        )
    disk.write_text(RESULTS / "fediod_classification.md", "\n".join(lines) + "\n")
    disk.write_text(RESULTS / "fediod_classification.json", json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
