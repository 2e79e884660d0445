"""FedAvg, Local Training (Standalone) and Centralized on Fashion-MNIST with FedMD-CG's protocol.

K = 10 clients, balanced ("equal-size") Dirichlet omega in {10, 1, 0.1}, 100 rounds, 20 local
mini-batch steps of 64 per round, SGD lr 0.05, the FedMD-CG "Lenet"; next to the paper's FedAvg
and Local rows. Also times the default main job (`fedistill run`). Every run is its own process,
so its wall time and peak memory are its own.

    python benchmarks/foundation_fmnist.py [--data-dir DIR] [--rounds 100] [--seeds 0]

Writes benchmarks/results/foundation_fmnist.{md,json}; a run folder under --out left by an earlier
run of the script is replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from fediod_step_time import matmul_peak_gflops
from fedistill import disk
from fedistill.machine import joined, of_summaries, of_summary
from fedistill.reproduce.paths import DATA

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: FedMD-CG, Table 1 / appendix (local accuracy / global accuracy, %), Fashion-MNIST.
PAPER = {
    ("fedavg", 10.0): (84.28, 85.02),
    ("fedavg", 1.0): (80.99, 84.77),
    ("fedavg", 0.1): (59.29, 78.91),
    ("standalone", 10.0): (82.89, 83.80),
    ("standalone", 1.0): (74.19, 80.32),
    ("standalone", 0.1): (37.71, 56.34),
}

PROTOCOL = [
    "--dataset", "fashion-mnist", "--clients", "10", "--partition", "dirichlet-equal",
    "--model", "lenet-fedmdcg", "--local-steps", "20", "--batch-size", "64", "--lr", "0.05",
    "--set", "val_fraction=0.0", "--set", "eval_every=5", "--set", "checkpoint_every=25",
    "--set", "fedavg.weighting=samples",
]  # fmt: skip


def fedistill(args: list[str]) -> float:
    """One `fedistill run` in a process of its own, its folder (`--out`/`--name`) emptied first: `fedistill
    run` refuses to write over a run, and a second run of this script reuses every name. Its wall time."""
    shutil.rmtree(Path(args[args.index("--out") + 1]) / args[args.index("--name") + 1], ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedistill.cli", "run", "--quiet", *args], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", default=str(HERE / "runs"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    gflops = matmul_peak_gflops()
    out = Path(args.out)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for omega in (10.0, 1.0, 0.1):
            name = f"fmnist-omega{omega:g}-seed{seed}"
            common = [*PROTOCOL, "--data-dir", args.data_dir, "--alpha", str(omega), "--rounds", str(args.rounds),
                      "--seed", str(seed), "--out", str(out)]  # fmt: skip
            fedistill([*common, "--algorithm", "fedavg,standalone", "--name", name])
            # Centralized: the same total number of SGD steps as the federation (10 clients x 20 steps).
            fedistill(
                [*common, "--algorithm", "centralized", "--local-steps", "200", "--name", name + "-central"]
            )
            for algorithm, folder in (
                ("fedavg", name),
                ("standalone", name),
                ("centralized", name + "-central"),
            ):
                summary = json.loads((out / folder / algorithm / "summary.json").read_text())
                final = summary["final"]
                paper_local, paper_global = PAPER.get((algorithm, omega), (None, None))
                rows.append(
                    {
                        "algorithm": algorithm,
                        "omega": omega,
                        "seed": seed,
                        "local_accuracy": 100 * final["local_accuracy"]
                        if "local_accuracy" in final
                        else None,
                        "test_accuracy": 100 * final["test_accuracy"],
                        "test_accuracy_std": 100 * final.get("test_accuracy_std", 0.0),
                        "paper_local": paper_local,
                        "paper_global": paper_global,
                        "wall_time_s": summary["wall_time_s"],
                        "peak_memory_mb": summary["peak_memory_mb"],
                        "run_dir": os.path.relpath(out / folder / algorithm, HERE.parent),
                        "machine": of_summary(summary),
                    }
                )
    demo_dir = out / "default-main-job"
    demo_time = fedistill(["--out", str(out), "--name", demo_dir.name])
    demo = json.loads((demo_dir / "results.json").read_text())
    write(rows, demo, demo_time, args, gflops)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write(
    rows: list[dict], demo: list[dict], demo_time: float, args: argparse.Namespace, gflops: float
) -> None:
    """The table and the record; the machine is the one the runs' summaries name, beside this CPU's
    one-thread fp32 matmul rate (`gflops`), so that wall times from two hosts can be told apart."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = joined([*(r["machine"] for r in rows), of_summaries(demo)])
    command = f"python benchmarks/foundation_fmnist.py --rounds {args.rounds} --seeds {args.seeds}"
    lines = [
        "# Foundation benchmark: Fashion-MNIST, FedMD-CG protocol",
        "",
        f"Command: `{command}` (each run a separate process).",
        "",
        f"Machine: {machine}; fp32 matmul {gflops:.1f} GFLOP/s at one thread, measured in the same command.",
        "",
        "Protocol: K = 10, balanced equal-size Dirichlet (`dirichlet-equal`), 100 rounds, 20 local steps of",
        "batch 64, SGD lr 0.05, FedMD-CG's Lenet, all clients every round, no validation holdout.",
        "Local accuracy = each client's model after its local update, on its IID test shard (sample-weighted",
        "mean); for FedAvg, global accuracy = the averaged model on the whole test set. For Local Training",
        "(standalone) our 'test' column is the mean ± std of the local models on the whole test set; the",
        "paper's LT global column averages the local models (an evaluation-only oracle not run here).",
        "Centralized pools all training data and takes 200 steps per round (the federation's total).",
        "",
        "| algorithm | omega | seed | local acc (ours) | local acc (paper) | gap | test acc (ours) | global acc (paper) | gap | wall s | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        local_gap = (
            None
            if r["paper_local"] is None or r["local_accuracy"] is None
            else r["local_accuracy"] - r["paper_local"]
        )
        test = _fmt(r["test_accuracy"]) + (
            f" ± {r['test_accuracy_std']:.2f}" if r["test_accuracy_std"] else ""
        )
        global_gap = None
        if r["paper_global"] is not None and r["algorithm"] == "fedavg":
            global_gap = r["test_accuracy"] - r["paper_global"]
        lines.append(
            f"| {r['algorithm']} | {r['omega']:g} | {r['seed']} | {_fmt(r['local_accuracy'])} | {_fmt(r['paper_local'])} "
            f"| {_fmt(local_gap)} | {test} | {_fmt(r['paper_global'])} | {_fmt(global_gap)} "
            f"| {r['wall_time_s']:.0f} | {r['peak_memory_mb']:.0f} |"
        )  # fmt: skip
    lines += [
        "",
        "## Default main job (`fedistill run`, digits)",
        "",
        f"Whole command wall time: {demo_time:.1f} s (process start to exit).",
        "",
        "| algorithm | test acc % | wall s (run loop) | peak MB |",
        "|---|---|---|---|",
    ]
    for s in demo:
        lines.append(
            f"| {s['algorithm']} | {100 * s['test_accuracy']:.2f} | {s['wall_time_s']:.1f} | {s['peak_memory_mb']:.0f} |"
        )
    disk.write_text(RESULTS / "foundation_fmnist.md", "\n".join(lines) + "\n")
    payload = {
        "command": command,
        "machine": machine,
        "matmul_peak_gflops": gflops,
        "rows": rows,
        "default_main_job": {"wall_time_s": demo_time, "runs": demo},
    }
    disk.write_text(RESULTS / "foundation_fmnist.json", json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
