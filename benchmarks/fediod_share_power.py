"""FedIOD's teachers' ensemble with class shares from the counts raised to a power (`fediod.share_power`),
scored on the held-out validation images and on the test set: how the power was chosen, on validation data.

For each seed, the sites of a FedIOD config train their stage-1 teachers (or load the ones a run with the
same settings left in the stage-1 cache: `--cache-dir`), exactly as a run's stage 1 does, and the
class-share ensemble (n_kc^p / sum_j n_jc^p per class) of their raw logits and of their log-probabilities
is scored for each power p on the images the partition holds out for validation (the union of the sites'
validation splits) and on the test set. Eq. 8's density ratios are not part of it: they come from the
discriminators of stage 2. `--label-shares counts,frequencies` scores both readings of Eq. 8's label term
(`fediod.label_shares`): the sites' shares of each class's samples, or each site's class frequencies.

    python benchmarks/fediod_share_power.py --config configs/fediod-vs-fedavg/fediod-fashion-mnist-alpha0.1.toml \\
        --seeds 0,1,2 --powers 0.25,0.5,0.75,1 [--label-shares counts] [--tag TAG] \\
        [--cache-dir runs/reproduce/fediod-vs-fedavg-cpu/runs/.cache]

Writes benchmarks/results/fediod_share_power_<dataset>-alpha<alpha>[_TAG].{md,json}. One torch thread, as the
target's runs (a teacher trained at another thread count is another model, and is not the cached one).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from _common import RESULTS, benchmark_parser
from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.fediod import FedIODClient, FedIODOptions, FedIODServer
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared.training import evaluate_model, task_of
from fedistill.config import RunConfig, build_config, load_toml, options_for
from fedistill.data.transforms import to_float
from fedistill.engine.setup import client_contexts, prepare_data, score_first
from fedistill.errors import UserError
from fedistill.federation.ledger import Ledger
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.tables import write_table
from fedistill.transports.inprocess import InProcessFleet

LOGITS = ("raw", "log-probabilities")


def teachers_and_data(config: RunConfig) -> tuple[list[torch.nn.Module], torch.Tensor, dict]:
    """The sites' stage-1 teachers (trained, or loaded from the cache), their class counts as the server
    received them, and the (images, labels) of the validation and test sets."""
    options = options_for(config, "fediod", FedIODOptions)
    data = prepare_data(config)
    contexts = client_contexts(config, get_algorithm("fediod"), options, data)
    clients = {ctx.client_id: FedIODClient(ctx) for ctx in contexts}
    dataset, info = data.dataset, data.dataset.info
    task = task_of(config, info)
    server = FedIODServer(
        ServerContext(
            info, config, options, len(clients),
            lambda m: evaluate_model(m, dataset.test, info, task=task), None, dataset.test.y,
            score=lambda outputs: score_first(task, dataset, outputs, None),
        )
    )  # fmt: skip
    server.setup(InProcessFleet(clients, Ledger(None)))
    assert server.federation is not None and server.federation.counts is not None
    validation = dataset.train.subset(data.split.server_val)
    sets = {
        "validation": (to_float(validation.x, info), validation.y),
        "test": (to_float(dataset.test.x, info), dataset.test.y),
    }
    teachers = [clients[c].teacher.eval() for c in server.federation.clients]
    return teachers, server.federation.counts.float(), sets


def scores(config: RunConfig, powers: list[float], readings: list[str]) -> list[dict]:
    """One row per (label shares, logits, power): the ensemble's accuracy % on each set."""
    teachers, counts, sets = teachers_and_data(config)
    keys = [(r, mode, p) for r in readings for mode in LOGITS for p in powers]
    rows = {k: {"label_shares": k[0], "logits": k[1], "power": k[2]} for k in keys}
    base = {"counts": counts, "frequencies": L.class_frequencies(counts)}
    for name, (x, y) in sets.items():
        with torch.no_grad():
            raw = torch.stack([t(x) for t in teachers])  # (K, N, C)
        for reading, mode, p in keys:
            logits = raw if mode == "raw" else raw.log_softmax(-1)
            ensemble = (L.class_share(base[reading] ** p)[:, None, :] * logits).sum(0)
            rows[reading, mode, p][name] = round(100 * float((ensemble.argmax(-1) == y).float().mean()), 2)
    return list(rows.values())


def table(runs: list[dict]) -> list[str]:
    """Mean over the seeds, then each seed, for every (logits, power)."""
    seeds = sorted({r["seed"] for r in runs})
    per_seed = " | ".join(f"seed {s} val / test" for s in seeds)
    lines = [f"| label shares | logits | power | validation % (mean) | test % (mean) | {per_seed} |",
             "|---" * (5 + len(seeds)) + "|"]  # fmt: skip
    row_key = lambda r: (r.get("label_shares", "counts"), r["logits"], r["power"])  # noqa: E731
    for key in dict.fromkeys(row_key(r) for r in runs):
        reading, mode, p = key
        mine = [r for r in runs if row_key(r) == key]
        by_seed = {r["seed"]: r for r in mine}
        cells = " | ".join(f"{by_seed[s]['validation']:.2f} / {by_seed[s]['test']:.2f}" for s in seeds)
        lines.append(
            f"| {reading} | {mode} | {p:g} | {statistics.mean(r['validation'] for r in mine):.2f} "
            f"| {statistics.mean(r['test'] for r in mine):.2f} | {cells} |"
        )
    return lines


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--config", required=True, help="a FedIOD config (its dataset, partition, teachers)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--powers", default="0.25,0.5,0.75,1")
    parser.add_argument("--label-shares", default="counts", help="comma list of counts, frequencies")
    parser.add_argument("--tag", default="", help="the record's name ends in _TAG")
    parser.add_argument("--cache-dir", default="", help="the stage-1 cache of runs with the same settings")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    try:
        powers = [float(p) for p in args.powers.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(
            f"--powers and --seeds are comma lists of numbers; got {args.powers!r} and {args.seeds!r}"
        )
    if min(powers) <= 0:
        parser.error(f"every power must be > 0 (fediod.share_power), got {args.powers}")
    readings = [r.strip() for r in args.label_shares.split(",") if r.strip()]
    if not readings or set(readings) - {"counts", "frequencies"}:
        parser.error(f"--label-shares takes counts and/or frequencies, got {args.label_shares!r}")
    torch.set_num_threads(1)
    runs = []
    for seed in seeds:
        keys = {"seed": seed, "data_dir": args.data_dir, "threads": 1, "device": "cpu"}
        try:
            config = build_config(RunConfig(), load_toml(args.config), keys | {"cache_dir": args.cache_dir})
            runs += [{"seed": seed, **row} for row in scores(config, powers, readings)]
        except UserError as error:  # a missing config or data file, a bad key: one line, not a traceback
            parser.error(str(error))
        print(f"seed {seed} done", flush=True)
    name = f"fediod_share_power_{config.dataset}-alpha{config.alpha:g}" + (f"_{args.tag}" if args.tag else "")
    command = " ".join(["python benchmarks/fediod_share_power.py", *shown_arguments(sys.argv[1:])])
    header = [
        f"# FedIOD's teachers' ensemble by class shares from the counts to a power ({config.dataset}, "
        f"K = {config.clients}, Dirichlet alpha {config.alpha:g}, {config.model})",
        "",
        f"Command: `{command}`",
        "",
        "Each site's stage-1 teacher as a run of the config trains it (one torch thread); the class-share "
        "ensemble n_kc^p / sum_j n_jc^p of the teachers' raw logits or log-probabilities, scored on the "
        "partition's held-out validation images (the union of the sites' validation splits) and on the test "
        "set. Power 1 is the shares unchanged; `fediod.share_power` sets p. Label shares: counts, each site's "
        "share of a class's samples (the default), or frequencies, each site's class frequency against the "
        "other sites' (`fediod.label_shares`).",
        "",
    ]
    markdown = write_table(
        Path(args.results), name, [*header, *table(runs)], {"command": command, "runs": runs}
    )
    print(markdown.read_text())


if __name__ == "__main__":
    main()
