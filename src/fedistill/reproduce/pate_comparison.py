"""FedKD and FedIOD under PATE at the same epsilons, on the same teachers (the FedIOD paper's Table 5, with
FedKD's row beside it).

Both methods end the same way: the clients' teachers vote on unlabelled inputs, the aggregator releases
the noisy plurality (GNMax) and a fresh student learns from those labels alone. They differ only in what
the teachers vote on: FedKD (Gong et al. 2022) on a *public* set of real images (another dataset's
training images, or `holdout`, the federation's held-out split that no client trains on), FedIOD on
samples of its generator, so it needs no public data. Everything else is held equal: the teachers, the
number of queries, the noise (sigma calibrated once per query count and epsilon on the data-independent
RDP bound of `fedistill.privacy.pate`, the guarantee that can be published as it is), the student and
the test split.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedistill.algorithms.shared.distillation_data import dataset_source
from fedistill.data.registry import same_images
from fedistill.data.transforms import to_float
from fedistill.privacy import pate
from fedistill.reproduce.pate_teachers import Queries
from fedistill.reproduce.paths import display_path
from fedistill.reproduce.tables import write_table
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
    if same_images(name, config.dataset):  # aliases and splits of one release too
        sys.exit(
            f"--public {spec!r} is (or shares images with) the federation's own dataset, whose training "
            "images are the clients' private data: use 'holdout' (its held-out split) or another dataset"
        )
    pool = dataset_source(name, info, config.data_dir, size=n, seed=seed, download=config.download)
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


def write(
    args: Any,
    config: Any,
    public: str,
    rows: list[dict[str, Any]],
    summary: dict,
    seconds: float,
    command: str,
    results: str | Path,
) -> list[str]:
    """`<results>/pate_fedkd_fediod_<dataset>.{md,json}`: both methods at every query count and epsilon,
    the paper's FedIOD number beside them; the Markdown's lines."""
    shown = display_path(Path(args.run))
    final = summary["final"]
    lines = [
        f"# FedKD and FedIOD under PATE, same teachers: {config.dataset}, K = {config.clients}, "
        f"alpha = {config.alpha:g}",
        "",
        f"Command: `{command}` ({seconds:.0f} s)",
        "",
        f"Teachers: the {config.clients} clients' stage-1 `{config.model}` models of `{shown}` (their "
        f"ensemble {100 * final.get('ensemble_accuracy', float('nan')):.2f}%, the run's FedIOD student "
        f"without DP {100 * final['test_accuracy']:.2f}%). FedKD's queries: {public}. FedIOD's: samples of "
        f"the run's generator. Each row trains a fresh `{config.model}` on the released labels alone "
        f"({args.student_steps} Adam steps at 1e-3, batch 64) and tests it on the test split.",
        f"Epsilon at delta = {args.delta:g}, client-level, for the released labels only; sigma is calibrated "
        "on the data-independent bound, so both methods get the same noise at the same queries and epsilon; "
        "the data-dependent epsilon of each method's own votes is shown beside it (lower where the teachers "
        "agree).",
        "",
        "| queries | epsilon | sigma | FedKD: student % | FedKD: labels = plurality | FedKD: data-dep. eps "
        "| FedIOD: student % | FedIOD: labels = plurality | FedIOD: data-dep. eps | paper, FedIOD "
        "(CIFAR-10, K = 20) % |",
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
                return (
                    f"{100 * r['test_accuracy']:.2f} | {r['label_agreement']:.3f} "
                    f"| {r['epsilon_data_dependent']:.2f}"
                )

            sigma = "-" if epsilon is None else f"{kd['sigma']:.3g}"
            paper = "-" if epsilon is None else f"{PAPER.get(epsilon, '-')}"
            label = "no noise (plurality)" if epsilon is None else f"{epsilon:g}"
            lines.append(f"| {n} | {label} | {sigma} | {cells(kd)} | {cells(iod)} | {paper} |")
    payload = {"command": command, "run": shown, "public": public, "seconds": seconds, "rows": rows}
    write_table(results, f"pate_fedkd_fediod_{config.dataset}", lines, payload)
    return lines
