"""One-shot methods on identical teachers: FedIOD next to DENSE, Co-Boosting, one-shot FedDF and one-shot
FedAvg, each distilling (or averaging) the very same stage-1 models, with the teachers' ensemble as the
ceiling and every method as a fraction of it.

Every cell (dataset, alpha) is one `fedistill run` per method with one stage-1 cache: the first method
trains the sites' models, the others load them (the summaries' `teachers_from_cache` proves it).

Budgets: FedIOD `epochs` x `iters` G-steps with an earlier set of stabilisers (`fediod`) or with
`preset = "stable"` and G and D_k of width 32 (`fediod-stable`); DENSE and Co-Boosting `epochs` epochs
of their own synthesis and distillation; one-shot FedDF distils `feddf_steps` steps on the other
MNIST-family dataset's unlabelled images (Fashion-MNIST for MNIST and the reverse, FedDF's "another
domain" setting); one-shot FedAvg averages once.

The papers' own numbers are printed beside ours for orientation only: DENSE (Zhang et al. 2022) reports
its student at about 77% (MNIST) and 74% (Fashion-MNIST) of its ensemble with 5 clients at alpha 0.1 and
its own models and budgets; Co-Boosting (Dai et al. 2024) 73.15% accuracy on Fashion-MNIST with 10
clients at alpha 0.1. Their settings differ from these runs (clients, models, epochs), so they orient;
they do not score.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedistill import disk, machine
from fedistill.reproduce.launch import PAPER_PRESET, run_fedistill
from fedistill.reproduce.reuse import current
from fedistill.reproduce.tables import write_json

METHODS = ("fedavg-oneshot", "feddf-oneshot", "dense", "coboosting", "fediod", "fediod-stable")
STABILISERS = ["fediod.w_bn=10.0", "fediod.pool_size=20000", "fediod.pool_steps=10", "fediod.mimic='kl'"]
# `fediod-stable`: FedIOD with `preset = "stable"` (the demo's stabilisers, student budget and rates) and
# G and D_k of width 32 (the `fediod` row: the paper's 64 / 128 and an earlier set of stabilisers)
STABLE_ROW = ["fediod.preset='stable'", "fediod.generator_width=32", "fediod.discriminator_width=32"]
# the table's FedIOD numbers were recorded with full-precision messages, before `compact` became the default
RECORDED_WIRE = "fediod.wire='float32'"
# and its stable row with the class shares of the counts themselves, before the stable preset took their
# square roots (`share_power`)
RECORDED_SHARES = "fediod.share_power=1.0"


def algorithm_of(method: str) -> str:
    """The algorithm a method's row runs (`fediod-stable` is FedIOD with another preset)."""
    return "fediod" if method == "fediod-stable" else method


OTHER_DOMAIN = {"mnist": "fashion-mnist", "fashion-mnist": "mnist"}
PAPERS = {
    ("mnist", "0.1"): "DENSE: 0.77 of its ensemble (5 clients)",
    ("fashion-mnist", "0.1"): "DENSE: 0.74 of its ensemble (5 clients); Co-Boosting: 73.15% (10 clients)",
}


def method_sets(method: str, args: Any, dataset: str, kd_steps: int = 0) -> list[str]:
    """Each method's budget, on the same stage-1 options (`teacher_epochs`) as every other."""
    stage1 = [f"{algorithm_of(method)}.teacher_epochs={args.teacher_epochs}"]
    if kd_steps:  # DENSE / Co-Boosting: this many student batches per epoch instead of one pass
        stage1.append(f"{method}.kd_steps={kd_steps}")
    if algorithm_of(method) == "fediod":
        return [
            *stage1,
            RECORDED_WIRE,
            f"fediod.iters_per_epoch={args.iters}",
            *([*STABLE_ROW, RECORDED_SHARES] if method == "fediod-stable" else [PAPER_PRESET, *STABILISERS]),
        ]
    if method == "feddf-oneshot":
        source = f"dataset:{OTHER_DOMAIN.get(dataset, 'noise')}" if dataset in OTHER_DOMAIN else "noise"
        return [*stage1, f"feddf-oneshot.source='{source}'", f"feddf-oneshot.steps={args.feddf_steps}"]
    return stage1


def cell(args: Any, dataset: str, alpha: str) -> dict[str, Any]:
    """Every asked method's run of one (dataset, alpha) on one stage-1 cache (`--table-only`: the finished
    ones only), and each row's numbers."""
    name = f"oneshot-{dataset}-alpha{alpha}-seed{args.seed}"
    cache = Path(args.out) / name / ".stage1"
    common = [f"threads={args.threads}", f"cache_dir='{cache}'"]
    rows = {}
    variants = [
        (method, kd)
        for method in args.methods.split(",")
        for kd in (args.kd_steps if method in ("dense", "coboosting") else [0])
    ]
    for method, kd in variants:
        rounds = args.epochs if algorithm_of(method) in ("fediod", "dense", "coboosting") else 1
        args.dataset = dataset
        run = f"{name}-{method}{f'-kd{kd}' if kd else ''}"
        if args.table_only and not current(Path(args.out) / run / algorithm_of(method) / "summary.json"):
            continue  # the table from finished runs of this code only
        summary = run_fedistill(
            algorithm_of(method), args, name=run, alpha=alpha, model=args.model,
            rounds=rounds, out=args.out, sets=[*common, *method_sets(method, args, dataset, kd)],
        )  # fmt: skip
        final = summary["final"]
        rows[f"{method} (kd_steps {kd})" if kd else method] = {
            "test_accuracy": final["test_accuracy"],
            "ensemble_accuracy": final.get("ensemble_accuracy"),
            # the same uniform average of the same teachers for every method (FedIOD also reports its own)
            "ensemble_uniform_accuracy": final.get(
                "ensemble_uniform_accuracy", final.get("ensemble_accuracy")
            ),
            "teacher_mean_accuracy": final.get("teacher_mean_accuracy"),
            "teachers_from_cache": final.get("teachers_from_cache"),
            "wall_time_s": summary["wall_time_s"],
            "parameters_up": summary["communication"]["client->server"]["per_kind"].get("parameters", 0),
            "machine": machine.of_summary(summary),
        }
    return {"dataset": dataset, "alpha": alpha, "rows": rows}


def kd_step_list(text: str) -> list[int]:
    """`--kd-steps`: a comma list of whole numbers >= 0."""
    try:
        steps = [int(k) for k in text.split(",")]
    except ValueError:
        steps = []
    if not steps or min(steps) < 0:
        raise argparse.ArgumentTypeError(f"a comma list of whole numbers >= 0, e.g. 0,200; got {text!r}")
    return steps


def markdown(cells: list[dict[str, Any]], command: str) -> str:
    """The table: every method of every cell as a fraction of its ensemble."""
    lines = [
        "# One-shot methods on identical teachers",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.of_rows(r for c in cells for r in c['rows'].values())}.",
        "",
        "Every row of a cell distils (or averages) the same stage-1 models: one cache, and each summary's "
        "`teachers_from_cache` shows the hits. The ceiling is the teachers' ensemble as each method "
        "weighs it (FedIOD: Eq. 8 class shares; the others: uniform); `of uniform` divides every student by "
        "the same uniform average of the same teachers. Wall s: the whole run at one torch thread on a "
        "2-core machine shared with another benchmark, so only a rough cost.",
        "",
        "| dataset | alpha | method | student % | ensemble % | of ensemble | of uniform "
        "| teachers from cache | parameters up | wall s | papers (orientation only) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        for method, r in c["rows"].items():
            ensemble = r["ensemble_accuracy"]
            fraction = f"{r['test_accuracy'] / ensemble:.3f}" if ensemble else "-"
            uniform = r.get("ensemble_uniform_accuracy")
            of_uniform = f"{r['test_accuracy'] / uniform:.3f}" if uniform else "-"
            peer = method.split(" ")[0] in ("dense", "coboosting")
            paper = PAPERS.get((c["dataset"], c["alpha"]), "") if peer else ""
            lines.append(
                f"| {c['dataset']} | {c['alpha']} | {method} | {100 * r['test_accuracy']:.2f} | "
                f"{'-' if ensemble is None else f'{100 * ensemble:.2f}'} | {fraction} | {of_uniform} | "
                f"{r['teachers_from_cache']:.0f} | {r['parameters_up']:,} | {r['wall_time_s']:.0f} "
                f"| {paper} |"
            )
    return "\n".join(lines) + "\n"


def keeps_the_table_file(methods: str, table_only: bool) -> bool:
    """A run of a subset of the methods would replace the whole table file with part of it: it only prints
    its table (`--table-only` tabulates every finished run, so it writes)."""
    return methods != ",".join(METHODS) and not table_only


def write(cells: list[dict[str, Any]], dataset: str, command: str, results: str | Path) -> str:
    """`<results>/one_shot_<dataset>.{md,json}`; the Markdown."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    text = markdown(cells, command)
    disk.write_text(results / f"one_shot_{dataset}.md", text)
    write_json(
        results / f"one_shot_{dataset}.json", {"command": command, "cells": cells}, indent=1, newline=False
    )
    return text
