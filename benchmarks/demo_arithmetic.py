"""How much arithmetic each method of the digits demo does: floating-point operations counted op by op
(the formulas of `torch.utils.flop_counter`, forward and backward, convolutions and matrix products),
next to the wall time of the same method in a separate, uncounted run.

Seconds differ from host to host up to 2x; operations do not. On a CPU these small convolutions are
compute-bound, so a method's time follows its operations, each kind of layer at its own rate (wide layers
such as G's run more operations per second than the small CNN's narrow ones); a run gets faster by
computing less, not by moving its messages faster. FedIOD's count is split by who does it: the sites'
stage 1 (teachers trained once, `train`), the sites during distillation (their discriminators' steps,
their teachers on G's samples and the input-gradients), and the server (G, and the student).
Each method runs once counted and once timed, one after another, at one torch thread.

    python benchmarks/demo_arithmetic.py [--methods fediod,fedavg] [--seed 0] [--threads 1] [--no-time]

Writes benchmarks/results/demo_arithmetic.{md,json}.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from fedistill import cli, disk
from fedistill.federation.client import ClientLogic
from fedistill.models.generator import Generator
from fedistill.reproduce.arguments import shown_arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEMO, RESULTS, benchmark_parser
from fediod_step_time import one_thread_gflops

LABELS = {"fediod": "FedIOD", "fedavg": "FedAvg", "standalone": "Standalone", "centralized": "Centralized"}


class OperationCount(TorchDispatchMode):
    """Floating-point operations of every matrix product and convolution, forward and backward, added to
    `counts[bucket]`, and the seconds those products took to `seconds[bucket]`; `bucket` names who is
    computing. (torch's `FlopCounterMode` tracks modules with hooks that `torch.autograd.grad` on a leaf
    refuses, as FedIOD's server step does.)"""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, float] = defaultdict(float)
        self.seconds: dict[str, float] = defaultdict(float)
        self.bucket = "server"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        formula = flop_registry.get(func._overloadpacket)
        if formula is None:
            return func(*args, **kwargs)
        start = time.perf_counter()
        out = func(*args, **kwargs)
        self.seconds[self.bucket] += time.perf_counter() - start
        self.counts[self.bucket] += formula(*args, **kwargs, out_val=out)
        return out

    def enter(self, bucket: str) -> str:
        """Count under `bucket` from now on; returns the bucket to go back to."""
        outer, self.bucket = self.bucket, bucket
        return outer


def count_as(count: OperationCount, bucket: str, output: torch.Tensor) -> None:
    """Count the backward pass of every autograd node behind `output` under `bucket`: each node's
    products run between its pre-hook and its hook, wherever the backward pass starts from."""
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if not hasattr(node, "variable"):  # a weight's AccumulateGrad: no products, and shared by every
            _count_node_as(count, bucket, node)  # graph alive, so its hooks would pile up across them
        stack.extend(next_node for next_node, _ in node.next_functions)


def _count_node_as(count: OperationCount, bucket: str, node: torch.autograd.graph.Node) -> None:
    outer: list[str] = []

    def before(grad_outputs):  # type: ignore[no-untyped-def]
        outer.append(count.enter(bucket))

    def after(grad_inputs, grad_outputs):  # type: ignore[no-untyped-def]
        count.enter(outer.pop())

    node.register_prehook(before)
    node.register_hook(after)


@contextmanager
def generators_known(count: OperationCount) -> Iterator[None]:
    """Count each generator's forward passes, and the backward passes through them, as G's."""
    original = Generator.forward

    def forward(self: Generator, *args, **kwargs):  # type: ignore[no-untyped-def]
        outer = count.enter("generator")
        try:
            out = original(self, *args, **kwargs)
        finally:
            count.enter(outer)
        if out.requires_grad:
            count_as(count, "generator", out)
        return out

    Generator.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        Generator.forward = original  # type: ignore[method-assign]


@contextmanager
def per_request(count: OperationCount) -> Iterator[None]:
    """Count what a client computes while answering a request under that request's type."""
    original = ClientLogic.handle

    def handle(self: ClientLogic, message):  # type: ignore[no-untyped-def]
        outer = count.enter(message.type)
        try:
            return original(self, message)
        finally:
            count.enter(outer)

    ClientLogic.handle = handle  # type: ignore[method-assign]
    try:
        yield
    finally:
        ClientLogic.handle = original  # type: ignore[method-assign]


def run_demo(method: str, seed: int, threads: int, out: Path) -> dict:
    """One method of the demo, in this process; its results.json row."""
    code = cli.main(
        [
            "run", "--config", str(DEMO), "--set", f"algorithm={method}", "--set", f"threads={threads}",
            "--seed", str(seed), "--set", "stage1_cache=false", "--out", str(out), "--name", method, "--quiet",
        ]
    )  # fmt: skip
    if code != 0:
        raise SystemExit(f"the demo's {method} run failed (exit code {code})")
    (row,) = json.loads((out / method / "results.json").read_text(encoding="utf-8"))
    return row


def counted(method: str, seed: int, threads: int, out: Path) -> dict:
    """The method's run under the count: total operations, and the sites' split by request type."""
    count = OperationCount()
    with count, per_request(count), generators_known(count):
        row = run_demo(method, seed, threads, out)
    gflop = {bucket: flops / 1e9 for bucket, flops in sorted(count.counts.items())}
    server, generator = gflop.pop("server", 0.0), gflop.pop("generator", 0.0)
    sites = sum(gflop.values())
    groups = {
        "sites": [b for b in count.counts if b not in ("server", "generator")],
        "generator": ["generator"],
        "server_other": ["server"],
    }
    seconds = {group: sum(count.seconds.get(b, 0.0) for b in buckets) for group, buckets in groups.items()}
    return {
        "test_accuracy": row["test_accuracy"],
        "gflop": sites + server + generator,
        "gflop_sites": sites,
        "gflop_server": server + generator,
        "gflop_server_generator": generator,
        "gflop_by_request": gflop,
        # how fast each party's products ran inside the counted run (the products alone, no other work)
        "gflops_in_products": {
            group: sum(count.counts.get(b, 0.0) for b in buckets) / seconds[group] / 1e9
            for group, buckets in groups.items()
            if seconds[group] > 0
        },
    }


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--methods", default="fediod,fedavg")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-time", action="store_true", help="count only; no uncounted timing run")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(LABELS))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(LABELS)}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods:
            row = {"method": method} | counted(method, args.seed, args.threads, Path(tmp) / "counted")
            if not args.no_time:
                timed = run_demo(method, args.seed, args.threads, Path(tmp) / "timed")
                row |= {"wall_s": timed["wall_time_s"], "timed_test_accuracy": timed["test_accuracy"]}
            rows.append(row)
    payload = {
        "command": " ".join(["python benchmarks/demo_arithmetic.py", *shown_arguments(sys.argv[1:])]),
        "seed": args.seed,
        "threads": args.threads,
        "matmul_gflops_1_thread": one_thread_gflops(),
        "rows": rows,
    }
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    disk.write_text(results / "demo_arithmetic.json", json.dumps(payload, indent=2) + "\n")
    disk.write_text(results / "demo_arithmetic.md", markdown(payload))
    print(markdown(payload))


def markdown(payload: dict) -> str:
    rows = payload["rows"]
    base = next((r for r in rows if r["method"] == "fedavg"), None)
    timed = all("wall_s" in r for r in rows)
    lines = [
        "# The digits demo's arithmetic, method by method",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"The demo's settings (`src/fedistill/engine/demo.toml`), seed {payload['seed']}, "
        f"{payload['threads']} torch thread(s), no stage-1 cache. Operations: floating-point operations "
        "counted with the formulas of `torch.utils.flop_counter` (convolutions and matrix products, forward "
        "and backward). Sites: inside the clients' request handlers; server: the rest, of which G: its forward "
        "passes and the backward passes through it. "
        f"This machine's fp32 matmul rate at one thread, same run: {payload['matmul_gflops_1_thread']:.1f} "
        "GFLOP/s (2048 x 2048).",
        "",
        "| method | test % | GFLOP | sites | server | server: G | x FedAvg's GFLOP"
        + (" | wall s (uncounted run) | x FedAvg's time |" if timed else " |"),
        "|---|---|---|---|---|---|---" + ("|---|---|" if timed else "|"),
    ]
    for r in rows:
        ratio = f"{r['gflop'] / base['gflop']:.1f}x" if base else "-"
        line = (
            f"| {LABELS[r['method']]} | {100 * r['test_accuracy']:.2f} | {r['gflop']:.1f} | "
            f"{r['gflop_sites']:.1f} | {r['gflop_server']:.1f} | {r['gflop_server_generator']:.1f} | {ratio}"
        )
        if timed:
            time_ratio = f"{r['wall_s'] / base['wall_s']:.1f}x" if base else "-"
            line += f" | {r['wall_s']:.1f} | {time_ratio}"
        lines.append(line + " |")
    lines += [
        "",
        "How fast each party's products ran, inside the counted run (GFLOP/s; the products alone):",
        "",
    ]
    lines += ["| method | sites | G | rest of the server |", "|---|---|---|---|"]
    for r in rows:
        rate = r.get("gflops_in_products", {})
        cells = [f"{rate[k]:.1f}" if k in rate else "-" for k in ("sites", "generator", "server_other")]
        lines.append(f"| {LABELS[r['method']]} | " + " | ".join(cells) + " |")
    lines += ["", "The sites' operations by request type (GFLOP):", ""]
    lines += ["| method | request | GFLOP |", "|---|---|---|"]
    for r in rows:
        for kind, gflop in r["gflop_by_request"].items():
            lines.append(f"| {LABELS[r['method']]} | `{kind}` | {gflop:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
