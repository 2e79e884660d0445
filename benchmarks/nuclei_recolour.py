"""Does a segmenter trained on H&E-like nuclei find the fluorescence site when it trains on recoloured
images? A probe of `fedistill.data.transforms.random_recolour` (FedIOD's `student_recolour`) on real
training images instead of G's.

One U-Net (Table 4's: width 8, depth 4, Adam 2e-3, batch 16) trained on the two H&E-like sites' patches
of `nuclei-synthetic-sites` (Table 4's data: 256 px images cut into 64 px patches, 8 training and 4 test
images per site), with each share of `--shares` of its training batches recoloured, then scored on every
site's test patches: Dice of nucleus (inside or contour) against background, per patch pixels pooled per
site. The fluorescence site (bright nuclei on black) is never trained on: the question is whether the
shapes learnt under random looks carry over to a look the model never saw.

    python benchmarks/nuclei_recolour.py [--shares 0,0.5] [--epochs 10] [--seeds 0,1,2]

Writes benchmarks/results/nuclei_recolour.{md,json}; one torch thread.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import torch

from fedistill.data.registry import load_dataset
from fedistill.data.transforms import random_recolour, to_float
from fedistill.models.registry import build_model
from fedistill.reproduce.arguments import benchmark_parser, shown_arguments
from fedistill.reproduce.paths import RESULTS
from fedistill.reproduce.tables import write_table
from fedistill.seeding import seeded, torch_generator
from fedistill.tasks import make_task

DATASET = "nuclei-synthetic-sites"
OPTIONS = {"image_size": 256, "patch_size": 64, "train_images": 8, "test_images": 4}
TRAINED_ON = (1, 2)  # the two H&E-like sites


def train_and_score(data, share: float, epochs: int, seed: int) -> dict[str, float]:
    """Dice (%) per test site of a U-Net trained on the H&E-like sites with `share` of its images
    recoloured."""
    info, task = data.info, make_task(data.info)
    sized = dataclasses.replace(info, num_classes=task.output_channels(info))
    model = seeded(seed, lambda: build_model("unet", sized, options={"width": 8, "depth": 4}), "model")
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    keep = np.isin(data.train_groups, TRAINED_ON)
    x, y = to_float(data.train.x[keep], info), task.pixel_targets(data.train.y[keep]).long()
    draws = torch_generator(seed, "nuclei-recolour")
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=draws)
        for start in range(0, len(x), 16):
            batch = order[start : start + 16]
            loss = task.loss(model(random_recolour(x[batch], info, share, draws)), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    test_x, test_y = to_float(data.test.x, info), data.test.y
    with torch.no_grad():
        predicted = torch.cat([model(test_x[i : i + 64]).argmax(1) for i in range(0, len(test_x), 64)]) > 0
    scores = {}
    for site, name in enumerate(data.group_names):
        at = torch.from_numpy(data.test_groups == site)
        found, truth = predicted[at], test_y[at] > 0
        scores[name] = 200.0 * float((found & truth).sum()) / max(1.0, float(found.sum() + truth.sum()))
    return scores


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--shares", default="0,0.5", help="shares of recoloured images, comma-separated")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the model and the draws, comma-separated")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    try:
        shares = [float(x) for x in args.shares.split(",")]
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        parser.error("--shares takes numbers and --seeds integers, comma-separated (e.g. 0,0.5 and 0,1,2)")
    if not all(0.0 <= share <= 1.0 for share in shares):
        parser.error("--shares are shares of the training images, each in [0, 1]")
    torch.set_num_threads(1)
    data = load_dataset(DATASET, args.data_dir, **OPTIONS)
    runs: dict[float, list[dict[str, float]]] = {}
    for share in shares:
        for seed in seeds:
            start = time.perf_counter()
            runs.setdefault(share, []).append(train_and_score(data, share, args.epochs, seed))
            print(
                f"share {share}, seed {seed}: {runs[share][-1]} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    names = list(data.group_names)

    def cell(share: float, name: str) -> str:
        values = [run[name] for run in runs[share]]
        return " / ".join(f"{v:.2f}" for v in values) + f" (mean {sum(values) / len(values):.2f})"

    lines = [
        "# Recoloured training images: a U-Net trained on the H&E-like nuclei sites, scored on every site",
        "",
        f"Command: `{' '.join(['python benchmarks/nuclei_recolour.py', *shown_arguments(sys.argv[1:])])}`",
        "",
        f"{DATASET} (semi-synthetic: 125 real fluorescence nuclei rendered in three looks), {OPTIONS}; U-Net "
        f"width 8, depth 4, Adam 2e-3, batch 16, {args.epochs} epochs on the sites "
        f"{', '.join(names[i] for i in TRAINED_ON)}; seeds {', '.join(map(str, seeds))}; Dice % of nucleus "
        "against background over each site's test patches, per seed. The fluorescence site is never trained on.",
        "",
        "| recoloured share | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
        *(f"| {share:g} | " + " | ".join(cell(share, n) for n in names) + " |" for share in runs),
    ]
    payload = {"command": shown_arguments(sys.argv[1:]), "options": OPTIONS, "epochs": args.epochs,
               "seeds": seeds, "trained_on": [names[i] for i in TRAINED_ON],
               "dice": {str(share): rows for share, rows in runs.items()}}  # fmt: skip
    print(write_table(args.results, "nuclei_recolour", lines, payload))


if __name__ == "__main__":
    main()
