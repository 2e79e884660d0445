"""FedIOD's segmentation figures (the paper's Figures 5, 3 and 6) from the runs of the segmentation tables.

- Figure 5 (brain lesions): a few test slices, cropped around the lesion, with the true contour (green)
  and each method's predicted contour (red), from the models each run saved (Standalone: the site model
  with the median test Dice; Centralized: its one model). The last rows are the two real lesion patients
  (contrast T1, skull on: a shift of domain from the skull-stripped semi-synthetic training slices).
- Figure 3 (nuclei): one stitched whole test image per site, true (green) and predicted (red) instance
  contours per method.
- Figure 6: synthetic images beside the masks that condition them, drawn from the generators FedIOD and
  AsynDGAN saved (FedIOD's prior-mask run too, where it exists): masks of unseen test images, with the
  real image of each mask for reference. Each G draws as its run did: FedIOD's in eval mode with seeded
  noise, AsynDGAN's in train mode with seeded dropout (pix2pix's test-time behaviour).

Everything shown is semi-synthetic except the real patients' rows.

    python benchmarks/segmentation_figures.py [--results DIR] [--runs DIR] [--slices 4]

Reads the runs named in <results>/segmentation_table{2,4}.json (either may be missing; a run outside
the repository is named `OUT/<run>/<algorithm>` there, found under `--runs`, the tables' `--out`) and writes
segmentation_figure5.png, segmentation_figure3_nuclei.png and segmentation_figure6[_nuclei].png there.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from safetensors.torch import load_file
from skimage.segmentation import find_boundaries
from torch import nn

from fedistill.algorithms.fediod import TaskView
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared.training import task_of
from fedistill.config import RunConfig, options_for, read_config
from fedistill.data.base import ImageSet, LoadedDataset
from fedistill.data.medical.patches import stitch_by_meta, stitch_instances
from fedistill.data.registry import load_dataset
from fedistill.metrics.instances import instances_from_three_class
from fedistill.metrics.segmentation import dice
from fedistill.models.pix2pix import build_conditional_generator, one_hot_mask
from fedistill.reproduce.arguments import benchmark_parser
from fedistill.reproduce.paths import RESULTS, RUNS, recorded_path
from fedistill.reproduce.segmentation_plan import LABELS, REAL_SCORING, SEMI
from fedistill.reproduce.segmentation_scores import median_site, real_patients, saved_models
from fedistill.seeding import derive_seed
from fedistill.tasks import Task

ORDER = ("centralized", "standalone", "fedavg", "asyndgan", "fediod", "fediod-prior")
GENERATORS = ("asyndgan", "fediod", "fediod-prior")
TRUE, PREDICTED = "#2ca02c", "#d62728"


class Runs:
    """The runs one table's JSON names, each with its config, and the dataset they share."""

    def __init__(self, record: dict[str, Any], data_dir: str, runs: Path = RUNS, name: str = "") -> None:
        self.record = record
        self.rows: dict[str, dict[str, Any]] = record.get("rows") or {}
        if not self.rows:  # every run of the table failed: nothing to draw
            raise SystemExit(
                f"{name or 'the table'} names no run: run benchmarks/segmentation_tables.py again"
            )
        self.paths = {m: recorded_path(r["run"], runs) for m, r in self.rows.items()}
        missing = [str(p) for p in self.paths.values() if not (p / "config.toml").is_file()]
        if missing:
            raise SystemExit(
                f"the table's runs are not there: {', '.join(missing)}; pass the segmentation tables' "
                "--out as --runs"
            )
        self.configs = {m: read_config(p / "config.toml") for m, p in self.paths.items()}
        config = next(iter(self.configs.values()))
        self.config = config
        self.data_dir = data_dir
        self.data = load_dataset(config.dataset, data_dir, **config.options.get(config.dataset, {}))
        self.task = task_of(config, self.data.info)

    def models(self) -> dict[str, tuple[str, nn.Module]]:
        """One model per method, with its column label (Standalone: the median site by test Dice)."""
        out = {}
        for method in ORDER:
            if method not in self.paths:
                continue
            nets = saved_models(self.paths[method], method, self.configs[method], self.data)
            label = LABELS[method]
            if len(nets) > 1:
                dices = [s["dice"] for s in self.rows[method]["sites"]]
                site = median_site(dices)
                nets, label = [nets[site]], f"{label} (site {site}, median)"
            out[method] = (label, nets[0])
        return out


def read_runs(results: Path, table: int, data_dir: str, runs: Path = RUNS) -> Runs | None:
    path = results / f"segmentation_table{table}.json"
    if not path.is_file():
        print(f"{path} not found: run benchmarks/segmentation_tables.py first; table {table} skipped")
        return None
    return Runs(json.loads(path.read_text(encoding="utf-8")), data_dir, runs, path.name)


def predict(task: Task, model: nn.Module, data: ImageSet, info: Any) -> np.ndarray:
    """Per-pixel class probabilities (N, C, H, W) of `model` on `data`, normalised as in training."""
    with torch.no_grad():
        return task.outputs(model, data, info).softmax(1).numpy()


def unit_images(data: ImageSet) -> np.ndarray:
    """Stored images (N, C, H, W) as floats in [0, 1] for display."""
    return data.x.float().numpy() / 255.0


def show(ax: Any, image: np.ndarray) -> None:
    """An image (C, H, W) in [0, 1]: grey for one channel, RGB for three."""
    if image.shape[0] == 1:
        ax.imshow(image[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(np.clip(image.transpose(1, 2, 0), 0.0, 1.0), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def contour(ax: Any, mask: np.ndarray, colour: str) -> None:
    if mask.any():
        ax.contour(mask.astype(float), levels=[0.5], colors=colour, linewidths=1.2)


def outline(ax: Any, instances: np.ndarray, colour: str) -> None:
    """Every instance's inner boundary pixels in `colour` exactly (one colour, not a colour map's dark
    end), pixel for pixel over the image."""
    edges = find_boundaries(instances, mode="inner")
    if edges.any():
        ax.imshow(np.ma.masked_where(~edges, edges.astype(float)), cmap=ListedColormap([colour]),
                  vmin=0, vmax=1, interpolation="nearest")  # fmt: skip


def crop_box(mask: np.ndarray, margin: int, minimum: int) -> tuple[slice, slice]:
    """A square around the mask's foreground (its bounding box plus `margin`), at least `minimum` wide."""
    size = mask.shape[-1]
    rows, cols = np.nonzero(mask)
    if not len(rows):
        return slice(0, size), slice(0, size)
    side = max(minimum, rows.max() - rows.min() + 1 + 2 * margin, cols.max() - cols.min() + 1 + 2 * margin)
    side = min(side, size)
    centre = ((rows.min() + rows.max()) // 2, (cols.min() + cols.max()) // 2)
    starts = [int(np.clip(c - side // 2, 0, size - side)) for c in centre]
    return slice(starts[0], starts[0] + side), slice(starts[1], starts[1] + side)


def pick_slices(data: LoadedDataset, count: int) -> list[int]:
    """`count` test slices of different subjects, spread over the quantiles of lesion area."""
    area = (data.test.y > 0).flatten(1).sum(1).numpy()
    subjects = np.asarray(data.test_meta["subject"])
    real = np.asarray(data.test_meta.get("real", np.zeros(len(area))))
    candidates = [i for i in np.argsort(area, kind="stable") if area[i] > 0 and real[i] == 0]
    picked: list[int] = []
    for q in np.linspace(0.3, 1.0, count):
        for i in sorted(candidates, key=lambda i: abs(area[i] - np.quantile(area[candidates], q))):
            if subjects[i] not in {subjects[j] for j in picked}:
                picked.append(int(i))
                break
    return picked


def figure5(runs: Runs, count: int, path: Path) -> Path:
    data, info, task = runs.data, runs.data.info, runs.task
    settings = runs.record.get("settings", {})  # the patients as the table scored them
    scored = {key: settings.get(key, default) for key, default in REAL_SCORING.items()}
    real, patients = real_patients(runs.config, argparse.Namespace(data_dir=runs.data_dir, **scored))
    chosen = pick_slices(data, count)
    cases: list[tuple[str, ImageSet, int]] = [(f"{SEMI} test slice {i}", data.test, i) for i in chosen]
    for patient in sorted(set(patients)):
        indices = [i for i, p in enumerate(patients) if p == patient]
        largest = max(indices, key=lambda i: int((real.test.y[i] > 0).sum()))
        cases.append((f"real {patient} (domain shift)", real.test, largest))
    models = runs.models()
    probs = {
        m: {id(s): predict(task, net, s, info) for s in (data.test, real.test)}
        for m, (_, net) in models.items()
    }
    fig = new_figure(2.2 * len(models), 2.3 * len(cases))
    axes = fig.subplots(len(cases), len(models), squeeze=False)
    for r, (title, images, i) in enumerate(cases):
        truth = images.y[i].numpy() > 0
        box = crop_box(truth, margin=8, minimum=24)
        for c, (method, (label, _)) in enumerate(models.items()):
            ax = axes[r][c]
            predicted = probs[method][id(images)][i].argmax(0) > 0
            show(ax, unit_images(images)[i][:, box[0], box[1]])
            contour(ax, truth[box], TRUE)
            contour(ax, predicted[box], PREDICTED)
            ax.set_title(f"{label}\nDice {100 * dice(truth, predicted):.1f}" if r == 0 else
                         f"Dice {100 * dice(truth, predicted):.1f}", fontsize=8)  # fmt: skip
            if c == 0:
                ax.set_ylabel(title, fontsize=7)
    fig.suptitle(f"Predicted (red) and true (green) lesion contours, crops of {info.image_size} px slices "
                 f"({SEMI} except the real patients)", fontsize=9)  # fmt: skip
    return save(fig, path)


def figure3_nuclei(runs: Runs, path: Path) -> Path:
    data, info, task = runs.data, runs.data.info, runs.task
    meta = data.test_meta
    images = stitch_by_meta(unit_images(data.test), meta)
    truths = stitch_instances(np.asarray(meta["image_instances"]), meta)
    groups = np.asarray(data.test_groups)
    subjects = np.asarray(meta["subject"])
    first = [int(subjects[np.flatnonzero(groups == g)[0]]) for g in range(len(data.group_names))]
    models = runs.models()
    wholes = {m: stitch_by_meta(predict(task, net, data.test, info), meta) for m, (_, net) in models.items()}
    fig = new_figure(2.6 * len(models), 2.7 * len(first))
    axes = fig.subplots(len(first), len(models), squeeze=False)
    for r, subject in enumerate(first):
        truth = truths[subject]
        for c, (method, (label, _)) in enumerate(models.items()):
            ax = axes[r][c]
            prob = wholes[method][subject]
            predicted = instances_from_three_class(prob[0], prob[1], prob[2])
            show(ax, images[subject])
            outline(ax, truth, TRUE)
            outline(ax, predicted, PREDICTED)
            if r == 0:
                ax.set_title(label, fontsize=8)
            if c == 0:
                ax.set_ylabel(data.group_names[r], fontsize=7)
    fig.suptitle(f"Predicted (red) and true (green) nucleus contours on whole {SEMI} test images", fontsize=9)
    return save(fig, path)


def generator(runs: Runs, method: str) -> tuple[nn.Module, int, str]:
    """The run's saved G, its condition channels and the algorithm that drew with it."""
    config: RunConfig = runs.configs[method]
    algorithm = "asyndgan" if method == "asyndgan" else "fediod"
    options = options_for(config, algorithm, get_algorithm(algorithm).options)
    info, task = runs.data.info, runs.task
    if algorithm == "fediod" and options.generator_mixture == "per-client":
        raise SystemExit(f"{runs.paths[method]}: Figure 6 draws from a shared G; this G takes sites too")
    classes = (
        task.output_channels(info)  # AsynDGAN conditions on the classes S predicts per pixel
        if algorithm == "asyndgan"
        else TaskView(task, info, 0).condition_classes
    )
    dropout = options.dropout if algorithm == "asyndgan" else False
    net = build_conditional_generator(info, classes, noise_channels=options.noise_channels,
                                      width=options.generator_width, blocks=options.generator_blocks,
                                      dropout=dropout)  # fmt: skip
    net.load_state_dict(load_file(str(runs.paths[method] / "models" / "generator.safetensors")))
    return net, classes, algorithm


def draw(runs: Runs, method: str, targets: torch.Tensor) -> np.ndarray:
    """G's images in [0, 1] of the masks of stored targets (B, H, W), as the method conditions on them."""
    net, classes, algorithm = generator(runs, method)
    seed = runs.configs[method].seed
    rng = torch.Generator().manual_seed(derive_seed(seed, "figure6", method))
    if algorithm == "asyndgan":  # S's classes per pixel (nuclei: inside and contour apart)
        condition = one_hot_mask(runs.task.pixel_targets(targets), classes)
    else:  # the class map, or the nuclei's foreground
        condition = one_hot_mask(TaskView(runs.task, runs.data.info, seed).condition_of(targets), classes)
    noise = net.sample_noise(condition, rng) if net.noise_channels else None
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "figure6-dropout", method))
        net.train(algorithm == "asyndgan")
        return net.forward_unit(condition, noise).numpy()


def figure6(runs: Runs, indices: Sequence[int], path: Path) -> Path:
    data = runs.data
    methods = [m for m in GENERATORS if m in runs.paths]
    targets = data.test.y[list(indices)]
    drawn = {m: draw(runs, m, targets) for m in methods}
    shown_masks = runs.task.pixel_targets(targets).numpy()
    columns = ["mask (condition)", "real image of the mask", *(f"{LABELS[m]}: G(mask)" for m in methods)]
    fig = new_figure(2.2 * len(columns), 2.2 * len(indices))
    axes = fig.subplots(len(indices), len(columns), squeeze=False)
    real = unit_images(data.test)
    for r, i in enumerate(indices):
        panels = [
            shown_masks[r][None] / max(int(shown_masks.max()), 1),
            real[i],
            *(drawn[m][r] for m in methods),
        ]
        for c, image in enumerate(panels):
            show(axes[r][c], image)
            if r == 0:
                axes[r][c].set_title(columns[c], fontsize=8)
    fig.suptitle(
        f"Synthetic images from the saved generators, on masks of unseen {SEMI} test images", fontsize=9
    )
    return save(fig, path)


def nuclei_patches(data: LoadedDataset) -> list[int]:
    """The test patch with the most nucleus pixels of each site."""
    area = (data.test.y > 0).flatten(1).sum(1).numpy()
    groups = np.asarray(data.test_groups)
    return [
        int(max(np.flatnonzero(groups == g), key=lambda i: area[i])) for g in range(len(data.group_names))
    ]


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """The figures of whichever tables' JSON are there; 1 when there is none."""
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--results", default=str(RESULTS), help="where the tables' JSON are; figures go there"
    )
    parser.add_argument(
        "--runs", default=str(RUNS), help="the tables' --out: where a record's OUT/<run> folders are"
    )
    parser.add_argument("--slices", type=int, default=4, help="semi-synthetic test slices in Figure 5")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = Path(args.results)
    written = []
    brain = read_runs(results, 2, args.data_dir, Path(args.runs))
    if brain is not None:
        written.append(figure5(brain, args.slices, results / "segmentation_figure5.png"))
        written.append(
            figure6(brain, pick_slices(brain.data, args.slices), results / "segmentation_figure6.png")
        )
    nuclei = read_runs(results, 4, args.data_dir, Path(args.runs))
    if nuclei is not None:
        written.append(figure3_nuclei(nuclei, results / "segmentation_figure3_nuclei.png"))
        written.append(
            figure6(nuclei, nuclei_patches(nuclei.data), results / "segmentation_figure6_nuclei.png")
        )
    return 0 if written else 1
