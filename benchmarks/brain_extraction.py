"""How deep inside the head's outline the brain starts: the depth `brain_extraction.STRIP_MM` uses.

Semi-synthetic heads whose brain is known: the Colin 27 and MNI152 brains of `brats-synthetic-lesions`
at `--image-size` (256: 0.94 mm pixels, near the real patients' 0.78 mm), each subject wrapped in CSF,
skull and scalp of random thickness (`lesion_randomisation.synthetic_head`, the ranges of its `HEAD_MM`),
on the axial slices that hold at least a fifth of the largest slice's brain. For every depth, the mask of
the pixels deeper than it inside the head's outline (per slice, as `extract_brain` does) is scored
against the true brain: Dice, and the share of the non-brain head it keeps. The depth of best mean Dice
is the one chosen. The real lesion patients are not read.

    python benchmarks/brain_extraction.py [--subjects 20] [--image-size 256]

Writes benchmarks/results/brain_extraction.{md,json}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fedistill.data.medical.brain_extraction import STRIP_MM, inside_distance
from fedistill.data.medical.brain_synthetic import COLIN27, MNI152, load_host
from fedistill.data.medical.lesion_randomisation import synthetic_head
from fedistill.data.medical.volumes import axial_slices
from fedistill.reproduce.arguments import benchmark_parser, shown_arguments
from fedistill.reproduce.paths import RESULTS
from fedistill.reproduce.tables import write_table

DEPTHS_MM = tuple(float(d) for d in range(4, 27, 2))


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--subjects", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    folder = Path(args.data_dir) / "brain-mri"
    hosts = [load_host(str(folder / name), name.split("_")[0], args.image_size) for name in (COLIN27, MNI152)]
    dice = {d: [] for d in DEPTHS_MM}
    kept = {d: [] for d in DEPTHS_MM}
    for i in range(args.subjects):
        host = hosts[i % len(hosts)]
        brain, image = axial_slices(host.brain), axial_slices(host.volume)
        area = brain.sum(axis=(1, 2))
        keep = area >= 0.2 * area.max()
        brain, image = brain[keep], image[keep]
        _, head = synthetic_head(image, brain, host.voxel_mm, np.random.default_rng([args.seed, i]))
        inside = inside_distance(head, (host.voxel_mm, host.voxel_mm))
        for depth in DEPTHS_MM:
            mask = inside > depth
            dice[depth].append(2.0 * (mask & brain).sum() / (mask.sum() + brain.sum()))
            kept[depth].append((mask & ~brain).sum() / (head & ~brain).sum())
    best = max(DEPTHS_MM, key=lambda d: float(np.mean(dice[d])))
    rows = [
        {"depth_mm": d, "dice": float(np.mean(dice[d])), "dice_min": float(np.min(dice[d])),
         "non_brain_kept": float(np.mean(kept[d])), "non_brain_kept_p95": float(np.percentile(kept[d], 95))}
        for d in DEPTHS_MM
    ]  # fmt: skip
    shown = shown_arguments(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python benchmarks/brain_extraction.py", *shown])
    lines = [
        "# Brain extraction depth, on semi-synthetic heads",
        "",
        f"Command: `{command}`",
        "",
        f"{args.subjects} semi-synthetic subjects (the Colin 27 and MNI152 brains at {args.image_size} px, "
        f"{hosts[0].voxel_mm:.2f} mm pixels, in synthetic CSF, skull and scalp of random thickness); the "
        "brain mask is the pixels deeper than the depth inside the head's outline, slice by slice. "
        "Semi-synthetic data only: the real lesion patients are not read.",
        "",
        "| depth mm | brain Dice, mean | brain Dice, worst subject | non-brain head kept, mean | "
        "non-brain head kept, 95th pct |",
        "|---|---|---|---|---|",
        *(
            f"| {r['depth_mm']:.0f}{' (chosen)' if r['depth_mm'] == best else ''} | {r['dice']:.4f} | "
            f"{r['dice_min']:.4f} | {r['non_brain_kept']:.4f} | {r['non_brain_kept_p95']:.4f} |"
            for r in rows
        ),
        "",
        f"Chosen: {best:.0f} mm, the best mean Dice (`brain_extraction.STRIP_MM` = {STRIP_MM:g}).",
    ]
    record = {"command": command, "data": "semi-synthetic", "subjects": args.subjects,
              "image_size": args.image_size, "seed": args.seed, "rows": rows, "chosen_mm": best}  # fmt: skip
    print(write_table(args.results, "brain_extraction", lines, record).read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
