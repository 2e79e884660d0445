"""FedAvg and FedIOD in a Flower deployment (SuperLink + SuperNodes on loopback) against in-process.

Same config and seed for both; per-round times from each run's metrics.jsonl. FedIOD runs twice
in deployment: with its S-step targets merged into the next query.generate (the default, two
exchanges per generator step) and with a separate query.student (three), to measure what that
batching buys where every exchange costs a fresh client process per node.

    python benchmarks/flower_deployment_speed.py [--nodes 2] [--fedavg-rounds 3] [--fediod-iters 2]

Uses the process harness of tests/flower_processes.py. Writes
benchmarks/results/flower_deployment_speed.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from flower_processes import deployment, round_times  # noqa: E402

RESULTS = HERE / "results"


def in_process(overrides: dict, root: Path) -> Path:
    from fedistill.experiment.runner import run_suite
    from fedistill.flower.apps import config_from_run_config

    config = config_from_run_config({**overrides, "out": str(root), "name": overrides["name"]})
    run_suite(config, root / overrides["name"], progress=False)
    return root / overrides["name"] / config.algorithms[0]


def describe(run: Path, transport: str, label: str, wall_s: float, per: int) -> dict:
    times = round_times(run / "metrics.jsonl")
    summary = json.loads((run / "summary.json").read_text())
    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    exchanges = len({(r["round"], r["step"], r["type"]) for r in ledger if r["type"] != "query.hello"})
    return {
        "transport": transport,
        "run": label,
        "round_times_s": times,
        "steady_round_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "per_step_s": (statistics.median(times[1:]) if len(times) > 1 else times[0]) / per,
        "exchanges": exchanges,
        "wall_s": wall_s,
        "test_accuracy": summary["test_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--fedavg-rounds", type=int, default=3)
    parser.add_argument("--fediod-epochs", type=int, default=2)
    parser.add_argument("--fediod-iters", type=int, default=2)
    args = parser.parse_args()
    base = {"dataset": "digits", "model": "lenet-fedmdcg", "clients": args.nodes}
    fediod_set = (f"fediod.teacher_epochs=1 fediod.iters_per_epoch={args.fediod_iters} "
                  "fediod.generator_width=16 fediod.discriminator_width=16")  # fmt: skip
    runs = [
        ("fedavg", {**base, "algorithm": "fedavg", "rounds": args.fedavg_rounds}, 1),
        ("fediod merged", {**base, "algorithm": "fediod", "rounds": args.fediod_epochs, "set": fediod_set},
         args.fediod_iters),
        ("fediod separate query.student",
         {**base, "algorithm": "fediod", "rounds": args.fediod_epochs,
          "set": fediod_set + " fediod.merge_student_queries=false"}, args.fediod_iters),
    ]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for i, (label, overrides, per) in enumerate(runs):
            started = time.monotonic()
            run = in_process({**overrides, "name": f"inprocess-{i}"}, root / "inprocess")
            rows.append(describe(run, "inprocess", label, time.monotonic() - started, per))
        with deployment(root / "deploy", args.nodes, tls=False) as dep:
            for i, (label, overrides, per) in enumerate(runs):
                name = f"deploy-{i}"
                algorithm_dir = root / "runs" / name / overrides["algorithm"]
                wall = dep.flwr_run({**overrides, "out": str(root / "runs"), "name": name}, timeout=1800,
                                    summary=algorithm_dir / "summary.json")  # fmt: skip
                rows.append(describe(algorithm_dir, "deployment", label, wall, per))
    for row in rows:
        ref = next(r for r in rows if r["transport"] == "inprocess" and r["run"] == row["run"])
        row["x_inprocess"] = row["steady_round_s"] / ref["steady_round_s"]
        row["same_accuracy"] = abs(row["test_accuracy"] - ref["test_accuracy"]) < 1e-5
    command = (f"python benchmarks/flower_deployment_speed.py --nodes {args.nodes} --fedavg-rounds "
               f"{args.fedavg_rounds} --fediod-epochs {args.fediod_epochs} --fediod-iters {args.fediod_iters}")  # fmt: skip
    lines = [
        f"# Flower deployment against in-process: digits, {args.nodes} SuperNodes on loopback",
        "",
        f"Command: `{command}`",
        "",
        "Steady round = median of rounds 2..N (FedIOD: one round = one distillation epoch of "
        f"{args.fediod_iters} generator steps, so per step = round / {args.fediod_iters}). Exchanges = distinct",
        "(round, step, message type) in the ledger, start-up handshake left out.",
        "",
        "| run | transport | steady round s | per step s | x in-process | exchanges | whole run s | same accuracy |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {r['run']} | {r['transport']} | {r['steady_round_s']:.2f} | {r['per_step_s']:.2f} "
            f"| {r['x_inprocess']:.0f} | {r['exchanges']} | {r['wall_s']:.0f} | {r['same_accuracy']} |"
            for r in rows
        ],
    ]  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "flower_deployment_speed.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (RESULTS / "flower_deployment_speed.json").write_text(
        json.dumps({"command": command, "rows": rows}, indent=2)
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
