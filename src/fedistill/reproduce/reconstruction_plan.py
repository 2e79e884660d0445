"""FedIOD's Table 9 (appendix, "Brain MRI reconstruction") at CPU scale: SSIM and PSNR per test source.

Four sites, one real T1 volume each (`brain-t1-sites`: Colin 27, MNI152 2009a, two patients), 4x random
Cartesian undersampling of k-space simulated from the magnitude slices (fastMRI's mask, 8% of the lines
at the centre), every site testing on every site's held-out slabs. Rows, all on the same partition, seed,
model and local budget (`--epochs` local epochs per site for every method):

  zero-filled   the undersampled input itself: the floor
  Standalone    each site's own model on every source (the mean of the four, and one row per site)
  Centralized   one model on the pooled training slices (not federated: the ceiling)
  FedAvg        `--epochs` rounds of one local epoch, uniform averaging (Guo et al.'s code)
  FL-MRCM       the same FedAvg plus feature alignment to a target site; one run per target, and, as Guo
                et al. report it, each test source scored by the run whose target it is
  FedIOD        teachers trained `--epochs` epochs, then `--fediod-epochs` x `--iters` generator steps;
                the student selected on the sites' validation splits; no parameter leaves a site. Its
                default on per-pixel tasks, the lean preset: S learns from G's own batches (replayed)
  fediod-paper  the same with the paper's exchanges: 2 S-steps per G-step on fresh samples every site
                labels (`fediod.preset = "paper"`), the bytes the lean preset saves

    python benchmarks/reconstruction_table.py --image-size 64 --epochs 20 --fediod-epochs 30 --iters 10 \\
        --threads 1 --reuse

Each method is its own `fedistill run` process. SSIM, PSNR per volume with the volume's maximum as the data
range (fastMRI's evaluation). FedAvg's, FL-MRCM's and FedIOD's numbers are their runs' own summaries;
Standalone's and Centralized's models are scored from their runs' last checkpoint with the same harness,
because their clients score test slices one by one (they hold no volume ids). The paper's T1 numbers
(configs/expected.toml) stand beside ours for orientation only: its sites are fastMRI, BraTS 2020 and IXI
with hundreds of subjects, T1 and T2, at 256 px with the full U-Net.

Writes <results>/reconstruction_table9.{md,json} (default benchmarks/results/); runs go under --out
(default benchmarks/runs/reconstruction-table/). --reuse keeps runs that finished; without it a run
directory of the same name is replaced. benchmarks/reconstruction_figures.py draws Figure 7 from the JSON.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedistill.reproduce.arguments import benchmark_parser, settings_digest
from fedistill.reproduce.launch import run_fedistill
from fedistill.reproduce.paths import EXPECTED, RESULTS, RUNS

STEM = "reconstruction_table9"


SITES = 4


# dataset -> the `--set` options that make it four sites at the asked size
DATASETS = {"brain-t1-sites": (), "mni152-t1": ("mni152-t1.sites=4",)}


METHODS = ("standalone", "centralized", "fedavg", "flmrcm", "fediod", "fediod-paper")


LABELS = {
    "zero-filled": "Zero-filled input (floor)",
    "standalone": "Standalone (mean of the site models)",
    "standalone-own": "Standalone (the column's site's own model)",
    "centralized": "Centralized (pooled data, not federated)",
    "fedavg": "FedAvg",
    "flmrcm": "FL-MRCM (target = the column's site)",
    "fediod": "FedIOD (student)",
    "fediod-paper": "FedIOD, the paper's exchanges (2 fresh S-steps per G-step)",
}


# Table 9's test sources, in its order (B, F, I), by the key configs/expected.toml uses
PAPER_SOURCES = (("brats", "B"), ("fastmri", "F"), ("ixi", "I"))


# FedIOD's G and D_k at CPU size (the paper: pix2pix's ResNet-9 G at width 64, the 70x70 PatchGAN)
FEDIOD_SMALL = (
    "fediod.generator_width=16",
    "fediod.generator_blocks=3",
    "fediod.noise_channels=2",
    "fediod.discriminator_width=16",
    "fediod.discriminator_layers=3",
    "fediod.synthetic_batch_size=8",
)
# The paper's exchanges: 2 S-steps per G-step on fresh samples every site labels (the lean default: none)
FEDIOD_PAPER = ("fediod.preset='paper'", "fediod.student_steps=2")


@dataclass
class RunSpec:
    """One `fedistill run` of the table: which method, under what name, for how many rounds."""

    method: str
    name: str
    rounds: int
    sets: list[str]
    target: int | None = None  # FL-MRCM's target site
    extra: list[str] = field(default_factory=list)
    row: str = ""  # the table row it makes, when not `method` (fediod-paper)

    def __post_init__(self) -> None:
        self.row = self.row or self.method


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The table's settings from the command line (`argv`, else `sys.argv`); usage errors exit with 2."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--dataset", default="brain-t1-sites", choices=sorted(DATASETS))
    parser.add_argument("--image-size", type=int, default=64, help="slice size in pixels (the paper: 256)")
    parser.add_argument(
        "--chans", type=int, default=16, help="U-Net channels (fastMRI's and the paper's: 32)"
    )
    parser.add_argument("--pools", type=int, default=4, help="U-Net pooling layers (the paper's: 4)")
    parser.add_argument("--epochs", type=int, default=20, help="local epochs per site, every method")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam, every method (the paper: 1e-4)")
    parser.add_argument("--acceleration", type=float, default=4.0)
    parser.add_argument("--center-fraction", type=float, default=0.08)
    # 30: at 20 the student was still improving (selected at epochs 20, 19, 20 of seeds 0-2); at 30 it is
    # within 0.01 SSIM of FedAvg on all three seeds, the sites sending 0.26 of FedAvg's bytes
    # (benchmarks/results/sweeps/reconstruction_table9_fediod-e30-lrs2e-3*.md)
    parser.add_argument("--fediod-epochs", type=int, default=30, help="distillation epochs (the paper: 100)")
    parser.add_argument("--iters", type=int, default=10, help="FedIOD generator steps per epoch")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--flmrcm-targets", default="all", help="FL-MRCM target sites: all, or a comma list of site indices"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="for every run, over the table's own"
    )
    parser.add_argument("--reuse", action="store_true", help="keep runs that finished")
    parser.add_argument("--out", default=str(RUNS / "reconstruction-table"), help="run directories")
    parser.add_argument("--results", default=str(RESULTS), help="where the table is written")
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        parser.error(
            f"unknown method(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(METHODS)}"
        )
    if args.image_size % 2**args.pools:
        parser.error(f"--image-size {args.image_size} must be a multiple of 2^--pools = {2**args.pools}")
    for key in ("image_size", "chans", "pools", "epochs", "batch_size", "fediod_epochs", "iters"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    try:
        targets = (
            range(SITES) if args.flmrcm_targets == "all" else [int(t) for t in args.flmrcm_targets.split(",")]
        )
    except ValueError:
        parser.error(f"--flmrcm-targets wants all or site indices, got {args.flmrcm_targets!r}")
    if not targets or any(not 0 <= t < SITES for t in targets):
        parser.error(f"--flmrcm-targets: site indices are 0-{SITES - 1}, got {args.flmrcm_targets!r}")
    args.targets = sorted(set(targets))
    args.clients = SITES  # what _common.run_fedistill passes
    return args


def command_line(args: argparse.Namespace) -> str:
    """The invocation that reproduces the table (paths left out: they are the machine's)."""
    parts = [
        f"--dataset {args.dataset}", f"--image-size {args.image_size}", f"--chans {args.chans}",
        f"--pools {args.pools}", f"--epochs {args.epochs}", f"--batch-size {args.batch_size}",
        f"--lr {args.lr:g}", f"--acceleration {args.acceleration:g}",
        f"--center-fraction {args.center_fraction:g}", f"--fediod-epochs {args.fediod_epochs}",
        f"--iters {args.iters}", f"--methods {','.join(args.methods)}",
        f"--flmrcm-targets {args.flmrcm_targets}", f"--threads {args.threads}", f"--seed {args.seed}",
        *[f"--set {s}" for s in args.set], *(["--reuse"] if args.reuse else []),
    ]  # fmt: skip
    return "python benchmarks/reconstruction_table.py " + " ".join(parts)


def common_sets(args: argparse.Namespace) -> list[str]:
    """What every run shares: data, model, task, optimiser, threads (`--set` comes last, so it wins)."""
    return [
        f"{args.dataset}.image_size={args.image_size}", *DATASETS[args.dataset],
        f"model_options.chans={args.chans}", f"model_options.num_pool_layers={args.pools}",
        f"task.acceleration={args.acceleration}", f"task.center_fraction={args.center_fraction}",
        'optimizer="adam"', f"threads={args.threads}",
    ]  # fmt: skip


def cell(args: argparse.Namespace) -> str:
    """The part of every run name that says which settings it measures; `--set` items add a digest of
    themselves, so `--reuse` never hands back a run made without them (or with others)."""
    name = f"{args.dataset}-{args.image_size}px-c{args.chans}-e{args.epochs}-lr{args.lr:g}-seed{args.seed}"
    if not args.set:
        return name
    return f"{name}-set{settings_digest(sorted(args.set))}"


def run_specs(args: argparse.Namespace) -> list[RunSpec]:
    """The runs the asked methods need, baselines first (FedIOD, the slowest, last)."""
    base, e = cell(args), args.epochs
    once = [f"eval_every={e}", f"checkpoint_every={e}"]  # the final model is what the table reports
    specs = []
    for method in METHODS:
        if method not in args.methods:
            continue
        if method in ("standalone", "centralized"):
            specs.append(RunSpec(method, f"{base}-{method}", e, once))
        elif method == "fedavg":
            specs.append(RunSpec(method, f"{base}-fedavg", e, [*once, 'fedavg.weighting="uniform"']))
        elif method == "flmrcm":
            for t in args.targets:
                specs.append(
                    RunSpec(method, f"{base}-flmrcm-target{t}", e, [*once, f"flmrcm.target_site={t}"], t)
                )
        else:
            budget = [f"fediod.teacher_epochs={e}", f"fediod.iters_per_epoch={args.iters}"]
            paper = method == "fediod-paper"
            name = f"{base}-{method}-d{args.fediod_epochs}x{args.iters}"
            sets = [
                *FEDIOD_SMALL,
                *(FEDIOD_PAPER if paper else ()),
                *budget,
                f"checkpoint_every={args.fediod_epochs}",
            ]
            specs.append(RunSpec("fediod", name, args.fediod_epochs, sets, row=method))
    for spec in specs:
        spec.extra = ["--partition", "natural", "--local-epochs", "1", "--batch-size", str(args.batch_size),
                      "--lr", f"{args.lr:g}"]  # fmt: skip
    return specs


def run(spec: RunSpec, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Run (or reuse) one method; returns its run directory and summary."""
    suite = Path(args.out) / spec.name
    done = (suite / spec.method / "summary.json").is_file()
    if suite.exists() and not (args.reuse and done):
        shutil.rmtree(suite)
    print(f"{spec.name} ...", file=sys.stderr, flush=True)
    summary = run_fedistill(
        spec.method, args, name=spec.name, alpha="0.5", model="unet-fastmri", rounds=spec.rounds,
        out=args.out, sets=[*common_sets(args), *spec.sets, *args.set], extra=spec.extra,
    )  # fmt: skip
    return suite / spec.method, summary


def read_paper() -> dict[str, dict[str, dict[str, float]]]:
    """Table 9's T1 SSIM / PSNR per method and test source, from configs/expected.toml."""
    entries = tomllib.loads(EXPECTED.read_text(encoding="utf-8")) if EXPECTED.is_file() else {}
    paper: dict[str, dict[str, dict[str, float]]] = {}
    for key, entry in entries.items():
        if not key.startswith("reconstruction/t1-"):
            continue
        method = key.removeprefix("reconstruction/t1-").split("-")[0].removesuffix(".toml")
        for metric in ("ssim", "psnr"):
            for source, _ in PAPER_SOURCES:
                value = entry.get(f"paper_{metric}_{source}")
                if value is not None:
                    paper.setdefault(method, {}).setdefault(metric, {})[source] = value
    return paper
