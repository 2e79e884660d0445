"""One poisoning site in the demo's federation: clean, without the site, poisoned, and poisoned with each
defence, for FedIOD, FedDF and FedAvg, over several seeds.

The federation is the README demo's (digits, 10 clients, Dirichlet alpha 0.5, small-cnn; FedIOD at the
demo's settings). Site 1 sends finite poison, which passes every structural check:

- FedIOD, `scaled-logits`: its teacher logits times 1e30 in every reply that carries logits;
- FedIOD, `inflated-counts`: its class counts times 1000 (the demo weighs the ensemble by class shares);
- FedDF and FedAvg, `huge-bias`: its model's last bias plus 1e30 each round.

Runs per algorithm and seed: `clean` (site 1 honest), `without the site` (every request to site 1 fails, so
it is dropped at once: the run the issue's bound compares with), each poison with the plausibility checks
off (`poisoned`) and on (`poisoned + checks`, the default), and where one exists the robust combination
alone, checks off (`poisoned + median`: FedIOD's `ensemble_combine`, FedAvg's `aggregate`). A run that
stops reports why.

    python benchmarks/poisoning.py --seeds 0,1,2

Writes benchmarks/results/poisoning.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from _common import RESULTS
from fedistill import disk
from fedistill.analysis.poisons import huge_bias, inflated_counts, scaled_logits
from fedistill.config import RunConfig, build_config, load_toml
from fedistill.engine.launch import run_suite
from fedistill.errors import FederationError, UserError
from fedistill.federation.messages import Message
from fedistill.transports.inprocess import InProcessFleet

BAD = 1
DEMO = Path(__file__).resolve().parents[1] / "src" / "fedistill" / "engine" / "demo.toml"
Poison = Callable[[Message], Message]


def absent(message: Message) -> Message:
    """The site never answers: every request to it fails."""
    raise RuntimeError("site absent")


POISONS: dict[str, Poison] = {
    "scaled-logits": scaled_logits,
    "inflated-counts": inflated_counts,
    "huge-bias": huge_bias,
}
#: per algorithm: its poisons, and the option that combines the sites robustly (None: no such option)
CASES = {
    "fediod": (("scaled-logits", "inflated-counts"), "ensemble_combine"),
    "feddf": (("huge-bias",), None),
    "fedavg": (("huge-bias",), "aggregate"),
}
#: the demo's federation and its FedIOD and FedAvg sections; FedDF trains locally as the demo's FedAvg does
#: (3 local epochs, 10 rounds) and distils 200 steps per round
DEMO_LAYER = load_toml(DEMO)
COMMON = {k: v for k, v in DEMO_LAYER.items() if not isinstance(v, dict) and k != "algorithm"}
SECTIONS = {
    "fediod": DEMO_LAYER["fediod"],
    "fedavg": DEMO_LAYER["fedavg"],
    "feddf": {"local_epochs": 3, "steps": 200},
}


def settings_for(algorithm: str, seed: int, threads: int, options: dict) -> RunConfig:
    section = {**SECTIONS[algorithm], **options}
    layer = {**COMMON, "algorithm": algorithm, "seed": seed, "threads": threads, algorithm: section}
    return build_config(RunConfig(), layer)


def run(config: RunConfig, poison: Poison | None) -> dict:
    """One run: its final test accuracy, its seconds, the clients it dropped (or why it stopped)."""
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


def plan(algorithm: str) -> list[tuple[str, Poison | None, dict]]:
    """(label, poison, options) of every run of one algorithm and seed."""
    poisons, combine = CASES[algorithm]
    runs: list[tuple[str, Poison | None, dict]] = [("clean", None, {}), ("without the site", absent, {})]
    for name in poisons:
        runs.append((f"{name}: poisoned", POISONS[name], {"plausibility_checks": False}))
        runs.append((f"{name}: poisoned + checks", POISONS[name], {}))
        if combine is not None and name != "inflated-counts":  # a median of shares does not undo a claim
            runs.append(
                (
                    f"{name}: poisoned + median",
                    POISONS[name],
                    {"plausibility_checks": False, combine: "median"},
                )
            )
    return runs


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def note(row: dict) -> str:
    """Why a run stopped (its first clause), or the clients it dropped."""
    if "stopped" in row:
        return "stopped: " + row["stopped"].split(";")[0].split(". client")[0]
    return ", ".join(f"client {c}" for c in row["dropped"]) or "-"


def table(rows: list[dict], seeds: list[int]) -> list[str]:
    """Per algorithm and run: mean ± std over the seeds, and the mean difference from the run without the
    site and from the clean run, seed by seed (same seed, same partition, same teachers' start)."""
    lines = [
        "| algorithm | run | test accuracy % (mean ± std) | vs without the site | vs clean | seconds | dropped / stopped |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(r["algorithm"], r["run"], r["seed"]): r for r in rows}
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        for label in dict.fromkeys(r["run"] for r in rows if r["algorithm"] == algorithm):
            runs = [by[algorithm, label, s] for s in seeds]
            notes = sorted({note(r) for r in runs})
            seconds = statistics.fmean(r["seconds"] for r in runs)
            if any(r["test_accuracy"] is None for r in runs):
                lines.append(f"| {algorithm} | {label} | - | - | - | {seconds:.1f} | {'; '.join(notes)} |")
                continue
            accuracy = [100 * r["test_accuracy"] for r in runs]
            cells = [f"{mean_std(accuracy)[0]:.2f} ± {mean_std(accuracy)[1]:.2f}"]
            for reference in ("without the site", "clean"):
                base = [by[algorithm, reference, s]["test_accuracy"] for s in seeds]
                diffs = [a - 100 * b for a, b in zip(accuracy, base, strict=True)]
                cells.append(f"{statistics.fmean(diffs):+.2f} (largest {max(diffs, key=abs):+.2f})")
            lines.append(
                f"| {algorithm} | {label} | {' | '.join(cells)} | {seconds:.1f} | {'; '.join(notes)} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma list of seeds")
    parser.add_argument("--algorithms", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table-only", action="store_true", help="rewrite the table from poisoning.json")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = args.algorithms.split(",")
    if unknown := set(algorithms) - set(CASES):
        parser.error(f"unknown algorithms: {', '.join(sorted(unknown))}")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MPLBACKEND", "Agg")
    rows = []
    if args.table_only:  # the runs of the last full measurement (a list in files written before the command)
        saved = json.loads((RESULTS / "poisoning.json").read_text(encoding="utf-8"))
        rows = saved["runs"] if isinstance(saved, dict) else saved
    for algorithm in [] if args.table_only else algorithms:
        for seed in seeds:
            for label, poison, options in plan(algorithm):
                config = settings_for(algorithm, seed, args.threads, options)
                rows.append({"algorithm": algorithm, "run": label, "seed": seed} | run(config, poison))
                print(rows[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = f"python benchmarks/poisoning.py --seeds {args.seeds} --algorithms {args.algorithms} --threads {args.threads}"
    payload = {"command": command, "runs": rows}
    disk.write_text(RESULTS / "poisoning.json", json.dumps(payload, indent=1) + "\n")
    lines = [
        "# One poisoning site in the demo's federation",
        "",
        f"Command: `{command}`",
        "",
        "The README demo's federation (digits, 10 clients, Dirichlet alpha 0.5, small-cnn, FedIOD at the demo's"
        " settings; FedDF and FedAvg 10 rounds of 3 local epochs). Site 1 sends finite poison: FedIOD teacher"
        " logits x 1e30 (`scaled-logits`) or class counts x 1000 (`inflated-counts`, the demo weighs its"
        " ensemble by class shares); FedDF and FedAvg a last bias + 1e30 (`huge-bias`). `poisoned`: the"
        " plausibility checks off; `+ checks`: on (the default); `+ median`: checks off, the sites' outputs"
        " (FedIOD) or parameters (FedAvg) combined by a weighted median. *Without the site*: every request to"
        " site 1 fails, so it is dropped at once. Differences are per seed (same partition and start), in"
        f" points, mean over seeds {args.seeds} and the largest.",
        "",
        *table(rows, seeds),
    ]
    disk.write_text(RESULTS / "poisoning.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
