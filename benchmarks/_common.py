"""What the benchmark scripts that launch `fedistill run` processes share.

Each benchmark row is one `fedistill run` process, and the scripts agree on where data, runs and
results live, on the run names of a cell, and on `--reuse` (keep a run that has already written its
summary). Keeping that here means the scripts differ only in their rows and their report tables.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEMO = HERE.parent / "src" / "fedistill" / "experiment" / "demo.toml"


def benchmark_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring as written (its usage lines keep their layout)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(HERE.parents[1] / "shared" / "data"))
    return parser


def fediod_parser(doc: str | None) -> argparse.ArgumentParser:
    """`benchmark_parser` with the data and partition options every FedIOD benchmark starts with."""
    parser = benchmark_parser(doc)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--clients", type=int, default=10)
    return parser


def add_fediod_run_options(parser: argparse.ArgumentParser, reuse_help: str) -> None:
    """The FedIOD budget (epochs, D-steps, teacher epochs), seed, run folder, `--set` and `--reuse`."""
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--teacher-epochs", type=int, default=10)
    add_seed_and_out(parser)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--reuse", action="store_true", help=reuse_help)


def add_seed_and_out(parser: argparse.ArgumentParser) -> None:
    """The seed and the folder the runs go to (benchmarks/runs unless told)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "runs"))


def add_device_and_shape(parser: argparse.ArgumentParser) -> None:
    """`--device`, and `--image-size` / `--channels` that resample an MNIST-like set (e.g. to CIFAR's
    3 x 32 x 32): the options of a measurement that may run on an accelerator at the paper's shape."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (the runs' device key)")
    parser.add_argument("--image-size", type=int, default=0, help="MNIST-like sets: resample to this size")
    parser.add_argument("--channels", type=int, default=0, help="MNIST-like sets: 3 repeats grey into colour")


def check_shape(parser: argparse.ArgumentParser, args: argparse.Namespace, datasets: Sequence[str]) -> None:
    """A one-line usage error, before anything runs, when `--image-size` / `--channels` meet a dataset
    that cannot be resampled."""
    from fedistill.data.registry import dataset_options

    asked = [
        f"--{flag}" for flag, value in (("image-size", args.image_size), ("channels", args.channels)) if value
    ]
    fixed = [d for d in datasets if "image_size" not in dataset_options(d)]
    if asked and fixed:
        parser.error(
            f"{' and '.join(asked)}: dataset {fixed[0]!r} cannot be reshaped (mnist, fashion-mnist can)"
        )


def variant_suffix(args: argparse.Namespace) -> str:
    """The device and any resampling as a file-name suffix (`_cuda_32px_3ch`), so variants never overwrite."""
    name = "" if args.device == "cpu" else f"_{args.device.replace(':', '')}"
    name += f"_{args.image_size}px" if args.image_size else ""
    return name + (f"_{args.channels}ch" if args.channels else "")


def variant_flags(args: argparse.Namespace) -> str:
    """The same options as they go on a recorded command line."""
    return (
        ("" if args.device == "cpu" else f" --device {args.device}")
        + (f" --image-size {args.image_size}" if args.image_size else "")
        + (f" --channels {args.channels}" if args.channels else "")
    )


def cell_name(args: argparse.Namespace) -> str:
    """`<dataset>-alpha<alpha>-seed<seed>`: the part of a run name that says which cell it measures."""
    return f"{args.dataset}-alpha{args.alpha:g}-seed{args.seed}"


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
    if not (args.reuse and summary_path.is_file()):
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
        [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--config", str(DEMO), "--algorithm", algorithms,
         *extra, "--clients", str(clients), "--alpha", alpha, "--seed", str(seed), "--out", str(out),
         "--name", name, *[x for s in items for x in ("--set", s)]],
        capture_output=True, text=True,
    )  # fmt: skip
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
