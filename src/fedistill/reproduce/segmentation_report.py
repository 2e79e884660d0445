"""The segmentation tables as written: every measured number labelled semi-synthetic, the paper's numbers
(real data, the paper's models and budgets) in tables of their own, for orientation only."""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedistill import machine
from fedistill.algorithms.fediod import LEAN_SMALL_MASKS
from fedistill.data.registry import load_dataset
from fedistill.errors import ConfigError
from fedistill.reproduce.arguments import shown_arguments
from fedistill.reproduce.paths import display_path
from fedistill.reproduce.segmentation_plan import LABELS, METHODS, SEMI, SENDING_LESS, Table
from fedistill.reproduce.tables import write_table

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


def mean_std(values: Sequence[float], scale: float = 1.0) -> tuple[float, float]:
    array = np.asarray(values, dtype=float) * scale
    return float(array.mean()), float(array.std())  # std over the sites (population), as the runs do


def fmt(values: Sequence[float], scale: float = 100.0) -> str:
    mean, std = mean_std(values, scale)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ± {std:.2f}"


def commands_line(commands: Sequence[str]) -> str:
    if len(commands) == 1:
        return f"Command: `{commands[0]}`"
    later = "; then ".join(f"`{c}`" for c in commands[1:])
    return f"Commands: `{commands[0]}`; then, adding or replacing the rows it ran ({MERGE_FLAG}), {later}"


MERGE_FLAG = "--merge"


def machines(rows: dict[str, dict[str, Any]]) -> str:
    """Which machine(s) the rows' runs came from: a row's numbers may not repeat on another CPU."""
    return machine.of_rows(rows.values())


def machine_line(rows: dict[str, dict[str, Any]]) -> str:
    return f"Machine: {machines(rows)}."


def command(args: argparse.Namespace) -> str:
    """The command as run, less the folders it read from and wrote to (they are the machine's)."""
    return " ".join(
        ["python benchmarks/segmentation_tables.py", *map(shlex.quote, shown_arguments(args.argv))]
    )


def settings_line(table: Table, args: argparse.Namespace) -> str:
    local = table.epochs // table.rounds
    return (f"{table.dataset} ({SEMI}), {table.dataset_options}, K = {table.clients} (`natural` sites); "
            f"U-Net width {args.width}, depth {args.depth} for every method; Adam lr {args.lr}, batch "
            f"{args.batch_size}; {table.epochs} local epochs per site for every method (Standalone, FedAvg, "
            f"Centralized: {table.rounds} rounds x {local}; FedIOD's teachers: {table.epochs}); FedIOD and "
            f"AsynDGAN: {table.distill_epochs} epochs x {table.iters} G-steps of {args.synthetic_batch} "
            f"masks, G width {args.g_width} with {args.g_blocks} ResNet blocks, D_k width {args.d_width} "
            f"with {args.d_layers} layers; FedIOD {args.student_steps} S-steps per G-step; AsynDGAN's S "
            f"{table.epochs} epochs' worth of G's pairs; seed {args.seed}; {args.threads} torch thread(s) "
            f"per run, one run at a time")  # fmt: skip


def table2_lines(
    rows: dict[str, dict[str, Any]], table: Table, args: argparse.Namespace, commands: Sequence[str]
) -> list[str]:
    lines = [
        f"# Table 2-style: brain-lesion segmentation, {SEMI} (brats-synthetic-lesions), K = {table.clients}",
        "",
        commands_line(commands),
        "",
        machine_line(rows),
        "",
        f"Settings: {settings_line(table, args)}.",
        "",
        f"Every number in the first two tables is measured on {SEMI} data: real brains (Colin 27 and the "
        "MNI152 2009a template, T1) with painted synthetic lesions, except the 'real patient' columns: "
        "the two real lesion patients of `brain-lesions-real`, contrast-enhanced T1 with 6.5 mm slices, "
        f"{REAL_SKULL[args.real_skull]}{real_intensity_text(args)}. No model saw a real lesion in training, "
        "so those columns "
        "measure a shift of domain, not BraTS performance.",
        "",
        "| method | Dice % | Sens. % | Spec. % | HD95 px | real patient 1: Dice % / HD95 | real patient 2: "
        "Dice % / HD95 | wall s / CPU s | sent up MB (label masks) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for method in METHODS:
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
        lines += ["", "No model finds either real lesion (Dice 0 for every method and site)."]
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
    if "fediod" in rows and "fedavg" in rows and set(rows) & {*SENDING_LESS, "fediod-default"}:
        lines += ["", *sending_less_lines(rows, args)]
    lines += ["", *paper2_lines()]
    return lines


def real_intensity_text(args: argparse.Namespace) -> str:
    """How the brain-extracted real scans were put on the training brains' scale (`--real-intensity`)."""
    if args.real_skull == "on":
        return ""
    return REAL_INTENSITY[args.real_intensity]


#: how the extracted real brains were scaled (`--real-intensity`; records that lack it used "percentile",
#: and `--merge` refuses to add to them)
REAL_INTENSITY = {
    "brain-median": ", each scan scaled so that its brain's median meets the training brains' median "
    "(`scan_scale`)",
    "percentile": ", each scan scaled by its brain's 0.5th-99.5th percentiles, as the training brains were",
}


#: how the real patients' scans were scored (`--real-skull`)
REAL_SKULL = {
    "on": "scored with the skull on, as scanned (the models trained on skull-stripped brains)",
    "stripped": "scored after brain extraction (`fedistill.data.medical.brain_extraction`: the head's "
    "outline moved inwards, as the training brains are skull-stripped)",
    "stripped-tissue": "scored after brain extraction by its tissue rule (`fedistill.data.medical."
    "brain_extraction`: the tissue connected to the brain, as the training brains are skull-stripped)",
}


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
        "| mask source | Dice % | HD95 px | real patients' Dice % (1 / 2) | stage 2 wall s | run wall s / "
        "CPU s | label masks sent MB |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {name} | {dice(r):.2f} | {r['sites'][0]['hd95']:.2f} | {dice(r, 'real_dice_patient1'):.2f} / "
            f"{dice(r, 'real_dice_patient2'):.2f} | {r['rounds_s']:.0f} | {seconds(r)} | "
            f"{r['label_bytes'] / 1e6:.2f} |"
            for name, r in (("clients", clients), ("prior", prior))
        ),
        "",
        f"Masks from the prior instead of the sites' uploads: {dice(prior) - dice(clients):+.2f} Dice "
        f"points, {prior['rounds_s'] - clients['rounds_s']:+.0f} s of stage 2 (wall).",
    ]  # fmt: skip


def sending_less_lines(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """FedIOD's sites' bytes against FedAvg's, and the Dice each way of sending less keeps."""
    fedavg = rows["fedavg"]
    what = {
        "fediod": "every site, every class's logits, fresh S-step samples (the paper's exchanges)",
        "fediod-default": "every site, one logit per pixel, logits and input-gradients in one byte, G's "
        f"batches only, in a pool of {LEAN_SMALL_MASKS['pool_size']} with {LEAN_SMALL_MASKS['pool_steps']} "
        "S-steps per G-step (the default settings: the lean preset)",
        "fediod-margin": 'every site, one logit per pixel (`pixel_logits = "margin"`)',
        "fediod-sampled": f"{args.sampled_sites} sites per G-step (`sites_per_step`), one logit per pixel",
        "fediod-lean": f"every site, one logit per pixel, G's batches only ({args.lean_iters} G-steps per "
        f"epoch; S learns from them in a pool of {args.lean_pool}, {args.lean_pool_steps} S-steps per "
        "G-step: `student_steps = 0`)",
    }
    lines = [
        "## What FedIOD's sites send, and what sending less costs (same teachers)",
        "",
        "Every run distils the same stage-1 teachers (stage-1 cache). Sent up: everything the sites sent "
        "the server, label masks included.",
        "",
        "| FedIOD sends | Dice % | HD95 px | sent up MB | of FedAvg's | stage 2 wall s |",
        "|---|---|---|---|---|---|",
    ]
    for method in what:
        if method in rows:
            r, up = rows[method], rows[method]["up_bytes"]
            lines.append(
                f"| {what[method]} | {100 * r['sites'][0]['dice']:.2f} | {r['sites'][0]['hd95']:.2f} | "
                f"{up / 1e6:.1f} | {up / fedavg['up_bytes']:.2f} | {r['rounds_s']:.0f} |"
            )
    lines += [
        "",
        f"FedAvg's sites sent {fedavg['up_bytes'] / 1e6:.1f} MB (their model every round) for Dice "
        f"{100 * fedavg['sites'][0]['dice']:.2f}; FedIOD's bytes do not grow with the model, FedAvg's do.",
    ]
    return lines


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
    rows: dict[str, dict[str, Any]],
    table: Table,
    args: argparse.Namespace,
    sites: Sequence[str],
    commands: Sequence[str],
) -> list[str]:
    header = ["| method | test site | Dice % | Obj-Dice % | AJI % | HD95 px |", "|---|---|---|---|---|---|"]
    lines = [
        f"# Table 4-style: cross-site nuclei instance segmentation, {SEMI} (nuclei-synthetic-sites)",
        "",
        commands_line(commands),
        "",
        machine_line(rows),
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
    for method in (m for m in rows if m != "standalone"):  # Standalone's models: Table 8 below
        metrics = rows[method]["sites"][0]
        per_site = [site_metrics(metrics, s) for s in sites]
        for site, values in zip(sites, per_site, strict=True):
            lines.append(instance_row(f"{LABELS[method]} ({SEMI})", site, values))
        lines.append(instance_row(f"**{LABELS[method]}**", "average", np.mean(per_site, axis=0)))
    if "standalone" in rows:
        lines += ["", f"## Table 8-style: each site's Standalone model on every test site ({SEMI})", "",
                  "| trained on | test site | Dice % | Obj-Dice % | AJI % | HD95 px |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
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
    lines += ["", "| Standalone trained on (paper, Table 8) | test site | Dice % | Obj-Dice % | AJI % "
              "| HD95 px |", "|---|---|---|---|---|---|"]  # fmt: skip
    for trained, values in PAPER_TABLE8.items():
        for site, v in zip((*PAPER_SITES, "average"), values, strict=True):
            lines.append(paper_instance_row(trained, site, v))
    return lines


def paper_instance_row(label: str, test: str, v: Sequence[float]) -> str:
    return f"| {label} | {test} | {v[0]:.2f} | {v[1]:.2f} | {v[2]:.2f} | {v[3]:.2f} |"


def settings(table: Table, args: argparse.Namespace) -> dict[str, Any]:
    """What a record was made with: the table's data and budgets, the models and training every row shares."""
    keys = ("width", "depth", "lr", "batch_size", "g_width", "g_blocks", "d_width", "d_layers", "seed",
            "synthetic_batch", "student_steps", "threads")  # fmt: skip
    real = ("real_skull", "real_intensity") if table.number == 2 else ()  # Table 2 alone meets patients
    return {**vars(table), **{k: getattr(args, k) for k in (*keys, *real)}}


def earlier_record(table: Table, args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The rows and commands of the table's record under --results, for `--merge`: refused when the record
    was made with other settings, since its rows and the new ones would then not compare."""
    path = Path(args.results) / f"segmentation_table{table.number}.json"
    if not path.is_file():
        raise ConfigError(f"{MERGE_FLAG}: no record {path} to add rows to; run the whole table first")
    record = json.loads(path.read_text(encoding="utf-8"))
    ours = json.loads(json.dumps(settings(table, args)))  # as the record stores them (tuples as lists)
    shared = (k for k in ours if k not in ("methods", "threads"))
    differ = sorted(k for k in shared if record["settings"].get(k) != ours[k])
    if differ:
        raise ConfigError(
            f"{MERGE_FLAG}: {path} was made with other settings ({', '.join(differ)}), so its rows would not "
            "compare with these; run the whole table"
        )
    before = [
        " ".join(map(shlex.quote, shown_arguments(shlex.split(c))))
        for c in record.get("commands", [record["command"]])
    ]
    rows = record["rows"]
    for row in rows.values():  # records older than `display_path` named the machine's folder
        if Path(row["run"]).is_absolute():
            row["run"] = display_path(Path(row["run"]))
    return rows, before


def write(
    table: Table, rows: dict[str, dict[str, Any]], args: argparse.Namespace, merge: bool = False
) -> Path:
    """segmentation_table<N>.{md,json} under --results (the JSON holds every site's metrics and runs); the
    Markdown's path. With `merge`, the record's other rows stay (`earlier_record`)."""
    commands = [command(args)]
    if merge:
        earlier, before = earlier_record(table, args)
        merged = earlier | rows
        rows = {m: merged[m] for m in METHODS if m in merged}
        commands = [*before, *commands]
    if table.number == 2:
        lines = table2_lines(rows, table, args, commands)
        paper: dict[str, Any] = {"table2": PAPER_TABLE2}
    else:
        data = load_dataset(table.dataset, args.data_dir, **table.dataset_options)
        lines = table4_lines(rows, table, args, data.group_names, commands)
        paper = {"table4": PAPER_TABLE4, "table8": PAPER_TABLE8, "sites": PAPER_SITES}
    mismatched = [m for m, r in rows.items() if not r["matches_run_summary"]]
    if mismatched:
        lines += ["", f"Warning: the saved models of {', '.join(mismatched)} score differently from their "
                  "runs' own final test Dice."]  # fmt: skip
    made_with = settings(table, args) | {"methods": list(rows)}
    record = {"command": commands[-1], "commands": commands, "data": SEMI, "dataset": table.dataset,
              "table": table.number, "settings": made_with, "rows": rows, "paper": paper,
              "paper_note":
                  "real data, the paper's models and budgets: for orientation, not comparable"}  # fmt: skip
    return write_table(args.results, f"segmentation_table{table.number}", lines, record)
