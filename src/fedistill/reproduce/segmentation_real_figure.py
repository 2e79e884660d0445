"""The two real lesion patients with every segmentation method's prediction overlaid: what a user of the
library would get from the models the segmentation runs trained.

Each model is loaded with `fedistill.load_model` and each patient's NIfTI volume goes through `fedistill
predict`'s own path (`inference.segment.segment_volume`: axial slices, the run's intensity scaling, the
240 mm field of view, the model's image size, the class map taken back to the volume's grid), so the masks
and Dice shown are on the patient's own 0.78 mm pixels. The inference layer sits beside this one, so the
entry point (benchmarks/segmentation_real_figure.py) hands both functions in. The slices shown are each
patient's `count` slices with the largest lesion area in the ground truth (never chosen by a prediction).

Rows are slices, shown whole (cut to the head) so that false positives anywhere show; columns the image,
the true lesion (green contour), then one panel per method with its predicted lesion (red) over the true
contour, that slice's Dice and how many pixels it called lesion. A method whose run exported no whole
model (Standalone keeps its models with the sites; Centralized runs older than its export too) is taken
from the last checkpoint instead (Standalone: the site with the median semi-synthetic test Dice) and
starred. The models were
trained on semi-synthetic, skull-stripped brains; the patients are real contrast T1 with the skull on, so
predict extracts their brains first (`--skull-strip`, as the tables score them) unless `--whole-head`.

    python benchmarks/segmentation_real_figure.py --runs RUNS_DIR [--out DIR] [--slices 2] [--whole-head]

RUNS_DIR holds run folders (e.g. `<out>/reproduce/segmentation-table2-ci/runs` of
`fedistill reproduce segmentation-table2 --scale ci --out <out>`); every finished method folder in them is
drawn. Writes segmentation_real_patients.png and .json into --out (benchmarks/results by default).
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from matplotlib.colors import ListedColormap
from PIL import Image

from fedistill import disk
from fedistill.algorithms.shared.training import evaluate_model, task_of
from fedistill.config import RunConfig, read_config
from fedistill.data.base import DatasetInfo
from fedistill.data.medical.brain_extraction import RULES, extract_brain, extraction_rule
from fedistill.data.medical.brain_synthetic import PATIENTS
from fedistill.data.medical.volumes import axial_slices, read_volume, scale_to_uint8
from fedistill.data.registry import load_dataset
from fedistill.data.transforms import to_float
from fedistill.errors import RunDirError
from fedistill.metrics.segmentation import dice
from fedistill.reproduce.arguments import benchmark_parser
from fedistill.reproduce.paths import CHECKOUT, RESULTS
from fedistill.reproduce.segmentation_figures import ORDER, PREDICTED, TRUE, contour, new_figure
from fedistill.reproduce.segmentation_plan import LABELS, method_of_run
from fedistill.reproduce.segmentation_scores import median_site, saved_models
from fedistill.tasks import Task

if TYPE_CHECKING:  # the inference layer is passed in by the caller (benchmarks/segmentation_real_figure.py)
    from collections.abc import Callable

    from fedistill.inference.forward import Trained

    Loader = Callable[[Path, str], Trained]  # fedistill.load_model
    Segmenter = Callable[..., None]  # fedistill.inference.segment.segment_volume

NAME = "segmentation_real_patients"
EXTRACTED = "#ffd92f"  # the outline of what brain extraction keeps
#: Config keys that hold machine paths, recorded as placeholders.
PLACEHOLDERS = {"data_dir": "<data>", "out": "<runs>", "cache_dir": "<cache>"}


@dataclass
class Patient:
    """One patient's axial slices (Z, H, W) on the volume's own grid: the image as the models' pipeline
    scales it (uint8) and the true lesion."""

    name: str
    image_path: Path
    images: np.ndarray
    truth: np.ndarray
    brain: np.ndarray  # what `--skull-strip` keeps (brain_extraction)


@dataclass
class SiteModel:
    """A site model from a run's checkpoint, with what predict needs of a loaded model (`Trained`): the
    run's task, dataset facts, config and normalisation (`data.transforms.to_float`, as in training)."""

    module: torch.nn.Module
    task: Task
    info: DatasetInfo
    algorithm: str
    config: RunConfig
    name: str

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        return to_float(images.detach().cpu(), self.info)


def read_patient(folder: Path, name: str, rule: str = "outline") -> Patient:
    """`<name>_image.nii.gz` and `<name>_label.nii.gz`, cut into axial slices as predict cuts them, and
    the brain that extraction by `rule` keeps."""
    image_path, label_path = folder / f"{name}_image.nii.gz", folder / f"{name}_label.nii.gz"
    volume, (zx, zy, _) = read_volume(image_path)
    raw = axial_slices(volume)
    truth = axial_slices(read_volume(label_path)[0]) > 0
    images = scale_to_uint8(raw, raw > 0, "volume-percentile", str(image_path))
    return Patient(name, image_path, images, truth, extract_brain(raw, (zy, zx), rule=rule))


def largest_lesion_slices(truth: np.ndarray, count: int) -> list[int]:
    """The `count` slices (Z, H, W) with the most lesion pixels (ties: the lower index), in slice order;
    chosen from the ground truth alone."""
    area = truth.reshape(len(truth), -1).sum(1)
    ranked = sorted((z for z in range(len(area)) if area[z] > 0), key=lambda z: (-int(area[z]), z))
    return sorted(ranked[:count])


def predicted_lesion(
    model: Trained, patient: Patient, folder: Path, segment: Segmenter, skull_strip: bool | str
) -> np.ndarray:
    """The model's lesion mask of the patient's volume, exactly as `fedistill predict` writes it, read
    back as axial slices (Z, H, W)."""
    answer = folder / f"{len(list(folder.iterdir()))}-{patient.image_path.name}"
    segment(model, patient.image_path, answer, 64, skull_strip=skull_strip)
    return axial_slices(read_volume(answer)[0]) > 0


def load_models(
    runs: Mapping[str, tuple[Path, str]], data_dir: Path, load: Loader
) -> tuple[dict[str, Trained], dict[str, str]]:
    """Each method's model through `fedistill.load_model`; a method that exported none (Standalone's stay
    with the sites, as Centralized's did before it exported one) from its run's last checkpoint instead,
    and where each came from."""
    models, sources = {}, {}
    for label, (run_dir, algorithm) in runs.items():
        try:
            models[label] = load(run_dir, algorithm)
            sources[label] = f"fedistill.load_model: models/{models[label].name}.safetensors"
        except RunDirError:
            models[label], sources[label] = checkpoint_model(Path(run_dir) / algorithm, algorithm, data_dir)
    return models, sources


def checkpoint_model(folder: Path, algorithm: str, data_dir: Path) -> tuple[Trained, str]:
    """A run's site model from its last checkpoint (the one of Centralized; Standalone's site with the
    median semi-synthetic test Dice, as Figure 5 picks it)."""
    config = read_config(folder / "config.toml")
    data = load_dataset(config.dataset, data_dir, **config.options.get(config.dataset, {}))
    task = task_of(config, data.info)
    nets = saved_models(folder, algorithm, config, data)
    dices = [evaluate_model(net, data.test, data.info, task=task)["dice"] for net in nets]
    site = median_site(dices)
    model = SiteModel(nets[site], task, data.info, algorithm, config, name=f"client_{site}")
    where = "median site by semi-synthetic test Dice" if len(nets) > 1 else "its one site"
    return model, f"last checkpoint, client_{site} ({where}): the run exported no whole model"


def real_patients_figure(
    runs: Mapping[str, tuple[Path, str]],
    data_dir: Path,
    out_dir: Path,
    *,
    load: Loader,
    segment: Segmenter,
    count: int = 2,
    command: str = "",
    runs_made_by: str = "",
    skull_strip: bool | str = True,
) -> dict[str, Any]:
    """Load every method's model with `load` (`fedistill.load_model`), predict both patients with `segment`
    (`fedistill predict`'s `segment_volume`) and write `<out_dir>/segmentation_real_patients` .png and
    .json; returns the JSON's record."""
    models, sources = load_models(runs, data_dir, load)
    fallback = [label for label, source in sources.items() if not source.startswith("fedistill.load_model")]
    record = draw_real_patients(
        models, data_dir, out_dir, segment=segment, count=count, command=command, fallback=fallback,
        skull_strip=skull_strip,
    )  # fmt: skip
    record["runs"] = {label: run_record(*runs[label]) | {"model": sources[label]} for label in runs}
    if runs_made_by:
        record["runs_made_by"] = runs_made_by
    disk.write_text(out_dir / f"{figure_name(skull_strip)}.json", json.dumps(record, indent=2) + "\n")
    return record


def draw_real_patients(
    models: Mapping[str, Trained],
    data_dir: Path,
    out_dir: Path,
    *,
    segment: Segmenter,
    count: int = 2,
    command: str = "",
    fallback: Sequence[str] = (),
    skull_strip: bool | str = True,
) -> dict[str, Any]:
    """The figure of loaded models on the two patients (`<data_dir>/brain-mri`), and its JSON record;
    `skull_strip`: predict on the brain-extracted scans (`segment_volume`'s option: True or a rule)."""
    rule = extraction_rule(skull_strip)
    patients = [read_patient(Path(data_dir) / "brain-mri", name, rule or "outline") for name in PATIENTS]
    with tempfile.TemporaryDirectory() as scratch:
        masks = {
            label: [predicted_lesion(model, p, Path(scratch), segment, skull_strip) for p in patients]
            for label, model in models.items()
        }
    rows = [(k, p, z) for k, p in enumerate(patients) for z in largest_lesion_slices(p.truth, count)]
    slices, volumes = [], {}
    for label in models:
        volumes[label] = {
            p.name: round(100 * dice(p.truth, masks[label][k]), 2) for k, p in enumerate(patients)
        }
    for k, p, z in rows:
        slices.append(
            {
                "patient": p.name,
                "slice": z,
                "lesion_pixels": int(p.truth[z].sum()),
                "dice": {label: round(100 * dice(p.truth[z], masks[label][k][z]), 2) for label in models},
                "predicted_pixels": {label: int(masks[label][k][z].sum()) for label in models},
            }
        )
    path = out_dir / f"{figure_name(skull_strip)}.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    _draw(models, patients, masks, rows, slices, path, fallback, skull_strip)
    return {
        "command": command,
        "skull_strip": bool(rule),
        "brain_extraction": rule or "none",
        "figure": path.name,
        "data": "brain-lesions-real (<data>/brain-mri/lesion_brain{1,2}_{image,label}.nii.gz)",
        "slice_choice": f"each patient's {count} axial slices with the largest true lesion area",
        "dice_unit": "percent, on the volume's own grid",
        "image_size": {label: m.info.image_size for label, m in models.items()},
        "slices": slices,
        "volume_dice": volumes,
    }


def _draw(
    models: Mapping[str, Trained],
    patients: Sequence[Patient],
    masks: Mapping[str, list[np.ndarray]],
    rows: Sequence[tuple[int, Patient, int]],
    slices: Sequence[dict[str, Any]],
    path: Path,
    fallback: Sequence[str],
    skull_strip: bool | str,
) -> None:
    """Whole slices (cut to the head), so false positives anywhere in the slice show as well as misses."""
    first = "image (yellow: the brain extracted)" if skull_strip else "image"
    columns = [first, "true lesion", *(f"{m}*" if m in fallback else m for m in models)]
    fig = new_figure(1.9 * len(columns), 2.0 * len(rows) + 0.7)
    axes = fig.subplots(len(rows), len(columns), squeeze=False)
    for r, ((k, patient, z), facts) in enumerate(zip(rows, slices, strict=True)):
        view = head_box(patient.images[z])
        truth, image = patient.truth[z][view], patient.images[z][view]
        _show(axes[r][0], image)
        if skull_strip:
            contour(axes[r][0], patient.brain[z][view], EXTRACTED)
        axes[r][0].set_ylabel(f"{patient.name}, slice {z}\nlesion {int(truth.sum())} px", fontsize=7)
        _show(axes[r][1], image)
        contour(axes[r][1], truth, TRUE)
        for c, label in enumerate(models, start=2):
            predicted = masks[label][k][z][view]
            ax = axes[r][c]
            _show(ax, image)
            if predicted.any():
                ax.imshow(np.ma.masked_where(~predicted, predicted), cmap=ListedColormap([PREDICTED]),
                          alpha=0.45, interpolation="nearest")  # fmt: skip
            contour(ax, predicted, PREDICTED)
            contour(ax, truth, TRUE)
            ax.set_xlabel(f"Dice {facts['dice'][label]:.1f}, {int(predicted.sum())} px predicted", fontsize=7)
        if r == 0:
            for ax, title in zip(axes[r], columns, strict=True):
                ax.set_title(title, fontsize=8)
    starred = "\n* no exported model: the run's last checkpoint (Standalone: median site)" if fallback else ""
    rule = extraction_rule(skull_strip)
    how = (
        f"`fedistill predict --skull-strip {rule}` does (brain extraction first"
        if rule
        else ("`fedistill predict` does (the whole head")
    )
    fig.suptitle(
        "Real patients (contrast T1, skull on), models trained on semi-synthetic lesions: "
        f"true lesion (green), predicted (red)\nPredicted as {how}, at each "
        "model's image size, mapped back to 0.78 mm pixels); Dice in %; patient's right on the right"
        + starred,
        fontsize=8,
    )
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120)
    # grey slices and two overlay colours: a 256-colour palette keeps the file a few hundred KB
    Image.open(buffer).convert("RGB").quantize(256).save(path, optimize=True)
    print(f"wrote {path}")


def head_box(image: np.ndarray, margin: int = 4) -> tuple[slice, slice]:
    """The slice's non-zero part (the head) with a small margin: the view, from the image alone."""
    rows, cols = np.nonzero(image)
    if not len(rows):
        return slice(None), slice(None)
    height, width = image.shape
    return (
        slice(max(0, rows.min() - margin), min(height, rows.max() + 1 + margin)),
        slice(max(0, cols.min() - margin), min(width, cols.max() + 1 + margin)),
    )


def _show(ax: Any, image: np.ndarray) -> None:
    ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def run_record(run_dir: Path, algorithm: str) -> dict[str, Any]:
    """Where a method's run lies (from the checkout, or under `<runs>`) and its config, machine paths
    replaced by placeholders."""
    run_dir = Path(run_dir)
    folder = run_dir / algorithm
    config_path = folder / "config.toml" if (folder / "config.toml").is_file() else run_dir / "config.toml"
    config = tomllib.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    config = {key: PLACEHOLDERS.get(key, value) for key, value in config.items()}
    try:
        where = str(run_dir.resolve().relative_to(CHECKOUT.resolve()))
    except ValueError:
        where = f"<runs>/{run_dir.name}"
    return {"run": where, "algorithm": algorithm, "config": config}


def find_runs(runs_dir: Path) -> dict[str, tuple[Path, str]]:
    """Every method folder with a summary in the run folders under `runs_dir`, labelled and in the
    segmentation tables' order. A run folder the tables named is known by its method (so FedIOD's
    variants, or FedAvg with and without recalibration, each keep their own column); any other by its
    algorithm."""
    found: dict[str, tuple[Path, str]] = {}
    for summary in sorted(Path(runs_dir).glob("*/*/summary.json")):
        run, algorithm = summary.parent.parent, summary.parent.name
        found[method_of_run(run.name) or algorithm] = (run, algorithm)
    known = [m for m in ORDER if m in found] + sorted(m for m in found if m not in ORDER)
    return {LABELS.get(m, m): found[m] for m in known}


def main(argv: Sequence[str] | None, load: Loader, segment: Segmenter) -> int:
    """The command line; `load` and `segment` are `fedistill.load_model` and `segment_volume` (the
    inference layer sits beside this one, so the entry point hands them in)."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--runs", required=True, help="the folder holding the segmentation run folders")
    parser.add_argument("--out", default=str(RESULTS), help="where the PNG and JSON go")
    parser.add_argument("--slices", type=int, default=2, help="slices per patient (largest true lesion)")
    parser.add_argument("--whole-head", action="store_true", help="predict on the whole head, no extraction")
    parser.add_argument("--brain-extraction", default="outline", choices=RULES,
                        help="the brain extraction rule (tissue: a figure of its own)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.whole_head and args.brain_extraction != "outline":
        parser.error("--whole-head predicts with no brain extraction; leave out --brain-extraction")
    torch.set_num_threads(1)
    runs = find_runs(Path(args.runs))
    if not runs:
        print(f"no finished runs under {args.runs}", file=sys.stderr)
        return 1
    command = f"python benchmarks/segmentation_real_figure.py --runs <runs> --slices {args.slices}"
    command += " --whole-head" if args.whole_head else ""
    command += f" --brain-extraction {args.brain_extraction}" if args.brain_extraction != "outline" else ""
    made_by = reproduce_command(Path(args.runs))
    real_patients_figure(
        runs,
        Path(args.data_dir),
        Path(args.out),
        load=load,
        segment=segment,
        count=args.slices,
        command=command,
        runs_made_by=made_by,
        skull_strip="" if args.whole_head else args.brain_extraction,
    )
    return 0


def figure_name(skull_strip: bool | str) -> str:
    """The figure's file stem: the tissue rule's figure stands beside the default's."""
    return f"{NAME}_tissue" if extraction_rule(skull_strip) == "tissue" else NAME


def reproduce_command(runs_dir: Path) -> str:
    """The `fedistill reproduce` command that made `<out>/reproduce/<target>-<scale>/runs`, else ""."""
    folder = runs_dir.resolve()
    if folder.name != "runs" or folder.parent.parent.name != "reproduce" or "-" not in folder.parent.name:
        return ""
    target, scale = folder.parent.name.rsplit("-", 1)
    where = f"<out>/reproduce/{folder.parent.name}/runs"
    return f"fedistill reproduce {target} --scale {scale} --out <out> (<runs> = {where})"
