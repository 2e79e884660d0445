"""Gradient inversion against what each method's client actually sends (FedMD-CG's Table 2, and FedIOD).

The threat models (an honest-but-curious server holding exactly what the ledger records, the requests it
sent and the public run configuration) and the settings are `fedistill.analysis.threat_models`; the
settings this table runs and its report are `fedistill.reproduce.privacy_attacks` and `privacy_report`.
Scores are the PSNR and SSIM of each reconstruction against the batch the client really trained on (best
one-to-one match, images in [0, 1]), averaged over ``--images`` private images per dataset; attacks are
this library's DLG (soft label optimised) and iDLG (label read off the last layer), L-BFGS,
``--iterations`` steps.

Model variants (``--variants``): ``relu`` is ``lenet-fedmdcg`` as the tables train it (ReLU, BatchNorm,
max-pool); ``sigmoid`` swaps ReLU for Sigmoid; ``dlg`` is the network in the conditions of the DLG paper
(Sigmoid, no max-pool, no normalisation).

    python benchmarks/privacy_attacks.py [--datasets mnist,fashion-mnist] [--images 8] [--variants relu,sigmoid,dlg]

Writes benchmarks/results/privacy_attacks.{md,json} and image grids (top row: the client's batch; then
DLG; then iDLG) under benchmarks/results/privacy_attacks/. FedPer's grids have no iDLG row: its reply
holds no last layer to read a label from (the table's n/a), and the grid's title says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fedistill import disk
from fedistill.analysis.threat_models import LR, VARIANTS, Setup
from fedistill.data.registry import load_dataset
from fedistill.errors import UserError
from fedistill.machine import this_machine
from fedistill.reproduce.paths import DATA, RESULTS
from fedistill.reproduce.privacy_attacks import (
    OBSERVED,
    PAPER_TABLE2,
    check_methods,
    in_process,
    run_dataset_variant,
    save_grids,
)
from fedistill.reproduce.privacy_report import NOTES, cell, images_note, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--datasets", default="mnist,fashion-mnist")
    parser.add_argument("--variants", default="relu,sigmoid,dlg")
    parser.add_argument("--methods", default="fedavg,fedper,lgfedavg,fedmdcg,fediod")
    parser.add_argument(
        "--images",
        type=int,
        default=8,
        help="private images attacked per dataset and setting (multi-step FedAvg and FedMD-CG attack whole "
        "clients only, FedIOD at least 2: a row that attacked another number says so)",
    )
    parser.add_argument(
        "--multi-steps", type=int, default=4, help="local steps of the multi-step FedAvg update"
    )
    parser.add_argument("--iterations", type=int, default=100, help="L-BFGS steps of DLG/iDLG")
    parser.add_argument(
        "--fediod-iterations", type=int, default=150, help="Adam steps of the FedIOD inversion"
    )
    parser.add_argument(
        "--kappa", type=float, default=0.1, help="relaxation of Adam's sign-like step in the FedIOD inversion"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.images < 1:
        parser.error("--images must be >= 1")
    for name, least in (("multi_steps", 1), ("iterations", 1), ("fediod_iterations", 0), ("kappa", 0)):
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    try:
        check_methods(args.methods)
    except ValueError as exc:
        parser.error(str(exc))
    for v in args.variants.split(","):
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    # every dataset loaded before any attack: a misspelt or missing one is refused now, not after the others
    try:
        datasets = {name: load_dataset(name, args.data_dir) for name in args.datasets.split(",")}
    except UserError as exc:
        parser.error(f"--datasets: {exc}")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    grid_dir = out / "privacy_attacks"
    grid_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    grids: dict[str, Any] = {}
    for dataset, loaded in datasets.items():
        results[dataset] = {}
        for variant in args.variants.split(","):
            t0 = time.perf_counter()
            setup = Setup(dataset, loaded.info, loaded.train, loaded.test, variant, args, in_process)
            raw = run_dataset_variant(setup)
            grids[f"{dataset}/{variant}"] = save_grids(setup, raw, grid_dir)
            results[dataset][variant] = {
                setting: {
                    "scores": {a: s.summary() for a, s in entry["scores"].items()},
                    "kinds_sent": entry.get("kinds", []),
                    **({"images": entry["images"]} if "images" in entry else {}),
                    **(
                        {"gradient_check_max": entry["gradient_check_max"]}
                        if entry.get("gradient_check_max") is not None
                        else {}
                    ),
                    **({"replay_error": entry["replay_error"]} if entry.get("replay_error") else {}),
                }
                for setting, entry in raw.items()
            }
            print(f"{dataset} {variant}: {time.perf_counter() - t0:.0f} s", flush=True)
            for setting, entry in results[dataset][variant].items():
                cells = ", ".join(
                    f"{a} {cell(s)}" + (f" ({s['note'].removeprefix('n/a: ')})" if s.get("note") else "")
                    for a, s in entry["scores"].items()
                )
                print(f"  {setting}: {cells}{images_note(setting, entry, vars(args))}", flush=True)
    settings_line = (
        f"images={args.images}, multi-step FedAvg={max(1, min(args.multi_steps, args.images))} steps of batch 1, "
        f"DLG/iDLG {args.iterations} L-BFGS steps, FedIOD inversion {args.fediod_iterations} Adam steps "
        f"(kappa {args.kappa}), lr {LR}, seed {args.seed}, threads {args.threads}"
    )
    data = {
        "benchmark": "privacy_attacks",
        "settings": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out")},
        "settings_line": settings_line,
        "paper_table2_psnr": PAPER_TABLE2,
        "variants": {k: vars(v) for k, v in VARIANTS.items()},
        "observed": OBSERVED,
        "results": results,
        "grids": grids,
        "notes": NOTES,
        "seconds": time.perf_counter() - started,
        "machine": this_machine(args.threads),
        "python": sys.version.split()[0],
    }
    disk.write_text(out / "privacy_attacks.json", json.dumps(data, indent=2))
    write_report(data, out / "privacy_attacks.md")
    print(f"wrote {out / 'privacy_attacks.md'} ({data['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    raise SystemExit(main())
