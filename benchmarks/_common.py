"""What the benchmark scripts share, under the names they use: the package's reproduction helpers
(`fedistill.reproduce`: options, `fedistill run` launches, the checkout's folders)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from fedistill.reproduce.arguments import (
    add_device_and_shape,
    add_fediod_run_options,
    add_seed_and_out,
    benchmark_parser,
    cell_name,
    check_shape,
    fediod_parser,
    resampled_shape,
    variant_flags,
    variant_suffix,
)
from fedistill.reproduce.launch import (
    DEMO,
    PAPER_PRESET,
    fediod_budget_sets,
    run_fediod,
    run_fedistill,
    run_on_demo,
)
from fedistill.reproduce.paths import RESULTS

HERE = Path(__file__).resolve().parent


def head_commit() -> str:
    """The checkout's short commit hash, as a record names the code that made it ("unknown" outside git)."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE, check=False
    )
    return done.stdout.strip() or "unknown"


def add_budget_arguments(parser: argparse.ArgumentParser, set_help: str | None = None) -> None:
    """The budget flags of the scripts that set FedIOD against FedAvg on one partition (clients, model,
    epochs, G-steps, teacher epochs, FedAvg rounds, threads, FedIOD's `--set` and `--reuse`), with the
    same defaults in each so that their runs compare."""
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--model", default="lenet-fedmdcg")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--teacher-epochs", type=int, default=10)
    parser.add_argument("--fedavg-rounds", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")


__all__ = [
    "DEMO",
    "HERE",
    "PAPER_PRESET",
    "RESULTS",
    "add_budget_arguments",
    "add_device_and_shape",
    "add_fediod_run_options",
    "add_seed_and_out",
    "benchmark_parser",
    "cell_name",
    "check_shape",
    "fediod_budget_sets",
    "fediod_parser",
    "head_commit",
    "resampled_shape",
    "run_fediod",
    "run_fedistill",
    "run_on_demo",
    "variant_flags",
    "variant_suffix",
]
