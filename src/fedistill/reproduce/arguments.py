"""The command-line options the reproductions share: data folder, FedIOD budget, seed and run folder,
device and image shape, and the run-name parts they make."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence

from fedistill.reproduce.paths import DATA, RUNS


def benchmark_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring as written (its usage lines keep their layout)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(DATA))
    return parser


#: Options naming the machine's folders: a recorded command leaves them (and their values) out.
MACHINE_PATHS = ("--out", "--results", "--data-dir")


def shown_arguments(argv: Sequence[str], folders: Sequence[str] = MACHINE_PATHS) -> list[str]:
    """The command line as a record cites it: the `folders` options left out, in both spellings
    (`--out X` and `--out=X`), since they are one machine's; but `--results` into a folder of the
    checkout's own results (`benchmarks/results/<sub>`) is kept, as without it the command would overwrite
    the default record."""
    kept: list[str] = []
    skip = False
    for i, item in enumerate(argv):
        flag, equals, value = item.partition("=")
        if skip:
            skip = False
        elif item in folders:  # `--out X`: X is the next item
            skip = True
            following = argv[i + 1] if i + 1 < len(argv) else ""
            kept += [item, following] if _published(item, following) else []
        elif not (equals and flag in folders) or _published(flag, value):
            kept.append(item)
    return kept


def _published(flag: str, value: str) -> bool:
    """`--results benchmarks/results/<sub>`: a record kept beside the default ones."""
    return flag == "--results" and value.startswith("benchmarks/results/") and ".." not in value.split("/")


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
    """The seed and the folder the runs go to (benchmarks/runs in a checkout, else runs/, unless told)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RUNS))


def add_device_and_shape(parser: argparse.ArgumentParser) -> None:
    """`--device`, and `--image-size` / `--channels` that resample an MNIST-like set (e.g. to CIFAR's
    3 x 32 x 32): the options of a measurement that may run on an accelerator at the paper's shape."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (the runs' device key)")
    parser.add_argument("--image-size", type=int, default=0, help="MNIST-like sets: resample to this size")
    parser.add_argument("--channels", type=int, default=0, help="MNIST-like sets: 3 repeats grey into colour")


def resampled_shape(args: argparse.Namespace) -> dict[str, int]:
    """The dataset options `--image-size` / `--channels` ask for (none when neither is given)."""
    asked = (("image_size", args.image_size), ("channels", args.channels))
    return {key: value for key, value in asked if value}


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """A one-line usage error, before anything runs, when `--device` names one this machine lacks."""
    from fedistill import devices
    from fedistill.errors import ConfigError

    try:
        devices.resolve(device)
    except ConfigError as error:
        parser.error(f"--device: {error}")


def check_shape(parser: argparse.ArgumentParser, args: argparse.Namespace, datasets: Sequence[str]) -> None:
    """A one-line usage error, before anything runs, when `--device` names one this machine lacks or
    `--image-size` / `--channels` meet a dataset that cannot be resampled. With `--reuse` the device is not
    checked: a GPU's finished runs can be read back into a table on a machine without one (a run still
    missing then stops with the same message from `fedistill run`)."""
    from fedistill.data.registry import dataset_options

    if not getattr(args, "reuse", False):
        check_device(parser, args.device)
    asked = ["--" + key.replace("_", "-") for key in resampled_shape(args)]
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


def settings_digest(settings: Sequence[object]) -> str:
    """Eight hex digits that change with any of a run's settings: the part of a run name that lets
    `--reuse` keep a run only when it was given the same."""
    return hashlib.sha256(json.dumps(list(settings)).encode()).hexdigest()[:8]
