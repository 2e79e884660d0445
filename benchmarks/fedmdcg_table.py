"""The FedMD-CG paper's accuracy table (Table 1, appendix E.2), one cell per ready config.

Every method of the paper on Fashion-MNIST (FedAvg, Local Training, FedPer, LG-FedAvg, FedGen, FedCG,
FedMD-CG) at omega in {10, 1, 0.1}, and FedAvg and FedMD-CG on MNIST, which stands in for the paper's
EMNIST-digits column (the `emnist-digits` configs are that column itself, when its files are at hand).
Each cell runs its config from configs/fedmdcg-table/ (K = 10, balanced Dirichlet `dirichlet-equal`,
100 rounds of 20 local SGD steps of 64 at lr 0.05, FedGen at its own 0.01, the code's "Lenet") as its
own `fedistill run` process, next to the paper's value from configs/expected.toml.

    python benchmarks/fedmdcg_table.py --datasets fashion-mnist,mnist --omegas 10,1,0.1 \\
        --methods fedavg,standalone,fedper,lgfedavg,fedgen,fedcg,fedmdcg --seeds 0 --rounds 100 --reuse

Local accuracy: each client's model on its IID 1/K shard of the test set, sample-weighted (the run's
`local_accuracy`). Global accuracy: for FedAvg the global model on the whole test set
(`test_accuracy`); for every other method the average of the full local models on the whole test
set, which their protocols never send: `global_accuracy_oracle`, an evaluation-only oracle computed
outside the protocol. Several seeds give mean ± std.

Writes <results>/fedmdcg_table_<dataset>.{md,json} (default benchmarks/results/); run directories go
under --out (default benchmarks/runs/fedmdcg-table/). --reuse keeps finished runs and resumes
interrupted ones; without it an existing run directory of the same cell is replaced.
--update-expected writes the measured means into configs/expected.toml (full-length runs only).
--seeds-for METHOD=SEEDS gives one method other seeds than --seeds (the table's three seeds for FedAvg
and FedMD-CG next to one for the rest).
"""

from __future__ import annotations

from _common import benchmark_parser
from fedistill.reproduce.expected import read_expected, write_expected
from fedistill.reproduce.fedmdcg_table import METHODS, cell_row, config_key, record_ours, write_results
from fedistill.reproduce.paths import RESULTS, RUNS


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--datasets", default="fashion-mnist,mnist")
    parser.add_argument("--omegas", default="10,1,0.1")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0")
    parser.add_argument(
        "--seeds-for",
        action="append",
        default=[],
        metavar="METHOD=SEEDS",
        help="other seeds for one method, e.g. fedmdcg=0,1,2 (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    parser.add_argument("--reuse", action="store_true", help="keep finished runs, resume interrupted ones")
    parser.add_argument("--out", default=str(RUNS / "fedmdcg-table"), help="run directories")
    parser.add_argument("--results", default=str(RESULTS), help="where the tables are written")
    parser.add_argument(
        "--update-expected", action="store_true", help="write our means into configs/expected.toml"
    )
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    omegas = [float(w) for w in args.omegas.split(",")]
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be a comma list of integers, got {args.seeds!r}")
    method_seeds = {m: seeds for m in methods}
    for item in args.seeds_for:
        method, _, values = item.partition("=")
        try:
            method_seeds[method] = [int(v) for v in values.split(",")]
        except ValueError:
            method = ""
        if method not in methods:
            parser.error(
                f"--seeds-for wants METHOD=SEEDS (METHOD one of --methods, integer seeds), got {item!r}"
            )
    expected = read_expected()
    command = "python benchmarks/fedmdcg_table.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in (
            ("datasets", args.datasets), ("omegas", args.omegas), ("methods", args.methods),
            ("seeds", args.seeds), ("rounds", args.rounds),
        )
    ) + "".join(f" --seeds-for {item}" for item in args.seeds_for) + (" --reuse" if args.reuse else "")  # fmt: skip

    for dataset in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        rows = []
        for method in methods:
            for omega in omegas:
                key = config_key(dataset, method, omega)
                entry = expected.get(key, {})
                row = cell_row(dataset, method, omega, method_seeds[method], entry, args)
                rows.append(row)
                if args.update_expected and entry and not row["missing"]:
                    record_ours(entry, row, args.rounds, key)
        write_results(dataset, rows, args, command)
    if args.update_expected:
        write_expected(expected)


if __name__ == "__main__":
    main()
