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

Next to them the table's Local Training and LG-FedAvg runs of the same cell (when present): the floor
FedMD-CG must clear and the plain head-averaging it builds on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedistill.engine.rundir import read_jsonl
from fedistill.reproduce.fedmdcg_table import cell_name, config_key, run_cell
from fedistill.reproduce.paths import CONFIGS, display_path
from fedistill.reproduce.tables import write_table

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
    config = CONFIGS / config_key(dataset, "fedmdcg", omega)
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
    """A run's local accuracy by round, its global oracle at the end and its wall time."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    oracle = summary.get("global_accuracy_oracle")
    return {
        "variant": label,
        "reference": reference,
        "omega": omega,
        "local_by_round": curve(run_dir),
        "global_oracle": None if oracle is None else 100 * oracle,
        "wall_time_s": summary["wall_time_s"],
        "run_dir": display_path(run_dir),
    }


def write_results(
    dataset: str, rows: list[dict[str, Any]], args: argparse.Namespace, command: str, skipped: list[str]
) -> None:
    """`<args.results>/fedmdcg_variants_<dataset>.{md,json,png}`: local accuracy at the rounds shown, the
    global oracle at the end, and the curves."""
    results = Path(args.results)
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
    payload = {"command": command, "dataset": dataset, "seed": args.seed, "rows": rows, "not_run": skipped}
    write_table(results, f"fedmdcg_variants_{dataset}", lines, payload)
    plot(rows, results / f"fedmdcg_variants_{dataset}.png", dataset)


def plot(rows: list[dict[str, Any]], path: Path, dataset: str) -> None:
    """Local accuracy against rounds, one panel per omega (the table's runs dashed)."""
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
