"""Wall time per FedAvg round and per FedIOD distillation step on every transport, in one run:
in-process, Flower's simulation engine, and a Flower deployment (SuperLink + SuperNodes on
loopback) with ephemeral ClientApp processes and with the long-lived node worker (`worker=true`).

Every transport runs the same config and seed; each in-process/simulation run is its own process.
Times come from each run's metrics.jsonl (`round_time_s`); round 1 (start-up: Ray workers, node
workers, imports, FedIOD's stage 1) is left out of the steady state. FedIOD runs with its S-step
targets merged into the next query.generate (the default, two exchanges per generator step) and,
with `--variants merged,separate`, with a separate query.student, to measure what that batching buys.

    python benchmarks/flower_speed.py [--dataset digits] [--nodes 2] [--fedavg-rounds 3] \
        [--fediod-epochs 2] [--fediod-iters 2] [--transports inprocess,simulation,deployment,worker]

Uses the process harness of tests/flower_processes.py. Writes benchmarks/results/flower_speed_<dataset>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import torch  # noqa: E402

from fediod_step_time import matmul_peak_gflops  # noqa: E402
from fedistill import disk  # noqa: E402
from fedistill.machine import this_machine  # noqa: E402
from fedistill.reproduce.arguments import shown_arguments  # noqa: E402
from fedistill.reproduce.paths import DATA  # noqa: E402
from flower_processes import deployment, round_times  # noqa: E402

RESULTS = HERE / "results"
CLI_TRANSPORT = {"inprocess": "inprocess", "simulation": "flower"}


def describe(run: Path, transport: str, label: str, wall_s: float, per: int) -> dict:
    times = round_times(run / "metrics.jsonl")
    summary = json.loads((run / "summary.json").read_text())
    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    exchanges = len({(r["round"], r["step"], r["type"]) for r in ledger if r["type"] != "query.hello"})
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {
        "transport": transport,
        "run": label,
        "round_times_s": times,
        "steady_round_s": steady,
        "per_step_s": steady / per,
        "exchanges": exchanges,
        "wall_s": wall_s,
        "test_accuracy": summary["test_accuracy"],
    }


def cli_run(overrides: dict, transport: str, root: Path, data_dir: str, threads: int) -> float:
    """One run through `fedistill run` (in-process or simulation), in its own process."""
    command = [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--transport", CLI_TRANSPORT[transport],
               "--data-dir", data_dir, "--out", str(root), "--name", overrides["name"]]  # fmt: skip
    for key in ("algorithm", "dataset", "model", "clients", "rounds"):
        command += [f"--{key}", str(overrides[key])]
    for item in overrides.get("set", "").split():
        command += ["--set", item]
    if transport == "inprocess":  # the thread count of a simulation node, so the arithmetic is the same
        command += ["--set", f"threads={threads}"]
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="lenet-fedmdcg")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--fedavg-rounds", type=int, default=3)
    parser.add_argument("--fediod-epochs", type=int, default=2)
    parser.add_argument("--fediod-iters", type=int, default=2)
    parser.add_argument("--variants", default="merged", help="FedIOD variants: merged,separate")
    parser.add_argument("--transports", default="inprocess,simulation,deployment,worker")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in-process (a node uses 1)")
    parser.add_argument("--results", default=str(RESULTS), help="where the table is written")
    args = parser.parse_args()
    base = {"dataset": args.dataset, "model": args.model, "clients": args.nodes}
    fediod_set = (f"fediod.preset=paper fediod.teacher_epochs=1 fediod.iters_per_epoch={args.fediod_iters} "
                  "fediod.generator_width=16 fediod.discriminator_width=16")  # fmt: skip
    runs = [("fedavg", {**base, "algorithm": "fedavg", "rounds": args.fedavg_rounds}, 1)]
    for variant in args.variants.split(","):
        extra = "" if variant == "merged" else " fediod.merge_student_queries=false"
        runs.append((f"fediod {variant}", {**base, "algorithm": "fediod", "rounds": args.fediod_epochs,
                                           "set": fediod_set + extra}, args.fediod_iters))  # fmt: skip
    transports = args.transports.split(",")
    torch.set_num_threads(1)  # a node's thread count: the rate the times below are read against
    gflops = matmul_peak_gflops()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for transport in [t for t in transports if t in CLI_TRANSPORT]:
            for i, (label, overrides, per) in enumerate(runs):
                name = f"{transport}-{i}"
                wall = cli_run(
                    {**overrides, "name": name}, transport, root / "runs", args.data_dir, args.threads
                )
                rows.append(
                    describe(root / "runs" / name / overrides["algorithm"], transport, label, wall, per)
                )
        for transport in [t for t in transports if t in ("deployment", "worker")]:
            node_config = (lambda i: {"worker": True, "data-dir": args.data_dir}) if transport == "worker" else (
                lambda i: {"data-dir": args.data_dir})  # fmt: skip
            with deployment(root / transport, args.nodes, tls=False, node_config=node_config) as dep:
                for i, (label, overrides, per) in enumerate(runs):
                    name = f"{transport}-{i}"
                    folder = root / "runs" / name / overrides["algorithm"]
                    settings = f"{overrides.get('set', '')} data_dir={args.data_dir}".strip()
                    wall = dep.flwr_run({**overrides, "set": settings, "out": str(root / "runs"), "name": name},
                                        timeout=1800, summary=folder / "summary.json")  # fmt: skip
                    rows.append(describe(folder, transport, label, wall, per))
    write(args, rows, gflops)


def write(args: argparse.Namespace, rows: list[dict], gflops: float) -> None:
    """The table and the record, with this machine and its one-thread fp32 matmul rate (`gflops`)."""
    for row in rows:
        ref = next((r for r in rows if r["transport"] == "inprocess" and r["run"] == row["run"]), None)
        row["x_inprocess"] = row["steady_round_s"] / ref["steady_round_s"] if ref else None
        row["same_accuracy"] = abs(row["test_accuracy"] - ref["test_accuracy"]) < 1e-5 if ref else None
    command = " ".join(["python benchmarks/flower_speed.py", *shown_arguments(sys.argv[1:])])
    lines = [
        f"# Transport speed: {args.dataset}, {args.nodes} clients/nodes, {args.model}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {this_machine()}; fp32 matmul {gflops:.1f} GFLOP/s at one thread, measured in the same "
        "command.",
        "",
        "Steady round = median of rounds 2..N (FedIOD: one round = one distillation epoch of "
        f"{args.fediod_iters} generator steps, so per step = round / {args.fediod_iters}). Exchanges = distinct",
        "(round, step, message type) in the ledger, start-up handshake left out. Transports: inprocess; simulation",
        "(Flower's simulation engine, `--transport flower`); deployment (SuperLink + SuperNodes, a fresh ClientApp",
        "process per message); worker (the same deployment with `worker=true`: one long-lived worker per node).",
        "",
        "| run | transport | steady round s | per step s | x in-process | exchanges | whole run s | same accuracy |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {r['run']} | {r['transport']} | {r['steady_round_s']:.3f} | {r['per_step_s']:.3f} "
            f"| {'-' if r['x_inprocess'] is None else format(r['x_inprocess'], '.2f')} | {r['exchanges']} "
            f"| {r['wall_s']:.0f} | {r['same_accuracy']} |"
            for r in rows
        ],
    ]  # fmt: skip
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    stem = results / f"flower_speed_{args.dataset}"
    disk.write_text(stem.with_suffix(".md"), "\n".join(lines) + "\n")
    disk.write_text(
        stem.with_suffix(".json"),
        json.dumps(
            {"command": command, "machine": this_machine(), "matmul_peak_gflops": gflops, "rows": rows},
            indent=2,
        )
        + "\n",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
