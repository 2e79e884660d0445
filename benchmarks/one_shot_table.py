"""One-shot methods on identical teachers (`fedistill.reproduce.one_shot_table`): FedIOD next to DENSE,
Co-Boosting, one-shot FedDF and one-shot FedAvg, each distilling (or averaging) the very same stage-1
models, with the teachers' ensemble as the ceiling and every method as a fraction of it.

Every cell (dataset, alpha) is one `fedistill run` suite of the five methods with one stage-1 cache:
the first method trains the sites' models, the others load them (the summaries' `teachers_from_cache`
proves it). K sites, Dirichlet alpha, `--model` for every teacher and student.

    python benchmarks/one_shot_table.py --datasets fashion-mnist,mnist --alphas 0.1,0.5,1 \\
        [--clients 10] [--model lenet-fedmdcg] [--teacher-epochs 10] [--epochs 10] [--iters 60] \\
        [--threads 1] [--reuse]

Budgets and the papers' numbers: fedistill.reproduce.one_shot_table. Writes benchmarks/results/one_shot_<dataset>.{md,json}.
"""

from __future__ import annotations

from _common import RESULTS, add_seed_and_out, benchmark_parser
from fedistill.reproduce.one_shot_table import (
    METHODS,
    cell,
    kd_step_list,
    keeps_the_table_file,
    markdown,
    write,
)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--datasets", default="fashion-mnist,mnist")
    parser.add_argument("--alphas", default="0.1,0.5,1")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--model", default="lenet-fedmdcg")
    parser.add_argument("--teacher-epochs", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--feddf-steps", type=int, default=500)
    parser.add_argument(
        "--kd-steps",
        type=kd_step_list,
        default=[0],
        help="comma list: DENSE / Co-Boosting student batches per epoch, one row each (0: one pass over the "
        "pool, their code; at 8 epochs that is 36 steps in all)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default=",".join(METHODS), help="a subset of the methods, in run order")
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="start no run: tabulate the runs that finished, leave out the rest",
    )
    add_seed_and_out(parser)
    args = parser.parse_args()
    args.reuse = args.reuse or args.table_only
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"--methods takes {', '.join(METHODS)}; not {', '.join(sorted(unknown))}")
    for dataset in args.datasets.split(","):
        cells = [cell(args, dataset, alpha) for alpha in args.alphas.split(",")]
        command = (f"python benchmarks/one_shot_table.py --datasets {dataset} --alphas {args.alphas} "
                   f"--clients {args.clients} --model {args.model} --teacher-epochs {args.teacher_epochs} "
                   f"--epochs {args.epochs} --iters {args.iters} --feddf-steps {args.feddf_steps}"
                   f"{'' if args.kd_steps == [0] else ' --kd-steps ' + ','.join(map(str, args.kd_steps))}")  # fmt: skip
        if keeps_the_table_file(args.methods, args.table_only):
            print(markdown(cells, command))
            print(f"(a subset of the methods: {RESULTS / f'one_shot_{dataset}.md'} is left as it was; "
                  "update it with --table-only and the full --alphas / --kd-steps)")  # fmt: skip
            continue
        print(write(cells, dataset, command, RESULTS))


if __name__ == "__main__":
    main()
