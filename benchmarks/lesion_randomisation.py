"""Plain vs domain-randomised lesion synthesis, per method, scored on the two real lesion patients.

Every method trains on the semi-synthetic `brats-synthetic-lesions` at Table 2's budget (64 px, 40 training
/ 10 test subjects, K = 10 size-sorted sites, U-Net width 8 depth 4, 20 local epochs per site; FedIOD 10
distillation epochs x 25 G-steps: `fedistill.reproduce.segmentation_plan`), once with the plain synthesis
and once per share of randomised training subjects (`synthesis = "randomised"`, `randomised_fraction`:
`fedistill.data.medical.lesion_randomisation`). The share is chosen per method on the semi-synthetic test
subjects only (plain synthesis; the real patients never choose anything); every model is then scored
(Dice, sensitivity, HD95) on the real patients of `brain-lesions-real` by
`fedistill.reproduce.segmentation_scores`, like Table 2's real-patient columns: after brain extraction by
default (`--real-skull stripped`, as the training brains are skull-stripped; `stripped-tissue`: the
tissue rule of `brain_extraction`), or the whole head (`on`); an
extracted brain is put on the training brains' scale by its median (`--real-intensity brain-median`, the
default) or by its percentiles as the training brains were (`percentile`): `scan_scale`.
FedIOD runs at its default settings (`fediod-default`) unless `fediod` (the paper's exchanges) is asked.

    python benchmarks/lesion_randomisation.py [--methods centralized,fedavg,fediod-default]
        [--fractions 0.5,1] [--real-skull stripped|stripped-tissue|on] [--real-intensity brain-median|percentile] [--reuse]

Writes benchmarks/results/lesion_randomisation.{md,json}; runs go to --out (default: lesion-randomisation/ in
the benchmarks' runs folder), one `fedistill run` process at a time at `--threads` torch threads.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from _common import head_commit
from fedistill import disk
from fedistill.data.base import LoadedDataset
from fedistill.data.medical.brain_synthetic import SCAN_SCALES, SKULLS
from fedistill.reproduce.arguments import benchmark_parser, shown_arguments
from fedistill.reproduce.paths import RESULTS, RUNS
from fedistill.reproduce.segmentation_plan import LABELS, Table, execute, plan, training_samples
from fedistill.reproduce.segmentation_plan import parse as table_defaults
from fedistill.reproduce.segmentation_report import REAL_SKULL, real_intensity_text
from fedistill.reproduce.segmentation_scores import real_patients, saved_models, score

DATASET = "brats-synthetic-lesions"
METHODS = ("centralized", "fedavg", "fediod", "fediod-default")
DEFAULT_METHODS = ("centralized", "fedavg", "fediod-default")  # FedIOD at its default settings
REAL_KEYS = ("dice", "sensitivity", "hd95")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The comparison's settings; Table 2's budget unless told (`--help`)."""
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--methods", default=",".join(DEFAULT_METHODS), help="a subset of " + ", ".join(METHODS)
    )
    parser.add_argument("--real-skull", default="stripped", choices=SKULLS,
                        help="the real patients' scans as scored: brain-extracted, or the whole head")  # fmt: skip
    parser.add_argument("--real-intensity", default="brain-median", choices=SCAN_SCALES,
                        help="how an extracted real brain is put on the training brains' scale")  # fmt: skip
    parser.add_argument("--fractions", default="0.5,1", help="shares of randomised training subjects")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RUNS / "lesion-randomisation"))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--reuse", action="store_true", help="keep runs of the same name that finished")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--subjects", default="40,10", help="training,test subjects")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=20, help="local epochs per site, every method")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--distill-epochs", type=int, default=10)
    parser.add_argument("--iters", type=int, default=25)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key for every run (e.g. fediod.w_adv=0), as `fedistill run --set`")  # fmt: skip
    args = parser.parse_args(argv)
    args.argv = shown_arguments(list(argv if argv is not None else sys.argv[1:]))
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {', '.join(sorted(unknown))}; valid: {', '.join(METHODS)}")
    args.fraction_list = [float(f) for f in args.fractions.split(",") if f.strip()]
    if not all(0 < f <= 1 for f in args.fraction_list):
        parser.error(f"--fractions must be numbers in (0, 1], got {args.fractions!r}")
    # Table 2's shared model, optimiser and G/D sizes: segmentation_plan's own defaults, so a key the table
    # gains is never missing here
    for key, value in vars(table_defaults([])).items():
        if not hasattr(args, key):
            setattr(args, key, value)
    return args


def variants(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(label, dataset options) of the plain synthesis and of each randomised share."""
    train, test = (int(v) for v in args.subjects.split(","))
    base = {"image_size": args.image_size, "train_subjects": train, "test_subjects": test}
    out = [("plain", base)]
    for share in args.fraction_list:
        out.append(
            (f"randomised {share:g}", {**base, "synthesis": "randomised", "randomised_fraction": share})
        )
    return out


def lesion_ranking(
    folder: Path, method: str, data: LoadedDataset, args: argparse.Namespace
) -> dict[str, float]:
    """Whether the model sees the real lesions at all, whatever its threshold: the area under the ROC curve
    of its lesion probability over every real-patient pixel (0.5: no signal), and its mean probability on
    the lesion pixels and on the others; both over the two patients and per patient (a patient whose
    lesion ranks high but scores below 0.5 is a threshold away from being found; one near 0.5 is not seen
    at all). `data`: the run's training set, as `score` loaded it."""
    import numpy as np
    import torch
    from sklearn.metrics import roc_auc_score

    from fedistill.config import read_config
    from fedistill.data.transforms import to_float

    config = read_config(folder / "config.toml")
    real, patients = real_patients(config, args)
    (net,) = saved_models(folder, method, config, data)
    with torch.no_grad():
        lesion = net(to_float(real.test.x, data.info)).softmax(1)[:, 1].flatten().numpy()
    truth = real.test.y.flatten().numpy() == 1
    patient = np.repeat(np.asarray(patients), truth.size // len(patients))
    out = {
        "real_pixel_auc": float(roc_auc_score(truth, lesion)),
        "real_p_lesion": float(lesion[truth].mean()),
        "real_p_other": float(lesion[~truth].mean()),
    }
    for name in ("patient1", "patient2"):
        mine = patient == name
        out[f"real_pixel_auc_{name}"] = float(roc_auc_score(truth[mine], lesion[mine]))
        out[f"real_p_lesion_{name}"] = float(lesion[mine & truth].mean())
    return out


def lesion_visibility(args: argparse.Namespace) -> list[dict[str, float]]:
    """Each real lesion slice at the run's image size, as the models get it: its lesion pixels and their
    mean intensity (0..1) minus that of a ring 2-4 px around them: how visible the lesion is."""
    from scipy import ndimage

    from fedistill.data.registry import load_dataset

    real = load_dataset(
        "brain-lesions-real",
        args.data_dir,
        image_size=args.image_size,
        skull=args.real_skull,
        intensity=args.real_intensity,
    )
    images, masks = real.test.x.numpy()[:, 0] / 255.0, real.test.y.numpy() == 1
    out = []
    for image, mask, subject in zip(images, masks, real.test_meta["subject"], strict=True):
        if not mask.any():
            continue
        ring = ndimage.binary_dilation(mask, iterations=4) & ~ndimage.binary_dilation(mask, iterations=1)
        contrast = float(image[mask].mean() - image[ring].mean())
        out.append({"patient": int(subject) + 1, "pixels": int(mask.sum()), "contrast": contrast})
    return out


def measure(args: argparse.Namespace, method: str, options: dict[str, Any], samples: int) -> dict[str, Any]:
    """One method on one synthesis: its run, then its model scored on the semi-synthetic test subjects
    and on the real patients."""
    table = Table(2, DATASET, args.clients, options, args.epochs, args.rounds, args.distill_epochs,
                  args.iters, (method,))  # fmt: skip
    (spec,) = plan(table, args, samples)
    folder = execute(table, spec, args)
    metrics, data = score(folder, method, args)
    (site,) = metrics
    real = {k: v for k, v in site.items() if k.startswith("real_") and k.split("_")[1] in REAL_KEYS}
    return {
        "run": spec.name,
        "semi_synthetic_dice": site["dice"],
        "semi_synthetic_hd95": site["hd95"],
        **real,
        **lesion_ranking(folder, method, data, args),
    }


def report(
    rows: list[dict[str, Any]], visibility: list[dict[str, float]], args: argparse.Namespace, commit: str
) -> str:
    """The results as Markdown."""
    command = "python benchmarks/lesion_randomisation.py " + shlex.join(args.argv)
    lines = [
        "# Lesion synthesis: plain vs domain-randomised, scored on real lesions",
        "",
        f"Command: `{command.strip()}`; commit {commit}.",
        "",
        f"Training data: {DATASET} (semi-synthetic: real T1 brains, painted lesions), {args.image_size} px, "
        f"subjects {args.subjects} (training,test), K = {args.clients} size-sorted sites; U-Net width "
        f"{args.width}, depth {args.depth}; {args.epochs} local epochs per site (FedAvg, Centralized: "
        f"{args.rounds} rounds); FedIOD {args.distill_epochs} distillation epochs x {args.iters} G-steps; "
        f"seed {args.seed}, {args.threads} torch thread(s). Semi-synthetic Dice: the plain semi-synthetic "
        "test subjects (the validation that chooses the randomised share, marked *). Real: the two patients "
        f"of brain-lesions-real (real contrast T1 lesions, {REAL_SKULL[args.real_skull]}"
        f"{real_intensity_text(args)}), mean over their "
        "lesion slices; never used to choose anything.",
        "",
        "| method | synthesis | semi-synthetic Dice % | real Dice % | real sens. % | real HD95 px | "
        "real Dice % patient 1 / 2 | real HD95 px patient 1 / 2 | real pixel AUC | real p(lesion): on "
        "lesion / elsewhere | pixel AUC patient 1 / 2 | p(lesion) on lesion, patient 1 / 2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " *" if r["chosen"] else ""
        lines.append(
            f"| {LABELS[r['method']]} | {r['synthesis']}{mark} | {100 * r['semi_synthetic_dice']:.2f} | "
            f"{100 * r['real_dice']:.2f} | {100 * r['real_sensitivity']:.2f} | {r['real_hd95']:.2f} | "
            f"{100 * r['real_dice_patient1']:.2f} / {100 * r['real_dice_patient2']:.2f} | "
            f"{r['real_hd95_patient1']:.2f} / {r['real_hd95_patient2']:.2f} | {r['real_pixel_auc']:.3f} | "
            f"{r['real_p_lesion']:.4f} / {r['real_p_other']:.4f} | {r['real_pixel_auc_patient1']:.3f} / "
            f"{r['real_pixel_auc_patient2']:.3f} | {r['real_p_lesion_patient1']:.4f} / "
            f"{r['real_p_lesion_patient2']:.4f} |"
        )
    lines += [
        "",
        "Real pixel AUC: how well the model's lesion probability ranks the real patients' lesion pixels above "
        "all their other pixels (0.5: no signal), whatever the threshold; Dice needs the probability above 0.5 "
        "as well. Per patient: the same over that patient's slices alone.",
        "",
        f"How visible the real lesions are at {args.image_size} px (each lesion slice: its pixels, and their "
        "mean intensity on the 0..1 scale the models see minus that of a ring 2-4 px around them):",
        "",
        "| patient | lesion px | contrast to its surroundings |",
        "|---|---|---|",
        *(f"| {v['patient']} | {v['pixels']} | {v['contrast']:+.3f} |" for v in visibility),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rows = []
    methods = [m for m in METHODS if m in args.methods.split(",")]
    samples: dict[str, int] = {}  # training samples of each synthesis (the same table for every method)
    for method in methods:  # one method's syntheses together, the cheapest method first
        for label, options in variants(args):
            if label not in samples:
                table = Table(2, DATASET, args.clients, options, args.epochs, args.rounds,
                              args.distill_epochs, args.iters, tuple(methods))  # fmt: skip
                samples[label] = training_samples(table, args)
            rows.append({"method": method, "synthesis": label, "options": options,
                         **measure(args, method, options, samples[label])})  # fmt: skip
    for method in methods:  # the randomised share each method keeps: best semi-synthetic Dice
        randomised = [r for r in rows if r["method"] == method and r["synthesis"] != "plain"]
        best = max(randomised, key=lambda r: r["semi_synthetic_dice"], default=None)
        for r in rows:
            if r["method"] == method:
                r["chosen"] = r is best
    commit = head_commit()
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    visibility = lesion_visibility(args)
    payload = {"command": "python benchmarks/lesion_randomisation.py " + shlex.join(args.argv), "commit": commit,
               "dataset": DATASET, "real_dataset": "brain-lesions-real", "real_skull": args.real_skull,
               "real_intensity": args.real_intensity, "rows": rows,
               "real_lesion_visibility": visibility}  # fmt: skip
    text = report(rows, visibility, args, commit)
    disk.write_text(results / "lesion_randomisation.json", json.dumps(payload, indent=2) + "\n")
    disk.write_text(results / "lesion_randomisation.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
