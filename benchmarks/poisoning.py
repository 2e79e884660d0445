"""One poisoning site on digits: clean, poisoned, and poisoned with the defence, for FedIOD and FedDF.

The poison is finite, so it passes every structural check: in FedIOD site 1 scales its teacher logits by
1e30 in every reply that carries logits; in FedDF it adds 1e30 to its model's last bias each round. The
defence is the default plausibility checks (federation/plausibility.py), which drop that site's replies as
invalid; "poisoned" turns them off. A poisoned run that stops reports why. Small settings, one thread:

    python benchmarks/poisoning.py

Writes benchmarks/results/poisoning.{md,json}.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from _common import RESULTS
from fedistill.analysis.poisons import huge_bias, scaled_logits
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.errors import FederationError, UserError
from fedistill.federation.messages import Message
from fedistill.transports.inprocess import InProcessFleet

BAD = 1
FEDIOD = {
    "algorithm": "fediod",
    "clients": 4,
    "alpha": 100.0,
    "model": "lenet-fedmdcg",
    "rounds": 2,
    "batch_size": 32,
    "fediod": {
        "preset": "stable",
        "teacher_epochs": 5,
        "iters_per_epoch": 5,
        "synthetic_batch_size": 16,
        "student_steps": 2,
        "generator_width": 8,
        "discriminator_width": 8,
        "latent_dim": 16,
    },
}
FEDDF = {
    "algorithm": "feddf",
    "clients": 4,
    "alpha": 100.0,
    "model": "mlp",
    "rounds": 3,
    "feddf": {"steps": 50, "eval_every_steps": 10},
}


def run(settings: dict, poison: Callable[[Message], Message] | None, checks: bool) -> dict:
    """One run: its final test accuracy, its seconds, the clients it dropped (or why it stopped)."""
    algorithm = settings["algorithm"]
    options = {**settings[algorithm], "plausibility_checks": checks}
    config = build_config(RunConfig(), {**settings, algorithm: options}, {})
    original = InProcessFleet.__init__

    def init(self, clients, ledger, **kwargs):
        original(self, clients, ledger, **kwargs)
        client = self._clients.get(BAD)
        if poison is not None and client is not None:
            honest = client.handle
            client.handle = lambda message: poison(honest(message))

    InProcessFleet.__init__ = init
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as folder:
            summary = run_suite(config, Path(folder), progress=False)[0]
        result = {"test_accuracy": summary["test_accuracy"], "dropped": sorted(summary["dropped_clients"])}
    except (FederationError, UserError) as error:
        result = {"test_accuracy": None, "stopped": str(error).splitlines()[0][:160]}
    finally:
        InProcessFleet.__init__ = original
    return result | {"seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("MPLBACKEND", "Agg")
    rows = []
    for name, settings, poison in (("fediod", FEDIOD, scaled_logits), ("feddf", FEDDF, huge_bias)):
        for label, poisoned, checks in (
            ("clean", False, True),
            ("poisoned", True, False),
            ("poisoned + defence", True, True),
        ):
            result = run(settings, poison if poisoned else None, checks)
            rows.append({"algorithm": name, "run": label} | result)
            print(rows[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "poisoning.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    lines = [
        "# One poisoning site on digits",
        "",
        "Site 1 of 4 (Dirichlet alpha 100) sends finite poison: FedIOD teacher logits x 1e30, a FedDF bias"
        " + 1e30. The defence is the default plausibility checks; `poisoned` turns them off. One thread;"
        " written by benchmarks/poisoning.py.",
        "",
        "| algorithm | run | test accuracy | seconds | dropped / stopped |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        accuracy = "-" if r["test_accuracy"] is None else f"{100 * r['test_accuracy']:.2f} %"
        note = r.get("stopped") or ", ".join(f"client {c}" for c in r["dropped"]) or "-"
        lines.append(f"| {r['algorithm']} | {r['run']} | {accuracy} | {r['seconds']} | {note} |")
    (RESULTS / "poisoning.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
