"""FedIOD's time to quality: its validated student against wall time and generator steps, next to
FedAvg's test accuracy against wall time on the same partition (one run each, same seed).

For each dataset and alpha (K clients, Dirichlet partition): one FedIOD run and one FedAvg run, each
its own `fedistill run` process. From their metrics.jsonl and summaries:
  - FedIOD's *validated* student at epoch r: the test accuracy of the student the clients' validation
    splits rate best among epochs 1..r (what `selection = "validation"` would hand over if the run
    stopped there, by the engine's own rule `keep_if_best`: a tie goes to the later epoch), as a fraction
    of the teachers' weighted ensemble (the one-shot ceiling);
  - the wall time at epoch r: stage 1 and set-up (the run's wall time less its epochs; stage 1 always
    trains, the stage-1 cache is off) plus the epochs so far, so it over-counts by the final
    evaluation;
  - the wall time and G-steps to reach 0.90 and 0.95 of the ensemble ("-": not reached);
  - FedAvg's test accuracy against its own wall time, and when it first reaches FedIOD's final
    validated accuracy.

    python benchmarks/fediod_time_to_quality.py --datasets fashion-mnist,mnist --alphas 0.1,1 \\
        [--model lenet-fedmdcg] [--epochs 8] [--iters 30] [--teacher-epochs 10] [--fedavg-rounds 50] \\
        [--threads 1] [--set fediod.KEY=VALUE ...] [--reuse]
        [--device cuda] [--model resnet8 --image-size 32 --channels 3]   # on a GPU; CIFAR's shape

The FedIOD runs use `fediod.preset = "stable"`, the demo's stabilisers and student budget (batch-norm
matching, a replay pool with 30 replay steps and 2 fresh S-steps per G-step, KL mimicry at tau 3) unless
`--paper` is given. Writes benchmarks/results/fediod_time_to_quality_<dataset>-alpha<alpha>.{md,json,png}, with the
machine and its fp32 matmul rate at `--threads` beside the wall times;
with `--tag NAME` (a variant: its `--set` items), benchmarks/results/sweeps/..._NAME.{md,json,png} instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from _common import (
    RESULTS,
    add_budget_arguments,
    add_device_and_shape,
    add_seed_and_out,
    benchmark_parser,
    check_shape,
    resampled_shape,
    run_fedistill,
    variant_flags,
    variant_suffix,
)
from fediod_step_time import matmul_peak_gflops
from fedistill import disk
from fedistill.algorithms.shared.selection import keep_if_best, nothing_selected
from fedistill.engine.rundir import read_jsonl
from fedistill.machine import of_summaries
from fedistill.reproduce.paths import display_path

# the digits demo's stabilisers and student budget (chosen there, not on these datasets)
STABILISERS = ["fediod.preset='stable'"]
THRESHOLDS = (0.90, 0.95)
#: Relative margin of a crossing: a student exactly at a threshold of its ensemble can come out a rounding
#: error below it (0.72 / 0.80 = 0.8999999999999999), while two accuracies over a test set differ by far more.
MARGIN = 1e-9
#: What model selection keeps of an epoch here: nothing (its metrics row already holds its test accuracy)
NO_STATE = nn.Module()


def fediod_curve(run: Path, iters: int) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    rows = read_jsonl(run / "metrics.jsonl")
    ensemble = summary["final"]["ensemble_accuracy"]
    start = summary["wall_time_s"] - sum(r["round_time_s"] for r in rows)
    points, best, elapsed = [], nothing_selected(), start
    chosen = 0.0
    # a run that never validates (`selection = "last"`) hands over each epoch's student
    validated = any(r.get("val_accuracy") is not None for r in rows)
    for r in rows:
        elapsed += r["round_time_s"]
        if not validated:
            chosen = r["test_accuracy"] if r.get("test_accuracy") is not None else chosen
        elif r.get("val_accuracy") is not None:  # the engine's selection rule, ties included
            best = keep_if_best(best, r["val_accuracy"], r["round"], NO_STATE)
            if best["epoch"] == r["round"]:
                chosen = r["test_accuracy"]
        points.append({"epoch": r["round"], "g_steps": r["round"] * iters, "wall_s": elapsed,
                       "validated_accuracy": chosen, "of_ensemble": chosen / ensemble})  # fmt: skip
    reached = {}
    for threshold in THRESHOLDS:
        first = next((p for p in points if p["of_ensemble"] >= threshold * (1 - MARGIN)), None)
        reached[f"{threshold:.2f}"] = None if first is None else {k: first[k] for k in ("wall_s", "g_steps")}
    return {"ensemble_accuracy": ensemble, "stage1_and_setup_s": start, "points": points, "reached": reached,
            "wall_time_s": summary["wall_time_s"], "final": points[-1]}  # fmt: skip


def fedavg_curve(run: Path) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    rows = read_jsonl(run / "metrics.jsonl")
    elapsed = summary["wall_time_s"] - sum(r["round_time_s"] for r in rows)
    points = []
    for r in rows:
        elapsed += r["round_time_s"]
        points.append({"round": r["round"], "wall_s": elapsed, "test_accuracy": r.get("test_accuracy")})
    return {"points": points, "final": points[-1], "wall_time_s": summary["wall_time_s"]}


def cell(args: argparse.Namespace, dataset: str, alpha: str) -> dict[str, Any]:
    args.dataset, args.alpha = dataset, float(alpha)
    name = f"ttq-{dataset}-alpha{alpha}-seed{args.seed}{variant_suffix(args)}"
    threads = [f"threads={args.threads}", "stage1_cache=false", f"device='{args.device}'",  # stage 1 timed, not reused
               *shape_sets(args)]  # fmt: skip
    fediod_sets = [*threads, f"fediod.teacher_epochs={args.teacher_epochs}", f"fediod.iters_per_epoch={args.iters}",
                   *([] if args.paper else STABILISERS), *args.set]  # fmt: skip
    common = {"alpha": alpha, "model": args.model, "out": args.out}
    fediod_name = f"{name}-fediod" + (f"-{args.tag}" if args.tag else "")  # FedAvg's run serves every tag
    run_fedistill("fediod", args, name=fediod_name, rounds=args.epochs, sets=fediod_sets, **common)
    # FedAvg on the same partition (same data, K, alpha and seed), one local epoch per round
    run_fedistill("fedavg", args, name=f"{name}-fedavg", rounds=args.fedavg_rounds, sets=threads,
                  extra=["--local-epochs", "1"], **common)  # fmt: skip
    out = Path(args.out)
    fediod = fediod_curve(out / fediod_name / "fediod", args.iters)
    fedavg = fedavg_curve(out / f"{name}-fedavg" / "fedavg")
    runs = f"{display_path(out / name, out)}-{{{fediod_name.removeprefix(name + '-')},fedavg}}"
    target = fediod["final"]["validated_accuracy"]
    first = next((p for p in fedavg["points"] if (p["test_accuracy"] or 0) >= target), None)
    fedavg["reaches_fediod_final"] = (
        None if first is None else {"round": first["round"], "wall_s": first["wall_s"]}
    )
    return {"dataset": dataset, "variant": variant_suffix(args).replace("_", " ").strip(), "alpha": float(alpha),
            "runs": runs, "fediod": fediod, "fedavg": fedavg,
            "run_dirs": [f"{fediod_name}/fediod", f"{name}-fedavg/fedavg"]}  # fmt: skip


def provenance(runs: list[Path] | list[str], gflops: float, threads: int) -> dict[str, Any]:
    """What the wall times were measured on: the machine the runs' summaries name and this CPU's fp32
    matmul rate at the runs' thread count, so that times from two hosts can be told apart."""
    summaries = [json.loads((Path(r) / "summary.json").read_text()) for r in runs
                 if (Path(r) / "summary.json").is_file()]  # fmt: skip
    return {"machine": of_summaries(summaries), "matmul_peak_gflops": gflops, "threads": threads}


def shape_sets(args: argparse.Namespace) -> list[str]:
    """`--set` options that resample an MNIST-like set (e.g. to CIFAR's 3 x 32 x 32), for both runs."""
    return [f"{args.dataset}.{key}={value}" for key, value in resampled_shape(args).items()]


def label(result: dict[str, Any]) -> str:
    """The dataset and its variant (device, resampling), as titles name them."""
    return " ".join(filter(None, (result["dataset"], result.get("variant"))))


def _at(reached: dict[str, Any] | None) -> str:
    return "-" if reached is None else f"{reached['wall_s']:.0f} s / {reached['g_steps']} G-steps"


def report(result: dict[str, Any], command: str) -> str:
    f, a = result["fediod"], result["fedavg"]
    final = f["final"]
    catch = a["reaches_fediod_final"]
    measured_on = []
    if "matmul_peak_gflops" in result:  # records made before it was measured have none
        measured_on = [
            f"Machine: {result['machine']}; fp32 matmul {result['matmul_peak_gflops']:.1f} GFLOP/s at "
            f"{result['threads']} thread(s), measured in the same command.",
            "",
        ]
    lines = [
        f"# FedIOD time to quality: {label(result)}, alpha {result['alpha']:g}",
        "",
        f"Command: `{command}`",
        "",
        *measured_on,
        "| method | final test % | of ensemble | wall time (s) | to 0.90 of ensemble | to 0.95 of ensemble |",
        "|---|---|---|---|---|---|",
        f"| FedIOD (validated student) | {100 * final['validated_accuracy']:.2f} | {final['of_ensemble']:.3f} "
        f"| {f['wall_time_s']:.0f} | {_at(f['reached']['0.90'])} | {_at(f['reached']['0.95'])} |",
        f"| FedAvg | {100 * (a['final']['test_accuracy'] or 0):.2f} | - | {a['wall_time_s']:.0f} | - | - |",
        "",
        f"Teachers' weighted ensemble: {100 * f['ensemble_accuracy']:.2f}%. FedIOD's stage 1 and set-up: "
        f"{f['stage1_and_setup_s']:.0f} s. FedAvg first reaches FedIOD's final validated accuracy "
        + ("never" if catch is None else f"in round {catch['round']}, after {catch['wall_s']:.0f} s")
        + ".",
        "",
        "| epoch | G-steps | wall s | validated % | of ensemble |",
        "|---|---|---|---|---|",
        *[
            f"| {p['epoch']} | {p['g_steps']} | {p['wall_s']:.0f} | {100 * p['validated_accuracy']:.2f} "
            f"| {p['of_ensemble']:.3f} |"
            for p in f["points"]
        ],
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    f, a = result["fediod"], result["fedavg"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["wall_s"] for p in f["points"]], [100 * p["validated_accuracy"] for p in f["points"]],
            marker="o", label="FedIOD (validated student)")  # fmt: skip
    ax.plot([p["wall_s"] for p in a["points"]], [100 * (p["test_accuracy"] or 0) for p in a["points"]],
            label="FedAvg")  # fmt: skip
    for threshold in THRESHOLDS:
        ax.axhline(100 * threshold * f["ensemble_accuracy"], ls=":", lw=1, color="grey")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(
        f"{label(result)}, alpha {result['alpha']:g}\n(dotted: 0.90 / 0.95 of the ensemble)", fontsize=10
    )
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--datasets", default="fashion-mnist,mnist")
    parser.add_argument("--alphas", default="0.1,1")
    add_budget_arguments(parser)
    parser.add_argument("--paper", action="store_true", help="FedIOD without the stabilisers")
    parser.add_argument(
        "--tag",
        default="",
        help="a variant's name (with its --set items): its FedIOD run and its result files "
        "(results/sweeps/..._<tag>) carry it, the published files stay as they are",
    )
    add_device_and_shape(parser)
    add_seed_and_out(parser)
    args = parser.parse_args()
    check_shape(parser, args, args.datasets.split(","))
    torch.set_num_threads(args.threads)
    gflops = matmul_peak_gflops()  # the runs' own thread count, as their wall times are
    for dataset in args.datasets.split(","):
        for alpha in args.alphas.split(","):
            result = cell(args, dataset, alpha)
            ran = [Path(args.out) / run for run in result.pop("run_dirs")]
            result |= provenance(ran, gflops, args.threads)
            command = (f"python benchmarks/fediod_time_to_quality.py --datasets {dataset} --alphas {alpha} "
                       f"--model {args.model} --epochs {args.epochs} --iters {args.iters} "
                       f"--teacher-epochs {args.teacher_epochs} --fedavg-rounds {args.fedavg_rounds} "
                       f"--threads {args.threads}" + (" --paper" if args.paper else "")
                       + variant_flags(args)
                       + "".join(f" --set {item}" for item in args.set)
                       + (f" --tag {args.tag}" if args.tag else ""))  # fmt: skip
            name = f"fediod_time_to_quality_{dataset}-alpha{alpha}{variant_suffix(args)}"
            folder = RESULTS / "sweeps" if args.tag else RESULTS
            name += f"_{args.tag}" if args.tag else ""
            disk.write_text(folder / f"{name}.md", report(result, command))
            disk.write_text(
                folder / f"{name}.json", json.dumps(result | {"command": command}, indent=2) + "\n"
            )
            plot(result, folder / f"{name}.png")
            print(report(result, command))


if __name__ == "__main__":
    main()
