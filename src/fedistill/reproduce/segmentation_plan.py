"""FedIOD's segmentation tables (the paper's Tables 2, 4 and 8) on the semi-synthetic stand-ins: the runs.

Table 2 (brain lesions): `brats-synthetic-lesions`, K = 10 sites holding subjects sorted by lesion size
(`partition = "natural"`, Chang et al.'s split), one U-Net for every method: Standalone (mean ± std over
the sites' models), Centralized, FedAvg, AsynDGAN and FedIOD, and FedAvg with its BatchNorm statistics
recomputed at the sites after the last round (`recalibrate_norm`), Dice, sensitivity, specificity and HD95
per test slice; each model also meets the two real lesion patients of `brain-lesions-real` (contrast T1,
skull on, 6.5 mm slices: a domain shift for models trained on skull-stripped T1 hosts with T2-like
painted lesions). One more FedIOD run draws its masks from the server's prior
(`fediod.mask_source = "prior"`: no label leaves a site) on the same teachers (stage-1 cache), and three
more measure what sending less costs: one logit per pixel (`fediod.pixel_logits = "margin"`), that
with `--sampled-sites` of the K sites asked per G-step (`fediod.sites_per_step`), and `fediod-lean`,
whose sites label nothing but G's batches: one logit per pixel, the student trained only on those
batches replayed from a pool (`student_steps = 0`, `pool_generator_batch`), and `--lean-iters` G-steps per
epoch with `--lean-pool-steps` S-steps each (20 x 5: the student's 100 updates per epoch of 25 x 4).

Table 4 / 8 (nuclei): `nuclei-synthetic-sites`, three stained sites built from 125 real nuclei, one
site each; Dice, object Dice, AJI and HD95 on whole test images per test site and averaged over the
sites, for FedAvg (also recalibrated), AsynDGAN, FedIOD, Centralized and each site's Standalone model
(Table 8).

The protocol every method shares: the same model and initialisation, the same partition and the same
number of local epochs per site (`--*-epochs`: Standalone, FedAvg and Centralized in rounds of
epochs / rounds epochs, FedIOD's teachers in one go); FedIOD and AsynDGAN the same G and D_k sizes,
synthetic batch and number of G-steps (`--*-distill-epochs` x `--*-iters`), and AsynDGAN's server-side
segmenter as many epochs' worth of synthetic pairs as a site gets of real ones. Everything else is each
method's own default. Model selection never reads the test set (FedIOD and AsynDGAN select on the
sites' validation splits; the others report their last round).

Every model is scored again here from the files its run saved, by one function, so every row is
measured alike (the runs' own summaries evaluate Standalone per patch on the nuclei): FedAvg's
and Centralized's `models/global` (Centralized's last checkpoint in runs from before it exported one),
AsynDGAN's `models/segmenter`, FedIOD's `models/student` (its selected student), and Standalone's site
models from their last checkpoint. Where a run's summary reports
the same metric, the two must agree; the JSON says whether they did.

    python benchmarks/segmentation_tables.py [--tables 2,4] [--methods ...] [--reuse]

Writes benchmarks/results/segmentation_table2.{md,json} and segmentation_table4.{md,json}. Every run is
its own `fedistill run` process at `--threads` torch threads (one by default).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedistill import disk
from fedistill.data.medical.brain_synthetic import SCAN_SCALES, SKULLS
from fedistill.data.registry import load_dataset
from fedistill.reproduce.arguments import benchmark_parser, settings_digest
from fedistill.reproduce.launch import run_fedistill
from fedistill.reproduce.paths import RESULTS, RUNS
from fedistill.reproduce.reuse import reusable

METHODS = (
    "standalone",
    "centralized",
    "fedavg",
    "fedavg-recalibrated",
    "asyndgan",
    "fediod",
    "fediod-default",
    "fediod-prior",
    "fediod-margin",
    "fediod-sampled",
    "fediod-lean",
)

#: FedIOD's variants that send less than its default (one logit per pixel; a sample of the sites per G-step;
#: only G's batches labelled), on Table 2's teachers (stage-1 cache).
SENDING_LESS = ("fediod-margin", "fediod-sampled", "fediod-lean")

#: The FedIOD variants measured on Table 2 only: where its masks come from, and what its sites send.
TABLE2_ONLY = ("fediod-prior", *SENDING_LESS)


LABELS = {
    "standalone": "Standalone",
    "centralized": "Centralized",
    "fedavg": "FedAvg",
    "fedavg-recalibrated": "FedAvg, BatchNorm statistics recomputed at the sites",
    "asyndgan": "AsynDGAN",
    "fediod": "FedIOD",
    "fediod-default": "FedIOD, default settings",
    "fediod-prior": "FedIOD, prior masks",
    "fediod-margin": "FedIOD, one logit per pixel",
    "fediod-sampled": "FedIOD, one logit per pixel, a sample of sites per G-step",
    "fediod-lean": "FedIOD, one logit per pixel, S on G's own batches",
}


#: How Table 2 scores the real patients unless told otherwise (`--real-skull`, `--real-intensity`).
REAL_SCORING = {"real_skull": "stripped", "real_intensity": "brain-median"}


SAVED = {"fedavg": "global", "fedavg-recalibrated": "global", "asyndgan": "segmenter"}
SAVED |= {m: "student" for m in METHODS if m.startswith("fediod")}


SEMI = "semi-synthetic"


@dataclass(frozen=True)
class Table:
    """One table's data, budgets and methods, read from the command line."""

    number: int
    dataset: str
    clients: int
    dataset_options: dict[str, Any]
    epochs: int  # local epochs per site, every method
    rounds: int  # rounds of Standalone, FedAvg and Centralized (epochs / rounds local epochs each)
    distill_epochs: int  # FedIOD's distillation epochs = AsynDGAN's rounds
    iters: int  # G-steps per distillation epoch, both
    methods: tuple[str, ...] = field(default=METHODS)

    def run_name(self, method: str, seed: int, settings: Sequence[object]) -> str:
        """`seg<N>-<dataset>-<size>px-K<K>-seed<S>-<method>-<digest of the run's settings>`: `--reuse`
        keeps a run only when everything it was given is the same."""
        size = self.dataset_options.get("patch_size", self.dataset_options.get("image_size"))
        digest = settings_digest([method, self.clients, seed, *settings])
        return f"seg{self.number}-{self.dataset}-{size}px-K{self.clients}-seed{seed}-{method}-{digest}"


#: `Table.run_name`'s tail: the table's method, then the digest of the run's settings
RUN_METHOD = re.compile(r"-seed\d+-(?P<method>[a-z-]+)-[0-9a-f]{8}$")


def method_of_run(folder_name: str) -> str | None:
    """The table method a run folder named by `Table.run_name` ran, or None for any other folder."""
    named = RUN_METHOD.search(folder_name)
    return named["method"] if named and named["method"] in METHODS else None


@dataclass(frozen=True)
class RunSpec:
    method: str
    algorithm: str
    name: str
    rounds: int
    extra: tuple[str, ...]
    sets: tuple[str, ...]


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The tables' settings from the command line (`argv`, else `sys.argv`); usage errors exit with 2."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--tables", default="2,4", help="which tables: 2 (brain lesions), 4 (nuclei)")
    parser.add_argument("--methods", default=",".join(METHODS), help="a subset of " + ", ".join(METHODS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RUNS), help="where the runs go")
    parser.add_argument("--results", default=str(RESULTS), help="where the tables go")
    parser.add_argument("--reuse", action="store_true", help="keep runs of the same name that finished")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    # the model and training every method shares
    parser.add_argument("--width", type=int, default=8, help="U-Net width (channels of its first level)")
    parser.add_argument("--depth", type=int, default=4, help="U-Net depth (poolings)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam, every method (the paper's BraTS lr)")
    # FedIOD's and AsynDGAN's generator and discriminators
    parser.add_argument("--g-width", type=int, default=16)
    parser.add_argument("--g-blocks", type=int, default=3)
    parser.add_argument("--d-width", type=int, default=16)
    parser.add_argument("--d-layers", type=int, default=2)
    parser.add_argument("--synthetic-batch", type=int, default=10, help="G's batch (AsynDGAN: >= K)")
    parser.add_argument("--student-steps", type=int, default=2, help="FedIOD's S-steps per G-step")
    parser.add_argument("--sampled-sites", type=int, default=3, help="fediod-sampled: sites each G-step asks")
    parser.add_argument("--lean-pool", type=int, default=2500, help="fediod-lean: G's samples the pool keeps")
    parser.add_argument("--lean-iters", type=int, default=20, help="fediod-lean: G-steps per epoch")
    parser.add_argument("--lean-pool-steps", type=int, default=5, help="fediod-lean: S-steps per G-step")
    # Table 2
    parser.add_argument("--t2-clients", type=int, default=10)
    parser.add_argument("--t2-image-size", type=int, default=64)
    parser.add_argument("--t2-subjects", default="40,10", help="training,test subjects")
    parser.add_argument("--t2-epochs", type=int, default=20)
    parser.add_argument("--t2-rounds", type=int, default=20)
    parser.add_argument("--t2-distill-epochs", type=int, default=10)
    parser.add_argument("--t2-iters", type=int, default=25)
    # Table 4
    parser.add_argument("--t4-image-size", type=int, default=256, help="whole synthetic images")
    parser.add_argument("--t4-patch-size", type=int, default=64)
    parser.add_argument("--t4-images", default="8,4", help="training,test images per site")
    parser.add_argument("--t4-epochs", type=int, default=30)
    parser.add_argument("--t4-rounds", type=int, default=30)
    parser.add_argument("--t4-distill-epochs", type=int, default=10)
    parser.add_argument("--t4-iters", type=int, default=20)
    parser.add_argument("--real-skull", default=REAL_SCORING["real_skull"], choices=SKULLS,
                        help="the real patients' scans as scored: brain-extracted (as the training brains "
                        "are; stripped-tissue: by the tissue rule), or the whole head")  # fmt: skip
    parser.add_argument("--real-intensity", default=REAL_SCORING["real_intensity"], choices=SCAN_SCALES,
                        help="how the brain-extracted real scans are put on the training brains' scale: "
                        "their brain's median to the hosts' (the default), or the hosts' own percentile "
                        "rule, which the scans' brightest voxels set")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="add the rows run now to the table's record "
        "under --results, keeping its other rows (the record must have the same settings)",
    )
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {', '.join(sorted(unknown))}; valid: {', '.join(METHODS)}")
    if not set(args.tables.split(",")) <= {"2", "4"}:
        parser.error(f"--tables takes 2 and/or 4, got {args.tables!r}")
    if not 1 <= args.sampled_sites <= args.t2_clients:
        parser.error(f"--sampled-sites must lie in 1..{args.t2_clients} (the Table 2 sites)")
    for flag in ("lean_pool", "lean_iters", "lean_pool_steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    for flag in ("t2_subjects", "t4_images"):
        given = getattr(args, flag)
        counts = given.split(",")
        if len(counts) != 2 or not all(c.strip().isdigit() for c in counts):
            name = "--" + flag.replace("_", "-")
            parser.error(f"{name} takes TRAIN,TEST (two counts, e.g. 40,10), got {given!r}")
    for t in ("t2", "t4"):
        if getattr(args, f"{t}_epochs") % getattr(args, f"{t}_rounds"):
            parser.error(f"--{t}-epochs must be a multiple of --{t}-rounds (equal local epochs per round)")
    return args


def tables(args: argparse.Namespace) -> list[Table]:
    """The asked tables with their data, budgets and methods."""
    methods = tuple(m for m in METHODS if m in args.methods.split(","))
    out = []
    if "2" in args.tables.split(","):
        train, test = (int(v) for v in args.t2_subjects.split(","))
        options = {"image_size": args.t2_image_size, "train_subjects": train, "test_subjects": test}
        out.append(Table(2, "brats-synthetic-lesions", args.t2_clients, options, args.t2_epochs,
                         args.t2_rounds, args.t2_distill_epochs, args.t2_iters, methods))  # fmt: skip
    if "4" in args.tables.split(","):
        train, test = (int(v) for v in args.t4_images.split(","))
        options = {"image_size": args.t4_image_size, "patch_size": args.t4_patch_size,
                   "train_images": train, "test_images": test}  # fmt: skip
        out.append(Table(4, "nuclei-synthetic-sites", 3, options, args.t4_epochs, args.t4_rounds,
                         args.t4_distill_epochs, args.t4_iters,
                         tuple(m for m in methods if m not in TABLE2_ONLY)))  # fmt: skip
    return out


def training_samples(table: Table, args: argparse.Namespace) -> int:
    """The sites' training samples together (after the 10% validation hold-out)."""
    data = load_dataset(table.dataset, args.data_dir, **table.dataset_options)
    return math.ceil(0.9 * len(data.train))


def plan(table: Table, args: argparse.Namespace, train_samples: int) -> list[RunSpec]:
    """The `fedistill run` of every method of `table`, budgets as the module docstring says."""
    common = [f"threads={args.threads}", "optimizer='adam'", f"model_options.width={args.width}",
              f"model_options.depth={args.depth}",
              *(f"{table.dataset}.{k}={v}" for k, v in table.dataset_options.items())]  # fmt: skip
    gan = [f"generator_width={args.g_width}", f"generator_blocks={args.g_blocks}",
           f"discriminator_width={args.d_width}", f"discriminator_layers={args.d_layers}",
           f"synthetic_batch_size={args.synthetic_batch}", f"iters_per_epoch={table.iters}"]  # fmt: skip
    # `fediod`: the paper's exchanges (fresh S-step samples every site labels), as the tables were first run;
    # `fediod-default`: the library's default on these tasks (the lean preset: S learns from G's own
    # batches, and, where the mask lays out the image, from the mask too); `fediod-lean` sends what the lean
    # preset sends, with its own pool and replay steps
    distil = [*(f"fediod.{s}" for s in gan), f"fediod.teacher_epochs={table.epochs}",
              f"fediod.lr_student={args.lr}"]  # fmt: skip
    fediod = [*distil, "fediod.preset='paper'", f"fediod.student_steps={args.student_steps}"]
    # AsynDGAN's S trains at the server on G's pairs: as many epochs' worth as a site's model gets
    segmenter_steps = math.ceil(table.epochs / table.distill_epochs * train_samples / args.batch_size)
    asyndgan = [*(f"asyndgan.{s}" for s in gan), f"asyndgan.segmenter_steps={segmenter_steps}"]
    margin, sampled = "fediod.pixel_logits='margin'", f"fediod.sites_per_step={args.sampled_sites}"
    # S learns only from the G-steps' batches, replayed from a pool: no site labels another sample
    lean = ("fediod.student_steps=0", "fediod.pool_generator_batch=true",
            f"fediod.pool_size={args.lean_pool}", f"fediod.pool_steps={args.lean_pool_steps}",
            f"fediod.iters_per_epoch={args.lean_iters}")  # fmt: skip
    base = ("--partition", "natural", "--batch-size", str(args.batch_size), "--lr", str(args.lr))
    local = (*base, "--local-epochs", str(table.epochs // table.rounds))
    specs = {
        "standalone": ("standalone", table.rounds, local, ()),
        "centralized": ("centralized", table.rounds, local, ()),
        "fedavg": ("fedavg", table.rounds, local, ()),
        # the averaged model's BatchNorm statistics replaced by the sites' pooled ones after the last round
        "fedavg-recalibrated": ("fedavg", table.rounds, local, ("recalibrate_norm=true",)),
        "asyndgan": ("asyndgan", table.distill_epochs, base, asyndgan),
        "fediod": ("fediod", table.distill_epochs, base, fediod),
        "fediod-default": ("fediod", table.distill_epochs, base, distil),
        "fediod-prior": ("fediod", table.distill_epochs, base, (*fediod, "fediod.mask_source='prior'")),
        "fediod-margin": ("fediod", table.distill_epochs, base, (*fediod, margin)),
        "fediod-sampled": ("fediod", table.distill_epochs, base, (*fediod, margin, sampled)),
        "fediod-lean": ("fediod", table.distill_epochs, base, (*fediod, margin, *lean)),
    }
    return [
        RunSpec(method, algorithm,
                table.run_name(method, args.seed, [algorithm, rounds, *extra, *common, *sets, *args.set]),
                rounds, extra, (*common, *sets, *args.set))
        for method, (algorithm, rounds, extra, sets) in specs.items() if method in table.methods
    ]  # fmt: skip


def execute(table: Table, spec: RunSpec, args: argparse.Namespace) -> Path:
    """Run (or, with --reuse, keep) one method's run; its algorithm folder.

    The run's CPU time (user + system, from the finished child process) goes to `cpu_seconds.json` in its
    folder: on a machine shared with other jobs it compares methods where wall time cannot."""
    run_args = argparse.Namespace(dataset=table.dataset, data_dir=args.data_dir, clients=table.clients,
                                  seed=args.seed, reuse=args.reuse)  # fmt: skip
    print(f"table {table.number}: {spec.method} ({spec.name})", flush=True)
    folder = Path(args.out) / spec.name / spec.algorithm
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    fresh = not reusable(folder / "summary.json", args.reuse)
    run_fedistill(spec.algorithm, run_args, name=spec.name, alpha="1", model="unet", rounds=spec.rounds,
                  out=args.out, sets=spec.sets, extra=spec.extra)  # fmt: skip
    if fresh:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        disk.write_text(folder / "cpu_seconds.json", json.dumps({"cpu_s": cpu}) + "\n")
    return folder
