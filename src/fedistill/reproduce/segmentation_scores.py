"""Every segmentation model scored again from the files its run saved, by one function, so every row of
the tables is measured alike (the runs' own summaries evaluate Standalone per patch on the nuclei).

FedAvg's and Centralized's `models/global` (Centralized's last checkpoint in runs from before it exported
one), AsynDGAN's `models/segmenter`, FedIOD's `models/student` (its selected student), and Standalone's
site models from their last checkpoint. Where a run's summary reports
the same metric, the two must agree; each row says whether they did.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from fedistill import machine
from fedistill.algorithms.shared.training import evaluate_model, new_model, task_of
from fedistill.config import RunConfig, read_config
from fedistill.data.base import LoadedDataset
from fedistill.data.registry import load_dataset
from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import source_names
from fedistill.reproduce.paths import display_path
from fedistill.reproduce.segmentation_plan import SAVED


def saved_models(run: Path, method: str, config: RunConfig, data: LoadedDataset) -> list[nn.Module]:
    """The models a run saved: one (FedAvg, AsynDGAN, FedIOD, Centralized: its exported model, or in runs
    from before it exported one its last checkpoint's) or one per site (Standalone, site order = client id
    = the natural partition's order)."""

    def model(state: dict[str, torch.Tensor]) -> nn.Module:
        net = new_model(config, data.info)
        net.load_state_dict(state)
        return net.eval()

    exported = run / "models" / "global.safetensors"
    if method == "centralized" and exported.is_file():  # what it exports (`recalibrate_norm` changes it)
        return [model(load_file(str(exported)))]
    if method in SAVED:
        path = run / "models" / f"{SAVED[method]}.safetensors"
        if not path.is_file():  # the run stopped before it exported its model
            raise SystemExit(f"{path} is missing: did the run finish? Finish it with --resume {run}")
        return [model(load_file(str(path)))]
    checkpoint = latest_checkpoint(run / "checkpoints")
    if checkpoint is None:
        raise SystemExit(f"{run}: no checkpoint holds the site models")
    state = read_checkpoint(checkpoint)
    clients = sorted(k for k in state if k.startswith("client_"))
    return [model(state[c]["model"]) for c in clients]


def median_site(dices: Sequence[float]) -> int:
    """The site with the median test Dice (the upper middle one of an even count), as Figure 5 and the real
    patients' figure pick Standalone's model; equal Dice go by site number (NumPy's default sort orders
    equal keys by the CPU's vector instructions, so another machine could pick another site)."""
    return int(np.argsort(dices, kind="stable")[len(dices) // 2])


def real_patients(config: RunConfig, args: argparse.Namespace) -> tuple[LoadedDataset, list[str]]:
    """The two patients' slices at the run's image size and slice rule, and each slice's patient."""
    options = config.options.get(config.dataset, {})
    real = load_dataset("brain-lesions-real", args.data_dir, image_size=options.get("image_size", 128),
                        slices=options.get("slices", "tumour"), skull=args.real_skull,
                        intensity=args.real_intensity)  # fmt: skip
    return real, [f"patient{int(s) + 1}" for s in real.test_meta["subject"]]


def score(run: Path, method: str, args: argparse.Namespace) -> tuple[list[dict[str, float]], LoadedDataset]:
    """Every saved model's test metrics (per source too), and on the real patients for Table 2; and the
    dataset they were measured on."""
    config = read_config(run / "config.toml")
    data = load_dataset(config.dataset, args.data_dir, **config.options.get(config.dataset, {}))
    task = task_of(config, data.info)
    chosen = json.loads((run / "summary.json").read_text())["final"].get("decision_threshold")
    if chosen is not None:  # `decision_threshold = "validation"`: the threshold the run chose and saved
        task = dataclasses.replace(task, decision_threshold=chosen)
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
    """Wall time, stage-2 time, bytes sent up (label masks among them), the machine and the run's own
    headline."""
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
        "machine": machine.of_summary(summary),
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
    """One method's row: every saved model's metrics, the run's costs, and whether they match its summary."""
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
