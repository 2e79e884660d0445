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
                the student selected on the sites' validation splits; no parameter leaves a site

    python benchmarks/reconstruction_table.py --image-size 64 --epochs 20 --fediod-epochs 20 --iters 10 \\
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
import json
import os
import shutil
import statistics
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, benchmark_parser, run_fedistill

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXPECTED = ROOT / "configs" / "expected.toml"
STEM = "reconstruction_table9"
SITES = 4
# dataset -> the `--set` options that make it four sites at the asked size
DATASETS = {"brain-t1-sites": (), "mni152-t1": ("mni152-t1.sites=4",)}
METHODS = ("standalone", "centralized", "fedavg", "flmrcm", "fediod")
LABELS = {
    "zero-filled": "Zero-filled input (floor)",
    "standalone": "Standalone (mean of the site models)",
    "centralized": "Centralized (pooled data, not federated)",
    "fedavg": "FedAvg",
    "flmrcm": "FL-MRCM (target = the column's site)",
    "fediod": "FedIOD (student)",
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
    "fediod.student_steps=2",
)


@dataclass
class RunSpec:
    """One `fedistill run` of the table: which method, under what name, for how many rounds."""

    method: str
    name: str
    rounds: int
    sets: list[str]
    target: int | None = None  # FL-MRCM's target site
    extra: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
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
    parser.add_argument("--fediod-epochs", type=int, default=20, help="distillation epochs (the paper: 100)")
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
    parser.add_argument("--out", default=str(HERE / "runs" / "reconstruction-table"), help="run directories")
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
        f"--pools {args.pools}", f"--epochs {args.epochs}", f"--batch-size {args.batch_size}", f"--lr {args.lr:g}",
        f"--acceleration {args.acceleration:g}", f"--center-fraction {args.center_fraction:g}",
        f"--fediod-epochs {args.fediod_epochs}", f"--iters {args.iters}", f"--methods {','.join(args.methods)}",
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
    return f"{args.dataset}-{args.image_size}px-c{args.chans}-e{args.epochs}-lr{args.lr:g}-seed{args.seed}"


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
            name = f"{base}-fediod-d{args.fediod_epochs}x{args.iters}"
            sets = [*FEDIOD_SMALL, *budget, f"checkpoint_every={args.fediod_epochs}"]
            specs.append(RunSpec(method, name, args.fediod_epochs, sets))
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


class Harness:
    """The runs' own evaluation (fedistill's runner): the test set, per volume and per source, on a model
    rebuilt from a run's config, so a saved state can be scored exactly as the server scores its model."""

    def __init__(self, run_dir: Path, data_dir: str) -> None:
        from fedistill.algorithms.training import task_of
        from fedistill.data.registry import load_dataset
        from fedistill.experiment.config import read_config
        from fedistill.experiment.runner import source_names

        self.config = read_config(run_dir / "config.toml").replace(data_dir=data_dir)
        options = self.config.options.get(self.config.dataset, {})
        self.dataset = load_dataset(self.config.dataset, self.config.data_dir, **options)
        self.task = task_of(self.config, self.dataset.info)
        self.sources = source_names(self.dataset)
        self.site_names = list(self.dataset.group_names)

    def model(self, state: dict[str, Any] | None = None) -> Any:
        from fedistill.algorithms.training import new_model

        model = new_model(self.config, self.dataset.info)
        if state is not None:
            model.load_state_dict(state)
        return model.eval()

    def score(self, model: Any) -> dict[str, float]:
        from fedistill.algorithms.training import evaluate_model

        data = self.dataset
        return evaluate_model(
            model, data.test, data.info, task=self.task, meta=data.test_meta, groups=self.sources
        )

    def zero_filled(self) -> dict[str, float]:
        """The undersampled input scored as a reconstruction (the task's masks, an identity network)."""
        from torch import nn

        return self.score(nn.Identity())


def client_states(run_dir: Path) -> list[dict[str, Any]]:
    """Each client's model from the run's last checkpoint (evaluation only: the protocol sends none)."""
    from fedistill.experiment.checkpoint import latest_checkpoint, read_checkpoint

    path = latest_checkpoint(run_dir / "checkpoints")
    if path is None:
        raise SystemExit(f"{run_dir}: no checkpoint to read the site models from")
    parts = read_checkpoint(path)
    return [parts[key]["model"] for key in sorted(k for k in parts if k.startswith("client_"))]


def saved_state(run_dir: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "models" / f"{name}.safetensors"))


def per_source(
    metrics: dict[str, float], sources: Sequence[str], prefix: str = ""
) -> dict[str, dict[str, float]]:
    """{"ssim": {source: value}, "psnr": {...}} from a metrics dict (`test_ssim_<source>` with prefix test_)."""
    return {m: {s: float(metrics[f"{prefix}{m}_{s}"]) for s in sources} for m in ("ssim", "psnr")}


def row(method: str, label: str, scores: dict[str, dict[str, float]], **extra: Any) -> dict[str, Any]:
    means = {f"{m}_mean": statistics.fmean(scores[m].values()) for m in ("ssim", "psnr")}
    return {"method": method, "label": label, **scores, **means, **extra}


def rel(path: Path) -> str:
    return os.path.relpath(path, ROOT)


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


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every asked method and score it; returns the table's rows and what the notes cite."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    done = [(spec, *run(spec, args)) for spec in run_specs(args)]
    harness = Harness(done[0][1], args.data_dir)
    sites = harness.site_names
    zero = per_source(harness.zero_filled(), sites)
    rows = [row("zero-filled", LABELS["zero-filled"], zero, wall_time_s=None)]
    facts: dict[str, Any] = {"sites": sites, "rescore_max_abs_diff": 0.0}

    def check(run_dir: Path, state_name: str, summary: dict[str, Any]) -> None:
        """The saved model, re-scored here, gives the run's own numbers (the harness is the runner's)."""
        again = harness.score(harness.model(saved_state(run_dir, state_name)))
        diff = max(abs(again[f"ssim_{s}"] - summary["final"][f"test_ssim_{s}"]) for s in sites)
        facts["rescore_max_abs_diff"] = max(facts["rescore_max_abs_diff"], diff)

    flmrcm = []
    for spec, run_dir, summary in done:
        wall = summary["wall_time_s"]
        if spec.method in ("standalone", "centralized"):
            states = client_states(run_dir)
            scored = [per_source(harness.score(harness.model(s)), sites) for s in states]
            models = [{"site": sites[k] if spec.method == "standalone" else "pooled", "run_dir": rel(run_dir),
                       "checkpoint_client": k} for k in range(len(states))]  # fmt: skip
            if spec.method == "centralized":
                rows.append(row("centralized", LABELS["centralized"], scored[0], wall_time_s=wall,
                                run_dir=rel(run_dir), models=models))  # fmt: skip
                continue
            mean = {
                m: {s: statistics.fmean(x[m][s] for x in scored) for s in sites} for m in ("ssim", "psnr")
            }
            std = {
                m: {s: statistics.pstdev(x[m][s] for x in scored) for s in sites} for m in ("ssim", "psnr")
            }
            rows.append(row("standalone", LABELS["standalone"], mean, std=std, wall_time_s=wall,
                            run_dir=rel(run_dir), models=models))  # fmt: skip
            for k, scores in enumerate(scored):
                rows.append(row("standalone-site", f"Standalone: {sites[k]}'s model", scores, site=sites[k],
                                wall_time_s=None, run_dir=rel(run_dir), models=[models[k]]))  # fmt: skip
        elif spec.method == "fedavg":
            check(run_dir, "global", summary)
            rows.append(row("fedavg", LABELS["fedavg"], per_source(summary["final"], sites, "test_"),
                            wall_time_s=wall, run_dir=rel(run_dir),
                            models=[{"site": "global", "run_dir": rel(run_dir), "file": "models/global.safetensors"}]))  # fmt: skip
        elif spec.method == "flmrcm":
            check(run_dir, "global", summary)
            flmrcm.append((spec.target, run_dir, summary))
        else:
            check(run_dir, "student", summary)
            final = summary["final"]
            facts["fediod"] = {
                "up_per_kind": summary["communication"]["client->server"]["per_kind"],
                "down_total": summary["communication"]["server->client"]["total_bytes"],
                **{
                    k: final.get(k)
                    for k in ("ensemble_ssim", "teacher_mean_ssim", "selected_epoch", "val_ssim")
                },
                "setup_time_s": summary.get("setup_time_s"),
            }
            rows.append(row("fediod", LABELS["fediod"], per_source(final, sites, "test_"), wall_time_s=wall,
                            run_dir=rel(run_dir), models=[{"site": "student", "run_dir": rel(run_dir),
                                                           "file": "models/student.safetensors"}]))  # fmt: skip
    if flmrcm:
        rows += flmrcm_rows(flmrcm, sites)
    order = [
        "zero-filled",
        "standalone",
        "standalone-site",
        "centralized",
        "fedavg",
        "flmrcm",
        "flmrcm-target",
        "fediod",
    ]
    rows.sort(key=lambda r: order.index(r["method"]))
    return rows, facts


def flmrcm_rows(
    runs: list[tuple[int | None, Path, dict[str, Any]]], sites: list[str]
) -> list[dict[str, Any]]:
    """One row per target, and the paper's row: each source scored by the run whose target it is."""
    rows, diagonal, models = [], {"ssim": {}, "psnr": {}}, []
    for target, run_dir, summary in runs:
        assert target is not None
        scores = per_source(summary["final"], sites, "test_")
        model = {"site": sites[target], "run_dir": rel(run_dir), "file": "models/global.safetensors"}
        rows.append(row("flmrcm-target", f"FL-MRCM, target {sites[target]}", scores, target=sites[target],
                        wall_time_s=summary["wall_time_s"], run_dir=rel(run_dir), models=[model]))  # fmt: skip
        for m in ("ssim", "psnr"):
            diagonal[m][sites[target]] = scores[m][sites[target]]
        models.append(model)
    if len(runs) == len(sites):
        wall = sum(s["wall_time_s"] for _, _, s in runs)
        rows.insert(0, row("flmrcm", LABELS["flmrcm"], diagonal, wall_time_s=wall, models=models))
    return rows


def fmt(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if metric == "ssim" else f"{value:.2f}"


def table(rows: list[dict[str, Any]], metric: str, sites: list[str], paper: dict[str, Any]) -> list[str]:
    unit = "SSIM" if metric == "ssim" else "PSNR dB"
    head = " | ".join(sites)
    papers = " | ".join(f"paper T1 {letter}" for _, letter in PAPER_SOURCES)
    lines = [f"| {unit} | {head} | mean | {papers} | wall s |", "|---" * (len(sites) + 6) + "|"]
    for r in rows:
        ours = " | ".join(fmt(r[metric][s], metric) for s in sites)
        theirs = paper.get(r["method"], {}).get(metric, {})
        cited = " | ".join(fmt(theirs.get(source), metric) for source, _ in PAPER_SOURCES)
        wall = "-" if r.get("wall_time_s") is None else f"{r['wall_time_s']:.0f}"
        label = f"**{r['label']}**" if r["method"] in ("fediod",) else r["label"]
        lines.append(f"| {label} | {ours} | {fmt(r[f'{metric}_mean'], metric)} | {cited} | {wall} |")
    return lines


def ledger_note(facts: dict[str, Any]) -> str:
    if "fediod" not in facts:
        return "FedIOD was not run: no ledger to cite."
    up = facts["fediod"]["up_per_kind"]
    kinds = ", ".join(f"{kind} {n:,} B" for kind, n in sorted(up.items()))
    return (
        f"Ledger of the FedIOD run, bytes sent by the sites (client->server) per kind: {kinds}; parameters: "
        f"{up.get('parameters', 0)} B. The test `tests/test_fediod_dense.py::"
        "test_no_parameter_leaves_a_client_and_masks_travel_only_when_uploaded[reconstruction]` checks the same "
        "on every build: no parameter bytes, and only logits, discriminator outputs, input-gradients, metrics, "
        "label statistics and the foreground masks uploaded once (label-masks) leave a site."
    )


def write_results(rows: list[dict[str, Any]], facts: dict[str, Any], args: argparse.Namespace) -> Path:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    sites, paper, command = facts["sites"], read_paper(), command_line(args)
    e = args.epochs
    lines = [
        f"# FedIOD Table 9 at CPU scale: MRI reconstruction, {args.dataset}, {args.image_size} px, "
        f"{args.acceleration:g}x",
        "",
        f"Command: `{command}` (each method its own `fedistill run` process).",
        "",
        f"Budgets: fastMRI's U-Net (`unet-fastmri`, chans {args.chans}, {args.pools} poolings) for every method "
        f"and every FedIOD teacher and student; Adam at lr {args.lr:g}, batch {args.batch_size}; {e} local "
        f"epochs per site for every method (Standalone and Centralized {e} epochs, FedAvg and FL-MRCM {e} rounds "
        f"of one epoch, FedIOD's teachers {e} epochs); FedIOD {args.fediod_epochs} distillation epochs of "
        f"{args.iters} generator steps ({args.fediod_epochs * args.iters} in all), synthetic batches of 8 with 2 "
        "student steps each, G = pix2pix's ResNet G at width 16 with 3 blocks, D_k = PatchGAN width 16, 3 layers, "
        "the foreground masks uploaded once, the perceptual term on (the paper: width 64, 9 blocks, 100 epochs "
        f"at 1e-4); FedAvg and FL-MRCM average uniformly (Guo et al.'s code). {args.threads or 'default'} "
        "torch thread(s) per run; seed "
        f"{args.seed}; undersampling: random Cartesian columns at {args.acceleration:g}x with "
        f"{args.center_fraction:g} of the lines at the centre, one seeded mask per slice (fastMRI's).",
        "",
        "**Not comparable with the paper's numbers**, which stand beside ours for orientation only: our sites "
        "are four real T1 volumes (Colin 27, MNI152 2009a, two patients with lesions), one per site, a few "
        "dozen training slices each; the k-space is simulated from magnitude images (no phase, single "
        f"coil); T1 only (there is no real T2 volume here); {args.image_size} px and a small U-Net instead of "
        "256 px and the full one; minutes of CPU instead of the paper's budgets. The paper's sources (B = "
        "BraTS 2020, F = fastMRI, I = IXI) are not ours: its columns are not our columns. Each test source "
        "here is one volume (its held-out 16 mm slabs), so a cell is that volume's SSIM or PSNR.",
        "",
        "## SSIM",
        "",
        *table(rows, "ssim", sites, paper),
        "",
        "## PSNR",
        "",
        *table(rows, "psnr", sites, paper),
        "",
        "## Notes",
        "",
        "- Wall time: the run's own (`summary.json`, set-up and FedIOD's stage 1 included); FL-MRCM's main row "
        "adds its per-target runs; Standalone trains its four sites one after the other in one run.",
        "- Standalone's and Centralized's rows are their final models read from the runs' last checkpoints and "
        "scored with the runner's harness (per volume, per source): those methods' clients hold no volume "
        "ids, so the `test_ssim` in their own summaries scores each slice on its own maximum.",
        "- FedAvg's, FL-MRCM's and FedIOD's rows are their summaries; their saved models re-scored here agree "
        f"to {facts['rescore_max_abs_diff']:.1e} SSIM.",
    ]
    if "fediod" in facts:
        f = facts["fediod"]
        lines.append(
            f"- FedIOD: the teachers' weighted ensemble (the one-shot ceiling) reaches SSIM "
            f"{fmt(f.get('ensemble_ssim'), 'ssim')} and the teachers {fmt(f.get('teacher_mean_ssim'), 'ssim')} "
            f"on average over all test volumes; the student was selected at epoch {f.get('selected_epoch')} on "
            "the sites' validation splits."
        )
    lines += [
        f"- {ledger_note(facts)}",
        "- The paper's FedAD row (distillation on auxiliary real images) has no counterpart here. Paper-scale "
        "configs: `configs/reconstruction/` (fastMRI + BraTS 2020 + IXI, T1 and T2).",
    ]
    (results / f"{STEM}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    payload = {
        "command": command,
        "settings": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out", "results")},
        "fediod_small": list(FEDIOD_SMALL),
        "sites": sites,
        "paper_t1": paper,
        "facts": facts,
        "rows": rows,
    }
    (results / f"{STEM}.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return results / f"{STEM}.md"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    rows, facts = measure(args)
    print(write_results(rows, facts, args).read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
