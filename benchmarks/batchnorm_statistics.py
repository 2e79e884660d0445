"""Why recomputed BatchNorm statistics raise Table 2's Dice: the same trained weights scored with the
running statistics their training left, and with statistics estimated again at the final weights.

For every Table 2 run under --runs that trained on the sites' data (Centralized, FedAvg) its exported
model is scored on the semi-synthetic test subjects with:

  stored          the running statistics the run ended with (Centralized: its training's moving averages;
                  FedAvg: the average of the sites' moving averages)
  pooled          each layer's per-channel mean and variance over every training slice at the final
                  weights (what `recalibrate_norm` computes, here over all sites' slices in one place)
  pooled, turned  the same over four draws of the training flips and right-angle turns: does training's
                  augmentation explain the gap?
  batch mean      the mean over one epoch of shuffled, augmented batches (the run's batch size, as it
                  trained) of each batch's own mean and variance at the final weights (torch's
                  cumulative average)
  moving average  the moving average at torch's momentum 0.1 of three such epochs, as training keeps it:
                  what the stored statistics would be had the weights stopped moving

and, for FedIOD's runs that keep a replay pool, its selected student with the stored statistics and with
statistics over the pool of G's samples it was trained on (the server holds them; no site is asked).

    python benchmarks/batchnorm_statistics.py --runs RUNS_DIR

RUNS_DIR holds Table 2's run folders (`benchmarks/segmentation_tables.py --tables 2 --out RUNS_DIR`).
Writes benchmarks/results/batchnorm_statistics.{md,json}.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedistill import machine
from fedistill.algorithms.shared.norm_statistics import pooled, site_moments, write_statistics
from fedistill.algorithms.shared.training import evaluate_model, task_of
from fedistill.config import RunConfig, read_config
from fedistill.data.base import ImageSet, LoadedDataset
from fedistill.data.registry import load_dataset
from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint
from fedistill.models.norm import norm_layers
from fedistill.reproduce.arguments import benchmark_parser
from fedistill.reproduce.paths import RESULTS
from fedistill.reproduce.segmentation_real_figure import find_runs
from fedistill.reproduce.segmentation_scores import saved_models
from fedistill.reproduce.tables import write_table
from fedistill.tasks import Task
from fedistill.tasks.per_pixel_batches import joint_flip_rotate

#: table label: algorithm, for the models trained on the sites' data
PLAIN = {"Centralized": "centralized", "FedAvg": "fedavg"}
TURNED_DRAWS = 4
POOL_BATCH = 8  # FedIOD's synthetic batch in Table 2
MOMENTUM = 0.1  # torch's BatchNorm default, which the trained models used
AVERAGE_EPOCHS = 3  # of the moving average from reset: the reset values keep a weight of 0.9^(3 x 22)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--runs", required=True, help="the folder holding Table 2's run folders")
    parser.add_argument("--seed", type=int, default=0, help="the augmentation draws and batch order")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for label, (run, algorithm) in find_runs(Path(args.runs)).items():
        folder = run / algorithm
        if label in PLAIN:  # FedAvg's recalibrated run is its own Table 2 row: not a model to vary
            row: dict | None = site_trained_row(folder, PLAIN[label], label, args.seed)
        else:
            row = student_row(folder, label) if algorithm == "fediod" else None
        print(f"{label}: {row if row is not None else 'skipped'}", flush=True)
        if row is not None:
            rows.append(row)
    if not rows:
        print(f"no Centralized, FedAvg or FedIOD run under {args.runs}", file=sys.stderr)
        return 1
    command = "python benchmarks/batchnorm_statistics.py --runs <runs>" + (
        f" --seed {args.seed}" if args.seed else ""
    )
    payload = {"command": command, "machine": machine.this_machine(1), "rows": rows}
    path = write_table(args.results, "batchnorm_statistics", report(payload), payload)
    print(f"wrote {path}")
    return 0


@dataclass
class Setting:
    """A run's config, its dataset (loaded once for every run of the same data) and its task."""

    config: RunConfig
    data: LoadedDataset
    task: Task

    def score(self, model: nn.Module) -> dict[str, float]:
        metrics = evaluate_model(model.eval(), self.data.test, self.data.info, task=self.task)
        return {"dice": 100 * metrics["dice"], "hd95": metrics["hd95"]}


_DATASETS: dict[str, LoadedDataset] = {}


def setting(folder: Path) -> Setting:
    config = read_config(folder / "config.toml")
    options = config.options.get(config.dataset, {})
    key = repr((config.dataset, config.data_dir, sorted(options.items())))
    if key not in _DATASETS:
        _DATASETS[key] = load_dataset(config.dataset, config.data_dir, **options)
    data = _DATASETS[key]
    return Setting(config, data, task_of(config, data.info))


def with_pooled_statistics(model: nn.Module, at: Setting, images: ImageSet) -> tuple[nn.Module, dict]:
    """A copy of `model` with each BatchNorm layer's mean and variance over `images` (as `recalibrate_norm`
    pools them), and those statistics."""
    again = copy.deepcopy(model)
    moments = site_moments(again, at.task, images, at.data.info, at.config.batch_size)
    statistics, _ = pooled([(moments, len(images))], norm_layers(again))
    write_statistics(again, statistics)
    return again, statistics


def site_trained_row(folder: Path, algorithm: str, label: str, seed: int) -> dict:
    at = setting(folder)
    (model,) = saved_models(folder, algorithm, at.config, at.data)
    train = at.data.train
    generator = torch.Generator().manual_seed(seed)
    turned = [joint_flip_rotate(train.x, train.y, generator) for _ in range(TURNED_DRAWS)]
    turned_set = ImageSet(torch.cat([x for x, _ in turned]), torch.cat([y for _, y in turned]))
    stored = {n: (layer.running_mean.double().numpy(), layer.running_var.double().numpy())
              for n, layer in norm_layers(model).items()}  # fmt: skip
    pooled_model, statistics = with_pooled_statistics(model, at, train)
    row = {
        "label": label,
        "run": folder.parent.name,
        "samples": len(train),
        "stored": at.score(model),
        "pooled": at.score(pooled_model),
        "pooled_turned": at.score(with_pooled_statistics(model, at, turned_set)[0]),
        "stored_vs_pooled": distance(stored, statistics),
    }

    def epochs(count: int):  # shuffled, augmented batches as training drew them
        generator = torch.Generator().manual_seed(seed)
        for _ in range(count):
            batches = at.task.batches(train, at.data.info, at.config.batch_size, shuffle=True,
                                      generator=generator, augment=True, drop_last=True)  # fmt: skip
            yield from (x for x, _ in batches)

    row["batch_mean"] = at.score(cumulative(copy.deepcopy(model), epochs(1), at.task.predict))
    row["moving_average"] = at.score(
        cumulative(copy.deepcopy(model), epochs(AVERAGE_EPOCHS), at.task.predict, MOMENTUM)
    )
    return row


def student_row(folder: Path, label: str) -> dict | None:
    """FedIOD's selected student with its own statistics and with those of the replay pool (None: the run
    keeps no pool)."""
    checkpoint = latest_checkpoint(folder / "checkpoints")
    server = read_checkpoint(checkpoint).get("server", {}) if checkpoint is not None else {}
    pool = server.get("pool")
    if not pool or pool.get("x") is None:
        return None
    at = setting(folder)
    (student,) = saved_models(folder, "fediod", at.config, at.data)
    x = pool["x"]
    row = {"label": label, "run": folder.parent.name, "samples": len(x), "stored": at.score(student)}
    stop = len(x) - len(x) % POOL_BATCH
    batches = (x[i : i + POOL_BATCH] for i in range(0, stop, POOL_BATCH))
    row["pool_batch_mean"] = at.score(cumulative(copy.deepcopy(student), batches, lambda m, b: m(b)))
    return row


@torch.no_grad()
def cumulative(model: nn.Module, batches, forward, momentum: float | None = None) -> nn.Module:
    """`model` with each BatchNorm layer's statistics estimated afresh over `batches` (the other layers in
    evaluation mode): the plain mean of each batch's own (torch's `momentum = None`), or their moving
    average at `momentum`, as training keeps it."""
    model.eval()
    for layer in norm_layers(model).values():
        layer.reset_running_stats()
        layer.momentum = momentum
        layer.train()
    for batch in batches:
        forward(model, batch)
    return model.eval()


def distance(stored: dict, statistics: dict) -> dict[str, float]:
    """How far the stored statistics lie from the pooled ones, averaged over layers and channels: the mean's
    difference in pooled standard deviations, and |log| of the variances' ratio."""
    means = [np.abs(stored[n][0] - m).mean() / np.sqrt(v).mean() for n, (m, v) in statistics.items()]
    ratios = [np.abs(np.log(stored[n][1] / np.maximum(v, 1e-12))).mean() for n, (m, v) in statistics.items()]
    return {"mean_in_std": float(np.mean(means)), "abs_log_var_ratio": float(np.mean(ratios))}


def report(payload: dict) -> list[str]:
    sites = [r for r in payload["rows"] if "pooled" in r]
    students = [r for r in payload["rows"] if "pool_batch_mean" in r]

    def cell(m: dict) -> str:
        return f"{m['dice']:.2f} / {m['hd95']:.2f}"

    lines = [
        "# BatchNorm statistics of Table 2's models: stored against estimated again at the final weights",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Machine: {payload['machine']}",
        "",
        "Runs (`benchmarks/segmentation_tables.py --tables 2`, Table 2's record): "
        + ", ".join(f"`{r['run']}`" for r in payload["rows"]),
        "",
        "Semi-synthetic test Dice % / HD95 px of each run's exported model (seed 0, 64 px), the weights fixed, "
        "only the BatchNorm layers' running mean and variance changed. Pooled: over every training slice (all "
        f"sites' in one place, validation shards included); turned: over {TURNED_DRAWS} draws of the training "
        "flips and right-angle turns; batch mean: the plain mean of each batch's own statistics over one epoch of shuffled, augmented "
        f"batches as in training; moving average: their moving average at momentum {MOMENTUM} over "
        f"{AVERAGE_EPOCHS} such epochs (what training keeps, here at fixed weights).",
        "",
        "| model | training slices | stored | pooled | pooled, turned | batch mean | moving average | stored vs pooled: mean "
        "diff. in std / abs. log var ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sites:
        d = r["stored_vs_pooled"]
        lines.append(
            f"| {r['label']} | {r['samples']} | {cell(r['stored'])} | {cell(r['pooled'])} | "
            f"{cell(r['pooled_turned'])} | {cell(r['batch_mean'])} | {cell(r['moving_average'])} | {d['mean_in_std']:.3f} / "
            f"{d['abs_log_var_ratio']:.3f} |"
        )
    if students:
        lines += [
            "",
            "FedIOD's selected student, with its stored statistics and with the mean of batches of "
            f"{POOL_BATCH} of the replay pool (G's samples the server holds at the end):",
            "",
            "| model | pool samples | stored | pool batch mean |",
            "|---|---|---|---|",
            *(
                f"| {r['label']} | {r['samples']} | {cell(r['stored'])} | {cell(r['pool_batch_mean'])} |"
                for r in students
            ),
        ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
