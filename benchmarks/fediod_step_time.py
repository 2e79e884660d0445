"""Where one FedIOD distillation step spends its time, at K = 10 and K = 20 clients, and how much of
this CPU's arithmetic it uses.

For each K the same data, models and options; after stage 1 and two warm-up steps, `--steps`
distillation steps are timed and split into client work (inside the clients' handlers), transport
(checks on receipt and the ledger; in-process there is no serialisation) and server work (the rest:
G and S forward/backward, the server's loss terms, building requests).

FLOPs: one more step runs under a dispatch mode that counts, with torch's own formulas
(`torch.utils.flop_counter.flop_registry`), the matrix products and convolutions of every forward and
backward pass in it, clients' and server's (element-wise ops are not counted, so the achieved rate is
a lower bound). torch's `FlopCounterMode` itself cannot be used here: its per-module backward hooks
refuse the `torch.autograd.grad` calls FedIOD's clients and server make. Achieved FLOP/s = that
count / the mean step time, next to this machine's single-thread fp32 matmul peak measured in the
same run (the best of five 2048 x 2048 products at one thread).

    python benchmarks/fediod_step_time.py [--dataset digits] [--model lenet5] [--steps 10]
        [--image-size 32 --channels 3 --width 0]   # an MNIST-like set at CIFAR's shape, the paper's widths

Writes benchmarks/results/fediod_step_time_<dataset>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from fedistill import devices, disk
from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.fediod import FedIODClient, FedIODOptions, FedIODServer
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared.training import evaluate_model
from fedistill.config import RunConfig, build_config, options_for
from fedistill.engine.setup import client_contexts, prepare_data
from fedistill.federation.ledger import Ledger
from fedistill.transports.inprocess import InProcessFleet

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    RESULTS,
    add_device_and_shape,
    benchmark_parser,
    check_shape,
    resampled_shape,
    variant_flags,
    variant_suffix,
)


def measure(clients: int, args: argparse.Namespace) -> dict:
    fediod = {"preset": "paper", "teacher_epochs": 1, "generator_width": args.width, "discriminator_width": args.width,
              "student_steps": args.student_steps, "channels_last": args.channels_last}  # fmt: skip
    sync = torch.cuda.synchronize if devices.current().type == "cuda" else (lambda: None)
    shape = resampled_shape(args)
    config = build_config(
        RunConfig(),
        {"algorithm": "fediod", "clients": clients, "dataset": args.dataset, "data_dir": args.data_dir,
         "model": args.model, "fediod": fediod, "device": args.device, **({args.dataset: shape} if shape else {})},
    )  # fmt: skip
    server, fleet = warm_federation(config)
    fleet.seconds_in_clients = fleet.seconds_in_transport = 0.0
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        server.distillation_step(fleet)
    sync()
    total = (time.perf_counter() - start) / args.steps
    client = fleet.seconds_in_clients / args.steps
    transport = fleet.seconds_in_transport / args.steps
    with FlopCount() as counter:
        server.distillation_step(fleet)
    flops = counter.total
    return {"clients": clients, "step_s": total, "client_s": client, "transport_s": transport,
            "server_s": total - client - transport, "gflop_per_step": flops / 1e9,
            "gflops_achieved": flops / 1e9 / total}  # fmt: skip


def warm_federation(config: RunConfig, warm_up_steps: int = 2) -> tuple[FedIODServer, InProcessFleet]:
    """FedIOD's server and in-process sites for `config`, after stage 1 and `warm_up_steps` steps."""
    options = options_for(config, "fediod", FedIODOptions)
    data = prepare_data(config)
    contexts = client_contexts(config, get_algorithm("fediod"), options, data)
    fleet = InProcessFleet({c.client_id: FedIODClient(c) for c in contexts}, Ledger(None))
    test, info = data.dataset.test, data.dataset.info
    evaluate = lambda m: evaluate_model(m, test, info)  # noqa: E731
    server = FedIODServer(ServerContext(info, config, options, config.clients, evaluate, None, test.y))
    server.setup(fleet)
    for _ in range(warm_up_steps):
        server.distillation_step(fleet)
    return server, fleet


class FlopCount(TorchDispatchMode):
    """Counts the FLOPs of every op torch has a formula for, forward and backward alike."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """This machine's fp32 matmul rate at the current thread count (best of `repeats`)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def one_thread_gflops() -> float:
    """This machine's fp32 matmul rate at one torch thread, as records name it whatever thread count their
    runs used (the count is restored)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return matmul_peak_gflops()
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--width", type=int, default=32, help="generator and discriminator width (0: auto)")
    parser.add_argument("--student-steps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    add_device_and_shape(parser)
    parser.add_argument("--channels-last", action="store_true", help="fediod.channels_last = true")
    parser.add_argument("--results", default=str(RESULTS), help="where the table is written")
    args = parser.parse_args()
    check_shape(parser, args, [args.dataset])
    torch.set_num_threads(args.threads)
    devices.use(args.device)
    peak = matmul_peak_gflops()
    rows = [measure(k, args) for k in (10, 20)]
    command = (f"python benchmarks/fediod_step_time.py --dataset {args.dataset} --model {args.model} "
               f"--width {args.width} --student-steps {args.student_steps} --steps {args.steps} --threads {args.threads}"
               + variant_flags(args)
               + (" --channels-last" if args.channels_last else ""))  # fmt: skip
    on_cpu = devices.current().type == "cpu"
    lines = [
        f"# FedIOD: time per distillation step (in-process transport, {devices.current().type})",
        "",
        f"Command: `{command}`",
        "",
        f"Device: {devices.current()}. Matmul peak of this machine's CPU, same run: {peak:.1f} GFLOP/s "
        f"(fp32, 2048 x 2048, {args.threads} thread(s))"
        + ("." if on_cpu else "; the step ran on the accelerator, so 'of peak' does not apply."),
        "",
        "| K | step (s) | client work | transport | server work | K=20 / K=10 | GFLOP / step | GFLOP/s | of peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["step_s"] / rows[0]["step_s"]
        lines.append(
            f"| {r['clients']} | {r['step_s']:.3f} | {r['client_s']:.3f} ({100 * r['client_s'] / r['step_s']:.0f}%) "
            f"| {r['transport_s']:.3f} ({100 * r['transport_s'] / r['step_s']:.0f}%) "
            f"| {r['server_s']:.3f} ({100 * r['server_s'] / r['step_s']:.0f}%) | {ratio:.2f} "
            f"| {r['gflop_per_step']:.1f} | {r['gflops_achieved']:.1f} | "
            + (f"{100 * r['gflops_achieved'] / peak:.0f}% |" if on_cpu else "- |")
        )
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    name = f"fediod_step_time_{args.dataset}{variant_suffix(args)}"
    name += "_channels-last" if args.channels_last else ""
    disk.write_text(results / f"{name}.md", "\n".join(lines) + "\n")
    record = {"command": command, "matmul_peak_gflops": peak, "rows": rows}
    disk.write_text(results / f"{name}.json", json.dumps(record, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
