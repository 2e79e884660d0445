"""What the benchmark scripts share, under the names they use: the package's reproduction helpers
(`fedistill.reproduce`: options, `fedistill run` launches, the checkout's folders)."""

from __future__ import annotations

from pathlib import Path

from fedistill.reproduce.arguments import (
    add_device_and_shape,
    add_fediod_run_options,
    add_seed_and_out,
    benchmark_parser,
    cell_name,
    check_shape,
    fediod_parser,
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

__all__ = [
    "DEMO",
    "HERE",
    "PAPER_PRESET",
    "RESULTS",
    "add_device_and_shape",
    "add_fediod_run_options",
    "add_seed_and_out",
    "benchmark_parser",
    "cell_name",
    "check_shape",
    "fediod_budget_sets",
    "fediod_parser",
    "run_fediod",
    "run_fedistill",
    "run_on_demo",
    "variant_flags",
    "variant_suffix",
]
