"""FedIOD's Table 9 at CPU scale as written: SSIM and PSNR per test source for every method, the paper's T1
numbers beside them for orientation only, and the notes that say how each row was obtained."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedistill import machine
from fedistill.reproduce.reconstruction_plan import (
    FEDIOD_SMALL,
    PAPER_SOURCES,
    STEM,
    command_line,
    parse_args,
    read_paper,
)
from fedistill.reproduce.reconstruction_scores import measure
from fedistill.reproduce.tables import write_table


def fmt(value: float | None, metric: str) -> str:
    """SSIM to four places, PSNR to two, a dash for none."""
    if value is None:
        return "-"
    return f"{value:.4f}" if metric == "ssim" else f"{value:.2f}"


def table(rows: list[dict[str, Any]], metric: str, sites: list[str], paper: dict[str, Any]) -> list[str]:
    """One metric's table: every row per source and its mean, the paper's T1 values beside them."""
    unit = "SSIM" if metric == "ssim" else "PSNR dB"
    head = " | ".join(sites)
    papers = " | ".join(f"paper T1 {letter}" for _, letter in PAPER_SOURCES)
    lines = [f"| {unit} | {head} | mean | {papers} | wall s | sites sent MB | all MB |",
             "|---" * (len(sites) + 8) + "|"]  # fmt: skip
    for r in rows:
        ours = " | ".join(fmt(r[metric][s], metric) for s in sites)
        theirs = paper.get(r["method"], {}).get(metric, {})
        cited = " | ".join(fmt(theirs.get(source), metric) for source, _ in PAPER_SOURCES)
        wall = "-" if r.get("wall_time_s") is None else f"{r['wall_time_s']:.0f}"
        moved = " | ".join(
            "-" if r.get(k) is None else f"{r[k] / 1e6:.1f}" for k in ("up_bytes", "all_bytes")
        )
        label = f"**{r['label']}**" if r["method"] in ("fediod",) else r["label"]
        lines.append(
            f"| {label} | {ours} | {fmt(r[f'{metric}_mean'], metric)} | {cited} | {wall} | {moved} |"
        )
    return lines


def ledger_note(facts: dict[str, Any]) -> str:
    """What FedIOD's sites sent, per kind, from its ledger: no parameter among it."""
    if "fediod" not in facts:
        return "FedIOD was not run: no ledger to cite."
    up = facts["fediod"]["up_per_kind"]
    kinds = ", ".join(f"{kind} {n:,} B" for kind, n in sorted(up.items()))
    return (
        f"Ledger of the FedIOD run, bytes sent by the sites (client->server) per kind: {kinds}; parameters: "
        f"{up.get('parameters', 0)} B. The test `tests/test_fediod_dense.py::"
        "test_no_parameter_leaves_a_client_and_masks_travel_only_when_uploaded[reconstruction]` checks the "
        "same on every build: no parameter bytes, and only logits, discriminator outputs, input-gradients, "
        "metrics, label statistics and the foreground masks uploaded once (label-masks) leave a site."
    )


def write_results(rows: list[dict[str, Any]], facts: dict[str, Any], args: argparse.Namespace) -> Path:
    """`<args.results>/reconstruction_table9.{md,json}`; the Markdown's path."""
    sites, paper, command = facts["sites"], read_paper(), command_line(args)
    e = args.epochs
    lines = [
        f"# FedIOD Table 9 at CPU scale: MRI reconstruction, {args.dataset}, {args.image_size} px, "
        f"{args.acceleration:g}x",
        "",
        f"Command: `{command}` (each method its own `fedistill run` process).",
        "",
        f"Machine: {facts.get('machine', machine.NOT_RECORDED)}.",
        "",
        f"Budgets: fastMRI's U-Net (`unet-fastmri`, chans {args.chans}, {args.pools} poolings) for every "
        f"method and every FedIOD teacher and student; Adam at lr {args.lr:g}, batch {args.batch_size}; {e} "
        f"local epochs per site for every method (Standalone and Centralized {e} epochs, FedAvg and FL-MRCM "
        f"{e} rounds of one epoch, FedIOD's teachers {e} epochs); FedIOD {args.fediod_epochs} distillation "
        f"epochs of {args.iters} generator steps ({args.fediod_epochs * args.iters} in all), synthetic "
        "batches of 8 (the default, the lean preset: the student learns from G's own batches, half of each "
        "target the image G drew, 16 replay steps per G-step, student lr 2e-3; the paper's exchanges: 2 "
        "fresh student steps per G-step), G = pix2pix's ResNet G at width 16 with 3 blocks, D_k = "
        "PatchGAN width 16, 3 layers, the foreground masks uploaded once, the perceptual term on (the "
        "paper: width 64, 9 blocks, 100 epochs at 1e-4); FedAvg and FL-MRCM average uniformly (Guo et al.'s "
        f"code). {args.threads or 'default'} torch thread(s) per run; seed {args.seed}; undersampling: "
        f"random Cartesian columns at {args.acceleration:g}x with {args.center_fraction:g} of the lines at "
        "the centre, one seeded mask per slice (fastMRI's).",
        "",
        "**Not comparable with the paper's numbers**, which stand beside ours for orientation only: our "
        "sites are four real T1 volumes (Colin 27, MNI152 2009a, two patients with lesions), one per site, "
        "a few dozen training slices each; the k-space is simulated from magnitude images (no phase, single "
        f"coil); T1 only (there is no real T2 volume here); {args.image_size} px and a small U-Net instead "
        "of 256 px and the full one; minutes of CPU instead of the paper's budgets. The paper's sources (B "
        "= BraTS 2020, F = fastMRI, I = IXI) are not ours: its columns are not our columns. Each test "
        "source here is one volume (its held-out 16 mm slabs), so a cell is that volume's SSIM or PSNR.",
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
        "- Wall time: the run's own (`summary.json`, set-up and FedIOD's stage 1 included); FL-MRCM's main "
        "row adds its per-target runs; Standalone trains its four sites one after the other in one run.",
        "- Sent: the run's ledger totals in MB (10^6 bytes): what the sites sent the server, and both "
        "directions (FedAvg and FL-MRCM: the model every round; FedIOD: logits, Eq. 8 ratios and "
        "input-gradients on synthetic inputs one way, the inputs and output-gradients the other).",
        "- Standalone's and Centralized's rows are their final models read from the runs' last checkpoints "
        "and scored with the runner's harness (per volume, per source): those methods' clients hold no "
        "volume ids, so the `test_ssim` in their own summaries scores each slice on its own maximum.",
        "- Standalone (the column's site's own model): each volume scored by the model its own site "
        "trained, what a site that trains alone deploys; the mean of the site models also scores every "
        "model on the other sites' volumes, whose anatomy and contrast it never saw.",
        "- FedAvg's, FL-MRCM's and FedIOD's rows are their summaries; their saved models re-scored here "
        f"agree to {facts['rescore_max_abs_diff']:.1e} SSIM.",
    ]
    if "fediod" in facts:
        f = facts["fediod"]
        lines.append(
            "- FedIOD: the teachers' weighted ensemble (the ceiling of a student that only copies them; with "
            "`truth_weight` the student also learns G's own images) reaches SSIM "
            f"{fmt(f.get('ensemble_ssim'), 'ssim')} and the teachers "
            f"{fmt(f.get('teacher_mean_ssim'), 'ssim')} on average over all test volumes; the student was "
            f"selected at epoch {f.get('selected_epoch')} on the sites' validation splits."
        )
    lines += [
        f"- {ledger_note(facts)}",
        "- The paper's FedAD row (distillation on auxiliary real images) has no counterpart here. "
        "Paper-scale configs: `configs/reconstruction/` (fastMRI + BraTS 2020 + IXI, T1 and T2).",
    ]
    payload = {
        "command": command,
        "settings": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out", "results")},
        "fediod_small": list(FEDIOD_SMALL),
        "sites": sites,
        "paper_t1": paper,
        "facts": facts,
        "rows": rows,
    }
    return write_table(args.results, STEM, lines, payload)


def main(argv: Sequence[str] | None = None) -> None:
    """Run and score every method of the command line's table (`argv`, else `sys.argv`), then write it."""
    args = parse_args(argv)
    rows, facts = measure(args)
    print(write_results(rows, facts, args).read_text(encoding="utf-8"))
