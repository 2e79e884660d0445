"""FedIOD's outputs under PATE: how much accuracy survives when the clients' answers are private.

The FedIOD paper makes its clients' *outputs* differentially private with PATE (Papernot et al. 2018)
for its Table 5: instead of logits, each client's teacher casts one vote per synthetic input, the
aggregator releases the noisy plurality (GNMax, or Confident-GNMax, which also skips queries without
a clear majority), and the student learns from those labels. This script measures that on a finished
FedIOD run: its clients' teachers (from the run's last checkpoint) vote on samples of its generator,
the noise is calibrated to each target epsilon with the data-dependent RDP analysis of
`fedistill.privacy.pate`, and a fresh student of the run's architecture is trained on the released
labels only and tested on the test split.

    python benchmarks/fediod_pate.py --run benchmarks/runs/fediod-fashion-mnist-alpha1-seed0/fediod \\
        [--queries 5000] [--epsilons 3.5,6.0,7.7,10.0] [--query-counts 5000,1000,100] [--confident 7,3]

What the epsilon covers: a teacher is trained on one client's whole data set, so one vote moving is
one *client* changing anything in its data: these are client-level guarantees, for the released
labels only (the generator's training, which touched the discriminators' real data, is accounted
separately by `fediod.dp_*`, see benchmarks/fediod_privacy_utility.py). The aggregator sees the
individual votes (PATE's trusted-aggregator assumption, or secure aggregation). The data-dependent
epsilon is itself a function of the votes; publishing it needs the smooth-sensitivity step of the
PATE paper, which is not done here, so the data-independent epsilon at the same noise is reported
next to it.

Writes benchmarks/results/fediod_pate_<dataset>.{md,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedistill import disk
from fedistill.algorithms.shared.training import evaluate_model
from fedistill.config import read_config
from fedistill.engine.setup import prepare_data
from fedistill.errors import UserError
from fedistill.privacy import pate
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.pate_teachers import Queries, load_teachers, make_queries, train_student
from fedistill.reproduce.paths import DATA, RESULTS, RUNS

HERE = Path(__file__).resolve().parent
DEFAULT_RUN = RUNS / "fediod-fashion-mnist-alpha1-seed0" / "fediod"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default=str(DEFAULT_RUN), help="a finished FedIOD algorithm run directory")
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--queries", type=int, default=5000, help="synthetic inputs the clients vote on")
    parser.add_argument(
        "--query-counts", default="5000,1000,100",
        help="how many of them are labelled through PATE (fewer queries: less noise for the same epsilon)",
    )  # fmt: skip
    parser.add_argument("--epsilons", default="3.5,6.0,7.7,10.0")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument(
        "--confident", default="", metavar="T,SIGMA1",
        help="also run Confident-GNMax with threshold T (votes) and threshold noise SIGMA1",
    )  # fmt: skip
    parser.add_argument("--student-steps", type=int, default=2000, help="Adam steps of batch 64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        args.epsilons = [float(e) for e in args.epsilons.split(",")]
        args.query_counts = sorted({int(v) for v in args.query_counts.split(",")}, reverse=True)
        args.confident = tuple(float(v) for v in args.confident.split(",")) if args.confident else ()
    except ValueError as exc:
        parser.error(f"--epsilons, --query-counts and --confident take comma-separated numbers ({exc})")
    if (
        len(args.confident) not in (0, 2)
        or min(args.query_counts) < 1
        or max(args.query_counts) > args.queries
    ):
        parser.error("--confident takes T,SIGMA1; --query-counts must lie in [1, --queries]")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    run = Path(args.run)
    for need in ("config.toml", "summary.json", "models/generator.safetensors"):
        if not (run / need).is_file():
            sys.exit(
                f"{run} is not a finished FedIOD run directory ({need} is missing); pass --run RUN/fediod"
            )
    config = read_config(run / "config.toml")
    config = dataclasses.replace(config, data_dir=args.data_dir)
    try:
        data = prepare_data(config)
    except UserError as error:  # the data are elsewhere (a run of one's own): one line, not a traceback
        sys.exit(f"{run}: {error}; check --data-dir (the folder the run read its data from)")
    info, test = data.dataset.info, data.dataset.test
    teachers = load_teachers(run, config, info)
    queries = make_queries(run, teachers, info, args.queries, args.seed)
    plurality = queries.votes.argmax(1)
    rng = np.random.default_rng(args.seed)
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))

    def student_accuracy(x: torch.Tensor, target: torch.Tensor, soft: bool = False) -> float:
        student = train_student(config, info, x, target, soft, args.student_steps, args.seed)
        return float(evaluate_model(student, test, info)["accuracy"])

    rows: list[dict[str, Any]] = [
        {"row": "FedIOD student of the run (no DP)", "test_accuracy": summary["final"]["test_accuracy"]},
        {
            "row": f"teachers' mean logits on {len(queries.x)} inputs, no DP (logit mimicry)",
            "queries": len(queries.x),
            "test_accuracy": student_accuracy(queries.x, queries.mean_logits, soft=True),
        },
    ]
    for n in args.query_counts:
        subset = Queries(queries.x[:n], queries.votes[:n], queries.mean_logits[:n])
        plurality = subset.votes.argmax(1)
        rows.append({
            "row": f"{n} queries: plurality vote, no noise",
            "queries": n,
            "answered": n,
            "test_accuracy": student_accuracy(subset.x, torch.as_tensor(plurality)),
        })  # fmt: skip
        for target in args.epsilons:
            rows.append(gnmax_row(args, subset, plurality, target, rng, student_accuracy))
            if args.confident:
                rows.append(confident_row(args, subset, plurality, target, rng, student_accuracy))
            print(f"  {rows[-1]['row']}: {percent(rows[-1]['test_accuracy'])}%", flush=True)
    write(args, config, queries, rows, time.perf_counter() - started)


def gnmax_row(
    args: argparse.Namespace, queries: Queries, plurality: np.ndarray, target: float, rng: Any, accuracy: Any
) -> dict[str, Any]:
    """GNMax on every query, its noise calibrated to `target` on the data-dependent bound."""

    def epsilon_of(sigma: float) -> float:
        return pate.rdp_to_epsilon(pate.gnmax_rdp(queries.votes, sigma), args.delta)[0]

    sigma = pate.calibrate_sigma(epsilon_of, target)
    labels = pate.gnmax_aggregate(queries.votes, sigma, rng)
    independent = pate.gnmax_rdp(queries.votes, sigma, data_dependent=False)
    return {
        "row": f"{len(labels)} queries: GNMax, epsilon {target:g}",
        "queries": len(labels),
        "target_epsilon": target,
        "sigma": sigma,
        "epsilon_data_dependent": epsilon_of(sigma),
        "epsilon_data_independent": pate.rdp_to_epsilon(independent, args.delta)[0],
        "answered": len(labels),
        "label_agreement": float((labels == plurality).mean()),
        "test_accuracy": accuracy(queries.x, torch.as_tensor(labels)),
    }


def confident_row(
    args: argparse.Namespace, queries: Queries, plurality: np.ndarray, target: float, rng: Any, accuracy: Any
) -> dict[str, Any]:
    """Confident-GNMax at `target`: the threshold check's noise is fixed, the answer noise calibrated."""
    threshold, sigma1 = args.confident
    answered, _ = pate.confident_gnmax(
        queries.votes, threshold, sigma1, 1.0, np.random.default_rng(args.seed)
    )

    def epsilon_of(sigma2: float) -> float:
        rdp = pate.confident_gnmax_rdp(queries.votes, answered, threshold, sigma1, sigma2)
        return pate.rdp_to_epsilon(rdp, args.delta)[0]

    row = (
        f"{len(queries.x)} queries: Confident-GNMax (T {threshold:g}, sigma1 {sigma1:g}), epsilon {target:g}"
    )
    try:
        sigma2 = pate.calibrate_sigma(epsilon_of, target)
    except ValueError:  # the threshold checks alone spend more than the target
        return {"row": row + ": out of reach (the threshold checks alone exceed it)", "test_accuracy": None}
    labels = pate.gnmax_aggregate(queries.votes[answered], sigma2, rng)
    x = queries.x[torch.as_tensor(answered)]
    return {
        "row": row,
        "queries": len(queries.x),
        "target_epsilon": target,
        "sigma": sigma2,
        "epsilon_data_dependent": epsilon_of(sigma2),
        "answered": int(answered.sum()),
        "label_agreement": float((labels == plurality[answered]).mean()) if len(labels) else None,
        "test_accuracy": accuracy(x, torch.as_tensor(labels)) if len(labels) else None,
    }


def percent(accuracy: float | None) -> float | None:
    return None if accuracy is None else 100 * accuracy


def write(
    args: argparse.Namespace, config: Any, queries: Queries, rows: list[dict[str, Any]], seconds: float
) -> None:
    command = " ".join(["python benchmarks/fediod_pate.py", *shown_arguments(sys.argv[1:])])
    shown = os.path.relpath(args.run, HERE.parent)
    consensus = queries.votes.max(1) / queries.votes.sum(1)

    def cell(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        f"# FedIOD's outputs under PATE: {config.dataset}, K = {config.clients}, alpha = {config.alpha:g}",
        "",
        f"Command: `{command}` ({seconds:.0f} s)",
        "",
        f"Run: `{shown}`. {len(queries.x)} samples of its generator; each of the {config.clients} clients' "
        f"teachers votes on each (mean share of the plurality {consensus.mean():.2f}; all agree on "
        f"{(consensus == 1).mean():.0%}). A fresh `{config.model}` student learns from the released labels "
        f"alone ({args.student_steps} Adam steps at 1e-3, batch 64) and is tested on the test split.",
        f"Epsilon at delta = {args.delta:g}, client-level (one client's whole data set may change), for the "
        "released labels only. The noise is calibrated on the data-dependent bound, which depends on the votes "
        "(publishing it needs the smooth-sensitivity step, not done); the data-independent epsilon at the "
        "same noise is the guarantee without that step.",
        "",
        "| row | sigma | epsilon (data-dep.) | epsilon (data-indep.) | answered | labels = plurality | student test % |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {r['row']} | {cell(r.get('sigma'), '.3g')} | {cell(r.get('epsilon_data_dependent'), '.2f')} "
            f"| {cell(r.get('epsilon_data_independent'), '.3g')} | {cell(r.get('answered'), 'd')} "
            f"| {cell(r.get('label_agreement'), '.3f')} | {cell(percent(r['test_accuracy']), '.2f')} |"
            for r in rows
        ],
    ]  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"fediod_pate_{config.dataset}"
    disk.write_text(stem.with_suffix(".md"), "\n".join(lines) + "\n")
    payload = {"command": command, "run": str(shown), "seconds": seconds, "rows": rows}
    disk.write_text(stem.with_suffix(".json"), json.dumps(payload, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
