"""Where FedMD-CG's local accuracy goes: its table config next to variants of it, round by round.

Each variant is the FedMD-CG cell's ready config (configs/fedmdcg-table/, the same protocol as the
table: K = 10, balanced Dirichlet, 100 rounds of 20 SGD steps) run with a few `--set` overrides:

* ``paper``: the config as it is (its run is the table's own cell, reused when it is there);
* ``official-code``: ``fedmdcg.preset=official-code``, the released code's deviations (uniform noise,
  the never-cleared batch cache, label counts from that cache, the softmax in the server's L3);
* ``no-server-kd``: ``fedmdcg.server_distillation=false``, the server only averages the classifiers
  and generators (the crossed distillation is skipped; the clients' terms stay as they are);
* ``no-server-wd``: ``fedmdcg.server_weight_decay=0``; the code's Adam weight decay 1e-4 on the server
  is L2 added to the gradient, and the crossed-distillation gradients are so small that it dominates:
  Adam's normalised steps then shrink the global classifier every round;
* ``no-ramp``: ``fedmdcg.ramp=none``, the clients' distillation weights at full strength from round 2.

    python benchmarks/fedmdcg_variants.py --dataset fashion-mnist --omegas 1,10 \\
        --variants paper,official-code,no-server-kd --reuse

Next to them the table's Local Training and LG-FedAvg runs of the same cell (when present): the
floor FedMD-CG must clear and the plain head-averaging it builds on. Writes
<results>/fedmdcg_variants_<dataset>.{md,json,png}: local accuracy at rounds 5, 10, 25, 50 and 100,
the global-accuracy oracle at the end, and the local-accuracy curves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import benchmark_parser
from fedistill.experiment.rundir import read_jsonl
from fedmdcg_table import LABELS, ROOT, cell_name, config_key, run_cell

HERE = Path(__file__).resolve().parent
VARIANTS: dict[str, list[str]] = {
    "paper": [],
    "official-code": ["fedmdcg.preset=official-code"],
    "no-server-kd": ["fedmdcg.server_distillation=false"],
    "no-server-wd": ["fedmdcg.server_weight_decay=0"],
    "no-ramp": ["fedmdcg.ramp=none"],
}
REFERENCES = ("standalone", "lgfedavg")  # the table's runs drawn next to the variants
ROUNDS_SHOWN = (5, 10, 25, 50, 100)


def run_name(dataset: str, method: str, omega: float, seed: int, variant: str = "paper") -> str:
    """The table's run name for ``paper`` (so its cell is reused), with the variant appended otherwise."""
    return cell_name(dataset, method, omega, seed, 100, "" if variant == "paper" else variant)


def run_variant(dataset: str, omega: float, seed: int, variant: str, args: argparse.Namespace) -> Path:
    """Run (or reuse) one variant of the FedMD-CG cell; returns the algorithm's run directory."""
    config = ROOT / "configs" / config_key(dataset, "fedmdcg", omega)
    suffix = "" if variant == "paper" else variant
    return run_cell(config, dataset, "fedmdcg", omega, seed, args, variant=suffix, sets=VARIANTS[variant])


def curve(run_dir: Path) -> dict[int, float]:
    """Local accuracy (%) at every evaluated round of a run."""
    return {
        r["round"]: 100 * r["local_accuracy"]
        for r in read_jsonl(run_dir / "metrics.jsonl")
        if "local_accuracy" in r
    }


def row(label: str, omega: float, run_dir: Path, reference: bool = False) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    oracle = summary.get("global_accuracy_oracle")
    return {
        "variant": label,
        "reference": reference,
        "omega": omega,
        "local_by_round": curve(run_dir),
        "global_oracle": None if oracle is None else 100 * oracle,
        "wall_time_s": summary["wall_time_s"],
        "run_dir": os.path.relpath(run_dir, ROOT),
    }


def write_results(
    dataset: str, rows: list[dict[str, Any]], args: argparse.Namespace, command: str, skipped: list[str]
) -> None:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    head = " | ".join(f"local r{r}" for r in ROUNDS_SHOWN)
    lines = [
        f"# FedMD-CG variants: {dataset}, seed {args.seed}",
        "",
        f"Command: `{command}` (each run a separate `fedistill run` process).",
        "",
        "Local accuracy (%): each client's model on its IID 1/K test shard, sample-weighted, at the given "
        "round. Global: the evaluation-only oracle (the average of the full local models) at round 100.",
        "",
        f"| omega | run | {head} | global r100 | wall s |",
        "|---|---|" + "---|" * len(ROUNDS_SHOWN) + "---|---|",
    ]
    for r in rows:
        cells = " | ".join(
            f"{r['local_by_round'][n]:.2f}" if n in r["local_by_round"] else "-" for n in ROUNDS_SHOWN
        )
        glob = "-" if r["global_oracle"] is None else f"{r['global_oracle']:.2f}"
        lines.append(f"| {r['omega']:g} | {r['variant']} | {cells} | {glob} | {r['wall_time_s']:.0f} |")
    if skipped:
        lines += ["", "Not run (`--finished-only`): " + ", ".join(skipped) + "."]
    stem = results / f"fedmdcg_variants_{dataset}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    payload = {"command": command, "dataset": dataset, "seed": args.seed, "rows": rows, "not_run": skipped}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    plot(rows, stem.with_suffix(".png"), dataset)


def plot(rows: list[dict[str, Any]], path: Path, dataset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    omegas = sorted({r["omega"] for r in rows}, reverse=True)
    colors = {label: f"C{i}" for i, label in enumerate(dict.fromkeys(r["variant"] for r in rows))}
    fig, axes = plt.subplots(1, len(omegas), figsize=(5.5 * len(omegas), 4), squeeze=False)
    for ax, omega in zip(axes[0], omegas, strict=True):
        for r in (r for r in rows if r["omega"] == omega):
            rounds = sorted(r["local_by_round"])
            style = "--" if r["reference"] else "-"
            curve = [r["local_by_round"][n] for n in rounds]
            ax.plot(rounds, curve, style, color=colors[r["variant"]], label=r["variant"])
        ax.set(title=f"{dataset}, omega {omega:g}", xlabel="round", ylabel="local accuracy %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--omegas", default="1,10")
    parser.add_argument("--variants", default="paper,official-code,no-server-kd")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    parser.add_argument("--reuse", action="store_true", help="keep finished runs, resume interrupted ones")
    parser.add_argument(
        "--finished-only", action="store_true", help="start no run: report the finished variants only"
    )
    parser.add_argument("--out", default=str(HERE / "runs" / "fedmdcg-table"), help="run directories")
    parser.add_argument("--results", default=str(HERE / "results"), help="where the tables are written")
    args = parser.parse_args()
    args.rounds = 100  # the table's length: run_cell names and runs cells by it
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    try:
        omegas = [float(w) for w in args.omegas.split(",")]
    except ValueError:
        parser.error(f"--omegas must be a comma list of numbers, got {args.omegas!r}")
    for omega in omegas:
        if not (ROOT / "configs" / config_key(args.dataset, "fedmdcg", omega)).is_file():
            parser.error(
                f"no FedMD-CG config for {args.dataset} at omega {omega:g} under configs/fedmdcg-table/"
            )
    command = (
        f"python benchmarks/fedmdcg_variants.py --dataset {args.dataset} --omegas {args.omegas} "
        f"--variants {','.join(variants)} --seed {args.seed}"
        + (" --reuse" if args.reuse else "")
        + (" --finished-only" if args.finished_only else "")
    )
    rows, skipped = [], []
    for omega in omegas:
        for variant in variants:
            name = run_name(args.dataset, "fedmdcg", omega, args.seed, variant)
            if args.finished_only and not (Path(args.out) / name / "fedmdcg" / "summary.json").is_file():
                skipped.append(f"{variant} at omega {omega:g}")
                continue
            rows.append(row(variant, omega, run_variant(args.dataset, omega, args.seed, variant, args)))
        for method in REFERENCES:
            ref = Path(args.out) / run_name(args.dataset, method, omega, args.seed) / method
            if (ref / "summary.json").is_file():
                rows.append(row(f"{LABELS[method]} (table)", omega, ref, reference=True))
    write_results(args.dataset, rows, args, command, skipped)
    print((Path(args.results) / f"fedmdcg_variants_{args.dataset}.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
