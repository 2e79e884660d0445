"""The FedIOD similarity study end to end (the FedIOD paper's Figure 4): load each finished FedIOD run,
measure its synthetic data and the DLG contrast against every client's private set (`similarity_study`),
and write `fediod_similarity_<dataset>.{md,json,png}` (`similarity_report`); several runs of one dataset
share the files (one section and one row of plots per run)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from fedistill import disk
from fedistill.machine import this_machine
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.paths import DATA, RESULTS, RUNS
from fedistill.reproduce.similarity_report import plot, reading, strict_json, write_markdown
from fedistill.reproduce.similarity_study import (
    FEATURE_MODEL,
    FedIODRun,
    load_run,
    measure_run,
    reference_for,
)

DESCRIPTION = (
    "How close FedIOD's synthetic images come to each client's private images (the FedIOD paper's "
    "Figure 4), against what a FedAvg server recovers from one client update by gradient inversion (DLG)."
)
DEFAULT_RUN = RUNS / "fediod-fashion-mnist-alpha1-seed0" / "fediod"


def run_paths(values: list[str] | None) -> list[Path]:
    """The `--run` values, each repeatable or comma-separated; the default run when none is given."""
    if not values:
        return [DEFAULT_RUN]
    return [Path(p.strip()) for v in values for p in v.split(",") if p.strip()]


def main(argv: list[str] | None = None) -> int:
    """Measure every run of the command line (`argv`, else `sys.argv`) and write one report per dataset."""
    parser = argparse.ArgumentParser(
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", action="append", help="FedIOD run directory (repeatable or comma-separated)")
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--synthetic", type=int, default=2000, help="generator samples per run")
    parser.add_argument("--generator-bn", choices=("batch", "running"), default="batch")
    parser.add_argument("--clients", default="all", help="'all' or a comma list of client ids")
    parser.add_argument(
        "--dlg-images", type=int, default=8, help="private images per client for DLG (0: skip)"
    )
    parser.add_argument("--dlg-iterations", type=int, default=100, help="L-BFGS steps of DLG")
    parser.add_argument("--feature-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.synthetic < 2:
        parser.error("--synthetic must be >= 2 (a FID needs two samples)")
    if args.dlg_images < 0:
        parser.error("--dlg-images must be >= 0")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(
        ["python benchmarks/fediod_similarity.py", *shown_arguments(sys.argv[1:] if argv is None else argv)]
    )

    by_dataset: dict[str, list[FedIODRun]] = {}
    for path in run_paths(args.run):
        run = load_run(path, args.data_dir)
        by_dataset.setdefault(run.config.dataset, []).append(run)
    for dataset, runs in by_dataset.items():
        started = time.perf_counter()
        info, test = runs[0].info, runs[0].data.dataset.test
        reference = reference_for(test, info, args.feature_epochs, args.seed)
        print(f"{dataset}: feature network test accuracy {100 * reference.test_accuracy:.2f}%", flush=True)
        measured = [measure_run(run, reference, args) for run in runs]
        stem = out / f"fediod_similarity_{dataset}"
        data = {
            "benchmark": "fediod_similarity",
            "dataset": dataset,
            "command": command,
            "settings": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out", "run")},
            "feature_network": {
                "model": FEATURE_MODEL,
                "dim": int(reference.features(test.subset(range(2))).shape[1]),
                "epochs": args.feature_epochs,
                "trained_on": len(test) // 2,
                "train_accuracy": reference.features.accuracy,
                "test_accuracy": reference.test_accuracy,
            },
            "runs": measured,
            "plot": stem.with_suffix(".png").name,
            "seconds": time.perf_counter() - started,
            "machine": this_machine(args.threads),
        }
        data["readings"] = {entry["label"]: reading(entry) for entry in measured}
        plot(data, stem.with_suffix(".png"))
        disk.write_text(stem.with_suffix(".json"), json.dumps(strict_json(data), indent=2) + "\n")
        write_markdown(data, stem.with_suffix(".md"))
        print(f"wrote {stem.with_suffix('.md')} ({data['seconds']:.0f} s)", flush=True)
    return 0
