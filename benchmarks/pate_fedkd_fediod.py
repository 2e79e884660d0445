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
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fediod_pate import DEFAULT_RUN, HERE, RESULTS, Queries, load_teachers, make_queries, train_student
from fedistill.algorithms.distillation_data import dataset_source
from fedistill.algorithms.training import evaluate_model
from fedistill.data.transforms import to_float
from fedistill.experiment.config import read_config
from fedistill.experiment.runner import prepare_data
from fedistill.privacy import pate
from fedistill.seeding import torch_generator

# The FedIOD paper's Table 5 (CIFAR-10, K = 20, alpha 1): FedIOD's accuracy with DP at each epsilon
PAPER = {3.5: 44.45, 6.0: 58.96, 7.7: 62.14, 10.0: 73.58}


@torch.no_grad()
def votes_on(x: torch.Tensor, teachers: list[torch.nn.Module], classes: int) -> Queries:
    """Every teacher's vote (its top class) on each input, and their mean logits."""
    votes = np.zeros((len(x), classes))
    logits_sum = torch.zeros(len(x), classes)
    for teacher in teachers:
        logits = torch.cat([teacher(chunk) for chunk in x.split(500)])
        votes[np.arange(len(x)), logits.argmax(1).numpy()] += 1
        logits_sum += logits
    return Queries(x, votes, logits_sum / len(teachers))


def public_inputs(spec: str, data: Any, config: Any, n: int, seed: int) -> tuple[torch.Tensor, str]:
    """`n` public images, normalised for the federation, and a line saying what they are."""
    info = data.dataset.info
    if spec == "holdout":
        held = np.asarray(data.split.server_val)
        if len(held) < n:
            sys.exit(f"the held-out split has {len(held)} images, fewer than {n} queries; raise val_fraction")
        pick = held[torch.randperm(len(held), generator=torch_generator(seed, "pate-public")).numpy()[:n]]
        return to_float(data.dataset.train.x[pick], info), f"{n} images of {config.dataset}'s held-out split"
    if not spec.startswith("dataset:"):
        sys.exit(f"--public takes 'dataset:<name>' or 'holdout', not {spec!r}")
    name = spec.split(":", 1)[1]
    pool = dataset_source(name, info, config.data_dir, size=n, seed=seed)
    return pool.batch(
        n, torch_generator(seed, "pate-public")
    ), f"{n} training images of {name} (labels dropped)"


def gnmax_row(
    method: str, queries: Queries, epsilon: float, delta: float, rng: Any, accuracy: Any
) -> dict[str, Any]:
    """GNMax with sigma calibrated to `epsilon` on the data-independent bound (it depends on the number of
    queries only, so both methods get the same sigma); the data-dependent epsilon of these votes beside."""
    n = len(queries.x)
    sigma = pate.calibrate_sigma(
        lambda s: pate.rdp_to_epsilon(pate.gnmax_rdp(queries.votes, s, data_dependent=False), delta)[0],
        epsilon,
    )
    labels = pate.gnmax_aggregate(queries.votes, sigma, rng)
    return {
        "method": method,
        "queries": n,
        "target_epsilon": epsilon,
        "sigma": sigma,
        "epsilon_data_dependent": pate.rdp_to_epsilon(pate.gnmax_rdp(queries.votes, sigma), delta)[0],
        "label_agreement": float((labels == queries.votes.argmax(1)).mean()),
        "test_accuracy": accuracy(queries.x, torch.as_tensor(labels)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default=str(DEFAULT_RUN), help="a finished FedIOD algorithm run directory")
    parser.add_argument("--data-dir", default=str(HERE.parents[1] / "shared" / "data"))
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
    write(args, config, public_line, rows, summary, time.perf_counter() - started)


def write(
    args: Any, config: Any, public: str, rows: list[dict[str, Any]], summary: dict, seconds: float
) -> None:
    command = " ".join(["python benchmarks/pate_fedkd_fediod.py", *sys.argv[1:]])
    shown = os.path.relpath(args.run, HERE.parent)
    final = summary["final"]
    lines = [
        f"# FedKD and FedIOD under PATE, same teachers: {config.dataset}, K = {config.clients}, "
        f"alpha = {config.alpha:g}",
        "",
        f"Command: `{command}` ({seconds:.0f} s)",
        "",
        f"Teachers: the {config.clients} clients' stage-1 `{config.model}` models of `{shown}` (their ensemble "
        f"{100 * final.get('ensemble_accuracy', float('nan')):.2f}%, the run's FedIOD student without DP "
        f"{100 * final['test_accuracy']:.2f}%). FedKD's queries: {public}. FedIOD's: samples of the run's "
        f"generator. Each row trains a fresh `{config.model}` on the released labels alone "
        f"({args.student_steps} Adam steps at 1e-3, batch 64) and tests it on the test split.",
        f"Epsilon at delta = {args.delta:g}, client-level, for the released labels only; sigma is calibrated on "
        "the data-independent bound, so both methods get the same noise at the same queries and epsilon; the "
        "data-dependent epsilon of each method's own votes is shown beside it (lower where the teachers agree).",
        "",
        "| queries | epsilon | sigma | FedKD: student % | FedKD: labels = plurality | FedKD: data-dep. eps "
        "| FedIOD: student % | FedIOD: labels = plurality | FedIOD: data-dep. eps | paper, FedIOD (CIFAR-10, K = 20) % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    keyed = {(r["method"], r["queries"], r["target_epsilon"]): r for r in rows}
    for n in sorted({r["queries"] for r in rows}, reverse=True):
        for epsilon in [
            None,
            *sorted({r["target_epsilon"] for r in rows if r["target_epsilon"] is not None}),
        ]:
            kd, iod = keyed[("FedKD", n, epsilon)], keyed[("FedIOD", n, epsilon)]

            def cells(r: dict[str, Any], epsilon: float | None = epsilon) -> str:
                if epsilon is None:
                    return f"{100 * r['test_accuracy']:.2f} | - | -"
                return f"{100 * r['test_accuracy']:.2f} | {r['label_agreement']:.3f} | {r['epsilon_data_dependent']:.2f}"

            sigma = "-" if epsilon is None else f"{kd['sigma']:.3g}"
            paper = "-" if epsilon is None else f"{PAPER.get(epsilon, '-')}"
            label = "no noise (plurality)" if epsilon is None else f"{epsilon:g}"
            lines.append(f"| {n} | {label} | {sigma} | {cells(kd)} | {cells(iod)} | {paper} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"pate_fedkd_fediod_{config.dataset}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    payload = {"command": command, "run": shown, "public": public, "seconds": seconds, "rows": rows}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
