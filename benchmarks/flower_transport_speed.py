"""Wall time per FedAvg round and per FedIOD distillation step: in-process against Flower.

Every transport runs the same config and seed in this one invocation (each run its own process),
so the ratios compare like with like on a noisy machine. Times come from each run's metrics.jsonl
(`round_time_s`); the first round (start-up: Ray workers, imports, FedIOD's stage 1) is reported
separately from the steady state.

    python benchmarks/flower_transport_speed.py [--dataset digits] [--clients 10] [--rounds 4]
        [--transports inprocess,flower] [--data-dir ../shared/data]

Writes benchmarks/results/flower_transport_speed_<dataset>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def run(args: argparse.Namespace, transport: str, algorithm: str, extra: list[str]) -> dict:
    name = f"speed-{args.dataset}-{algorithm}-{transport}"
    out = Path(args.out)
    command = [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--algorithm", algorithm,
               "--transport", transport, "--dataset", args.dataset, "--data-dir", args.data_dir,
               "--clients", str(args.clients), "--rounds", str(args.rounds), "--model", args.model,
               "--seed", "0", "--out", str(out), "--name", name, *extra]  # fmt: skip
    if (out / name).exists():
        subprocess.run(["rm", "-rf", str(out / name)], check=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    process_s = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / name / algorithm / "metrics.jsonl").read_text().splitlines()]
    rounds = [r["round_time_s"] for r in rows if "round_time_s" in r]
    summary = json.loads((out / name / algorithm / "summary.json").read_text())
    return {
        "transport": transport,
        "algorithm": algorithm,
        "first_round_s": rounds[0],
        "steady_round_s": statistics.median(rounds[1:]) if len(rounds) > 1 else rounds[0],
        "process_s": process_s,
        "test_accuracy": summary["final"]["test_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=str(HERE.parents[1] / "shared" / "data"))
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--model", default="lenet-fedmdcg")
    parser.add_argument("--iters", type=int, default=5, help="FedIOD generator steps per epoch")
    parser.add_argument("--transports", default="inprocess,flower")
    parser.add_argument("--out", default=str(HERE / "runs"))
    args = parser.parse_args()
    fediod = ["--set", "fediod.teacher_epochs=1", "--set", f"fediod.iters_per_epoch={args.iters}",
              "--set", "fediod.generator_width=32", "--set", "fediod.discriminator_width=32"]  # fmt: skip
    rows = []
    for transport in args.transports.split(","):
        rows.append(run(args, transport, "fedavg", []))
        row = run(args, transport, "fediod", fediod)
        row["steady_step_s"] = row["steady_round_s"] / args.iters
        rows.append(row)
    base = {r["algorithm"]: r for r in rows if r["transport"] == "inprocess"}
    for r in rows:
        if r["algorithm"] in base:
            r["ratio_to_inprocess"] = r["steady_round_s"] / base[r["algorithm"]]["steady_round_s"]
    command = (
        f"python benchmarks/flower_transport_speed.py --dataset {args.dataset} --clients {args.clients} "
        f"--rounds {args.rounds} --model {args.model} --iters {args.iters} --transports {args.transports}"
    )
    lines = [
        f"# Transport speed: {args.dataset}, K = {args.clients}, {args.model}",
        "",
        f"Command: `{command}`",
        "",
        "Steady state = median over rounds 2..N (round 1 includes start-up). FedIOD: one round is one",
        f"distillation epoch of {args.iters} generator steps; per step = round / {args.iters}.",
        "",
        "| transport | algorithm | first round s | steady round s | per FedIOD step s | x in-process | process s | test % |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        step = f"{r['steady_step_s']:.3f}" if "steady_step_s" in r else "-"
        lines.append(
            f"| {r['transport']} | {r['algorithm']} | {r['first_round_s']:.2f} | {r['steady_round_s']:.3f} | {step} "
            f"| {r.get('ratio_to_inprocess', float('nan')):.2f} | {r['process_s']:.1f} | {100 * r['test_accuracy']:.2f} |"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"flower_transport_speed_{args.dataset}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
