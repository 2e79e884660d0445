"""FedIOD's distillation step with the sites answering one after another and together
(`fediod.sites_together`: one batched call over the same-architecture sites), side by side in one run.

Two federations are built from the same settings (the digits demo's FedIOD by default: K = 10,
small-cnn teachers, the stable preset with the demo's keys; stage 1 shortened to `--teacher-epochs`,
which changes no step's cost) and differ only in `sites_together`. After two warm-up steps each, blocks
of `--steps` steps alternate between them, at each thread count in turn, so that both see the same
machine load. Reported per thread count: the median step time and the sites' share of it (time inside
their handlers), each with the ratio alone / together, and this machine's single-thread fp32 matmul
rate from the same run.

    python benchmarks/fediod_sites_together.py [--clients 10] [--threads 1,2] [--steps 5] [--blocks 3]
        [--dataset mnist --model lenet5 --clients 100] [--device cuda]

Writes benchmarks/results/fediod_sites_together[_<dataset>_k<K>][_<device>].{md,json}.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
import tomllib
from pathlib import Path

import torch

from fedistill import devices, disk
from fedistill.algorithms.fediod import FedIODServer
from fedistill.config import RunConfig, build_config
from fedistill.transports.inprocess import InProcessFleet

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEMO,
    RESULTS,
    add_device_and_shape,
    benchmark_parser,
    check_shape,
    resampled_shape,
    variant_flags,
    variant_suffix,
)
from fediod_step_time import matmul_peak_gflops, warm_federation


def federation(together: bool, args) -> tuple[FedIODServer, InProcessFleet]:  # type: ignore[no-untyped-def]
    demo = tomllib.loads(DEMO.read_text(encoding="utf-8"))
    fediod = demo["fediod"] | {"teacher_epochs": args.teacher_epochs, "sites_together": together}
    layer = {key: demo[key] for key in ("dataset", "model", "partition", "alpha")}
    layer |= {"clients": args.clients, "fediod": fediod, "device": args.device, "algorithm": "fediod"}
    if args.dataset:
        layer |= {"dataset": args.dataset, "data_dir": args.data_dir}
    if args.model:
        layer["model"] = args.model
    shape = resampled_shape(args)
    if shape:
        layer[layer["dataset"]] = shape
    return warm_federation(build_config(RunConfig(), layer))


def timed_block(server: FedIODServer, fleet: InProcessFleet, steps: int) -> tuple[float, float]:
    """Seconds per step, and of it inside the sites' handlers, over `steps` steps."""
    sync = torch.cuda.synchronize if devices.current().type == "cuda" else (lambda: None)
    fleet.seconds_in_clients = 0.0
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        server.distillation_step(fleet)
    sync()
    return (time.perf_counter() - start) / steps, fleet.seconds_in_clients / steps


def peak_memory() -> str:
    """The process's peak RSS and, on CUDA, the card's peak allocation: what K sites' teachers and
    discriminators cost in one process, twice over here (both federations are alive)."""
    text = f"host RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    if devices.current().type == "cuda":
        text += f", GPU allocated {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
        text += f" ({torch.cuda.get_device_name()})"
    return text


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--dataset", default="", help="default: the demo's (digits)")
    parser.add_argument("--model", default="", help="default: the demo's (small-cnn)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--teacher-epochs", type=int, default=2)
    add_device_and_shape(parser)
    args = parser.parse_args()
    check_shape(parser, args, [args.dataset or "digits"])
    devices.use(args.device)
    threads = [int(t) for t in args.threads.split(",")]
    torch.set_num_threads(1)
    peak = matmul_peak_gflops()
    fleets = {name: federation(name == "together", args) for name in ("alone", "together")}
    rows = []
    for count in threads:
        torch.set_num_threads(count)
        samples: dict[str, list[tuple[float, float]]] = {"alone": [], "together": []}
        for _ in range(args.blocks):
            for name, (server, fleet) in fleets.items():
                samples[name].append(timed_block(server, fleet, args.steps))
        row = {"threads": count}
        for name, values in samples.items():
            row[f"{name}_step_s"] = statistics.median(v[0] for v in values)
            row[f"{name}_sites_s"] = statistics.median(v[1] for v in values)
        row["step_ratio"] = row["alone_step_s"] / row["together_step_s"]
        row["sites_ratio"] = row["alone_sites_s"] / row["together_sites_s"]
        rows.append(row)
    dataset, model = args.dataset or "digits", args.model or "small-cnn"
    command = (
        f"python benchmarks/fediod_sites_together.py --clients {args.clients} --threads {args.threads} "
        f"--steps {args.steps} --blocks {args.blocks}"
        + (f" --dataset {args.dataset}" if args.dataset else "")
        + (f" --model {args.model}" if args.model else "")
        + variant_flags(args)
    )
    lines = [
        f"# FedIOD: sites answering one after another and together ({dataset}, {model}, K = {args.clients})",
        "",
        f"Command: `{command}`",
        "",
        f"Device: {devices.current()}. This machine's fp32 matmul rate at one thread, same run: {peak:.1f} "
        f"GFLOP/s (2048 x 2048). Median of {args.blocks} alternating blocks of {args.steps} steps.",
        "",
        "| threads | step alone (s) | step together (s) | step ratio | sites alone (s) | sites together (s) "
        "| sites ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['alone_step_s']:.3f} | {r['together_step_s']:.3f} | {r['step_ratio']:.2f}x "
            f"| {r['alone_sites_s']:.3f} | {r['together_sites_s']:.3f} | {r['sites_ratio']:.2f}x |"
        )
    peaks = peak_memory()
    lines.insert(5, "")
    lines.insert(6, f"Peak memory of this process (both federations built): {peaks}.")
    name = "fediod_sites_together"
    if args.dataset or args.model or args.clients != 10:
        name += f"_{dataset}_k{args.clients}"
    name += variant_suffix(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    disk.write_text(RESULTS / f"{name}.md", "\n".join(lines) + "\n")
    record = {
        "command": command,
        "device": str(devices.current()),
        "matmul_gflops_1thread": peak,
        "peak_memory": peaks,
        "rows": rows,
    }
    disk.write_text(RESULTS / f"{name}.json", json.dumps(record, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
