"""FedIOD's segmentation tables (the paper's Tables 2, 4 and 8) on the semi-synthetic stand-ins.

Table 2 (brain lesions): `brats-synthetic-lesions`, K = 10 sites holding subjects sorted by lesion size
(`partition = "natural"`, Chang et al.'s split), one U-Net for every method: Standalone (mean ± std over
the sites' models), Centralized, FedAvg, AsynDGAN and FedIOD, Dice, sensitivity, specificity and HD95
per test slice; each model also meets the two real lesion patients of `brain-lesions-real` (contrast T1,
skull on, 6.5 mm slices: a domain shift for models trained on skull-stripped T1 hosts with T2-like
painted lesions). One more FedIOD run draws its masks from the server's prior
(`fediod.mask_source = "prior"`: no label leaves a site) on the same teachers (stage-1 cache).

Table 4 / 8 (nuclei): `nuclei-synthetic-sites`, three stained sites built from 125 real nuclei, one
site each; Dice, object Dice, AJI and HD95 on whole test images per test site and averaged over the
sites, for FedAvg, AsynDGAN, FedIOD, Centralized and each site's Standalone model (Table 8).

The protocol every method shares: the same model and initialisation, the same partition and the same
number of local epochs per site (`--*-epochs`: Standalone, FedAvg and Centralized in rounds of
epochs / rounds epochs, FedIOD's teachers in one go); FedIOD and AsynDGAN the same G and D_k sizes,
synthetic batch and number of G-steps (`--*-distill-epochs` x `--*-iters`), and AsynDGAN's server-side
segmenter as many epochs' worth of synthetic pairs as a site gets of real ones. Everything else is each
method's own default. Model selection never reads the test set (FedIOD and AsynDGAN select on the
sites' validation splits; the others report their last round).

Every model is scored again here from the files its run saved, by one function, so every row is
measured alike (the runs' own summaries evaluate Standalone per patch on the nuclei): FedAvg's
`models/global`, AsynDGAN's `models/segmenter`, FedIOD's `models/student` (its selected student), and
Standalone's and Centralized's site models from their last checkpoint. Where a run's summary reports
the same metric, the two must agree; the JSON says whether they did.

    python benchmarks/segmentation_tables.py [--tables 2,4] [--methods ...] [--reuse]

Writes benchmarks/results/segmentation_table2.{md,json} and segmentation_table4.{md,json}. Every run is
its own `fedistill run` process at `--threads` torch threads (one by default).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import resource
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from _common import HERE, RESULTS, benchmark_parser, run_fedistill
from fedistill.algorithms.training import evaluate_model, new_model, task_of
from fedistill.data.base import LoadedDataset
from fedistill.data.registry import load_dataset
from fedistill.experiment.checkpoint import latest_checkpoint, read_checkpoint
from fedistill.experiment.config import RunConfig, read_config
from fedistill.experiment.rundir import read_jsonl
from fedistill.experiment.runner import source_names

REPO = HERE.parent
METHODS = ("standalone", "centralized", "fedavg", "asyndgan", "fediod", "fediod-prior")
LABELS = {
    "standalone": "Standalone",
    "centralized": "Centralized",
    "fedavg": "FedAvg",
    "asyndgan": "AsynDGAN",
    "fediod": "FedIOD",
    "fediod-prior": "FedIOD, prior masks",
}
SAVED = {"fedavg": "global", "asyndgan": "segmenter", "fediod": "student", "fediod-prior": "student"}
SEMI = "semi-synthetic"

# The paper's numbers (FedIOD, AAAI 2024, arXiv:2312.14478): real BraTS 2018 T2 at 224 px and real
# histology with the 2015 U-Net and the paper's budgets. Shown for orientation only.
PAPER_TABLE2 = {  # Dice, Sens., Spec. (%), HD95 (px); Standalone: mean ± std over the 10 sites
    "standalone": ((65.03, 3.31), (69.27, 4.72), (99.35, 0.15), (24.61, 3.62)),
    "centralized": (74.85, 79.83, 99.55, 12.85),
    "fedavg": (70.71, 67.31, 99.85, 11.88),
    "asyndgan": (70.43, 72.95, 99.57, 14.94),
    "fediod": (75.38, 79.47, 99.60, 11.76),
}
PAPER_SITES = ("Cell17", "TCGA", "TNBC")
PAPER_TABLE4 = {  # per test site: Dice, Obj-Dice, AJI (%), HD95 (px); then the average over the sites
    "fedavg": ((68.74, 65.82, 39.37, 24.15), (77.57, 72.94, 50.03, 15.87), (43.95, 53.23, 22.48, 123.51),
               (63.42, 64.00, 37.29, 54.51)),
    "asyndgan": ((79.82, 59.03, 34.64, 19.27), (52.29, 57.12, 26.03, 47.47), (67.80, 67.31, 41.96, 39.63),
                 (66.64, 61.15, 34.21, 35.46)),
    "fediod": ((86.23, 68.03, 44.75, 7.01), (76.59, 72.67, 53.04, 12.69), (75.01, 74.03, 50.76, 29.54),
               (79.28, 71.58, 49.52, 16.41)),
}  # fmt: skip
PAPER_TABLE8 = {  # Standalone: trained on one site, tested on each (Table 8), then the average
    "Cell17": ((85.90, 67.24, 44.26, 8.21), (43.03, 33.83, 11.75, 34.75), (49.18, 50.70, 26.26, 55.71),
               (59.37, 50.59, 27.42, 32.89)),
    "TCGA": ((55.10, 48.25, 29.42, 31.94), (75.75, 71.58, 51.91, 13.14), (16.77, 25.42, 7.50, 126.14),
             (49.20, 48.41, 32.94, 57.07)),
    "TNBC": ((70.42, 56.79, 36.59, 24.33), (35.59, 24.32, 5.65, 35.31), (78.08, 76.84, 57.81, 23.72),
             (61.36, 52.65, 33.35, 27.78)),
}  # fmt: skip
INSTANCE_METRICS = ("dice", "object_dice", "aji", "hd95")


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
        digest = hashlib.sha256(json.dumps([method, self.clients, seed, *settings]).encode()).hexdigest()[:8]
        return f"seg{self.number}-{self.dataset}-{size}px-K{self.clients}-seed{seed}-{method}-{digest}"


@dataclass(frozen=True)
class RunSpec:
    method: str
    algorithm: str
    name: str
    rounds: int
    extra: tuple[str, ...]
    sets: tuple[str, ...]


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--tables", default="2,4", help="which tables: 2 (brain lesions), 4 (nuclei)")
    parser.add_argument("--methods", default=",".join(METHODS), help="a subset of " + ", ".join(METHODS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "runs"), help="where the runs go")
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
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {', '.join(sorted(unknown))}; valid: {', '.join(METHODS)}")
    if not set(args.tables.split(",")) <= {"2", "4"}:
        parser.error(f"--tables takes 2 and/or 4, got {args.tables!r}")
    for t in ("t2", "t4"):
        if getattr(args, f"{t}_epochs") % getattr(args, f"{t}_rounds"):
            parser.error(f"--{t}-epochs must be a multiple of --{t}-rounds (equal local epochs per round)")
    return args


def tables(args: argparse.Namespace) -> list[Table]:
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
                         tuple(m for m in methods if m != "fediod-prior")))  # fmt: skip
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
    fediod = [*(f"fediod.{s}" for s in gan), f"fediod.teacher_epochs={table.epochs}",
              f"fediod.student_steps={args.student_steps}", f"fediod.lr_student={args.lr}"]  # fmt: skip
    # AsynDGAN's S trains at the server on G's pairs: as many epochs' worth as a site's model gets
    segmenter_steps = math.ceil(table.epochs / table.distill_epochs * train_samples / args.batch_size)
    asyndgan = [*(f"asyndgan.{s}" for s in gan), f"asyndgan.segmenter_steps={segmenter_steps}"]
    base = ("--partition", "natural", "--batch-size", str(args.batch_size), "--lr", str(args.lr))
    local = (*base, "--local-epochs", str(table.epochs // table.rounds))
    specs = {
        "standalone": ("standalone", table.rounds, local, ()),
        "centralized": ("centralized", table.rounds, local, ()),
        "fedavg": ("fedavg", table.rounds, local, ()),
        "asyndgan": ("asyndgan", table.distill_epochs, base, asyndgan),
        "fediod": ("fediod", table.distill_epochs, base, fediod),
        "fediod-prior": ("fediod", table.distill_epochs, base, (*fediod, "fediod.mask_source='prior'")),
    }
    return [
        RunSpec(method, algorithm, table.run_name(method, args.seed, [algorithm, rounds, *extra, *common, *sets, *args.set]),
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
    fresh = not (args.reuse and (folder / "summary.json").is_file())
    run_fedistill(spec.algorithm, run_args, name=spec.name, alpha="1", model="unet", rounds=spec.rounds,
                  out=args.out, sets=spec.sets, extra=spec.extra)  # fmt: skip
    if fresh:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        (folder / "cpu_seconds.json").write_text(json.dumps({"cpu_s": cpu}) + "\n", encoding="utf-8")
    return folder


# --- scoring the saved models ----------------------------------------------------------------------
def saved_models(run: Path, method: str, config: RunConfig, data: LoadedDataset) -> list[nn.Module]:
    """The models a run saved: one (FedAvg, AsynDGAN, FedIOD, Centralized) or one per site (Standalone,
    site order = client id = the natural partition's order)."""

    def model(state: dict[str, torch.Tensor]) -> nn.Module:
        net = new_model(config, data.info)
        net.load_state_dict(state)
        return net.eval()

    if method in SAVED:
        return [model(load_file(str(run / "models" / f"{SAVED[method]}.safetensors")))]
    checkpoint = latest_checkpoint(run / "checkpoints")
    if checkpoint is None:
        raise SystemExit(f"{run}: no checkpoint holds the site models")
    state = read_checkpoint(checkpoint)
    clients = sorted(k for k in state if k.startswith("client_"))
    return [model(state[c]["model"]) for c in clients]


def real_patients(config: RunConfig, args: argparse.Namespace) -> tuple[LoadedDataset, list[str]]:
    """The two patients' slices at the run's image size and slice rule, and each slice's patient."""
    options = config.options.get(config.dataset, {})
    real = load_dataset("brain-lesions-real", args.data_dir, image_size=options.get("image_size", 128),
                        slices=options.get("slices", "tumour"))  # fmt: skip
    return real, [f"patient{int(s) + 1}" for s in real.test_meta["subject"]]


def score(run: Path, method: str, args: argparse.Namespace) -> tuple[list[dict[str, float]], LoadedDataset]:
    """Every saved model's test metrics (per source too), and on the real patients for Table 2; and the
    dataset they were measured on."""
    config = read_config(run / "config.toml")
    data = load_dataset(config.dataset, args.data_dir, **config.options.get(config.dataset, {}))
    task = task_of(config, data.info)
    real = real_patients(config, args) if config.dataset == "brats-synthetic-lesions" else None
    results = []
    for net in saved_models(run, method, config, data):
        with torch.no_grad():
            metrics = evaluate_model(net, data.test, data.info, task=task, meta=data.test_meta,
                                     groups=source_names(data))  # fmt: skip
            if real is not None:  # the training set's normalisation: what the model was trained on
                found = evaluate_model(net, real[0].test, data.info, task=task, groups=real[1])
                metrics |= {f"real_{k}": v for k, v in found.items()}
        results.append({k: float(v) for k, v in metrics.items()})
    return results, data


def run_facts(run: Path) -> dict[str, Any]:
    """Wall time, stage-2 time, bytes sent up (label masks among them) and the run's own headline."""
    summary = json.loads((run / "summary.json").read_text())
    up = summary["communication"]["client->server"]
    rounds = read_jsonl(run / "metrics.jsonl")
    cpu = run / "cpu_seconds.json"
    return {
        "wall_s": summary["wall_time_s"],
        "cpu_s": json.loads(cpu.read_text())["cpu_s"] if cpu.is_file() else None,
        "rounds_s": float(sum(r.get("round_time_s", 0.0) for r in rounds)),
        "up_bytes": up["total_bytes"],
        "label_bytes": up["per_kind"].get("label-masks", 0),
        "final": summary["final"],
    }


def consistent(method: str, metrics: list[dict[str, float]], final: dict[str, Any], table: int) -> bool:
    """Whether our score of the saved model(s) equals the run's own final test Dice (Standalone: the mean
    over its sites). On the nuclei, Standalone's and Centralized's sites score their models per patch,
    not on stitched whole images, so those two are not compared there."""
    if method in ("standalone", "centralized") and table == 4:
        return True
    ours = float(np.mean([m["dice"] for m in metrics]))
    return abs(ours - float(final["test_dice"])) < 1e-6


def row(method: str, run: Path, args: argparse.Namespace, table: int) -> dict[str, Any]:
    (metrics, data), facts = score(run, method, args), run_facts(run)
    final = facts.pop("final")
    extra = {k: final[k] for k in ("ensemble_dice", "teacher_mean_dice", "fraction_of_ensemble",
                                   "selected_epoch") if k in final}  # fmt: skip
    sources = trained_on(run, data.group_names) if table == 4 else []  # Table 2's groups are subjects
    return {"method": method, "run": display_path(run), "sites": metrics, "trained_on": sources, **facts,
            **extra, "matches_run_summary": consistent(method, metrics, final, table)}  # fmt: skip


def trained_on(run: Path, names: Sequence[str]) -> list[str]:
    """The source (group) most of each client's training data comes from, by the saved partition."""
    partition = json.loads((run / "partition.json").read_text())
    return [names[int(np.argmax(counts))] for counts in partition["train_counts"]]


def display_path(path: Path) -> str:
    """A run's folder relative to the repository when it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# --- the tables ------------------------------------------------------------------------------------
def mean_std(values: Sequence[float], scale: float = 1.0) -> tuple[float, float]:
    array = np.asarray(values, dtype=float) * scale
    return float(array.mean()), float(array.std())  # std over the sites (population), as the runs do


def fmt(values: Sequence[float], scale: float = 100.0) -> str:
    mean, std = mean_std(values, scale)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ± {std:.2f}"


def command(args: argparse.Namespace) -> str:
    """The exact command (the data and run folders left out where they are the defaults)."""
    return " ".join(["python benchmarks/segmentation_tables.py", *map(shlex.quote, args.argv)])


def settings_line(table: Table, args: argparse.Namespace) -> str:
    local = table.epochs // table.rounds
    return (f"{table.dataset} ({SEMI}), {table.dataset_options}, K = {table.clients} (`natural` sites); "
            f"U-Net width {args.width}, depth {args.depth} for every method; Adam lr {args.lr}, batch "
            f"{args.batch_size}; {table.epochs} local epochs per site for every method (Standalone, FedAvg, "
            f"Centralized: {table.rounds} rounds x {local}; FedIOD's teachers: {table.epochs}); FedIOD and "
            f"AsynDGAN: {table.distill_epochs} epochs x {table.iters} G-steps of {args.synthetic_batch} "
            f"masks, G width {args.g_width} with {args.g_blocks} ResNet blocks, D_k width {args.d_width} with "
            f"{args.d_layers} layers; FedIOD {args.student_steps} S-steps per G-step; AsynDGAN's S "
            f"{table.epochs} epochs' worth of G's pairs; seed {args.seed}; {args.threads} torch thread(s) "
            f"per run, one run at a time")  # fmt: skip


def table2_lines(rows: dict[str, dict[str, Any]], table: Table, args: argparse.Namespace) -> list[str]:
    lines = [
        f"# Table 2-style: brain-lesion segmentation, {SEMI} (brats-synthetic-lesions), K = {table.clients}",
        "",
        f"Command: `{command(args)}`",
        "",
        f"Settings: {settings_line(table, args)}.",
        "",
        f"Every number in the first two tables is measured on {SEMI} data: real brains (Colin 27 and the "
        "MNI152 2009a template, T1) with painted synthetic lesions, except the 'real patient' columns: "
        "the two real lesion patients of `brain-lesions-real`, which are contrast-enhanced T1 with the "
        "skull on and 6.5 mm slices. No model saw such an image in training, so those columns measure "
        "a shift of domain, not BraTS performance.",
        "",
        "| method | Dice % | Sens. % | Spec. % | HD95 px | real patient 1: Dice % / HD95 | real patient 2: Dice % / HD95 | wall s / CPU s | sent up MB (label masks) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for method in ("standalone", "centralized", "fedavg", "asyndgan", "fediod", "fediod-prior"):
        if method not in rows:
            continue
        r, sites = rows[method], rows[method]["sites"]

        def col(key: str, scale: float = 100.0, sites: list[dict[str, float]] = sites) -> str:
            return fmt([s[key] for s in sites], scale)

        real = " | ".join(
            f"{col(f'real_dice_patient{p}')} / {col(f'real_hd95_patient{p}', 1.0)}" for p in (1, 2)
        )
        lines.append(
            f"| {LABELS[method]} ({SEMI}) | {col('dice')} | {col('sensitivity')} | {col('specificity')} "
            f"| {col('hd95', 1.0)} | {real} | {seconds(r)} "
            f"| {r['up_bytes'] / 1e6:.1f} ({r['label_bytes'] / 1e6:.2f}) |"
        )
    lines += [
        "",
        "Standalone: mean ± std over the sites' own models (each tested on the whole test set). HD95 in "
        f"pixels of the {table.dataset_options['image_size']} px slices (the paper's are 224 px). "
        f"{TIME_NOTE} {UPLOAD_NOTE}",
    ]
    real = [s[f"real_dice_patient{p}"] for r in rows.values() for s in r["sites"] for p in (1, 2)]
    if real and max(real) == 0:
        lines += ["", "No model finds either real lesion (Dice 0 for every method and site): trained on "
                  "skull-stripped semi-synthetic slices, they meet contrast T1 with the skull on (Figure 5)."]  # fmt: skip
    if "fediod" in rows:
        f = rows["fediod"]
        lines += [
            "",
            f"FedIOD's teachers: mean Dice {100 * f.get('teacher_mean_dice', math.nan):.2f}, their "
            f"weighted ensemble (the one-shot ceiling) {100 * f.get('ensemble_dice', math.nan):.2f}; the "
            f"student reached {f.get('fraction_of_ensemble', math.nan):.2f} of it (selected epoch "
            f"{f.get('selected_epoch', '?')}, on the sites' validation splits).",
        ]
    if "fediod" in rows and "fediod-prior" in rows:
        lines += ["", *mask_source_lines(rows["fediod"], rows["fediod-prior"])]
    lines += ["", *paper2_lines()]
    return lines


TIME_NOTE = (
    "Wall and CPU time of each whole run (set-up, evaluation every round and FedIOD's stage 1 included), "
    "one run at a time at one torch thread on a 2-core machine that another job shared: wall times "
    "are inflated by that load, CPU times compare the methods."
)


UPLOAD_NOTE = (
    "Sent up: all the sites sent the server (FedAvg: its model every round; AsynDGAN: input-gradients; "
    "FedIOD: per-pixel logits, density ratios and input-gradients every G-step), label masks in brackets."
)


def seconds(r: dict[str, Any]) -> str:
    cpu = "-" if r.get("cpu_s") is None else f"{r['cpu_s']:.0f}"
    return f"{r['wall_s']:.0f} / {cpu}"


def mask_source_lines(clients: dict[str, Any], prior: dict[str, Any]) -> list[str]:
    def dice(r: dict[str, Any], key: str = "dice") -> float:
        return 100 * r["sites"][0][key]

    return [
        "## What keeping the labels at the sites costs (FedIOD, same teachers)",
        "",
        "`mask_source = \"clients\"`: each site uploads its label masks once (as AsynDGAN does) and G is "
        "conditioned on them; `\"prior\"`: the server draws masks from its own prior of smooth blobs and no "
        "label leaves a site. Both runs distil the same stage-1 teachers (the second reads them from the "
        "stage-1 cache, so its run time leaves stage 1 out): the stage-2 time compares like with like.",
        "",
        "| mask source | Dice % | HD95 px | real patients' Dice % (1 / 2) | stage 2 wall s | run wall s / CPU s | label masks sent MB |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {name} | {dice(r):.2f} | {r['sites'][0]['hd95']:.2f} | {dice(r, 'real_dice_patient1'):.2f} / "
            f"{dice(r, 'real_dice_patient2'):.2f} | {r['rounds_s']:.0f} | {seconds(r)} | {r['label_bytes'] / 1e6:.2f} |"
            for name, r in (("clients", clients), ("prior", prior))
        ),
        "",
        f"Masks from the prior instead of the sites' uploads: {dice(prior) - dice(clients):+.2f} Dice points, "
        f"{prior['rounds_s'] - clients['rounds_s']:+.0f} s of stage 2 (wall).",
    ]  # fmt: skip


def paper2_lines() -> list[str]:
    lines = [
        "## The paper's Table 2, for orientation only",
        "",
        "Real BraTS 2018 (HGG, T2, 170 training / 40 test subjects, 224 px), the 2015 U-Net, 50 local "
        "epochs, 400 distillation epochs. **Not comparable** with the rows above: different, "
        f"{SEMI} data here, a smaller U-Net, smaller G and D_k, and budgets a CPU can run.",
        "",
        "| method (paper) | Dice % | Sens. % | Spec. % | HD95 px |",
        "|---|---|---|---|---|",
    ]
    for method, values in PAPER_TABLE2.items():
        cells = [f"{v[0]:.2f} ± {v[1]:.2f}" if isinstance(v, tuple) else f"{v:.2f}" for v in values]
        lines.append(f"| {LABELS[method]} (paper, BraTS 2018) | {' | '.join(cells)} |")
    return lines


def site_metrics(metrics: dict[str, float], site: str) -> tuple[float, ...]:
    return tuple(metrics[f"{m}_{site}"] for m in INSTANCE_METRICS)


def instance_row(label: str, test: str, values: Sequence[float]) -> str:
    dice, obj, aji, hd = values
    return f"| {label} | {test} | {100 * dice:.2f} | {100 * obj:.2f} | {100 * aji:.2f} | {hd:.2f} |"


def table4_lines(
    rows: dict[str, dict[str, Any]], table: Table, args: argparse.Namespace, sites: Sequence[str]
) -> list[str]:
    header = ["| method | test site | Dice % | Obj-Dice % | AJI % | HD95 px |", "|---|---|---|---|---|---|"]
    lines = [
        f"# Table 4-style: cross-site nuclei instance segmentation, {SEMI} (nuclei-synthetic-sites)",
        "",
        f"Command: `{command(args)}`",
        "",
        f"Settings: {settings_line(table, args)}.",
        "",
        f"Every number here is {SEMI}: the three sites are composed from the 125 real nuclei of one "
        "fluorescence image (held-out nuclei in the test images), rendered in a fluorescence stain and two "
        "H&E-like stains at different scales and densities. Metrics are per whole test image (patches "
        "stitched back), then averaged per test site; 'average' is the mean over the test sites.",
        "",
        *header,
    ]
    for method in ("centralized", "fedavg", "asyndgan", "fediod"):
        if method not in rows:
            continue
        metrics = rows[method]["sites"][0]
        per_site = [site_metrics(metrics, s) for s in sites]
        for site, values in zip(sites, per_site, strict=True):
            lines.append(instance_row(f"{LABELS[method]} ({SEMI})", site, values))
        lines.append(instance_row(f"**{LABELS[method]}**", "average", np.mean(per_site, axis=0)))
    if "standalone" in rows:
        lines += ["", f"## Table 8-style: each site's Standalone model on every test site ({SEMI})", "",
                  "| trained on | test site | Dice % | Obj-Dice % | AJI % | HD95 px |", "|---|---|---|---|---|---|"]  # fmt: skip
        trained_on = rows["standalone"]["trained_on"]
        for trained, metrics in zip(trained_on, rows["standalone"]["sites"], strict=True):
            per_site = [site_metrics(metrics, s) for s in sites]
            for site, values in zip(sites, per_site, strict=True):
                lines.append(instance_row(trained, site, values))
            lines.append(instance_row(f"**{trained}**", "average", np.mean(per_site, axis=0)))
    lines += ["", f"Time per method. {TIME_NOTE} {UPLOAD_NOTE}", "",
              "| method | wall s / CPU s | sent up MB (label masks) |", "|---|---|---|"]  # fmt: skip
    for method, r in rows.items():
        lines.append(
            f"| {LABELS[method]} | {seconds(r)} | {r['up_bytes'] / 1e6:.1f} ({r['label_bytes'] / 1e6:.2f}) |"
        )
    lines += [
        "",
        "## The paper's Tables 4 and 8, for orientation only",
        "",
        "Real CPM-17 (Cell17), TCGA (MoNuSeg) and TNBC, 256 px patches of whole slides, U-Net, 100 local "
        f"epochs, 400 distillation epochs. **Not comparable** with the rows above: {SEMI} sites from one "
        "image's nuclei, a smaller U-Net and CPU budgets. The paper's sites are not ours: no row here "
        "stands for Cell17, TCGA or TNBC.",
        "",
        *header,
    ]  # fmt: skip
    for method, values in PAPER_TABLE4.items():
        for site, v in zip((*PAPER_SITES, "average"), values, strict=True):
            lines.append(paper_instance_row(f"{LABELS[method]} (paper)", site, v))
    lines += ["", "| Standalone trained on (paper, Table 8) | test site | Dice % | Obj-Dice % | AJI % | HD95 px |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for trained, values in PAPER_TABLE8.items():
        for site, v in zip((*PAPER_SITES, "average"), values, strict=True):
            lines.append(paper_instance_row(trained, site, v))
    return lines


def paper_instance_row(label: str, test: str, v: Sequence[float]) -> str:
    return f"| {label} | {test} | {v[0]:.2f} | {v[1]:.2f} | {v[2]:.2f} | {v[3]:.2f} |"


def write(table: Table, rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> Path:
    """segmentation_table<N>.{md,json} under --results; the JSON holds every site's metrics and runs."""
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    if table.number == 2:
        lines = table2_lines(rows, table, args)
        paper: dict[str, Any] = {"table2": PAPER_TABLE2}
    else:
        data = load_dataset(table.dataset, args.data_dir, **table.dataset_options)
        lines = table4_lines(rows, table, args, data.group_names)
        paper = {"table4": PAPER_TABLE4, "table8": PAPER_TABLE8, "sites": PAPER_SITES}
    mismatched = [m for m, r in rows.items() if not r["matches_run_summary"]]
    if mismatched:
        lines += ["", f"Warning: the saved models of {', '.join(mismatched)} score differently from their "
                  "runs' own final test Dice."]  # fmt: skip
    stem = results / f"segmentation_table{table.number}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    record = {"command": command(args), "data": SEMI, "dataset": table.dataset, "table": table.number,
              "settings": {**vars(table), "width": args.width, "depth": args.depth, "lr": args.lr,
                           "batch_size": args.batch_size, "g_width": args.g_width, "g_blocks": args.g_blocks,
                           "d_width": args.d_width, "d_layers": args.d_layers, "seed": args.seed,
                           "synthetic_batch": args.synthetic_batch, "student_steps": args.student_steps,
                           "threads": args.threads},
              "rows": rows, "paper": paper,
              "paper_note": "real data, the paper's models and budgets: for orientation, not comparable"}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return stem.with_suffix(".md")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    for table in tables(args):
        specs = plan(table, args, training_samples(table, args))
        runs = {spec.method: execute(table, spec, args) for spec in specs}
        rows = {method: row(method, run, args, table.number) for method, run in runs.items()}
        path = write(table, rows, args)
        print(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
