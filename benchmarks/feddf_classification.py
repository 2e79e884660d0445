"""FedDF against FedAvg, FedProx and FedAvgM (FedDF paper, Tables 1-2 style), and FedDF's
distillation-data ablation (its Figure 5 style).

Main table: K = 20 clients, a fraction C = 0.4 sampled per round, Dirichlet alpha in {1, 0.1}, the
same rounds, local epochs, model and partition for every method (one fedistill run per cell, so
every method sees the same partition and client samples). Reports the final test accuracy and the
number of rounds each method needs to reach a target accuracy fixed before the runs (TARGETS).
FedDF distils on unlabeled images of the *other* dataset (MNIST for Fashion-MNIST and the reverse).

    python benchmarks/feddf_classification.py [--datasets fashion-mnist,mnist] [--alphas 1,0.1] \
        [--rounds 30] [--seeds 0] [--reuse]

Ablation (`--ablation`): FedDF alone, one run per distillation source (`--sources`), e.g.
`dataset:mnist,noise,generator:benchmarks/runs/<fediod run>/fediod/models/generator.safetensors`.

Writes benchmarks/results/feddf_classification.{md,json} (or feddf_distillation_data.{md,json}).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from fedistill import disk
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.paths import DATA
from fedistill.reproduce.reuse import kept

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: test accuracy (%) whose first crossing counts as "rounds to target"; fixed before any run.
TARGETS = {
    ("fashion-mnist", 1.0): 80.0,
    ("fashion-mnist", 0.1): 65.0,
    ("mnist", 1.0): 97.0,
    ("mnist", 0.1): 90.0,
}
OTHER = {"fashion-mnist": "mnist", "mnist": "fashion-mnist"}
ALGORITHMS = "fedavg,fedprox,fedavgm,feddf"


def protocol(args: argparse.Namespace, dataset: str, alpha: float, seed: int) -> list[str]:
    return [
        "--dataset", dataset, "--data-dir", args.data_dir, "--clients", str(args.clients),
        "--alpha", f"{alpha:g}", "--model", args.model, "--rounds", str(args.rounds),
        "--local-epochs", str(args.local_epochs), "--batch-size", "32", "--lr", str(args.lr),
        "--seed", str(seed), "--set", f"fraction={args.fraction}", "--set", "eval_every=1",
        "--set", f"checkpoint_every={args.rounds}", "--set", f"feddf.steps={args.steps}",
        *[x for s in args.set for x in ("--set", s)],
    ]  # fmt: skip


def run(args: argparse.Namespace, name: str, algorithms: str, extra: list[str], cell: list[str]) -> Path:
    folder = Path(args.out) / name
    if not (args.reuse and kept(folder / a / "summary.json" for a in algorithms.split(","))):
        command = [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--algorithm", algorithms,
                   "--out", args.out, "--name", name, *cell, *extra]  # fmt: skip
        try:
            subprocess.run(command, check=True)
        except subprocess.CalledProcessError as error:  # its own message is printed above: no traceback
            raise SystemExit(
                f"fedistill run {name!r} failed with exit code {error.returncode} "
                "(a finished run of that name is kept with --reuse)"
            ) from None
    return folder


def curve(folder: Path, algorithm: str) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (folder / algorithm / "metrics.jsonl").read_text().splitlines()]
    return [(r["round"], 100 * r["test_accuracy"]) for r in rows if "test_accuracy" in r]


def rounds_to(points: list[tuple[int, float]], target: float) -> int | None:
    return next((r for r, acc in points if acc >= target), None)


def summarise(cells: list[dict]) -> dict:
    """Mean ± std over seeds of the final accuracy; rounds to target per seed."""
    finals = [c["final"] for c in cells]
    return {
        "final_mean": statistics.fmean(finals),
        "final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
        "best_mean": statistics.fmean(c["best"] for c in cells),
        "last5_mean": statistics.fmean(c["last5"] for c in cells),
        "rounds_to_target": [c["rounds_to_target"] for c in cells],
        "seeds": [c["seed"] for c in cells],
    }


def measure(folder: Path, algorithm: str, target: float, seed: int) -> dict:
    points = curve(folder, algorithm)
    summary = json.loads((folder / algorithm / "summary.json").read_text())
    return {
        "seed": seed,
        "final": 100 * summary["final"]["test_accuracy"],
        "best": max(acc for _, acc in points),
        "last5": statistics.fmean(acc for _, acc in points[-5:]),  # steadier than one round's value
        "rounds_to_target": rounds_to(points, target),
        "wall_time_s": summary["wall_time_s"],
        "curve": points,
    }


def fmt_rounds(values: list[int | None], rounds: int) -> str:
    return ", ".join(str(v) if v is not None else f">{rounds}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--datasets", default="fashion-mnist,mnist")
    parser.add_argument("--alphas", default="1,0.1")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--steps", type=int, default=500, help="FedDF distillation steps per round (max)")
    parser.add_argument("--ablation", action="store_true", help="FedDF alone, one run per --sources entry")
    parser.add_argument("--sources", default="", help="comma list of feddf.source values (ablation)")
    parser.add_argument("--out", default=str(HERE / "runs"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--reuse", action="store_true", help="keep finished runs of the same name")
    args = parser.parse_args()
    rows = []
    for dataset in args.datasets.split(","):
        for alpha in [float(a) for a in args.alphas.split(",")]:
            target = TARGETS.get((dataset, alpha), 0.0)
            variants = (
                [(f"feddf[{s}]", "feddf", s) for s in args.sources.split(",") if s]
                if args.ablation
                else [(a, a, f"dataset:{OTHER.get(dataset, 'mnist')}") for a in ALGORITHMS.split(",")]
            )
            per_variant: dict[str, list[dict]] = {label: [] for label, _, _ in variants}
            for seed in [int(s) for s in args.seeds.split(",")]:
                cell = protocol(args, dataset, alpha, seed)
                if args.ablation:
                    for label, algorithm, source in variants:
                        tag = (
                            source.replace(":", "-")
                            if source.startswith("dataset:")
                            else source.split(":")[0]
                        )
                        name = f"feddf-ablation-{dataset}-alpha{alpha:g}-seed{seed}-{tag}"
                        folder = run(args, name, algorithm, ["--set", f"feddf.source={source}"], cell)
                        per_variant[label].append(measure(folder, algorithm, target, seed))
                else:
                    source = variants[-1][2]
                    name = f"feddf-{dataset}-alpha{alpha:g}-seed{seed}"
                    folder = run(args, name, ALGORITHMS, ["--set", f"feddf.source={source}"], cell)
                    for label, algorithm, _ in variants:
                        per_variant[label].append(measure(folder, algorithm, target, seed))
            for label, cells in per_variant.items():
                rows.append({"dataset": dataset, "alpha": alpha, "method": label, "target": target,
                             **summarise(cells), "runs": cells})  # fmt: skip
    write(args, rows)


def write(args: argparse.Namespace, rows: list[dict]) -> None:
    stem = "feddf_distillation_data" if args.ablation else "feddf_classification"
    command = " ".join(["python benchmarks/feddf_classification.py", *shown_arguments(sys.argv[1:])])
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "data_dir", "reuse")}
    path = RESULTS / f"{stem}.json"
    key = lambda r: (r["dataset"], r["alpha"], r["method"])  # noqa: E731
    if path.is_file():  # keep rows of other cells measured by earlier invocations
        fresh = {key(r) for r in rows}
        rows = [r for r in json.loads(path.read_text())["rows"] if key(r) not in fresh] + rows
    disk.write_text(path, json.dumps({"command": command, "settings": settings, "rows": rows}, indent=2))
    lines = [
        "# FedDF " + ("distillation-data ablation" if args.ablation else "against FedAvg, FedProx, FedAvgM"),
        "",
        f"`{command}`",
        "",
        f"K = {args.clients}, C = {args.fraction}, {args.rounds} rounds x {args.local_epochs} local epoch(s), "
        f"{args.model}, SGD lr {args.lr}, batch 32; FedDF: up to {args.steps} distillation steps per round "
        "(Adam 1e-3, cosine, early stopping on the server's validation split). Test accuracy in %; "
        "rounds to target: the first round whose test accuracy reaches the target (one value per seed).",
        "",
        "| dataset | alpha | method | final (mean ± std) | mean of last 5 rounds | best | target "
        "| rounds to target | seeds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['alpha']:g} | {r['method']} | {r['final_mean']:.2f} ± {r['final_std']:.2f} "
            f"| {r.get('last5_mean', float('nan')):.2f} | {r['best_mean']:.2f} | {r['target']:g} | {fmt_rounds(r['rounds_to_target'], args.rounds)} "
            f"| {len(r['seeds'])} |"
        )
    disk.write_text(RESULTS / f"{stem}.md", "\n".join(lines) + "\n")
    plot_curves(rows + (main_table_references(rows) if args.ablation else []), RESULTS / f"{stem}.png")
    print("\n".join(lines))


def main_table_references(rows: list[dict]) -> list[dict]:
    """The main table's FedAvg and FedDF (other-dataset source) curves of the ablation's cells, to plot
    the ablation against."""
    path = RESULTS / "feddf_classification.json"
    if not path.is_file():
        return []
    cells = {(r["dataset"], r["alpha"]) for r in rows}
    labels = {"fedavg": "fedavg (main table)", "feddf": "feddf[dataset:other] (main table)"}
    return [
        {**r, "method": labels[r["method"]]}
        for r in json.loads(path.read_text())["rows"]
        if (r["dataset"], r["alpha"]) in cells and r["method"] in labels
    ]


def plot_curves(rows: list[dict], path: Path) -> None:
    """Test accuracy per round, one panel per (dataset, alpha), one line per method (first seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["dataset"], r["alpha"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells), 3.6), squeeze=False)
    for ax, (dataset, alpha) in zip(axes[0], cells, strict=True):
        for r in rows:
            if (r["dataset"], r["alpha"]) == (dataset, alpha):
                rounds, acc = zip(*r["runs"][0]["curve"], strict=True)
                label = re.sub(r"\[generator:.*\]", "[generator]", r["method"])  # a long path otherwise
                ax.plot(rounds, acc, label=label, linestyle="--" if "main table" in label else "-")
        ax.set(title=f"{dataset}, alpha {alpha:g}", xlabel="round", ylabel="test accuracy %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
