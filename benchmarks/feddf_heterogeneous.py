"""FedDF with three architectures against per-group FedAvg (FedDF paper, Table 3 style).

Clients are cycled over the architecture groups (client k gets group k % 3). Per-group FedAvg
averages each group's models and sends them back (`feddf.distill=false`); FedDF then distils the
ensemble of every received model, of all architectures, into each group's average. Same seed, so
the same partition and client samples for both. Reports test accuracy per group.

    python benchmarks/feddf_heterogeneous.py [--dataset digits] [--groups lenet-fedmdcg,mlp,resnet8] \
        [--clients 15] [--rounds 20] [--source dataset:fashion-mnist] [--jobs 2] [--threads 1] [--reuse]

Writes benchmarks/results/feddf_heterogeneous.{md,json} for the default groups and
feddf_heterogeneous_<dataset>_<groups>.{md,json} for others (FedDF's Figure 4 mix:
`--groups resnet20,resnet32,shufflenetv2`).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, add_seed_and_out, benchmark_parser, cell_name, run_fedistill
from fedistill import disk
from fedistill.engine.rundir import read_jsonl
from fedistill.reproduce.arguments import shown_arguments

DEFAULT_GROUPS = "lenet-fedmdcg,mlp,resnet8"


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--groups", default=DEFAULT_GROUPS)
    parser.add_argument("--clients", type=int, default=15)
    parser.add_argument("--fraction", type=float, default=0.4)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--source", default="dataset:fashion-mnist")
    add_seed_and_out(parser)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (per-group FedAvg and FedDF)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="FedDF run only")
    args = parser.parse_args()
    groups = args.groups.split(",")
    slug = (
        args.source.split(":")[0] if args.source.startswith("generator:") else args.source.replace(":", "-")
    )
    extra = " ".join(args.set)
    feddf_label = f"FedDF ({args.source.split('/')[-1]}{', ' + extra if extra else ''})"

    def run(label: str, distill: bool) -> dict:
        kind = (
            f"feddf-{slug}{'-' + '-'.join(args.set).replace('=', '-') if args.set else ''}"
            if distill
            else "fedavg"
        )
        sets = [f"fraction={args.fraction}", f"feddf.groups={args.groups}", f"feddf.distill={str(distill).lower()}",
                f"feddf.steps={args.steps}", f"feddf.source={args.source}",
                *([f"threads={args.threads}"] if args.threads else []), *(args.set if distill else [])]  # fmt: skip
        name = f"feddf-heterogeneous-{cell_name(args)}-{kind}"
        summary = run_fedistill(
            "feddf",
            args,
            name=name,
            alpha=f"{args.alpha:g}",
            model=groups[0],
            rounds=args.rounds,
            out=args.out,
            sets=sets,
            extra=["--local-epochs", str(args.local_epochs)],
        )
        final = summary["final"]
        metrics = read_jsonl(Path(args.out) / name / "feddf" / "metrics.jsonl")
        return {
            "method": label,
            "per_group": {g: 100 * final[f"test_accuracy_{g}"] for g in groups},
            "mean": 100 * final["test_accuracy"],
            "mean_by_round": [100 * m["test_accuracy"] for m in metrics if "test_accuracy" in m],
            "wall_time_s": summary["wall_time_s"],
        }

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run is its own process
        rows = list(pool.map(lambda spec: run(*spec), (("per-group FedAvg", False), (feddf_label, True))))
    command = " ".join(["python benchmarks/feddf_heterogeneous.py", *shown_arguments(sys.argv[1:])])
    for row in rows:
        row["command"] = command
    stem = (
        "feddf_heterogeneous"
        if args.groups == DEFAULT_GROUPS and args.dataset == "digits"
        else f"feddf_heterogeneous_{args.dataset}_{'_'.join(groups)}"
    )
    path = RESULTS / f"{stem}.json"
    if path.is_file():  # keep the rows of other distillation sources
        fresh = {r["method"] for r in rows}
        rows = [r for r in json.loads(path.read_text())["rows"] if r["method"] not in fresh] + rows
    lines = [
        f"# FedDF with heterogeneous architectures: {args.dataset}, K = {args.clients}, C = {args.fraction}, "
        f"alpha {args.alpha:g}",
        "",
        f"`{command}`",
        "",
        f"Groups cycled over clients: {', '.join(groups)}; {args.rounds} rounds x {args.local_epochs} local "
        f"epochs; FedDF distils on the named source (up to {args.steps} steps per group and round); each row's "
        "command is in the JSON. Test %:",
        "",
        f"| method | {' | '.join(groups)} | mean | wall s |",
        f"|---|{'---|' * len(groups)}---|---|",
        *[
            f"| {r['method']} | {' | '.join(format(r['per_group'][g], '.2f') for g in groups)} | {r['mean']:.2f} "
            f"| {r['wall_time_s']:.0f} |"
            for r in rows
        ],
    ]
    curves = [r for r in rows if r.get("mean_by_round")]
    if curves:  # the paper's Figure 4 is a curve over rounds
        longest = max(len(r["mean_by_round"]) for r in curves)
        lines += [
            "",
            "Mean test % over the groups, by round:",
            "",
            f"| method | {' | '.join(str(i + 1) for i in range(longest))} |",
            f"|---|{'---|' * longest}",
            *[
                f"| {r['method']} | {' | '.join(format(v, '.2f') for v in r['mean_by_round'])} |"
                for r in curves
            ],
        ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    disk.write_text(RESULTS / f"{stem}.md", "\n".join(lines) + "\n")
    disk.write_text(path, json.dumps({"rows": rows}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
