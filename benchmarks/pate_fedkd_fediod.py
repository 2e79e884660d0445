"""FedKD and FedIOD under PATE at the same epsilons, on the same teachers (the FedIOD paper's Table 5,
with FedKD's row beside it).

Both methods end the same way: the clients' teachers vote on unlabelled inputs, the aggregator releases
the noisy plurality (GNMax) and a fresh student learns from those labels alone. They differ only in what
the teachers vote on: FedKD (Gong et al. 2022) on a *public* set of real images (`--public`: another
dataset's training images, MNIST for a Fashion-MNIST federation by default, or `holdout`, the
federation's held-out split that no client trains on), FedIOD on samples of its generator, so it needs no
public data. Everything else is held equal: the teachers (every client's stage-1 model from one finished
FedIOD run's checkpoint), the number of queries, the noise (sigma calibrated once per query count and
epsilon on the data-independent RDP bound of `fedistill.privacy.pate`, the guarantee that can be published
as it is), the student (the run's architecture, `--student-steps` Adam steps) and the test split.

    python benchmarks/pate_fedkd_fediod.py --run RUN/fediod [--public dataset:mnist] \\
        [--query-counts 1000,100] [--epsilons 3.5,6.0,7.7,10.0]

The `fedkd` algorithm runs the same protocol over messages (`fedkd.pate_epsilon`, `fedkd.public`); this
script uses the run's teachers directly so both rows vote with the very same models. The epsilons are
client-level (one vote per client and query): with K = 10 clients that is a far stronger unit than the
paper's, whose numbers (CIFAR-10, K = 20) are printed for orientation only.

Writes benchmarks/results/pate_fedkd_fediod_<dataset>.{md,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedistill.algorithms.shared.training import evaluate_model
from fedistill.config import read_config
from fedistill.engine.setup import prepare_data
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.pate_comparison import gnmax_row, public_inputs, votes_on, write
from fedistill.reproduce.pate_teachers import Queries, load_teachers, make_queries, train_student
from fedistill.reproduce.paths import DATA, RESULTS, RUNS

DEFAULT_RUN = RUNS / "fediod-fashion-mnist-alpha1-seed0" / "fediod"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default=str(DEFAULT_RUN), help="a finished FedIOD algorithm run directory")
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument(
        "--public", default="dataset:mnist", help="FedKD's public set: dataset:<name> | holdout"
    )
    parser.add_argument("--query-counts", default="1000,100")
    parser.add_argument("--epsilons", default="3.5,6.0,7.7,10.0")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--student-steps", type=int, default=2000, help="Adam steps of batch 64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        epsilons = [float(e) for e in args.epsilons.split(",")]
        counts = sorted({int(v) for v in args.query_counts.split(",")}, reverse=True)
    except ValueError as exc:
        parser.error(f"--epsilons and --query-counts take comma-separated numbers ({exc})")
    if min(counts) < 1 or min(epsilons) <= 0:
        parser.error("--query-counts must be >= 1 and --epsilons > 0")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    run = Path(args.run)
    for need in ("config.toml", "summary.json", "models/generator.safetensors"):
        if not (run / need).is_file():
            sys.exit(
                f"{run} is not a finished FedIOD run directory ({need} is missing); pass --run RUN/fediod"
            )
    config = dataclasses.replace(read_config(run / "config.toml"), data_dir=args.data_dir)
    data = prepare_data(config)
    info, test = data.dataset.info, data.dataset.test
    teachers = load_teachers(run, config, info)
    synthetic = make_queries(run, teachers, info, max(counts), args.seed)
    public_x, public_line = public_inputs(args.public, data, config, max(counts), args.seed)
    inputs = {"FedKD": votes_on(public_x, teachers, info.num_classes), "FedIOD": synthetic}

    def accuracy(x: torch.Tensor, target: torch.Tensor, soft: bool = False) -> float:
        student = train_student(config, info, x, target, soft, args.student_steps, args.seed)
        return float(evaluate_model(student, test, info)["accuracy"])

    rows: list[dict[str, Any]] = []
    for n in counts:
        for method, queries in inputs.items():
            subset = Queries(queries.x[:n], queries.votes[:n], queries.mean_logits[:n])
            rng = np.random.default_rng(args.seed)
            rows.append({"method": method, "queries": n, "target_epsilon": None,
                         "test_accuracy": accuracy(subset.x, torch.as_tensor(subset.votes.argmax(1)))})  # fmt: skip
            for epsilon in epsilons:
                rows.append(gnmax_row(method, subset, epsilon, args.delta, rng, accuracy))
                print(
                    f"{method} {n} queries, epsilon {epsilon:g}: {100 * rows[-1]['test_accuracy']:.2f}%",
                    flush=True,
                )
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    command = " ".join(["python benchmarks/pate_fedkd_fediod.py", *shown_arguments(sys.argv[1:])])
    seconds = time.perf_counter() - started
    print("\n".join(write(args, config, public_line, rows, summary, seconds, command, RESULTS)))


if __name__ == "__main__":
    main()
