"""FedDF's remaining experiments at a scale this CPU can run: its Table 3 (VGG-9 without normalisation,
drop-worst), Table 4 (1-bit binarized ResNet-8 clients, fused in full precision) and one compact table of
the ablations of its Tables 5-8 (initialisation of the fused model, local optimiser, distillation
optimiser, FedProx local training).

The paper's protocol, scaled down: K = 20 clients, C = 0.4 sampled per round, Dirichlet alpha; every row
of a table on the same partition, client samples, rounds and local epochs (one `fedistill run` each, same
seed); FedDF distils on another dataset's unlabelled training images (`--source`, the paper's CIFAR-100
for CIFAR-10) and selects its student on the server's validation split. Defaults run on the embedded
digits (8 x 8), where a table takes minutes; `--dataset fashion-mnist` or `mnist` run the same rows at
28 x 28 (the CIFAR configs of the paper's scale are in configs/feddf/, for a GPU).

    python benchmarks/feddf_tables.py [--tables 3,4,ablation] [--dataset digits] [--rounds 20] \\
        [--local-epochs 2] [--alphas 1,0.1] [--reuse]

Figure 4 (ResNet-20 / ResNet-32 / ShuffleNetV2 clients) is benchmarks/feddf_heterogeneous.py with
`--groups resnet20,resnet32,shufflenetv2`.

Writes benchmarks/results/feddf_tables_<dataset>.{md,json}.
"""

from __future__ import annotations

import sys

from _common import RESULTS, add_seed_and_out, benchmark_parser
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.feddf_tables import TABLES, row, write


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--tables", default="3,4,ablation")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--alphas", default="1,0.1", help="Tables 5-8 at each; Tables 3 and 4 at the first")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="FedDF's distillation steps per round")
    parser.add_argument("--source", default="", help="FedDF's distillation data; default: another dataset")
    parser.add_argument(
        "--partition",
        default="dirichlet",
        help="e.g. dirichlet-balanced where alpha 0.1 leaves a client of a small dataset empty",
    )
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    add_seed_and_out(parser)
    args = parser.parse_args()
    unknown = set(args.tables.split(",")) - set(TABLES)
    if unknown:
        parser.error(f"--tables takes {', '.join(TABLES)}; not {', '.join(sorted(unknown))}")
    alphas = args.alphas.split(",")
    rows = []
    for table in args.tables.split(","):
        for alpha in alphas if table == "ablation" else alphas[:1]:
            for spec in TABLES[table]:
                rows.append(row(args, *spec, alpha=alpha))
                print(f"{spec[1]} (alpha {alpha}): {100 * rows[-1]['test_accuracy']:.2f}%", flush=True)
    command = " ".join(["python benchmarks/feddf_tables.py", *shown_arguments(sys.argv[1:])])
    print(write(rows, args, command, RESULTS))


if __name__ == "__main__":
    main()
