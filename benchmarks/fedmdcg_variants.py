"""Where FedMD-CG's local accuracy goes: its table config next to variants of it, round by round.

Each variant is the FedMD-CG cell's ready config (configs/fedmdcg-table/, the same protocol as the
table: K = 10, balanced Dirichlet, 100 rounds of 20 SGD steps) run with a few `--set` overrides:

* ``paper``: the config as it is (its run is the table's own cell, reused when it is there);
* ``official-code``: ``fedmdcg.preset=official-code``, the released code's deviations (uniform noise,
  the never-cleared batch cache, label counts from that cache, the softmax in the server's L3);
* ``no-server-kd``: ``fedmdcg.server_distillation=false``, the server only averages the classifiers
  and generators (the crossed distillation is skipped; the clients' terms stay as they are);
* ``no-server-wd``: ``fedmdcg.server_weight_decay=0``; the code's Adam weight decay 1e-4 on the server
  is L2 added to the gradient, and the crossed-distillation gradients are so small that it dominates:
  Adam's normalised steps then shrink the global classifier every round;
* ``no-ramp``: ``fedmdcg.ramp=none``, the clients' distillation weights at full strength from round 2.

    python benchmarks/fedmdcg_variants.py --dataset fashion-mnist --omegas 1,10 \\
        --variants paper,official-code,no-server-kd --reuse

Next to them the table's Local Training and LG-FedAvg runs of the same cell (when present): the
floor FedMD-CG must clear and the plain head-averaging it builds on. Writes
<results>/fedmdcg_variants_<dataset>.{md,json,png}: local accuracy at rounds 5, 10, 25, 50 and 100,
the global-accuracy oracle at the end, and the local-accuracy curves.
"""

from __future__ import annotations

from pathlib import Path

from _common import benchmark_parser
from fedistill.reproduce.fedmdcg_table import LABELS, config_key
from fedistill.reproduce.fedmdcg_variants import (
    REFERENCES,
    VARIANTS,
    row,
    run_name,
    run_variant,
    write_results,
)
from fedistill.reproduce.paths import CONFIGS, RESULTS, RUNS


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--omegas", default="1,10")
    parser.add_argument("--variants", default="paper,official-code,no-server-kd")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")
    parser.add_argument("--reuse", action="store_true", help="keep finished runs, resume interrupted ones")
    parser.add_argument(
        "--finished-only", action="store_true", help="start no run: report the finished variants only"
    )
    parser.add_argument("--out", default=str(RUNS / "fedmdcg-table"), help="run directories")
    parser.add_argument("--results", default=str(RESULTS), help="where the tables are written")
    args = parser.parse_args()
    args.rounds = 100  # the table's length: run_cell names and runs cells by it
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    try:
        omegas = [float(w) for w in args.omegas.split(",")]
    except ValueError:
        parser.error(f"--omegas must be a comma list of numbers, got {args.omegas!r}")
    for omega in omegas:
        if not (CONFIGS / config_key(args.dataset, "fedmdcg", omega)).is_file():
            parser.error(
                f"no FedMD-CG config for {args.dataset} at omega {omega:g} under configs/fedmdcg-table/"
            )
    command = (
        f"python benchmarks/fedmdcg_variants.py --dataset {args.dataset} --omegas {args.omegas} "
        f"--variants {','.join(variants)} --seed {args.seed}"
        + (" --reuse" if args.reuse else "")
        + (" --finished-only" if args.finished_only else "")
    )
    rows, skipped = [], []
    for omega in omegas:
        for variant in variants:
            name = run_name(args.dataset, "fedmdcg", omega, args.seed, variant)
            if args.finished_only and not (Path(args.out) / name / "fedmdcg" / "summary.json").is_file():
                skipped.append(f"{variant} at omega {omega:g}")
                continue
            rows.append(row(variant, omega, run_variant(args.dataset, omega, args.seed, variant, args)))
        for method in REFERENCES:
            ref = Path(args.out) / run_name(args.dataset, method, omega, args.seed) / method
            if (ref / "summary.json").is_file():
                rows.append(row(f"{LABELS[method]} (table)", omega, ref, reference=True))
    if not rows:  # --finished-only found nothing: no table, and no empty figure
        parser.error(
            f"no finished run of {', '.join(variants)} (nor the table's reference runs) under --out "
            f"{args.out}; run without --finished-only, or pass the folder the runs went to"
        )
    write_results(args.dataset, rows, args, command, skipped)
    print((Path(args.results) / f"fedmdcg_variants_{args.dataset}.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
