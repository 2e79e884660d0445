"""Each benchmark row is one `fedistill run` process: launching it, and keeping it when `--reuse` finds it
finished. Keeping that here means the reproductions differ only in their rows and their report tables.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fedistill.engine as engine_package
from fedistill.reproduce.reuse import reusable

#: The digits demo's settings, the base of the demo sweeps.
DEMO = Path(engine_package.__file__).parent / "demo.toml"


#: The paper's FedIOD settings, named: the library's default preset ("auto") turns the stabilisers on for
#: classification, and the benchmarks that measure the paper's method keep the settings they were run with.
PAPER_PRESET = "fediod.preset='paper'"


def fediod_budget_sets(args: argparse.Namespace) -> list[str]:
    """The `--set` assignments that give a FedIOD run the budget asked for on the command line."""
    return [f"fediod.teacher_epochs={args.teacher_epochs}", f"fediod.iters_per_epoch={args.iters}"]


def run_fedistill(
    algorithm: str,
    args: argparse.Namespace,
    *,
    name: str,
    alpha: str,
    model: str,
    rounds: int,
    out: str | Path,
    sets: Sequence[str],
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Run `fedistill run` as its own process, unless `--reuse` finds it finished; return its summary.

    `args` gives the dataset, data folder, clients, seed and `--reuse`; `alpha` comes as the text to
    pass, `extra` are options that go after `--rounds`, and `sets` become `--set` options.
    """
    summary_path = Path(out) / name / algorithm / "summary.json"
    if not reusable(summary_path, args.reuse):
        try:
            subprocess.run(
                [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--algorithm", algorithm,
                 "--dataset", args.dataset, "--data-dir", args.data_dir, "--clients", str(args.clients),
                 "--alpha", alpha, "--model", model, "--rounds", str(rounds), *extra,
                 "--seed", str(args.seed), "--out", str(out), "--name", name,
                 *[x for s in sets for x in ("--set", s)]],
                check=True,
            )  # fmt: skip
        except subprocess.CalledProcessError as error:  # its own message is printed above: no traceback here
            raise SystemExit(
                f"fedistill run {name!r} ({algorithm}) failed with exit code {error.returncode}"
            ) from None
    return json.loads(summary_path.read_text())


def run_fediod(args: argparse.Namespace, name: str, model: str, sets: Sequence[str]) -> dict[str, Any]:
    """`run_fedistill` for a FedIOD row: `--epochs` distillation epochs, runs under `--out`, with the
    paper's settings unless `sets` name a preset (later assignments win)."""
    out = Path(args.out)
    return run_fedistill(
        "fediod",
        args,
        name=name,
        alpha=str(args.alpha),
        model=model,
        rounds=args.epochs,
        out=out,
        sets=[PAPER_PRESET, *sets],
    )


def run_on_demo(
    *,
    algorithms: str,
    name: str,
    out: str | Path,
    clients: int,
    alpha: str,
    seed: int,
    sets: Sequence[str],
    extra: Sequence[str] = (),
) -> str | None:
    """One `fedistill run` on the digits demo's settings (demo.toml) plus `sets`, as its own process at one
    torch thread; `extra` are further command-line options (`--dataset`, `--data-dir`). Returns the last
    line of its error output if it failed (e.g. a partition that leaves a client without data: a row of
    the table, not a crash), else None."""
    items = ["threads=1", *sets]
    done = subprocess.run(
        [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--config", str(DEMO),
         "--algorithm", algorithms, *extra, "--clients", str(clients), "--alpha", alpha,
         "--seed", str(seed), "--out", str(out), "--name", name, *[x for s in items for x in ("--set", s)]],
        capture_output=True, text=True,
    )  # fmt: skip
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def fedistill_run(args: Sequence[str]) -> None:
    """`fedistill run --quiet ARGS` as its own process; an error stops the caller with its exit code."""
    subprocess.run([sys.executable, "-m", "fedistill.cli", "run", "--quiet", *args], check=True)
